"""Writes Fashion-MNIST (IDX files) as two ImageFolder trees of real image files, the data the image
examples, tests and benchmark read:

  OUT/png/{train,validation}/<class>/<index>.png    28x28 grayscale PNG, all 60,000 + 10,000 images
  OUT/jpeg/{train,validation}/<class>/<index>.jpg   64x64 RGB JPEG (bilinear upscale, quality 90),
                                                    the first 10,000 training and 2,000 test images

Class folders sort in label order (0_tshirt_top ... 9_ankle_boot), so ImageFolder's labels are the
data set's. Usage: image_folder.py IDX_DIR OUT
"""
import gzip
import os
import sys

import numpy as np
from PIL import Image

CLASSES = ["tshirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle_boot"]
VERSION = "1"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def write_tree(root, images, labels, fmt):
    tmp = root + ".partial"
    for label, name in enumerate(CLASSES):
        os.makedirs(os.path.join(tmp, f"{label}_{name}"), exist_ok=True)
    for index, (pixels, label) in enumerate(zip(images, labels)):
        folder = os.path.join(tmp, f"{label}_{CLASSES[label]}")
        image = Image.fromarray(pixels, mode="L")
        if fmt == "png":
            image.save(os.path.join(folder, f"{index:05d}.png"))
        else:
            image.convert("RGB").resize((64, 64), Image.BILINEAR).save(os.path.join(folder, f"{index:05d}.jpg"), quality=90)
    os.rename(tmp, root)


def main():
    idx_dir, out = sys.argv[1], sys.argv[2]
    marker = os.path.join(out, "complete")
    if os.path.exists(marker) and open(marker).read().strip() == VERSION:
        print(f"image folders already in {out}")
        return
    train_x = read_idx(os.path.join(idx_dir, "train-images-idx3-ubyte.gz"))
    train_y = read_idx(os.path.join(idx_dir, "train-labels-idx1-ubyte.gz"))
    test_x = read_idx(os.path.join(idx_dir, "t10k-images-idx3-ubyte.gz"))
    test_y = read_idx(os.path.join(idx_dir, "t10k-labels-idx1-ubyte.gz"))
    import shutil
    for sub in ("png", "jpeg"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
        for split in ("train", "validation"):
            shutil.rmtree(os.path.join(out, sub, split + ".partial"), ignore_errors=True)
        os.makedirs(os.path.join(out, sub), exist_ok=True)
    write_tree(os.path.join(out, "png", "train"), train_x, train_y, "png")
    write_tree(os.path.join(out, "png", "validation"), test_x, test_y, "png")
    write_tree(os.path.join(out, "jpeg", "train"), train_x[:10000], train_y[:10000], "jpeg")
    write_tree(os.path.join(out, "jpeg", "validation"), test_x[:2000], test_y[:2000], "jpeg")
    with open(marker, "w") as f:
        f.write(VERSION + "\n")
    print(f"wrote Fashion-MNIST as PNG and JPEG image folders in {out}")


if __name__ == "__main__":
    main()
