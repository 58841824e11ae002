"""Writes an ImageNet-shaped folder from Fashion-MNIST (IDX files): the layout, file names, image
sizes and odd files of ILSVRC-2012's training and validation folders, with real, learnable pictures,
for the ImageNet example and its tests.

  OUT/train/n0000000<k>/n0000000<k>_<index>.JPEG   RGB JPEG, 375-500 pixels a side (ImageNet's
                                                    usual sizes), quality 90, 4:2:0, each
                                                    Fashion-MNIST image upscaled and tinted
  OUT/val/n0000000<k>/ILSVRC2012_val_<index>.JPEG  the same from the test split
  two CMYK JPEGs in each split (ImageNet's training set holds 22, saved by Photoshop) and one PNG
  named .JPEG in the training split (ImageNet holds one), as the real folders have them
  OUT/complete                                      written last: the folder is whole

Usage: imagenet_folder.py IDX_DIR OUT [TRAIN_PER_CLASS [VAL_PER_CLASS]]   (default 100 and 20)
"""
import os
import shutil
import sys

try:
    import numpy as np
    from PIL import Image
except ImportError as missing:  # reported as skipped (77), with the reason
    print(f"skipped: this Python has no {missing.name} (Debian: python3-pil, python3-numpy)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from image_folder import read_idx  # noqa: E402 - the IDX reader of the Fashion-MNIST image folders

CLASSES = 10


def picture(digit, rng):
    """A 28x28 gray picture at ImageNet's size: a side of 375-500 pixels, a tint, a textured background."""
    width, height = int(rng.integers(375, 501)), int(rng.integers(375, 501))
    gray = np.asarray(Image.fromarray(digit, "L").resize((width, height), Image.BICUBIC), dtype=np.float32) / 255.0
    tint = rng.uniform(0.4, 1.0, 3).astype(np.float32)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    background = (0.15 + 0.1 * np.sin(x / rng.uniform(7, 30)) * np.cos(y / rng.uniform(7, 30)))[..., None]
    rgb = gray[..., None] * tint + (1.0 - gray[..., None]) * background
    return Image.fromarray(np.clip(rgb * 255.0 + rng.normal(0, 4, rgb.shape), 0, 255).astype(np.uint8), "RGB")


def write_split(out, split, images, labels, per_class, rng):
    counts = [0] * CLASSES
    written = []
    for index in range(len(labels)):
        label = int(labels[index])
        if counts[label] >= per_class:
            continue
        counts[label] += 1
        folder = os.path.join(out, split, f"n{label:08d}")
        os.makedirs(folder, exist_ok=True)
        name = f"n{label:08d}_{index}.JPEG" if split == "train" else f"ILSVRC2012_val_{index + 1:08d}.JPEG"
        path = os.path.join(folder, name)
        picture(images[index], rng).save(path, quality=90, subsampling="4:2:0")
        written.append(path)
        if min(counts) >= per_class:
            break
    # The odd files of the real folders: CMYK JPEGs, and (training only) a PNG named .JPEG.
    for path in written[3:5]:
        Image.open(path).convert("CMYK").save(path, quality=90)
    if split == "train":
        Image.open(written[7]).save(written[7], format="PNG")
    return len(written)


def main():
    idx, out = sys.argv[1], sys.argv[2]
    train_per_class = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    val_per_class = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    shutil.rmtree(out, ignore_errors=True)
    rng = np.random.default_rng(2012)
    train = write_split(out, "train", read_idx(f"{idx}/train-images-idx3-ubyte.gz"), read_idx(f"{idx}/train-labels-idx1-ubyte.gz"),
                        train_per_class, rng)
    val = write_split(out, "val", read_idx(f"{idx}/t10k-images-idx3-ubyte.gz"), read_idx(f"{idx}/t10k-labels-idx1-ubyte.gz"),
                      val_per_class, rng)
    with open(os.path.join(out, "complete"), "w") as f:
        f.write(f"{train} {val}\n")
    print(f"ok: an ImageNet-shaped folder of {train} training and {val} validation images in {out}")


if __name__ == "__main__":
    main()
