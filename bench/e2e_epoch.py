"""One epoch of the MNIST example written in Python, end to end, as trainer_bench --epoch runs it in
C++: read Fashion-MNIST's IDX files, normalise with the training images' mean and spread, train the
seed network (40/40 filters, dropout 0.3, SGD lr 0.03 momentum 0.9, batch 64, shuffled) for one epoch
with torch.utils.data.DataLoader, validate on the 10,000 test images in batches of 500.
Prints one JSON object: wall seconds and the accuracy reached."""
import gzip
import json
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def main():
    torch.manual_seed(17)
    start = time.perf_counter()
    train_x = torch.from_numpy(read_idx(f"{DIR}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    train_y = torch.from_numpy(read_idx(f"{DIR}/train-labels-idx1-ubyte.gz").astype(np.int64))
    test_x = torch.from_numpy(read_idx(f"{DIR}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    test_y = torch.from_numpy(read_idx(f"{DIR}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    mean, std = train_x.mean().item(), train_x.std().item()
    train_x = ((train_x - mean) / std).unsqueeze(1).contiguous()
    test_x = ((test_x - mean) / std).unsqueeze(1).contiguous()
    model = nn.Sequential(nn.Conv2d(1, 40, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(40, 40, 5), nn.MaxPool2d(2), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 40, 50), nn.ReLU(), nn.Dropout(0.3), nn.Linear(50, 10),
                          nn.LogSoftmax(dim=1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    train = DataLoader(TensorDataset(train_x, train_y), batch_size=64, shuffle=True)
    test = DataLoader(TensorDataset(test_x, test_y), batch_size=500)
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
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in test:
            correct += (model(x).argmax(1) == y).sum().item()
    seconds = time.perf_counter() - start
    print(json.dumps({"name": "MNIST example, one Fashion-MNIST epoch end to end: Python", "value": seconds, "unit": "s",
                      "spread": 1.0, "accuracy": correct / len(test_y), "torch": torch.__version__}))


if __name__ == "__main__":
    sys.exit(main())
