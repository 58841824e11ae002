"""Prints the Python reference values that tests/unit/optim_test.cpp pastes for dettrial::optim's
NAdam, RAdam and Adamax:

    python3 tests/python/adam_family_reference.py

Two float32 parameters, w (3 x 4) and b (5), start at ((arange(n) * 0.3) % 2 - 1) and take STEPS
steps of torch.optim's optimizer (its default single-tensor path on the CPU) with the gradient of
step k set to (((arange(n) * 0.7 + 1.1 * k) % 3) - 1.5) / 4, no autograd, so that only the
optimizer's arithmetic is compared. Printed, per configuration: an FNV-1a 64-bit hash of the bytes of
both parameters and of every state tensor (exp_avg, then exp_avg_sq or exp_inf, then NAdam's
mu_product) after each step, and the keys of the state dict's first group and first state.

The values in the test were printed by torch 2.15.0 (CPU).
"""
import torch

STEPS = 30


def fnv1a(h, data):
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def values(n, scale, shift):
    return torch.arange(n, dtype=torch.float32).mul(scale).add(shift)


CONFIGS = [
    ("NAdam()", lambda p: torch.optim.NAdam(p)),
    ("NAdam(lr=0.01, weight_decay=0.1, momentum_decay=0.01)", lambda p: torch.optim.NAdam(p, lr=0.01, weight_decay=0.1, momentum_decay=0.01)),
    ("NAdam(weight_decay=0.05, decoupled_weight_decay=True, maximize=True)",
     lambda p: torch.optim.NAdam(p, weight_decay=0.05, decoupled_weight_decay=True, maximize=True)),
    ("RAdam()", lambda p: torch.optim.RAdam(p)),
    ("RAdam(lr=0.01, weight_decay=0.1)", lambda p: torch.optim.RAdam(p, lr=0.01, weight_decay=0.1)),
    ("RAdam(betas=(0.8, 0.99), weight_decay=0.05, decoupled_weight_decay=True)",
     lambda p: torch.optim.RAdam(p, betas=(0.8, 0.99), weight_decay=0.05, decoupled_weight_decay=True)),
    ("Adamax()", lambda p: torch.optim.Adamax(p)),
    ("Adamax(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, maximize=True)",
     lambda p: torch.optim.Adamax(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, maximize=True)),
]


def main():
    print(f"// tests/python/adam_family_reference.py, torch {torch.__version__}")
    for name, make in CONFIGS:
        w = torch.nn.Parameter(values(12, 0.3, 0.0).remainder(2.0).sub(1.0).reshape(3, 4))
        b = torch.nn.Parameter(values(5, 0.3, 0.0).remainder(2.0).sub(1.0))
        opt = make([w, b])
        h = 0xCBF29CE484222325
        for k in range(1, STEPS + 1):
            for p in (w, b):
                p.grad = values(p.numel(), 0.7, 1.1 * k).remainder(3.0).sub(1.5).div(4.0).reshape(p.shape)
            opt.step()
            for p in (w, b):
                h = fnv1a(h, p.detach().numpy().tobytes())
                state = opt.state[p]
                for key in ("exp_avg", "exp_avg_sq", "exp_inf", "mu_product"):
                    if key in state:
                        h = fnv1a(h, state[key].numpy().tobytes())
        sd = opt.state_dict()
        group = ", ".join(f'"{k}"' for k in sorted(sd["param_groups"][0].keys()) if k != "params")
        state = ", ".join(f'"{k}"' for k in sorted(sd["state"][0].keys()))
        print(f'    {{"{name}", 0x{h:016x}ULL, {{{group}}}, {{{state}}}}},')


if __name__ == "__main__":
    main()
