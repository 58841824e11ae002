#!/usr/bin/env python3
"""A dettrial checkpoint's size against Python's own torch.save of the same state.
  checkpoint_size.py DIR LIMIT
DIR holds checkpoints (one folder each). For each, torch.load reads its state_dict.pth, and
torch.save writes what a Python trainer saves: the model's, the optimizer's and the LR scheduler's
state dicts. The checkpoint folder (every file: weights, optimizer, generators, progress, config,
metadata) must be at most LIMIT times that file."""
import io
import os
import sys

try:
    import torch
except ImportError:
    print("skipped: this Python has no torch")
    sys.exit(77)

directory, limit = sys.argv[1], float(sys.argv[2])
checkpoints = sorted(d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d)))
if len(checkpoints) < 2:
    sys.exit(f"checkpoint_size: expected two checkpoints in {directory}, found {checkpoints}")
for name in checkpoints:
    path = os.path.join(directory, name)
    state = torch.load(os.path.join(path, "state_dict.pth"), map_location="cpu")
    python = io.BytesIO()
    torch.save({"model": state["models_state_dict"][0],
                "optimizer": state["optimizers_state_dict"][0],
                "lr_scheduler": state["lr_schedulers_state_dict"][0]}, python)
    ours = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    ratio = ours / python.getbuffer().nbytes
    optimizer = "Adam" if "exp_avg" in next(iter(state["optimizers_state_dict"][0]["state"].values())) else "SGD with momentum"
    print(f"{optimizer}: checkpoint {ours} bytes in {len(os.listdir(path))} files, torch.save {python.getbuffer().nbytes} bytes: {ratio:.3f}x")
    if ratio > limit:
        sys.exit(f"checkpoint_size: {optimizer}'s checkpoint is {ratio:.3f}x torch.save's, more than {limit}x")
print(f"ok: every checkpoint is at most {limit}x Python's torch.save of the same state dicts")
