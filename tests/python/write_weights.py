"""Writes weights the way Python users and Determined write them, for dettrial::load_weights to read.

The network is the MNIST example's (the same layers, in the same order, as examples/mnist). In DIR:
- plain.pt: torch.save(net.state_dict());
- determined/state_dict.pth: a Determined PyTorchTrial checkpoint (models_state_dict, optimizers_state_dict, ...);
- wrapped.pt: {"model_state_dict": ..., "epoch": 3} with DistributedDataParallel's "module." names;
- backbone.pt: the network without its last layer plus an entry the network lacks (fine-tuning);
- wrong_shape.pt: the last layer with 5 outputs instead of 10;
- optimizer.pt: the optimizer's state dict (not a model's);
- io.pt: an input and the network's output on it (eval mode).
Exits 77 (CTest's skip) when this Python has no torch.
"""
import os
import sys

try:
    import torch
    from torch import nn
except ImportError:
    print("skipped: this Python has no torch")
    sys.exit(77)


def main(directory):
    os.makedirs(os.path.join(directory, "determined"), exist_ok=True)
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(10, 20, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(16 * 20, 50), nn.ReLU(), nn.Dropout(0.2),
        nn.Linear(50, 10), nn.LogSoftmax(1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    net(torch.randn(2, 1, 28, 28)).sum().backward()
    optimizer.step()  # momentum buffers in the optimizer's state
    state = net.state_dict()
    torch.save(state, os.path.join(directory, "plain.pt"))
    torch.save(optimizer.state_dict(), os.path.join(directory, "optimizer.pt"))
    torch.save({"models_state_dict": [state], "optimizers_state_dict": [optimizer.state_dict()],
                "lr_schedulers_state_dict": [], "callbacks": {},
                "rng_state": {"cpu_rng_state": torch.random.get_rng_state()}},
               os.path.join(directory, "determined", "state_dict.pth"))
    torch.save({"model_state_dict": {"module." + k: v for k, v in state.items()}, "epoch": 3},
               os.path.join(directory, "wrapped.pt"))
    backbone = {k: v for k, v in state.items() if not k.startswith("10.")}
    backbone["projection.weight"] = torch.zeros(3, 50)
    torch.save(backbone, os.path.join(directory, "backbone.pt"))
    wrong = dict(state)
    wrong["10.weight"] = torch.zeros(5, 50)
    torch.save(wrong, os.path.join(directory, "wrong_shape.pt"))

    net.eval()
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        torch.save({"input": x, "output": net(x)}, os.path.join(directory, "io.pt"))
    print("ok: wrote", directory, "with torch", torch.__version__)


if __name__ == "__main__":
    main(sys.argv[1])
