#!/usr/bin/env bash
# Usage: imagenet_pretrained.sh PROGRAM CONFIG IMAGENET_FOLDER WEIGHTS OUTPUT_DIR
# The ImageNet example with `pretrained` naming a state dict Python saved from torchvision's
# ResNet-50 (tests/python/torchvision_resnets.py, 10 classes as the folder has): it loads strictly and
# trains from those weights, so its first loss is not the fresh network's (same seed, same batch).
set -u
program=$1 config=$2 folder=$3 weights=$4 out=$5
rm -rf "$out"
mkdir -p "$out"
export DETTRIAL_IMAGE_FOLDER=$folder
run() {
  local log=$1
  shift
  "$program" --config "$config" --test-mode --set hyperparameters.arch=resnet50 "$@" --output "$out/$log" >"$out/$log.log" 2>&1 ||
    { cat "$out/$log.log"; echo "imagenet_pretrained: '$log' failed"; exit 1; }
}
run fresh
run pretrained --set "hyperparameters.pretrained=$weights"
cat "$out/pretrained.log"
grep -q "=> using pre-trained model 'resnet50' from '$weights'" "$out/pretrained.log" || { echo "imagenet_pretrained: no pre-trained line"; exit 1; }
if grep -q "fc starts fresh" "$out/pretrained.log"; then echo "imagenet_pretrained: the classifier was not loaded"; exit 1; fi
python3 - "$out/fresh/metrics.jsonl" "$out/pretrained/metrics.jsonl" <<'PY'
import json, sys
def first_loss(path):
    rows = [json.loads(line) for line in open(path)]
    return next(r["metrics"]["loss"] for r in rows if r["type"] == "training")
fresh, pretrained = first_loss(sys.argv[1]), first_loss(sys.argv[2])
assert fresh != pretrained, (fresh, pretrained)
print(f"ok: warm-started from torchvision's ResNet-50: first loss {pretrained} against {fresh} from a fresh network")
PY
