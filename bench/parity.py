"""Replays trainer_bench's parity runs in Python PyTorch: for each model folder (mlp/, mnist/) the same
initial weights, the same batches in the same order, the same generator state (dropout draws from it)
and the same optimizer (SGD with momentum); compares the per-batch losses with the C++ ones (to 5
decimals, as numpy.testing.assert_almost_equal means it) and the time per batch.
Usage: parity.py DIR. Prints one JSON object per measurement; exits 1 when a loss differs."""
import copy
import json
import pathlib
import sys
import time

import numpy as np
import torch

import networks


def load(path, dtype, shape):
    return torch.from_numpy(np.fromfile(path, dtype=dtype).reshape(shape))


def build(meta):
    if meta["model"] == "mlp":
        return networks.mlp(), torch.nn.functional.cross_entropy
    if meta["model"] == "mnist":
        return networks.mnist(meta["n_filters1"], meta["n_filters2"], meta["dropout"]), torch.nn.functional.nll_loss
    raise SystemExit(f"parity.py: unknown model {meta['model']!r}")


def replay(folder):
    meta = json.loads((folder / "meta.json").read_text())
    shape = tuple(meta["input_shape"])
    batches = shape[0]
    inputs = load(folder / "inputs.f32", np.float32, shape)
    labels = load(folder / "labels.i64", np.int64, shape[:2])
    cpp_losses = np.fromfile(folder / "losses.f32", dtype=np.float32)
    model, loss_fn = build(meta)
    params = list(model.parameters())
    if len(params) != meta["params"]:
        raise SystemExit(f"parity.py: the Python {meta['model']} has {len(params)} parameters, the C++ one {meta['params']}")
    with torch.no_grad():
        for i, p in enumerate(params):
            p.copy_(load(folder / f"param{i}.f32", np.float32, tuple(p.shape)))
    optimizer = torch.optim.SGD(params, lr=meta["lr"], momentum=meta["momentum"])
    # One untimed step on a copy first, as the C++ side is warm when it is timed (the first steps
    # create kernels' primitives); the generator state is set afterwards.
    warm = copy.deepcopy(model)
    loss_fn(warm(inputs[0]), labels[0]).backward()
    torch.set_rng_state(torch.from_numpy(np.fromfile(folder / "rng_state.u8", dtype=np.uint8)))
    model.train()
    losses = []
    total = torch.zeros((), dtype=torch.float64)
    start = time.perf_counter()
    for b in range(batches):
        loss = loss_fn(model(inputs[b]), labels[b])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            total += loss
        losses.append(loss.item())
    seconds = (time.perf_counter() - start) / batches
    diff = float(np.max(np.abs(np.array(losses, dtype=np.float32) - cpp_losses)))
    close5 = diff < 1.5e-5  # numpy's assert_almost_equal(decimal=5): |a - b| < 1.5 * 10**-5
    label = meta["label"]
    print(json.dumps({"name": f"Python PyTorch, same {label} run", "value": seconds, "unit": "s/batch", "spread": 1.0,
                      "torch": torch.__version__}))
    print(json.dumps({"name": f"Python / dettrial Trainer, {label} time per batch", "value": seconds / meta["cpp_seconds_per_batch"],
                      "unit": "ratio", "spread": 1.0}))
    print(json.dumps({"name": f"max |loss difference| Python vs C++, {label}", "value": diff, "unit": "abs", "spread": 1.0,
                      "equal_to_5_decimals": close5, "bit_identical": diff == 0.0, "batches": batches}))
    if not close5:
        first = int(np.argmax(np.abs(np.array(losses, dtype=np.float32) - cpp_losses) >= 1.5e-5))
        print(f"parity.py: {label}: batch {first}: Python loss {losses[first]!r}, C++ loss {float(cpp_losses[first])!r}",
              file=sys.stderr)
    return close5


def main():
    torch.set_num_threads(1)  # as trainer_bench
    root = pathlib.Path(sys.argv[1])
    folders = sorted(p.parent for p in root.glob("*/meta.json"))
    if not folders:
        raise SystemExit(f"parity.py: no runs under {root} (trainer_bench --parity-dir writes them)")
    ok = all([replay(folder) for folder in folders])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
