"""Loads a dettrial checkpoint of a trial whose optimizer is its own (tests/unit/rprop.hpp: Rprop,
declared with its Python layout beside it) into Python's torch.optim.Rprop.

The C++ side (tests/unit/checkpoint_test.cpp) trained the trial and checkpointed it. Here
state_dict.pth is read with torch.load (weights only, where torch has it), the model's tensors
become parameters in the trial's order, and torch.optim.Rprop loads the optimizer's state: every
parameter's `step`, `prev` and `step_size`, and the group's etas and step sizes as the trial set
them. One step from a gradient of ones must then move each parameter by its step size, as Rprop's
update with an unchanged sign does. Exits 77 (CTest's skip) when this Python has no torch.
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


def main(checkpoint, etas, step_sizes):
    state = load(os.path.join(checkpoint, "state_dict.pth"))
    model = state["models_state_dict"][0]
    params = [torch.nn.Parameter(t.clone()) for t in model.values()]
    optimizer = torch.optim.Rprop(params)
    optimizer.load_state_dict(state["optimizers_state_dict"][0])
    group = optimizer.param_groups[0]
    assert tuple(group["etas"]) == etas, group["etas"]
    assert tuple(group["step_sizes"]) == step_sizes, group["step_sizes"]
    assert len(optimizer.state) == len(params), f"{len(optimizer.state)} states for {len(params)} parameters"
    before = [p.detach().clone() for p in params]
    sizes = []
    for p in params:
        s = optimizer.state[p]
        assert s["prev"].shape == p.shape and s["step_size"].shape == p.shape
        assert float(s["step"]) > 0, s["step"]
        sizes.append(s["step_size"].clone())
    # With prev set to the new gradient's sign, every element keeps its sign: the step size grows by
    # etaplus (clamped) and each element moves by it, against the gradient.
    for p in params:
        optimizer.state[p]["prev"].fill_(1.0)
        p.grad = torch.ones_like(p)
    optimizer.step()
    for p, b, size in zip(params, before, sizes):
        want = b - (size * etas[1]).clamp(step_sizes[0], step_sizes[1])
        diff = (p.detach() - want).abs().max().item()
        assert diff <= 1e-6, f"a parameter moved {diff} away from Rprop's step"
    print(f"torch {torch.__version__}: Rprop loaded {len(params)} parameters' state and stepped on")


if __name__ == "__main__":
    main(sys.argv[1], (float(sys.argv[2]), float(sys.argv[3])), (float(sys.argv[4]), float(sys.argv[5])))
