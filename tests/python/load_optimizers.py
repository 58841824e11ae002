"""Loads optimizer states dettrial wrote in Python's layout into torch.optim and steps on from them.

For each optimizer, the C++ side (tests/unit/mnist_test.cpp) trained a small linear model two steps,
saved the optimizer's state dict (dettrial::optimizer_state_dict), the parameters, the input, and the
parameters after a third step. Here the same model gets those parameters, torch.optim.<name> loads
the state (its hyperparameters come from the param_groups), takes the third step, and must land on
the C++ parameters. Exits 77 (CTest's skip) when this Python has no torch.
"""
import os
import sys

try:
    import torch
except ImportError:
    print("skipped: this Python has no torch")
    sys.exit(77)


def load(path):
    if int(torch.__version__.split(".")[0]) >= 2:
        return torch.load(path, map_location="cpu", weights_only=True)
    return torch.load(path, map_location="cpu")


# Updates an older torch computes otherwise, which dettrial does not follow: (the first torch release
# dettrial matches, why). Their states are loaded there all the same; the step is not compared.
OTHER_ARITHMETIC = {
    "NAdam": ((2, 0), "torch before 2.0 multiplies NAdam's mu_product_next by mu twice, a bug 2.0 fixed; "
                      "dettrial follows torch 2"),
}


def release():
    return tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])


def main(directory):
    names = sorted(f[:-3] for f in os.listdir(directory) if f.endswith(".pt"))
    assert names, "no optimizer states in " + directory
    for name in names:
        d = load(os.path.join(directory, name + ".pt"))
        if not hasattr(torch.optim, name):
            print(f"{name}: not in torch {torch.__version__}, not compared")
            continue
        keys = ("weight", "bias") if "bias" in d else ("weight",)  # Muon's network has no bias
        net = torch.nn.Linear(3, 2, bias="bias" in d)
        with torch.no_grad():
            for key in keys:
                getattr(net, key).copy_(d[key])
        optimizer = getattr(torch.optim, name)(net.parameters(), lr=1.0)
        optimizer.load_state_dict(d["optimizer"])
        if name in OTHER_ARITHMETIC and release() < OTHER_ARITHMETIC[name][0]:
            print(f"{name}: state loaded; the step is not compared in torch {torch.__version__}: {OTHER_ARITHMETIC[name][1]}")
            continue
        optimizer.zero_grad()
        net(d["input"]).pow(2).sum().backward()
        optimizer.step()
        for key in keys:
            got, want = getattr(net, key).detach(), d["next_" + key]
            diff = (got - want).abs().max().item()
            assert diff <= 1e-5, f"{name}: {key} after a step in Python differs from C++'s by {diff}"
        print(f"{name}: state loaded, the next step matches")
    print("ok:", len(names), "optimizers")


if __name__ == "__main__":
    main(sys.argv[1])
