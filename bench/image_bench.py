"""torchvision's side of bench/image_bench.cpp: ImageFolder with its transforms (PIL), through
torch.utils.data.DataLoader at num_workers 0, 1 and 2, one epoch of each folder; and PIL's bare
decode rate. Prints one JSON object per measurement.
Usage: image_bench.py --png DIR --jpeg DIR --imagenet DIR --case png|jpeg|decode|imagenet|imagenet-val|imagenet-decode
                      [--workers N] [--quick]"""
import argparse
import json
import os
import resource
import time

import torch
import torchvision
from PIL import Image
from torchvision import datasets, transforms


def peak_mib(workers):
    """The main process's peak plus, for each worker process, the largest worker's peak."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own + workers * child


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--png")
    p.add_argument("--jpeg")
    p.add_argument("--imagenet")
    p.add_argument("--case", default="png")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    limit = 20 if a.quick else None
    if a.case == "decode":
        cores = len(os.sched_getaffinity(0))
        for label, root, mode in (("PNG folder 28x28", a.png, "L"), ("JPEG folder 64x64", a.jpeg, "RGB")):
            files = [path for path, _ in datasets.ImageFolder(root).samples][: 500 if a.quick else 20000]
            start = time.perf_counter()
            for path in files:
                with open(path, "rb") as f:
                    Image.open(f).convert(mode).load()
            rate = len(files) / (time.perf_counter() - start)
            print(json.dumps({"name": f"image decode alone, {label}: PIL, one thread x {cores} cores", "value": rate * cores,
                              "unit": "images/s", "spread": 1.0, "one_thread": rate}))
        return
    if a.case == "imagenet-decode":
        cores = len(os.sched_getaffinity(0))
        files = [path for path, _ in datasets.ImageFolder(a.imagenet).samples][: 100 if a.quick else 2000]
        start = time.perf_counter()
        for path in files:
            with open(path, "rb") as f:
                Image.open(f).convert("RGB").load()
        rate = len(files) / (time.perf_counter() - start)
        print(json.dumps({"name": f"image decode alone, ImageNet-sized JPEGs: PIL, one thread x {cores} cores", "value": rate * cores,
                          "unit": "images/s", "spread": 1.0, "one_thread": rate}))
        return
    torch.set_num_threads(1)  # as torchvision's workers run; the main process only collates
    normalize = transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    if a.case == "png":
        root, label = a.png, "PNG folder 28x28"
        tf = transforms.Compose([transforms.RandomCrop(28, padding=4), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                                 transforms.Normalize((0.2860,), (0.3530,))])
        loader = lambda path: Image.open(path).convert("L")  # noqa: E731 - torchvision's pil_loader, in L
    elif a.case == "imagenet":  # the porting guide's training pipeline
        root, label = a.imagenet, "ImageNet-sized JPEGs, RandomResizedCrop(224)"
        tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize])
        loader = datasets.folder.default_loader
    elif a.case == "imagenet-val":  # and its validation pipeline
        root, label = a.imagenet, "ImageNet-sized JPEGs, Resize(256) CenterCrop(224)"
        tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), normalize])
        loader = datasets.folder.default_loader
    else:
        root, label = a.jpeg, "JPEG folder 64x64"
        tf = transforms.Compose([transforms.RandomResizedCrop(64), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                                 transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
        loader = datasets.folder.default_loader
    data = datasets.ImageFolder(root, transform=tf, loader=loader)
    torch.manual_seed(1)
    dl = torch.utils.data.DataLoader(data, batch_size=64, shuffle=a.case != "imagenet-val", num_workers=a.workers)
    start = time.perf_counter()
    images = 0
    for i, (x, _) in enumerate(dl):
        images += x.shape[0]
        if limit and i + 1 == limit:
            break
    rate = images / (time.perf_counter() - start)
    print(json.dumps({"name": f"image pipeline, {label}: torchvision (workers {a.workers})", "value": rate, "unit": "images/s",
                      "spread": 1.0, "peak_mib": peak_mib(a.workers), "workers": a.workers, "torchvision": torchvision.__version__}))


if __name__ == "__main__":
    main()
