"""Python's torch.utils.data.DataLoader on the same data as data_loader_bench.cpp: 60,000 x 1 x 28 x 28
floats, batch 64, shuffled, one epoch; over a TensorDataset and over a per-example Dataset.
Prints one JSON object per measurement."""
import json
import statistics
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class PerExample(Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def epoch(loader):
    start = time.perf_counter()
    n = 0
    for x, _ in loader:
        n += x.shape[0] > 0
    return n / (time.perf_counter() - start)


def main():
    quick = "--quick" in sys.argv
    torch.manual_seed(0)
    torch.set_num_threads(torch.get_num_threads())
    images = torch.rand(60000, 1, 28, 28)
    labels = torch.randint(0, 10, (60000,))
    loaders = {
        "torch.utils.data.DataLoader, TensorDataset (workers 0)": DataLoader(TensorDataset(images, labels), batch_size=64, shuffle=True),
        "torch.utils.data.DataLoader, per-example Dataset (workers 0)": DataLoader(PerExample(images, labels), batch_size=64, shuffle=True),
    }
    results = {name: [] for name in loaders}
    for _ in range(1 if quick else 5):
        for name, loader in loaders.items():
            results[name].append(epoch(loader))
    for name, values in results.items():
        print(json.dumps({"name": name, "value": statistics.median(values), "unit": "batches/s",
                          "spread": max(values) / min(values), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
