"""Loads a dettrial checkpoint with Python's torch.load and checks it against the C++ run.

The C++ side (tests/unit/mnist_test.cpp) trained the MNIST example trial, checkpointed it, and wrote
io.pt: an input, the network's output on it, the learning rate and the checkpoint's path. Here the
same network is written in Python, the checkpoint's weights go into it (strict names), and its output
must match to 1e-6. The optimizer state loads into torch.optim.SGD and steps; the RNG state is
accepted by torch.set_rng_state.
"""
import json
import os
import sys

import torch
from torch import nn


def load(path):
    # torch >= 2 loads with weights_only=True by default: the file must need no other globals.
    if int(torch.__version__.split(".")[0]) >= 2:
        return torch.load(path, map_location="cpu", weights_only=True)
    return torch.load(path, map_location="cpu")


def main(directory):
    skipped = os.path.join(directory, "skipped.txt")
    if os.path.exists(skipped):  # the C++ side had no data to train on: CTest's skip
        with open(skipped) as f:
            print("skipped:", f.read().strip())
        sys.exit(77)
    io = load(os.path.join(directory, "io.pt"))
    checkpoint = io["checkpoint"]
    state = load(os.path.join(checkpoint, "state_dict.pth"))
    assert set(state) >= {"models_state_dict", "optimizers_state_dict", "lr_schedulers_state_dict", "rng_state", "callbacks"}, state.keys()

    n1, n2 = io["n_filters1"], io["n_filters2"]
    net = nn.Sequential(
        nn.Conv2d(1, n1, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(n1, n2, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * n2, 50), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(50, 10), nn.LogSoftmax(1))
    net.load_state_dict(state["models_state_dict"][0], strict=True)
    net.eval()
    with torch.no_grad():
        out = net(io["input"])
    diff = (out - io["output"]).abs().max().item()
    # The same kernels on the CPU; a GPU's convolutions sum in another order.
    tolerance = 1e-6 if io.get("device", "cpu") == "cpu" else 1e-4
    assert diff <= tolerance, f"outputs differ by {diff} (C++ on {io.get('device', 'cpu')}, tolerance {tolerance})"

    optimizer = torch.optim.SGD(net.parameters(), lr=1.0, momentum=0.9)
    optimizer.load_state_dict(state["optimizers_state_dict"][0])
    group = optimizer.param_groups[0]
    assert abs(group["lr"] - io["lr"]) < 1e-12, (group["lr"], io["lr"])
    assert group["momentum"] == 0.9
    params = list(net.parameters())
    for index, p in enumerate(params):
        buffer = optimizer.state[p]["momentum_buffer"]
        assert buffer.shape == p.shape, (index, buffer.shape, p.shape)
    net.train()
    loss = net(io["input"]).sum()
    loss.backward()
    optimizer.step()

    torch.set_rng_state(state["rng_state"]["cpu_rng_state"])
    scheduler = state["lr_schedulers_state_dict"][0]
    assert scheduler["last_epoch"] >= 1, scheduler

    # The gradient scaler under Determined's key, in GradScaler.state_dict()'s layout: 20 clean steps
    # from 1024 with growth every 8 give 4096 and 4 steps counted.
    scaler = state["scaler_state_dict"]
    assert scaler == {"scale": 4096.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 8, "_growth_tracker": 4}, scaler
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch 2.3+: a CPU GradScaler reads it
        python_scaler = torch.amp.GradScaler("cpu")
        python_scaler.load_state_dict(scaler)
        assert python_scaler.get_scale() == 4096.0 and python_scaler._get_growth_tracker() == 4

    with open(os.path.join(checkpoint, "metadata.json")) as f:
        metadata = json.load(f)
    assert metadata["steps_completed"] == 20, metadata
    with open(os.path.join(checkpoint, "load_data.json")) as f:
        load_data = json.load(f)
    assert load_data["hparams"]["n_filters1"] == n1, load_data
    print(f"ok: torch {torch.__version__} loaded {checkpoint}; outputs differ by {diff:.2e}")


if __name__ == "__main__":
    main(sys.argv[1])
