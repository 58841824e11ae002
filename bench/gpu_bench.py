"""Python's side of bench/gpu: the same runs as gpu_bench.cpp, in PyTorch, one JSON line each.

- The MNIST example's network on Fashion-MNIST (batch 64, SGD 0.03 momentum 0.9): eager with
  torch.utils.data.DataLoader (pinned, non-blocking copies); eager with the data kept on the GPU;
  forward + backward + optimizer.step() captured once in a torch.cuda.CUDAGraph and replayed, data on
  the GPU (the hand-written bar); optionally torch.compile(mode="reduce-overhead") (--compile).
- The same hand-written graph with fp16 autocast and a gradient scaler in it (the check for infs and
  fused SGD's unscale and skip captured, the scale's update after each replay): the bar for
  dettrial's graphed fp16 run.
- The ResNet-style convnet of gpu_bench.cpp (batch 256, synthetic images on the GPU), fp32, bf16
  autocast, and fp16 autocast with a GradScaler.
Each rate is timed from the start of the first epoch to the end of the last, the GPU synchronized at
both ends. Without a GPU it says so and exits 77 (skipped).
    python bench/gpu_bench.py [--data DIR] [--epochs N] [--quick] [--compile] [--only TEXT]
--only runs just the runs whose name holds TEXT (and says which it left out).
"""
import argparse
import gzip
import json
import pathlib
import sys
import time

import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from networks import mnist  # noqa: E402


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def fashion(directory):
    images = idx(pathlib.Path(directory) / "train-images-idx3-ubyte.gz").float().div_(255)
    labels = idx(pathlib.Path(directory) / "train-labels-idx1-ubyte.gz").long()
    images = images.sub_(images.mean()).div_(images.std()).unsqueeze(1).contiguous()
    return images, labels


def report(name, records, seconds, epochs, note=""):
    print(json.dumps({"name": name, "value": round(records / seconds, 1), "unit": "samples/s",
                      "seconds": round(seconds, 3), "epochs": epochs, "note": note}), flush=True)


def batches_of(n, batch, quick, drop_last=False):
    count = (n // batch) if drop_last else -(-n // batch)
    return min(count, 40) if quick else count


def mnist_eager_loader(images, labels, args):
    model = mnist(40, 40, 0.5).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=64, shuffle=True,
                                         pin_memory=True)
    torch.cuda.synchronize()
    start, records = time.perf_counter(), 0
    for _ in range(args.epochs):
        for i, (x, y) in enumerate(loader):
            if args.quick and i == 40:
                break
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = nn.functional.nll_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            records += x.shape[0]
    torch.cuda.synchronize()
    report("Python eager, torch DataLoader (pinned)", records, time.perf_counter() - start, args.epochs)


def mnist_on_gpu(images, labels, args, graph=False, compiled=False):
    images, labels = images.cuda(), labels.cuda()
    model = mnist(40, 40, 0.5).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)
    n, batch = images.shape[0], 64
    step_model = torch.compile(model, mode="reduce-overhead") if compiled else model

    def step(x, y):
        loss = nn.functional.nll_loss(step_model(x), y)
        loss.backward()
        opt.step()
        return loss

    torch.cuda.synchronize()
    start, records = time.perf_counter(), 0
    static_x = static_y = static_loss = g = None
    for epoch in range(args.epochs):
        order = torch.randperm(n, device="cuda")
        # The graph replays full batches; the last, partial one (a graph has fixed shapes) is dropped.
        count = batches_of(n, batch, args.quick, drop_last=graph)
        for i in range(count):
            index = order[i * batch:(i + 1) * batch]
            x, y = images.index_select(0, index), labels.index_select(0, index)
            if not graph:
                opt.zero_grad(set_to_none=True)
                step(x, y)
            elif g is None and epoch == 0 and i < 3:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    opt.zero_grad(set_to_none=True)
                    step(x, y)
                torch.cuda.current_stream().wait_stream(side)
            elif g is None:
                static_x, static_y = x.clone(), y.clone()
                g = torch.cuda.CUDAGraph()
                opt.zero_grad(set_to_none=True)
                with torch.cuda.graph(g):
                    static_loss = step(static_x, static_y)
                g.replay()
            else:
                static_x.copy_(x)
                static_y.copy_(y)
                g.replay()
            records += x.shape[0]
    torch.cuda.synchronize()
    name = ("Python, whole step in a hand-written CUDA graph, data on the GPU" if graph else
            "Python torch.compile(reduce-overhead), data on the GPU" if compiled else "Python eager, data on the GPU")
    report(name, records, time.perf_counter() - start, args.epochs, "full batches only" if graph else "")


