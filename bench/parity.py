"""Replays trainer_bench's MLP run in Python PyTorch: the same data, batch order and initial weights,
SGD with momentum; compares the per-batch losses with the C++ ones (to 5 decimals, as numpy.testing.assert_almost_equal) and the time.
Usage: parity.py DIR [--quick]. Prints one JSON object per measurement; exits 1 when a loss differs."""
import json
import pathlib
import sys
import time

import numpy as np
import torch


def load(path, dtype, shape):
    return torch.from_numpy(np.fromfile(path, dtype=dtype).reshape(shape))


def main():
    folder = pathlib.Path(sys.argv[1])
    meta = json.loads((folder / "meta.json").read_text())
    batches, bs, n, features = meta["batches"], meta["batch_size"], meta["records"], meta["features"]
    torch.set_num_threads(1)
    x = load(folder / "x.f32", np.float32, (n, features))
    y = load(folder / "y.i64", np.int64, (n,))
    order = load(folder / "order.i64", np.int64, (batches, bs))
    cpp_losses = np.fromfile(folder / "losses.f32", dtype=np.float32)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(load(folder / f"param{i}.f32", np.float32, tuple(p.shape)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    start = time.perf_counter()
    total = torch.zeros((), dtype=torch.float64)
    for b in range(batches):
        idx = order[b]
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            total += loss
        losses.append(loss.item())
    seconds = (time.perf_counter() - start) / batches
    diff = float(np.max(np.abs(np.array(losses, dtype=np.float32) - cpp_losses)))
    # "Equal to 5 decimals" as numpy's assert_almost_equal(decimal=5) and Lightning's parity tests mean it.
    close5 = diff < 1.5e-5
    print(json.dumps({"name": "Python PyTorch, same MLP run", "value": seconds, "unit": "s/batch", "spread": 1.0,
                      "torch": torch.__version__}))
    print(json.dumps({"name": "Python / dettrial Trainer, MLP time per batch", "value": seconds / meta["cpp_seconds_per_batch"],
                      "unit": "ratio", "spread": 1.0}))
    print(json.dumps({"name": "max |loss difference| Python vs C++, MLP", "value": diff, "unit": "abs", "spread": 1.0,
                      "equal_to_5_decimals": close5, "bit_identical": diff == 0.0, "batches": batches}))
    return 0 if close5 else 1


if __name__ == "__main__":
    sys.exit(main())
