#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora with the real tools: Python's pickle and torch.save, NumPy,
PIL (JPEG, PNG, WebP), the repository's own configs and checkpoints.

usage: make_corpus.py OUTPUT_DIR      (one folder per target below it; idempotent)
Needs torch, NumPy and PIL (Debian's python3-torch, python3-numpy, python3-pil): exit 77 without.
"""
import collections
import gzip
import io
import json
import os
import pickle
import random
import shutil
import struct
import sys
import zipfile

try:
    import numpy as np
    import torch
    from PIL import Image
except ImportError as e:
    print(f"skipped: {e}")
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
out = sys.argv[1]


def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def torch_save(obj, **kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    return buffer.getvalue()


# ---- pickles and torch.save archives -------------------------------------------------------------
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2), torch.nn.Linear(2, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
model(torch.randn(4, 3)).sum().backward()
optimizer.step()
shared = torch.arange(6, dtype=torch.float32)
archives = {
    "state_dict": model.state_dict(),
    "optimizer": optimizer.state_dict(),
    "dtypes": {str(t): torch.ones(2, dtype=t) for t in (torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
                                                         torch.int64, torch.float64, torch.bool)},
    "views": {"whole": shared, "view": shared[2:5], "strided": shared.view(2, 3).t()},
    "determined": {"models_state_dict": [model.state_dict()], "optimizers_state_dict": [optimizer.state_dict()],
                   "lr_schedulers_state_dict": [], "callbacks": {}, "rng_state": {"cpu_rng_state": torch.get_rng_state(),
                                                                                  "np_rng_state": np.random.get_state(),
                                                                                  "random_rng_state": random.getstate()}},
    "empty": {},
    "scalars": {"step": 3, "lr": 0.5, "name": "adam", "flag": True, "none": None, "nested": [(1, 2), {"a": [1.5]}]},
}
for name, obj in archives.items():
    data = torch_save(obj)
    put("archive", f"{name}.pt", data)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
        put("pickle", f"{name}.data.pkl", z.read(pkl))
# trial_state.pkl as Determined writes it, at each protocol.
trial_state = {"batches_trained": 9, "epochs_trained": 1, "trial_id": 3, "last_ckpt": 9, "step_id": 9, "last_val": 8}
for protocol in range(0, pickle.HIGHEST_PROTOCOL + 1):
    put("pickle", f"trial_state.p{protocol}.pkl", pickle.dumps(trial_state, protocol=protocol))
    values = {"list": [1, 2.5, "x", b"bytes", None, True], "tuple": (1, (2, 3)), "set": {1, 2}, "frozenset": frozenset({3}),
              "ordered": collections.OrderedDict(a=1), "big": 2**70, "negative": -5, "unicode": "\u00e9\u4e2d"}
    put("pickle", f"values.p{protocol}.pkl", pickle.dumps(values, protocol=protocol))
put("pickle", "numpy_state.p2.pkl", pickle.dumps(np.random.get_state(), protocol=2))
put("pickle", "numpy_array.p4.pkl", pickle.dumps(np.arange(6, dtype=np.uint16).reshape(2, 3), protocol=4))
put("pickle", "numpy_scalar.p4.pkl", pickle.dumps(np.float32(1.5), protocol=4))
put("pickle", "random_state.p4.pkl", pickle.dumps(random.getstate(), protocol=4))
shutil.copy(os.path.join(root, "tests/unit/fixtures/format1-checkpoint/trial_state.pkl"), os.path.join(out, "pickle", "fixture.pkl"))
shutil.copy(os.path.join(root, "tests/unit/fixtures/format1-checkpoint/state_dict.pth"), os.path.join(out, "archive", "fixture.pth"))

# ---- configs ---------------------------------------------------------------------------------------
for folder in ("examples", "tests/cli", "tests/experiment", "tests/unit/config_schema", "tests/determined"):
    for dirpath, _, files in os.walk(os.path.join(root, folder)):
        for f in files:
            if f.endswith(".yaml"):
                with open(os.path.join(dirpath, f), "rb") as text:
                    put("config", os.path.relpath(os.path.join(dirpath, f), root).replace("/", "_"), text.read())

# ---- checkpoint metadata ----------------------------------------------------------------------------
with open(os.path.join(root, "tests/unit/fixtures/format1-checkpoint/metadata.json"), "rb") as f:
    put("checkpoint_metadata", "dettrial.json", f.read())
determined = {"determined_version": "0.38.0", "framework": "torch-2.5.1", "format": "pickle", "steps_completed": 100,
              "trial_id": 7, "experiment_id": 3, "searcher_metric": "validation_loss"}
put("checkpoint_metadata", "determined.json", json.dumps(determined, indent=2).encode())
put("checkpoint_metadata", "empty.json", b"{}")

# ---- IDX and CIFAR --------------------------------------------------------------------------------
def idx(array):
    codes = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}
    header = struct.pack(">BBBB", 0, 0, codes[array.dtype.type], array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


put("idx", "images.idx3", idx(np.arange(2 * 4 * 3, dtype=np.uint8).reshape(2, 4, 3)))
put("idx", "labels.idx1", idx(np.array([3, 1, 4], dtype=np.uint8)))
put("idx", "floats.idx2", idx(np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3)))
put("idx", "ints.idx1", idx(np.array([-1, 70000], dtype=np.int32)))
mnist = os.path.join(root, "..", "shared", "data", "mnist-10k", "t10k-labels-idx1-ubyte.gz")
if os.path.exists(mnist):
    with gzip.open(mnist) as f:
        put("idx", "mnist-labels.idx1", f.read()[:8 + 64])
rng = np.random.default_rng(0)
put("cifar", "ten.bin", b"".join(bytes([i % 10]) + rng.integers(0, 256, 3072, dtype=np.uint8).tobytes() for i in range(2)))
put("cifar", "hundred.bin", b"".join(bytes([i % 20, i % 100]) + rng.integers(0, 256, 3072, dtype=np.uint8).tobytes() for i in range(2)))

# ---- images, by PIL ---------------------------------------------------------------------------------
pixels = rng.integers(0, 256, (13, 17, 3), dtype=np.uint8)
rgb = Image.fromarray(pixels, "RGB")


def saved(image, fmt, **kwargs):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


images = {
    "rgb.jpg": saved(rgb, "JPEG", quality=90),
    "gray.jpg": saved(rgb.convert("L"), "JPEG"),
    "cmyk.jpg": saved(rgb.convert("CMYK"), "JPEG"),
    "progressive.jpg": saved(rgb, "JPEG", progressive=True),
    "subsampled.jpg": saved(rgb.resize((40, 33)), "JPEG", subsampling=2, quality=50),
    "rgb.png": saved(rgb, "PNG"),
    "gray.png": saved(rgb.convert("L"), "PNG"),
    "gray_alpha.png": saved(rgb.convert("LA"), "PNG"),
    "rgba.png": saved(rgb.convert("RGBA"), "PNG"),
    "palette.png": saved(rgb.convert("P"), "PNG"),
    "gray16.png": saved(Image.fromarray((pixels[..., 0].astype(np.uint16) * 257), "I;16"), "PNG"),
    "optimized.png": saved(rgb, "PNG", optimize=True),
    "lossy.webp": saved(rgb, "WEBP", quality=80),
    "lossless.webp": saved(rgb, "WEBP", lossless=True),
    "alpha.webp": saved(rgb.convert("RGBA"), "WEBP"),
}
for name, data in images.items():
    put("image", name, data)
    put("image_window", name, data)
print(f"wrote the corpora of {len(os.listdir(out))} targets into {out}")