def mnist_graph_fp16(images, labels, args):
    """The hand-written graph of mnist_on_gpu in fp16: what torch.amp.GradScaler does for a fused
    optimizer (check the gradients for infs, hand the scale and the flag to the fused step, which
    unscales and skips on the GPU), captured; the scale's update runs after each replay."""
    images, labels = images.cuda(), labels.cuda()
    model = mnist(40, 40, 0.5).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, fused=True)
    params = list(model.parameters())
    scale = torch.full((), 65536.0, device="cuda")
    tracker = torch.zeros((), dtype=torch.int32, device="cuda")
    found_inf = torch.zeros((), device="cuda")
    one = torch.ones((), device="cuda")
    n, batch = images.shape[0], 64

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            loss = nn.functional.nll_loss(model(x), y)
        (loss.float() * scale).backward()
        found_inf.zero_()
        torch._amp_foreach_non_finite_check_and_unscale_([p.grad for p in params], found_inf, one)
        opt.grad_scale, opt.found_inf = scale, found_inf
        opt.step()
        return loss

    def update():
        torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)

    torch.cuda.synchronize()
    start, records = time.perf_counter(), 0
    static_x = static_y = g = None
    for epoch in range(args.epochs):
        order = torch.randperm(n, device="cuda")
        for i in range(batches_of(n, batch, args.quick, drop_last=True)):
            index = order[i * batch:(i + 1) * batch]
            x, y = images.index_select(0, index), labels.index_select(0, index)
            if g is None and epoch == 0 and i < 3:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    opt.zero_grad(set_to_none=True)
                    step(x, y)
                    update()
                torch.cuda.current_stream().wait_stream(side)
            elif g is None:
                static_x, static_y = x.clone(), y.clone()
                g = torch.cuda.CUDAGraph()
                opt.zero_grad(set_to_none=True)
                with torch.cuda.graph(g):
                    step(static_x, static_y)
                g.replay()
                update()
            else:
                static_x.copy_(x)
                static_y.copy_(y)
                g.replay()
                update()
            records += x.shape[0]
    torch.cuda.synchronize()
    report("Python, hand-written CUDA graph, fp16 with its scaler in the graph, data on the GPU", records,
           time.perf_counter() - start, args.epochs, f"full batches only; final scale {scale.item():g}")


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (self.shortcut(x) if self.shortcut is not None else x))


def small_resnet():
    layers = [nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    cin = 64
    for cout in (64, 128, 256):
        for b in range(2):
            layers.append(Block(cin, cout, 2 if b == 0 and cout != 64 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10)]
    return nn.Sequential(*layers)


def resnet(args, precision):
    n, batch = 10240, 256
    images = torch.randn(n, 3, 32, 32, device="cuda")
    labels = torch.randint(0, 10, (n,), device="cuda")
    model = small_resnet().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, fused=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")  # fused SGD skips on the device
    torch.cuda.synchronize()
    start, records = time.perf_counter(), 0
    for _ in range(args.epochs):
        order = torch.randperm(n, device="cuda")
        for i in range(batches_of(n, batch, args.quick, drop_last=True)):
            index = order[i * batch:(i + 1) * batch]
            x, y = images.index_select(0, index), labels.index_select(0, index)
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            records += batch
    torch.cuda.synchronize()
    name = {"bf16": "bf16 autocast", "fp16": "fp16 autocast and scaler"}.get(precision, "fp32")
    report(f"Python ResNet-style convnet, batch 256, {name}", records,
           time.perf_counter() - start, args.epochs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--only", default="", help="run just the runs whose name holds this text")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: gpu_bench.py needs a CUDA device (torch.cuda.is_available() is False)")
        return 77
    torch.manual_seed(0)
    runs = [("Python eager, torch DataLoader (pinned)", lambda d: mnist_eager_loader(*d, args)),
            ("Python eager, data on the GPU", lambda d: mnist_on_gpu(*d, args))]
    if args.compile:
        runs.append(("Python torch.compile(reduce-overhead), data on the GPU",
                     lambda d: mnist_on_gpu(*d, args, compiled=True)))
    runs += [("Python, whole step in a hand-written CUDA graph, data on the GPU",
              lambda d: mnist_on_gpu(*d, args, graph=True)),
             ("Python, hand-written CUDA graph, fp16 with its scaler in the graph, data on the GPU",
              lambda d: mnist_graph_fp16(*d, args))]
    for precision, name in (("fp32", "fp32"), ("bf16", "bf16 autocast"), ("fp16", "fp16 autocast and scaler")):
        runs.append((f"Python ResNet-style convnet, batch 256, {name}", lambda d, p=precision: resnet(args, p)))
    data, failed = None, 0
    for name, body in runs:
        if args.only not in name:
            print(f"left out (--only {args.only}): {name}")
            continue
        if data is None and "convnet" not in name:
            data = fashion(args.data)
        try:
            body(data)
        except Exception as e:  # one run's failure is reported, and the others still run
            print(f"failed: {name}: {type(e).__name__}: {e}", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
