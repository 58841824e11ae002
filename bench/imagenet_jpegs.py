"""Writes a folder of JPEGs of ImageNet's sizes and file sizes for bench/image: each 333-500 pixels
a side, quality 90, 4:2:0 chroma (PIL's default, as most of ImageNet), about 110 KB: smooth colour
fields at several scales with fine grain, so the decoder has a photograph's work (a blurred or flat
image compresses to a fraction and decodes faster). Ten class folders, ImageFolder's layout.
Usage: imagenet_jpegs.py OUT [COUNT]"""
import os
import sys

import numpy as np
from PIL import Image


def picture(rng, height, width):
    """Colour fields from coarse to fine, plus grain: ImageNet's mix of low and high frequencies."""
    out = np.zeros((height, width, 3), np.float32)
    for cells, weight in ((3, 90.0), (12, 50.0), (48, 50.0), (160, 80.0), (400, 90.0)):
        grid = rng.normal(0.0, 1.0, (cells, cells, 3)).astype(np.float32)
        field = Image.fromarray(((grid - grid.min()) / (np.ptp(grid) + 1e-6) * 255).astype(np.uint8), "RGB")
        out += (np.asarray(field.resize((width, height), Image.BICUBIC), np.float32) - 128.0) * (weight / 128.0)
    out += rng.normal(0.0, 16.0, out.shape)
    return np.clip(out + 128.0, 0, 255).astype(np.uint8)


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out, count = sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 2000
    done = os.path.join(out, "complete")
    if os.path.exists(done):
        print(out)
        return
    rng = np.random.default_rng(2009)
    sizes = []
    for i in range(count):
        folder = os.path.join(out, f"n{i % 10:08d}")
        os.makedirs(folder, exist_ok=True)
        height, width = (int(v) for v in rng.integers(333, 501, 2))
        path = os.path.join(folder, f"image_{i:06d}.JPEG")
        Image.fromarray(picture(rng, height, width), "RGB").save(path, quality=90)
        sizes.append(os.path.getsize(path))
    open(done, "w").write(f"{count} files, {sum(sizes) / len(sizes) / 1000:.0f} KB on average\n")
    print(out)


if __name__ == "__main__":
    main()
