"""Writes torchvision's ResNets with their own random weights, and what they compute, for dettrial's
vision::models tests: the real networks' outputs that dettrial's must match.

  OUT/<arch>.pt       torch.save(model.state_dict()): torchvision's initialisation after
                      torch.manual_seed(0), every BatchNorm's weight, bias and running statistics
                      then drawn at random too (so evaluation mode is not the identity)
  OUT/<arch>.io.pt    {"input": 3 x 3 x 64 x 64 images, "eval": the logits in eval mode, "train": the
                      logits of one train-mode forward, "after.<name>": each BatchNorm buffer after it}
  OUT/<arch>.init.pt  (resnet18, resnet50 with zero_init_residual, resnext50_32x4d) the state dict
                      torchvision builds after torch.manual_seed(7), untouched
  OUT/<arch>.safetensors  (resnet18, resnet50, with PyPI's safetensors) the same state dict as <arch>.pt
                      through Hugging Face's writer, as timm and the Hub ship weights
  OUT/manifest.json   the architectures, torch's and torchvision's versions, or why torchvision is absent
Usage: torchvision_resnets.py OUT
"""
import json
import os
import sys

ARCHITECTURES = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "wide_resnet50_2"]
INITIALISED = {"resnet18": {}, "resnet50": {"zero_init_residual": True}, "resnext50_32x4d": {}}
NUM_CLASSES = 10
AS_SAFETENSORS = ["resnet18", "resnet50"]


def main(out):
    os.makedirs(out, exist_ok=True)
    try:
        import torch
        import torchvision
    except ImportError as missing:  # reported as skipped (77), with the reason
        with open(os.path.join(out, "manifest.json"), "w") as f:
            json.dump({"missing": f"this Python has no {missing.name}"}, f)
        print(f"skipped: this Python has no {missing.name}")
        return 77
    from torchvision import models

    try:
        from safetensors.torch import save_file
    except ImportError:
        save_file = None
    torch.set_num_threads(1)  # one thread: the same reduction order however many cores run the test
    for arch in ARCHITECTURES:
        torch.manual_seed(0)
        model = getattr(models, arch)(num_classes=NUM_CLASSES)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.BatchNorm2d):
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.normal_(0.0, 0.1)
                    module.running_mean.normal_(0.0, 0.1)
                    module.running_var.uniform_(0.5, 1.5)
                    module.num_batches_tracked.fill_(3)
        torch.save(model.state_dict(), os.path.join(out, f"{arch}.pt"))
        if save_file and arch in AS_SAFETENSORS:
            save_file(model.state_dict(), os.path.join(out, f"{arch}.safetensors"), metadata={"format": "pt"})
        images = torch.randn(3, 3, 64, 64)
        with torch.no_grad():
            evaluated = model.eval()(images)
            trained = model.train()(images)
        io = {"input": images, "eval": evaluated, "train": trained}
        for name, buffer in model.named_buffers():
            io["after." + name] = buffer
        torch.save(io, os.path.join(out, f"{arch}.io.pt"))
    for arch, options in INITIALISED.items():
        torch.manual_seed(7)
        torch.save(getattr(models, arch)(num_classes=NUM_CLASSES, **options).state_dict(), os.path.join(out, f"{arch}.init.pt"))
    manifest = {"architectures": ARCHITECTURES, "initialised": {a: o for a, o in INITIALISED.items()}, "num_classes": NUM_CLASSES,
                "torch": torch.__version__, "torchvision": torchvision.__version__,
                "safetensors": AS_SAFETENSORS if save_file else []}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    print(f"ok: {len(ARCHITECTURES)} ResNets written by torchvision {torchvision.__version__} (torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
