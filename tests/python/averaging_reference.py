"""Prints the Python reference values that tests/unit/python_state_test.cpp pastes for
dettrial::optim::AveragedModel: torch.optim.swa_utils.AveragedModel with equal weights (its default)
and with get_ema_multi_avg_fn(decay), with and without use_buffers, on the CPU:

    python3 tests/python/averaging_reference.py

The model is Sequential(Linear(3, 4), BatchNorm1d(4), Linear(4, 2)) in float32. Before update k
(k = 0, ..., UPDATES - 1) every parameter and buffer of the model is set to
((arange(numel) * 0.37 + 1.3 * k) % 5) / 7 in its shape (num_batches_tracked to 3 * k), then
averaged.update_parameters(model). Printed, as C++ initializers, per configuration: an FNV-1a 64-bit
hash of the bytes of every entry of averaged.state_dict() (in its order) after every update, and
the state dict's names. Then update_bn over five batches (x, y), x = ((arange(18) * 0.1 * (b + 1)) % 3)
in shape (6, 3), of Sequential(Linear(3, 4), BatchNorm1d(4), ReLU(), Linear(4, 2)) whose values are
set as above with k = 1: its BatchNorm's buffers after (through a matrix product, whose last bits
differ between LibTorch builds: the test compares them to 1e-6).

The values in the test were printed by torch 2.15.0 (CPU).
"""
import struct

import torch
from torch import nn
from torch.optim import swa_utils

UPDATES = 25


def fnv1a(h, data):
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def set_values(model, k):
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.dtype == torch.long:
                t.fill_(3 * k)
            else:
                t.copy_(torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape).mul(0.37).add(1.3 * k).remainder(5.0).div(7.0))


CONFIGS = [
    ("ema(0.9)", lambda m: swa_utils.AveragedModel(m, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.9))),
    ("ema(0.99, use_buffers)", lambda m: swa_utils.AveragedModel(m, multi_avg_fn=swa_utils.get_ema_multi_avg_fn(0.99), use_buffers=True)),
    ("swa()", lambda m: swa_utils.AveragedModel(m)),
    ("swa(use_buffers)", lambda m: swa_utils.AveragedModel(m, use_buffers=True)),
]


def main():
    print(f"// tests/python/averaging_reference.py, torch {torch.__version__}")
    for name, make in CONFIGS:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
        averaged = make(model)
        h = 0xCBF29CE484222325
        for k in range(UPDATES):
            set_values(model, k)
            averaged.update_parameters(model)
            for t in averaged.state_dict().values():
                h = fnv1a(h, t.contiguous().numpy().tobytes())
        names = ", ".join(f'"{n}"' for n in averaged.state_dict().keys())
        print(f'    {{"{name}", 0x{h:016x}ULL, {{{names}}}}},')
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
    set_values(model, 1)
    batches = [(torch.arange(18, dtype=torch.float32).mul(0.1 * (b + 1)).remainder(3.0).reshape(6, 3), torch.zeros(6)) for b in range(5)]
    swa_utils.update_bn(batches, model)
    bn = model[1]
    print(f"// update_bn: running_mean {{{', '.join(repr(float(v)) for v in bn.running_mean)}}}, "
          f"running_var {{{', '.join(repr(float(v)) for v in bn.running_var)}}}, num_batches_tracked {int(bn.num_batches_tracked)}")


if __name__ == "__main__":
    main()
