#!/usr/bin/env bash
# Usage: imagenet_seed_config.sh PROGRAM SEED_CONFIG IMAGENET_FOLDER RESNET18_WEIGHTS OUTPUT_DIR
# The porting guide's own const.yaml (SEED_CONFIG: its text, verbatim) runs with the ImageNet
# example in test mode. Only the data's place is given on the command line (the guide's
# hyperparameters.data is /mnt/data, ImageNet's root with train/ and val/ below it; here the
# ImageNet-shaped folder). pretrained: True takes torchvision's ImageNet weights from torch.hub's
# cache ($TORCH_HOME/hub/checkpoints/resnet18-f37072fd.pth: here a state dict torchvision wrote);
# records_per_epoch is not used, as Determined's PyTorchTrial ignores it, and a line says so;
# smaller_is_better: false on val_loss gets a warning naming the metric. Without the weights in the
# cache, pretrained: True is refused in one sentence saying how to put them there (status 78).
set -u
program=$1 config=$2 folder=$3 weights=$4 out=$5
rm -rf "$out"
mkdir -p "$out/torch-home/hub/checkpoints" "$out/empty-torch-home"
cp "$weights" "$out/torch-home/hub/checkpoints/resnet18-f37072fd.pth"
fail() { cat "$out/$1.log"; echo "imagenet_seed_config: $2"; exit 1; }

TORCH_HOME=$out/torch-home "$program" --config "$config" --test-mode --set "hyperparameters.data=$folder" --output "$out/run" \
  >"$out/run.log" 2>&1 || fail run "the seed's const.yaml did not run"
grep -q "=> using pre-trained model 'resnet18' from '$out/torch-home/hub/checkpoints/resnet18-f37072fd.pth'" "$out/run.log" ||
  fail run "pretrained: True did not load torchvision's cached weights"
if grep -q "fc starts fresh" "$out/run.log"; then fail run "the weights' classifier was not loaded"; fi
grep -q "records_per_epoch 60000 is not used: an epoch is the training data loader's" "$out/run.log" ||
  fail run "no line says records_per_epoch is not used"
grep -q "warning: searcher.smaller_is_better is false for 'val_loss'" "$out/run.log" || fail run "no warning for smaller_is_better: false on val_loss"
grep -q '"type":"validation"' "$out/run/metrics.jsonl" || fail run "no validation"

TORCH_HOME=$out/empty-torch-home "$program" --config "$config" --test-mode --set "hyperparameters.data=$folder" --output "$out/no-weights" \
  >"$out/no-weights.log" 2>&1
status=$?
[ "$status" -eq 78 ] || fail no-weights "without the cached weights: exit status $status, expected 78"
grep -q "hyperparameters.pretrained is true, but torchvision's ImageNet weights for resnet18 are not in $out/empty-torch-home/hub/checkpoints/resnet18-f37072fd.pth" \
  "$out/no-weights.log" || fail no-weights "no sentence naming where the weights must be"
echo "ok: the guide's const.yaml ran as written (pretrained from torch.hub's cache, records_per_epoch not used, smaller_is_better warned)"
