"""Prints the Python reference values that tests/unit/python_state_test.cpp pastes for the schedulers
LinearLR, ConstantLR, CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR and
CosineAnnealingWarmRestarts of include/dettrial/optim/schedulers.hpp:

    python3 tests/python/scheduler_reference.py

Each configuration runs torch.optim.lr_scheduler's scheduler on an SGD whose groups start at the given
learning rates, calling step() STEPS times. Printed, as C++ initializers:

  - an FNV-1a 64-bit hash of every group's learning rate after 0, 1, ..., STEPS calls (the eight
    little-endian bytes of each float64, step by step, group by group), so that one rate one ulp off
    changes it;
  - a few of those rates as hex floats (float.hex), at the steps where the schedule turns, to say
    which rate differs when the hash does;
  - at SAVED_AT calls, pickle.dumps(scheduler.state_dict(), protocol=2).hex() (only for the first
    configuration of each scheduler type, to keep the test short), and the hash of the rates after
    SAVED_AT + 1, ..., STEPS calls, which a scheduler restored from that state must reproduce.

The values in the test were printed by torch 2.15.0 (CPU).
"""
import pickle
import struct

import torch
from torch import nn
from torch.optim import lr_scheduler as ls

STEPS = 300
SAVED_AT = 37


def fnv1a(rates_by_step):
    h = 0xCBF29CE484222325
    for rates in rates_by_step:
        for r in rates:
            for byte in struct.pack("<d", r):
                h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def optimizer(lrs):
    params = [nn.Parameter(torch.zeros(1)) for _ in lrs]
    return torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)], lr=lrs[0])


# (name the C++ test uses, learning rates, the scheduler, the steps to print, whether to pickle)
CONFIGS = [
    ("LinearLR(start_factor=0.25, end_factor=0.9, total_iters=40)", [0.1, 0.025],
     lambda o: ls.LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=40), [0, 1, 2, 39, 40, 41, 300], True),
    ("LinearLR()", [0.3],
     lambda o: ls.LinearLR(o), [0, 1, 4, 5, 6], False),
    ("LinearLR(start_factor=1.0, end_factor=0.05, total_iters=200)", [0.3, 0.07],
     lambda o: ls.LinearLR(o, start_factor=1.0, end_factor=0.05, total_iters=200), [0, 1, 199, 200, 201], False),
    ("ConstantLR(factor=0.4, total_iters=50)", [0.1, 0.025],
     lambda o: ls.ConstantLR(o, factor=0.4, total_iters=50), [0, 1, 49, 50, 51], True),
    ("ConstantLR()", [0.3],
     lambda o: ls.ConstantLR(o), [0, 4, 5, 6], False),
    ("CosineAnnealingLR(T_max=50, eta_min=0.001)", [0.1, 0.025],
     lambda o: ls.CosineAnnealingLR(o, T_max=50, eta_min=0.001), [0, 1, 49, 50, 51, 52, 100, 151, 300], True),
    ("CosineAnnealingLR(T_max=7)", [0.3],
     lambda o: ls.CosineAnnealingLR(o, T_max=7), [0, 1, 7, 8, 9, 15, 22], False),
    ("LambdaLR(lr_lambda=[lambda e: 1.0 / (1 + e // 30), lambda e: 0.97 ** e])", [0.1, 0.025],
     lambda o: ls.LambdaLR(o, lr_lambda=[lambda e: 1.0 / (1 + e // 30), lambda e: 0.97 ** e]), [0, 1, 29, 30, 300], True),
    ("LambdaLR(lr_lambda=lambda e: 0.95 ** e)", [0.3],
     lambda o: ls.LambdaLR(o, lr_lambda=lambda e: 0.95 ** e), [0, 1, 2, 300], False),
    ("MultiplicativeLR(lr_lambda=lambda e: 0.5 if e % 25 == 0 else 0.995)", [0.1, 0.025],
     lambda o: ls.MultiplicativeLR(o, lr_lambda=lambda e: 0.5 if e % 25 == 0 else 0.995), [0, 1, 24, 25, 26, 300], True),
    ("PolynomialLR(total_iters=120, power=2.0)", [0.1, 0.025],
     lambda o: ls.PolynomialLR(o, total_iters=120, power=2.0), [0, 1, 119, 120, 121], True),
    ("PolynomialLR()", [0.3],
     lambda o: ls.PolynomialLR(o), [0, 1, 4, 5, 6], False),
    ("PolynomialLR(total_iters=90, power=0.5)", [0.3],
     lambda o: ls.PolynomialLR(o, total_iters=90, power=0.5), [0, 1, 89, 90, 91], False),
    ("CosineAnnealingWarmRestarts(T_0=10, T_mult=2, eta_min=0.0001)", [0.1, 0.025],
     lambda o: ls.CosineAnnealingWarmRestarts(o, T_0=10, T_mult=2, eta_min=0.0001), [0, 1, 9, 10, 11, 29, 30, 70, 300], True),
    ("CosineAnnealingWarmRestarts(T_0=7)", [0.3],
     lambda o: ls.CosineAnnealingWarmRestarts(o, T_0=7), [0, 1, 6, 7, 8, 300], False),
]


def cpp_hex_string(data, indent="     "):
    text = data.hex()
    lines = [text[i:i + 120] for i in range(0, len(text), 120)]
    return ("\n" + indent).join(f'"{line}"' for line in lines)


def main():
    print(f"// tests/python/scheduler_reference.py, torch {torch.__version__}")
    for name, lrs, make, shown, pickled in CONFIGS:
        opt = optimizer(lrs)
        sched = make(opt)
        history = [[g["lr"] for g in opt.param_groups]]
        state = None
        for k in range(1, STEPS + 1):
            opt.step()
            sched.step()
            history.append([g["lr"] for g in opt.param_groups])
            assert history[-1] == sched.get_last_lr()
            if k == SAVED_AT and pickled:
                state = pickle.dumps(sched.state_dict(), protocol=2)
        samples = ", ".join("{%d, {%s}}" % (k, ", ".join(r.hex() for r in history[k])) for k in shown)
        print(f'    {{"{name}", {{{", ".join(repr(lr) for lr in lrs)}}}, 0x{fnv1a(history):016x}ULL,')
        print(f"     {{{samples}}},")
        if state is None:
            print("     0, nullptr},")
        else:
            print(f"     0x{fnv1a(history[SAVED_AT + 1:]):016x}ULL,")
            print(f"     {cpp_hex_string(state)}}},")


if __name__ == "__main__":
    main()
