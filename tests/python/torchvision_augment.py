"""Records what torchvision's augmentation computes, for dettrial's parity tests of its policies'
operations, magnitude tables, MixUp and CutMix: each case is torchvision's v2 functional (or batch
transform) on a fixed input with fixed parameters, so the draws, which are dettrial's own, play no
part.

  OUT/in/<name>.raw           the input images, H x W x C bytes
  OUT/op/<case>.raw           torchvision's output, H x W x C bytes
  OUT/mix/<case>.<part>.raw   MixUp's and CutMix's inputs and outputs (float32 or uint8, C order)
  OUT/manifest.json           the cases, the magnitude tables, the policies, versions
Usage: torchvision_augment.py OUT
"""
import json
import math
import os
import sys

try:
    import torch
    import torchvision
    from torchvision.transforms import v2
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F
except Exception as e:  # noqa: BLE001 - any failure to import means no torchvision here
    print(f"skipped: this Python cannot import torchvision's v2 transforms ({e})")
    sys.exit(77)


def pattern(height, width, channels, seed):
    """Gradients with noise and a few saturated pixels: every operation has something to do."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(height).view(-1, 1, 1)
    x = torch.arange(width).view(1, -1, 1)
    c = torch.arange(channels).view(1, 1, -1)
    base = (x * (3 + c) + y * (5 - c)) * 200 // (height + width) + torch.randint(0, 50, (height, width, channels), generator=g)
    image = (base % 256).to(torch.uint8)
    image[0, 0] = 255
    image[-1, -1] = 0
    return image  # H x W x C


def save(path, tensor):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(tensor.contiguous().numpy().tobytes())


def op_cases(images):
    """(case name, image name, op, magnitude, interpolation, fill, torchvision's output CHW)."""
    aa = v2.AutoAugment()
    cases = []
    fills = {"none": None, "one": [90.0], "each": [12.0, 200.0, 77.0]}
    for image_name, hwc in images.items():
        chw = hwc.permute(2, 0, 1).contiguous()
        h, w = hwc.shape[:2]
        for space_name, space, bins in (("aa", v2.RandAugment._AUGMENTATION_SPACE, 31), ("wide", v2.TrivialAugmentWide._AUGMENTATION_SPACE, 31)):
            for op, (magnitudes_fn, signed) in space.items():
                table = magnitudes_fn(bins, h, w)
                picks = [None] if table is None else [float(table[b]) for b in (0, 4, 9, 17, 30)]
                for magnitude in picks:
                    signs = [1.0, -1.0] if signed and magnitude else [1.0]
                    for sign in signs:
                        m = 0.0 if magnitude is None else magnitude * sign
                        geometric = op in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
                        for interpolation in (["nearest", "bilinear"] if geometric else ["nearest"]):
                            for fill_name in (list(fills) if geometric else ["none"]):
                                fill = fills[fill_name]
                                if fill_name == "each" and hwc.shape[2] != 3:
                                    continue
                                # The enum, not its name: torchvision 0.26 takes only InterpolationMode here.
                                out = aa._apply_image_or_video_transform(chw, op, m, interpolation=InterpolationMode(interpolation),
                                                                         fill=_fill_arg(fill))
                                name = f"{image_name}.{space_name}.{op}.{len(cases)}"
                                cases.append({"name": name, "image": image_name, "op": op, "magnitude": m,
                                              "interpolation": interpolation, "fill": fill or []})
                                save(f"{OUT}/op/{name}.raw", out.permute(1, 2, 0))
    return cases


def _fill_arg(fill):
    from torchvision.transforms.v2._utils import _setup_fill_arg
    return _setup_fill_arg(fill)


def rotate_cases(images):
    """The exact paths of rotate: half and quarter turns, on the square image and not."""
    cases = []
    for image_name, hwc in images.items():
        chw = hwc.permute(2, 0, 1).contiguous()
        for angle in (90.0, 180.0, 270.0, -90.0, 450.0, 33.5, -0.0):
            out = F.rotate(chw, angle)
            name = f"{image_name}.rotate.{len(cases)}"
            cases.append({"name": name, "image": image_name, "angle": angle})
            save(f"{OUT}/op/{name}.raw", out.permute(1, 2, 0))
    return cases


def mix_cases():
    """MixUp at a fixed lam, CutMix at a fixed lam and centre, on float and 8-bit batches."""
    cases = []
    g = torch.Generator().manual_seed(5)
    floats = torch.randn(5, 3, 7, 9, generator=g)
    bytes_ = torch.randint(0, 256, (5, 3, 7, 9), generator=g, dtype=torch.uint8)
    labels = torch.tensor([3, 0, 9, 3, 7])
    mixup = v2.MixUp(alpha=0.4, num_classes=10)
    cutmix = v2.CutMix(alpha=1.0, num_classes=10)
    for lam in (0.3, 0.8711):
        images, soft = mixup.transform(floats, {"lam": lam, "labels": labels, "batch_size": 5}), mixup.transform(
            labels, {"lam": lam, "labels": labels, "batch_size": 5})
        name = f"mixup.{len(cases)}"
        save(f"{OUT}/mix/{name}.in.raw", floats)
        save(f"{OUT}/mix/{name}.images.raw", images)
        save(f"{OUT}/mix/{name}.labels.raw", soft)
        cases.append({"name": name, "kind": "mixup", "lam": lam, "dtype": "float32", "shape": list(floats.shape), "labels": labels.tolist()})
    for lam, center_x, center_y, batch in ((0.3, 4, 2, floats), (0.65, 0, 6, bytes_), (0.05, 8, 0, floats)):
        h, w = batch.shape[-2:]
        # torchvision's make_params, with the draws given: its formula, line for line.
        r = 0.5 * math.sqrt(1.0 - lam)
        r_w_half, r_h_half = int(r * w), int(r * h)
        x1 = int(torch.clamp(torch.tensor([center_x]) - r_w_half, min=0))
        y1 = int(torch.clamp(torch.tensor([center_y]) - r_h_half, min=0))
        x2 = int(torch.clamp(torch.tensor([center_x]) + r_w_half, max=w))
        y2 = int(torch.clamp(torch.tensor([center_y]) + r_h_half, max=h))
        lam_adjusted = float(1.0 - (x2 - x1) * (y2 - y1) / (w * h))
        params = {"box": (x1, y1, x2, y2), "lam_adjusted": lam_adjusted, "labels": labels, "batch_size": 5}
        images, soft = cutmix.transform(batch, params), cutmix.transform(labels, params)
        name = f"cutmix.{len(cases)}"
        save(f"{OUT}/mix/{name}.in.raw", batch)
        save(f"{OUT}/mix/{name}.images.raw", images)
        save(f"{OUT}/mix/{name}.labels.raw", soft)
        cases.append({"name": name, "kind": "cutmix", "lam": lam, "center": [center_x, center_y], "box": [x1, y1, x2, y2],
                      "dtype": "float32" if batch.is_floating_point() else "uint8", "shape": list(batch.shape),
                      "labels": labels.tolist()})
    return cases


def tables():
    """Every magnitude of both spaces for 10 and 31 bins on a 29 x 37 image, and the policies."""
    out = {}
    for space_name, space in (("aa", v2.RandAugment._AUGMENTATION_SPACE), ("wide", v2.TrivialAugmentWide._AUGMENTATION_SPACE)):
        for op, (magnitudes_fn, signed) in space.items():
            for bins in (10, 31):
                table = magnitudes_fn(bins, 29, 37)
                out[f"{space_name}.{op}.{bins}"] = {"signed": signed, "values": None if table is None else [float(v) for v in table]}
    policies = {}
    for policy in (v2.AutoAugmentPolicy.IMAGENET, v2.AutoAugmentPolicy.CIFAR10, v2.AutoAugmentPolicy.SVHN):
        policies[policy.value] = [[[op, p, -1 if b is None else b] for op, p, b in pair] for pair in v2.AutoAugment(policy)._policies]
    ops = {"ra": list(v2.RandAugment._AUGMENTATION_SPACE), "ta_wide": list(v2.TrivialAugmentWide._AUGMENTATION_SPACE)}
    return out, policies, ops


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    OUT = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    images = {"rgb": pattern(29, 37, 3, 1), "gray": pattern(23, 31, 1, 2), "square": pattern(24, 24, 3, 3)}
    for name, hwc in images.items():
        save(f"{OUT}/in/{name}.raw", hwc)
    magnitude_tables, policies, op_orders = tables()
    manifest = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "images": {name: list(hwc.shape) for name, hwc in images.items()},
        "ops": op_cases(images),
        "rotations": rotate_cases(images),
        "mix": mix_cases(),
        "tables": magnitude_tables,
        "policies": policies,
        "op_orders": op_orders,
    }
    with open(f"{OUT}/manifest.json", "w") as f:
        json.dump(manifest, f)
    print(f"ok: {len(manifest['ops'])} operation cases, {len(manifest['mix'])} mixing cases, torchvision {torchvision.__version__}")
