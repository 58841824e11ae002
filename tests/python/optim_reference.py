"""Prints the Python reference values that tests/unit/optim_test.cpp hard-codes.

dettrial::optim::Adadelta and the schedulers of include/dettrial/optim/schedulers.hpp promise
PyTorch's (Python's) arithmetic: this script runs torch.optim.Adadelta and torch.optim.lr_scheduler
on the same problems as the C++ test and prints every number the test compares with, so anyone can
regenerate them:

    python3 tests/python/optim_reference.py

The test's values were printed by torch 2.15.0 (the PyPI wheel). torch 1.13.1 (Debian's python3-torch)
prints the same learning rates, bit for bit, and the same Adadelta values to about 1e-8 (the last bit of
float32: the two builds' BLAS sum the matrix product differently); its Adadelta state keeps `step` as a
Python int rather than a float32 tensor. The script prints the version it ran with and the state-dict
keys, which differ between versions (1.13 has `verbose`; 2.x has `_is_initial`, `default_min_lr`, and
Adadelta's `capturable` and `differentiable`).
"""
import math

import torch
from torch import nn


def floats(values):
    """Python floats, printed so that they round-trip exactly (repr)."""
    return "{" + ", ".join(repr(float(v)) for v in values) + "}"


# ---------------------------------------------------------------------------------------------------
# Adadelta: a linear layer 3 -> 2 with fixed weights, a fixed batch of 4, MSE loss, 5 steps (CPU).
def problem():
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_((torch.arange(6, dtype=torch.float32).reshape(2, 3) - 2.5) * 0.2)
        model.bias.copy_(torch.tensor([0.1, -0.2]))
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3) * 0.25 - 1.0
    y = torch.arange(8, dtype=torch.float32).reshape(4, 2) * 0.3 - 1.0
    return model, x, y


def adadelta_run(name, steps=5, **options):
    model, x, y = problem()
    opt = torch.optim.Adadelta(model.parameters(), **options)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    state = opt.state[model.weight]
    print(f"adadelta {name} {options}: after {steps} steps")
    print("  weight     ", floats(model.weight.detach().flatten()))
    print("  bias       ", floats(model.bias.detach()))
    print("  square_avg ", floats(state["square_avg"].flatten()), "(weight)")
    print("  acc_delta  ", floats(state["acc_delta"].flatten()), "(weight)")
    print("  step       ", repr(float(state["step"])), type(state["step"]).__name__,
          getattr(state["step"], "dtype", ""))
    group = opt.state_dict()["param_groups"][0]
    print("  group keys ", sorted(group.keys()))


# ---------------------------------------------------------------------------------------------------
# Schedulers: an optimizer whose groups start at the given learning rates.
def optimizer(*lrs):
    params = [nn.Parameter(torch.zeros(1)) for _ in lrs]
    return torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, lrs)], lr=lrs[0])


def lrs(opt):
    return [g["lr"] for g in opt.param_groups]


def scheduler_run(name, make, lr0, calls):
    opt = optimizer(*lr0)
    sched = make(opt)
    print(f"{name}: lrs of each group after 0..{calls} step() calls")
    history = [lrs(opt)]
    for _ in range(calls):
        opt.step()
        sched.step()
        history.append(lrs(opt))
    for g in range(len(lr0)):
        print(f"  group {g}", floats(h[g] for h in history))
    return sched


def state(name, sched, keys):
    sd = sched.state_dict()
    print(f"{name} state_dict: keys {sorted(sd.keys())}")
    for k in keys:
        print(f"  {k} = {sd[k]!r}")


def plateau_run(name, lr0, metrics, **options):
    opt = optimizer(*lr0)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **options)
    print(f"{name} {options}: metric, then lrs, best, num_bad_epochs, cooldown_counter after each step")
    print("  metrics", floats(metrics))
    history = []
    for m in metrics:
        opt.step()
        sched.step(m)
        history.append((lrs(opt), sched.best, sched.num_bad_epochs, sched.cooldown_counter))
    for g in range(len(lr0)):
        print(f"  lr group {g}", floats(h[0][g] for h in history))
    print("  best            ", floats(h[1] for h in history))
    print("  num_bad_epochs  ", "{" + ", ".join(str(h[2]) for h in history) + "}")
    print("  cooldown_counter", "{" + ", ".join(str(h[3]) for h in history) + "}")
    return sched


def main():
    print("torch", torch.__version__)
    torch.set_default_dtype(torch.float32)

    adadelta_run("defaults")
    adadelta_run("tuned", lr=0.5, rho=0.8, weight_decay=0.01)

    s = scheduler_run("StepLR(step_size=2, gamma=0.5)",
                      lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5), [1.0, 0.3], 6)
    state("StepLR after 6 calls", s, ["step_size", "gamma", "base_lrs", "last_epoch", "_step_count", "_last_lr"])
    s = scheduler_run("MultiStepLR(milestones=[2, 5, 5], gamma=0.1)",
                      lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[2, 5, 5], gamma=0.1), [1.0], 7)
    state("MultiStepLR after 7 calls", s, ["milestones", "gamma", "base_lrs", "last_epoch", "_step_count", "_last_lr"])
    s = scheduler_run("ExponentialLR(gamma=0.9)",
                      lambda o: torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9), [0.1], 6)
    state("ExponentialLR after 6 calls", s, ["gamma", "base_lrs", "last_epoch", "_step_count", "_last_lr"])

    s = plateau_run("ReduceLROnPlateau min/rel", [0.1],
                    [1.0, 0.95, 0.95, 0.95, 0.85, 0.8, 0.8, 0.8, 0.8, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
                    mode="min", factor=0.5, patience=2, threshold=0.1, cooldown=1, min_lr=0.02)
    state("ReduceLROnPlateau min/rel after 17 steps", s,
          ["factor", "min_lrs", "patience", "cooldown", "cooldown_counter", "mode", "threshold",
           "threshold_mode", "best", "num_bad_epochs", "mode_worse", "eps", "last_epoch", "_last_lr"])
    s = plateau_run("ReduceLROnPlateau max/abs", [0.1, 0.5],
                    [0.5, 0.52, 0.56, 0.6, 0.58, 0.61, 0.7, 0.69, 0.68, 0.67, 0.66, 0.65],
                    mode="max", factor=0.1, patience=1, threshold=0.05, threshold_mode="abs",
                    min_lr=[0.001, 0.05], eps=0.02)
    state("ReduceLROnPlateau max/abs after 12 steps", s,
          ["min_lrs", "best", "num_bad_epochs", "cooldown_counter", "mode_worse", "last_epoch", "_last_lr"])
    fresh = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer(0.1))
    print("fresh ReduceLROnPlateau: best", repr(fresh.best), "mode_worse", repr(fresh.mode_worse),
          "last_epoch", fresh.last_epoch, "inf is", math.isinf(fresh.best))


if __name__ == "__main__":
    main()
