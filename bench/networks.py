"""The networks of bench/trainer_bench.cpp written in Python PyTorch, layer for layer, so that the
parameters come in the same order as LibTorch's `parameters()`."""
from torch import nn


def mlp():
    """MlpTrial's model: 32 -> 64 -> 10."""
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def mnist(n_filters1=40, n_filters2=40, dropout=0.3):
    """examples/mnist's network (the seed tutorial's): two 5x5 convolutions with pooling, a 50-unit
    hidden layer with dropout, log-softmax over 10 classes."""
    return nn.Sequential(nn.Conv2d(1, n_filters1, 5), nn.MaxPool2d(2), nn.ReLU(),
                         nn.Conv2d(n_filters1, n_filters2, 5), nn.MaxPool2d(2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(16 * n_filters2, 50), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(50, 10), nn.LogSoftmax(dim=1))
