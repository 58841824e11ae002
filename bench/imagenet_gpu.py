"""The ImageNet example's training in PyTorch on a GPU, fed by torchvision's DataLoader (bench/imagenet-gpu):
the porting guide's step (torchvision's ResNet-18, RandomResizedCrop(224), RandomHorizontalFlip, ToTensor,
Normalize; ImageFolder; DataLoader(num_workers=N, pin_memory=True, shuffle); SGD 0.1, momentum 0.9,
weight decay 1e-4; fp32, cuDNN's defaults), as examples/imagenet trains it.
  imagenet_gpu.py --train DIR --workers N [--batches 45] [--warmup 5] [--batch-size 256]
  imagenet_gpu.py --synthetic [--batches 45]         the GPU alone: one batch made on the GPU, replayed
  imagenet_gpu.py --make-images DIR COUNT [--jobs J]  ImageNet-sized JPEGs (bench/imagenet_jpegs.py's
                                                       pictures, one seed per image, J processes)
Prints one JSON line: images/s from the end of the warm-up batches to the end of the last, the GPU
synchronized at both ends, and the seconds the loop waited for the loader."""
import argparse
import json
import os
import sys
import time


def make_images(out, count, jobs):
    """Writes COUNT JPEGs into ten class folders of OUT (and 5% more under OUT/val), in parallel."""
    import multiprocessing

    done = os.path.join(out, "complete")
    if os.path.exists(done):
        return
    with multiprocessing.Pool(jobs) as pool:
        pool.map(_write_image, [(out, i, count) for i in range(count + count // 20)], chunksize=8)
    open(done, "w").close()


def _write_image(job):
    import numpy as np
    from PIL import Image

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from imagenet_jpegs import picture

    out, i, count = job
    rng = np.random.default_rng([2009, i])
    split = "train" if i < count else "val"
    folder = os.path.join(out, split, f"n{i % 10:08d}")
    os.makedirs(folder, exist_ok=True)
    height, width = (int(v) for v in rng.integers(333, 501, 2))
    Image.fromarray(picture(rng, height, width), "RGB").save(os.path.join(folder, f"image_{i:06d}.JPEG"), quality=90)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batches", type=int, default=45)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--make-images", nargs=2, metavar=("DIR", "COUNT"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    args = parser.parse_args()
    if args.make_images:
        make_images(args.make_images[0], int(args.make_images[1]), args.jobs)
        print(args.make_images[0])
        return

    import torch
    import torchvision
    from torchvision import transforms

    if not torch.cuda.is_available():
        sys.exit("imagenet_gpu.py: torch sees no CUDA device")
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10 if not args.synthetic else 1000).to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    criterion = torch.nn.CrossEntropyLoss()

    def step(images, target):
        loss = criterion(model(images), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    if args.synthetic:
        images = torch.randn(args.batch_size, 3, 224, 224, device=device)
        target = torch.randint(0, 1000, (args.batch_size,), device=device)
        batches = iter(lambda: (images, target), None)
        name = "Python ResNet-18 fp32, data made on the GPU (the GPU alone)"
    else:
        normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
        dataset = torchvision.datasets.ImageFolder(
            args.train,
            transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]),
        )
        loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                             pin_memory=True, persistent_workers=args.workers > 0, drop_last=False)

        def forever():
            while True:
                for images, target in loader:
                    yield images.to(device, non_blocking=True), target.to(device, non_blocking=True)

        batches = forever()
        name = f"Python ResNet-18 fp32, torchvision DataLoader, {args.workers} workers"

    model.train()
    waited = 0.0
    for i in range(args.batches):
        if i == args.warmup:
            torch.cuda.synchronize()
            start = time.perf_counter()
            samples = 0
            waited = 0.0
        before = time.perf_counter()
        images, target = next(batches)
        waited += time.perf_counter() - before
        step(images, target)
        if i >= args.warmup:
            samples += images.size(0)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(json.dumps({"name": name, "value": samples / seconds, "data_wait_s": waited, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
