"""One epoch of the MNIST example written in Python, end to end, as trainer_bench --epoch runs it in
C++: read Fashion-MNIST's IDX files, normalise with the training images' mean and spread, train the
seed network (40/40 filters, dropout 0.3, SGD lr 0.03 momentum 0.9, batch 64, shuffled) for one epoch
with torch.utils.data.DataLoader (or --batches N), validate on the 10,000 test images in batches of 500.
Prints one JSON object: wall seconds and the accuracy reached."""
import argparse
import gzip
import json
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import networks

DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(bytearray(data), dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=0, help="train this many batches instead of one epoch")
    parser.add_argument("--trace", help="write the training phase under torch's profiler as a Chrome trace")
    args = parser.parse_args()
    torch.manual_seed(17)
    start = time.perf_counter()
    # The same tensor operations as the C++ trial's loading (numpy's astype and division into new
    # arrays took 1.2 s more here).
    train_x = torch.from_numpy(read_idx(f"{DIR}/train-images-idx3-ubyte.gz")).to(torch.float32).div_(255.0)
    train_y = torch.from_numpy(read_idx(f"{DIR}/train-labels-idx1-ubyte.gz")).to(torch.int64)
    test_x = torch.from_numpy(read_idx(f"{DIR}/t10k-images-idx3-ubyte.gz")).to(torch.float32).div_(255.0)
    test_y = torch.from_numpy(read_idx(f"{DIR}/t10k-labels-idx1-ubyte.gz")).to(torch.int64)
    mean, std = train_x.mean().item(), train_x.std().item()
    train_x = train_x.sub(mean).div_(std).unsqueeze(1).contiguous()
    test_x = test_x.sub_(mean).div_(std).unsqueeze(1).contiguous()
    model = networks.mnist(40, 40, 0.3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    train = DataLoader(TensorDataset(train_x, train_y), batch_size=64, shuffle=True)
    test = DataLoader(TensorDataset(test_x, test_y), batch_size=500)
    loaded = time.perf_counter()
    profiler = torch.autograd.profiler.profile() if args.trace else None
    if profiler:
        profiler.__enter__()
    model.train()
    total = torch.zeros((), dtype=torch.float64)
    for b, (x, y) in enumerate(train):
        output = model(x)
        loss = nn.functional.nll_loss(output, y)
        error = 1.0 - (output.argmax(1) == y).float().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            total += loss + error
        if (b + 1) % 100 == 0:
            total.item()
        if b + 1 == args.batches:
            break
    if profiler:
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(args.trace)
    trained = time.perf_counter()
    model.eval()
    # The trial's validation metrics: loss, error and accuracy per batch, averaged over the batches.
    sums = torch.zeros(3, dtype=torch.float64)
    batches = 0
    with torch.no_grad():
        for x, y in test:
            output = model(x)
            error = 1.0 - (output.argmax(1) == y).float().mean()
            sums += torch.stack([nn.functional.nll_loss(output, y), error, 1.0 - error]).double()
            batches += 1
    _validation_loss, _validation_error, accuracy = (sums / batches).tolist()
    seconds = time.perf_counter() - start
    what = f"{args.batches} batches" if args.batches else "one Fashion-MNIST epoch"
    print(json.dumps({"name": f"MNIST example, {what} end to end: Python", "value": seconds, "unit": "s",
                      "spread": 1.0, "accuracy": round(accuracy, 4), "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "phases": f"load {loaded - start:.2f} s, train {trained - loaded:.2f} s, validate {start + seconds - trained:.2f} s"}))


if __name__ == "__main__":
    sys.exit(main())
