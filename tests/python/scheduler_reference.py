"""Prints the Python reference values that tests/unit/python_state_test.cpp pastes for the schedulers
LinearLR, ConstantLR, CosineAnnealingLR, LambdaLR, MultiplicativeLR, PolynomialLR,
CosineAnnealingWarmRestarts, OneCycleLR, CyclicLR, SequentialLR, ChainedScheduler and SWALR of
include/dettrial/optim/:

    python3 tests/python/scheduler_reference.py

Each configuration runs torch.optim.lr_scheduler's scheduler on an SGD whose groups start at the given
learning rates, calling step() STEPS times. Printed, as C++ initializers:

  - an FNV-1a 64-bit hash of every group's learning rate and then every group's momentum (SGD's, or
    Adam's beta1 for a configuration named "Adam: ...", which OneCycleLR and CyclicLR cycle) after
    0, 1, ..., STEPS calls (the eight little-endian bytes of each float64, step by step, group by
    group), so that one value one ulp off changes it;
  - a few of those rates and momenta as hex floats (float.hex), at the steps where the schedule
    turns, to say which one differs when the hash does;
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
from torch.optim import swa_utils

STEPS = 300
SAVED_AT = 37


def fnv1a(rates_by_step):
    h = 0xCBF29CE484222325
    for rates in rates_by_step:
        for r in rates:
            for byte in struct.pack("<d", r):
                h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def optimizer(lrs, adam=False):
    params = [nn.Parameter(torch.zeros(1)) for _ in lrs]
    groups = [{"params": [p], "lr": lr} for p, lr in zip(params, lrs)]
    return torch.optim.Adam(groups, lr=lrs[0]) if adam else torch.optim.SGD(groups, lr=lrs[0])


def momentum(group):
    """SGD's momentum or Adam's beta1, which OneCycleLR and CyclicLR cycle."""
    return float(group["betas"][0] if "betas" in group else group["momentum"])


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
    ("OneCycleLR(max_lr=[1.0, 0.5], total_steps=300)", [0.1, 0.025],
     lambda o: ls.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=300), [0, 1, 89, 90, 91, 299, 300], True),
    ("OneCycleLR(max_lr=0.3, total_steps=300, pct_start=0.25, anneal_strategy='linear', three_phase=True, div_factor=10.0, "
     "final_div_factor=100.0)", [0.3],
     lambda o: ls.OneCycleLR(o, max_lr=0.3, total_steps=300, pct_start=0.25, anneal_strategy="linear", three_phase=True,
                             div_factor=10.0, final_div_factor=100.0), [0, 1, 74, 75, 148, 149, 150, 300], True),
    ("Adam: OneCycleLR(max_lr=0.01, epochs=3, steps_per_epoch=100)", [0.001, 0.002],
     lambda o: ls.OneCycleLR(o, max_lr=0.01, epochs=3, steps_per_epoch=100), [0, 1, 89, 90, 300], True),
    ("OneCycleLR(max_lr=0.2, total_steps=300, cycle_momentum=False)", [0.1],
     lambda o: ls.OneCycleLR(o, max_lr=0.2, total_steps=300, cycle_momentum=False), [0, 1, 300], False),
    ("CyclicLR(base_lr=0.01, max_lr=[0.1, 0.05], step_size_up=20)", [0.1, 0.025],
     lambda o: ls.CyclicLR(o, base_lr=0.01, max_lr=[0.1, 0.05], step_size_up=20), [0, 1, 19, 20, 21, 40, 41, 300], True),
    ("CyclicLR(base_lr=0.001, max_lr=0.1, step_size_up=15, step_size_down=25, mode='triangular2')", [0.3],
     lambda o: ls.CyclicLR(o, base_lr=0.001, max_lr=0.1, step_size_up=15, step_size_down=25, mode="triangular2"),
     [0, 15, 40, 55, 80, 300], False),
    ("Adam: CyclicLR(base_lr=[0.01, 0.002], max_lr=[0.1, 0.04], step_size_up=10, mode='exp_range', gamma=0.995)", [0.1, 0.025],
     lambda o: ls.CyclicLR(o, base_lr=[0.01, 0.002], max_lr=[0.1, 0.04], step_size_up=10, mode="exp_range", gamma=0.995),
     [0, 10, 20, 300], True),
    ("CyclicLR(base_lr=0.01, max_lr=0.1, step_size_up=7, scale_fn=lambda x: 1 / (1 + 0.01 * x), scale_mode='iterations', "
     "cycle_momentum=False)", [0.3],
     lambda o: ls.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=7, scale_fn=lambda x: 1 / (1 + 0.01 * x),
                           scale_mode="iterations", cycle_momentum=False), [0, 7, 14, 300], False),
    ("SequentialLR([LinearLR(start_factor=0.1, total_iters=5), CosineAnnealingLR(T_max=95)], milestones=[5])", [0.1, 0.025],
     lambda o: ls.SequentialLR(o, [ls.LinearLR(o, start_factor=0.1, total_iters=5), ls.CosineAnnealingLR(o, T_max=95)],
                               milestones=[5]), [0, 1, 4, 5, 6, 99, 100, 101, 300], True),
    ("SequentialLR([ConstantLR(factor=0.5, total_iters=10), ExponentialLR(gamma=0.98), StepLR(step_size=30, gamma=0.5)], "
     "milestones=[20, 120])", [0.3],
     lambda o: ls.SequentialLR(o, [ls.ConstantLR(o, factor=0.5, total_iters=10), ls.ExponentialLR(o, gamma=0.98),
                                   ls.StepLR(o, step_size=30, gamma=0.5)], milestones=[20, 120]), [0, 10, 19, 20, 21, 120, 121, 300],
     True),
    ("SequentialLR([LinearLR(start_factor=0.01, total_iters=10), MultiplicativeLR(lr_lambda=lambda e: 0.99), "
     "CosineAnnealingWarmRestarts(T_0=20)], milestones=[10, 100])", [0.1, 0.025],
     lambda o: ls.SequentialLR(o, [ls.LinearLR(o, start_factor=0.01, total_iters=10), ls.MultiplicativeLR(o, lr_lambda=lambda e: 0.99),
                                   ls.CosineAnnealingWarmRestarts(o, T_0=20)], milestones=[10, 100]), [0, 9, 10, 11, 100, 101, 300],
     False),
    ("SequentialLR([LinearLR(start_factor=0.5, total_iters=4), OneCycleLR(max_lr=[1.0, 0.5], total_steps=250)], milestones=[50])",
     [0.1, 0.025],
     lambda o: ls.SequentialLR(o, [ls.LinearLR(o, start_factor=0.5, total_iters=4), ls.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=250)],
                               milestones=[50]), [0, 4, 49, 50, 51, 300], False),
    ("SWALR(swa_lr=0.05, anneal_epochs=10)", [0.1, 0.025],
     lambda o: swa_utils.SWALR(o, swa_lr=0.05, anneal_epochs=10), [0, 1, 9, 10, 11, 300], True),
    ("SWALR(swa_lr=[0.01, 0.2], anneal_epochs=5, anneal_strategy='linear')", [0.1, 0.025],
     lambda o: swa_utils.SWALR(o, swa_lr=[0.01, 0.2], anneal_epochs=5, anneal_strategy="linear"), [0, 1, 4, 5, 6, 300], False),
    ("SWALR(swa_lr=0.05, anneal_epochs=0)", [0.3],
     lambda o: swa_utils.SWALR(o, swa_lr=0.05, anneal_epochs=0), [0, 1, 2, 300], False),
    ("ChainedScheduler([ConstantLR(factor=0.1, total_iters=4), ExponentialLR(gamma=0.99)])", [0.1, 0.025],
     lambda o: ls.ChainedScheduler([ls.ConstantLR(o, factor=0.1, total_iters=4), ls.ExponentialLR(o, gamma=0.99)]),
     [0, 1, 3, 4, 5, 300], True),
    ("ChainedScheduler([LinearLR(start_factor=0.2, total_iters=10), LambdaLR(lr_lambda=lambda e: 0.97 ** e)])", [0.3],
     lambda o: ls.ChainedScheduler([ls.LinearLR(o, start_factor=0.2, total_iters=10), ls.LambdaLR(o, lr_lambda=lambda e: 0.97 ** e)]),
     [0, 1, 9, 10, 11, 300], False),
]


def cpp_hex_string(data, indent="     "):
    text = data.hex()
    lines = [text[i:i + 120] for i in range(0, len(text), 120)]
    return ("\n" + indent).join(f'"{line}"' for line in lines)


def main():
    print(f"// tests/python/scheduler_reference.py, torch {torch.__version__}")
    for name, lrs, make, shown, pickled in CONFIGS:
        opt = optimizer(lrs, adam=name.startswith("Adam: "))
        sched = make(opt)

        def rates():
            return [g["lr"] for g in opt.param_groups] + [momentum(g) for g in opt.param_groups]

        history = [rates()]
        state = None
        for k in range(1, STEPS + 1):
            opt.step()
            sched.step()
            history.append(rates())
            assert history[-1][:len(lrs)] == sched.get_last_lr()
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
