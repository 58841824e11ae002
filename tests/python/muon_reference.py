"""Prints the Python reference values that tests/unit/optim_test.cpp pastes for dettrial::optim::Muon,
and, given a folder, writes torch.optim.Muon's own state after 12 steps for the test that continues
it in dettrial (tests/unit/mnist_test.cpp):

    python3 tests/python/muon_reference.py            # the hashes
    python3 tests/python/muon_reference.py FOLDER     # FOLDER/<n>.pt for configuration n

Two float32 matrices, w (3 x 4, wide) and v (5 x 2, tall: Newton-Schulz works on its transpose),
start at ((arange(n) * 0.3) % 2 - 1) and take STEPS steps of torch.optim.Muon with the gradient of
step k set to (((arange(n) * 0.7 + 1.1 * k) % 3) - 1.5) / 4, no autograd, so that only the
optimizer's arithmetic is compared. Printed, per configuration: an FNV-1a 64-bit hash of the bytes of
both matrices and their momentum buffers after each step, and the keys of the state dict's first
group and first state. A file holds the state dict after step 12, both matrices then, and the hash
so far (a hex string). Exits 77 (CTest's skip) when this torch has no torch.optim.Muon (before 2.9);
a configuration this torch's Muon refuses (an adjust_lr_fn it does not have yet: torch 2.11 has no
'spectral_unclamped') is a line "// skipped: <configuration>: <why>", with no file.

The values in the test were printed by torch 2.15.0 (CPU).
"""
import os
import sys

import torch

from adam_family_reference import fnv1a, values  # the same hash and problem values

STEPS = 30
SAVED_AT = 12

CONFIGS = [
    ("Muon()", {}),
    ("Muon(lr=0.02, weight_decay=0.01, nesterov=False, adjust_lr_fn='match_rms_adamw')",
     dict(lr=0.02, weight_decay=0.01, nesterov=False, adjust_lr_fn="match_rms_adamw")),
    ("Muon(momentum=0.9, eps=1e-05, ns_steps=3, adjust_lr_fn='spectral_unclamped')",
     dict(momentum=0.9, eps=1e-5, ns_steps=3, adjust_lr_fn="spectral_unclamped")),
    ("Muon(lr=0.05, ns_coefficients=(2.0, -1.5, 0.5), adjust_lr_fn='original')",
     dict(lr=0.05, ns_coefficients=(2.0, -1.5, 0.5), adjust_lr_fn="original")),
]


def main(folder):
    if not hasattr(torch.optim, "Muon"):
        print(f"skipped: torch {torch.__version__} has no torch.optim.Muon (it came in 2.9)")
        return 77
    print(f"// tests/python/muon_reference.py, torch {torch.__version__}")
    for n, (name, kwargs) in enumerate(CONFIGS):
        w = torch.nn.Parameter(values(12, 0.3, 0.0).remainder(2.0).sub(1.0).reshape(3, 4))
        v = torch.nn.Parameter(values(10, 0.3, 0.0).remainder(2.0).sub(1.0).reshape(5, 2))
        try:
            opt = torch.optim.Muon([w, v], **kwargs)
        except ValueError as e:  # an option this release does not have
            print(f"// skipped: {name}: torch {torch.__version__}: {e}")
            continue
        h = 0xCBF29CE484222325
        for k in range(1, STEPS + 1):
            for p in (w, v):
                p.grad = values(p.numel(), 0.7, 1.1 * k).remainder(3.0).sub(1.5).div(4.0).reshape(p.shape)
            opt.step()
            for p in (w, v):
                h = fnv1a(h, p.detach().numpy().tobytes())
                h = fnv1a(h, opt.state[p]["momentum_buffer"].numpy().tobytes())
            if folder and k == SAVED_AT:
                torch.save({"optimizer": opt.state_dict(), "w": w.detach().clone(), "v": v.detach().clone(),
                            "hash": f"{h:016x}"}, os.path.join(folder, f"{n}.pt"))
        sd = opt.state_dict()
        group = ", ".join(f'"{k}"' for k in sorted(sd["param_groups"][0].keys()) if k != "params")
        state = ", ".join(f'"{k}"' for k in sorted(sd["state"][0].keys()))
        print(f'    {{"{name}", 0x{h:016x}ULL, {{{group}}}, {{{state}}}}},')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
