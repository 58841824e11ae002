#!/usr/bin/env bash
# Usage: imagenet_lr.sh PROGRAM CONFIG IMAGENET_FOLDER OUTPUT_DIR PYTHON
# The porting guide's trial trains with the guide's schedule: StepLR(optimizer, lr_step_epochs,
# gamma=0.1) stepped after every epoch, as PYTHON's torch computes it. Three epochs with a decay
# after each (lr_step_epochs 1): every training report's learning rate must be the one Python's
# StepLR holds after that many epochs, 0.02, then 0.002, then 0.0002 (LibTorch's own StepLR, one
# step late, would hold 0.02 through the second epoch).
set -u
program=$1 config=$2 folder=$3 out=$4 python=$5
rm -rf "$out"
mkdir -p "$out"
export DETTRIAL_IMAGE_FOLDER=$folder
"$program" --config "$config" --set "searcher.max_length={epochs: 3}" --set hyperparameters.lr_step_epochs=1 \
  --set data.crop=64 --set data.resize=73 --output "$out/run" >"$out/run.log" 2>&1 ||
  { cat "$out/run.log"; echo "imagenet_lr: the run failed"; exit 1; }
if grep -q "is LibTorch's torch::optim::StepLR" "$out/run.log"; then
  cat "$out/run.log"
  echo "imagenet_lr: the example wraps LibTorch's StepLR"
  exit 1
fi
"$python" - "$out/run/metrics.jsonl" <<'PY'
import json, sys
import torch

rows = [json.loads(line) for line in open(sys.argv[1])]
training = [r for r in rows if r["type"] == "training"]
assert training, "no training reports"
# The guide's schedule in Python: SGD at lr 0.02 (the test config's), StepLR(step_size=1, gamma=0.1)
# stepped once an epoch; the rate after e epochs.
optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.02, momentum=0.9, weight_decay=1e-4)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
python_lr = [optimizer.param_groups[0]["lr"]]
for _ in range(3):
    optimizer.step()
    scheduler.step()
    python_lr.append(optimizer.param_groups[0]["lr"])
seen = set()
for r in training:
    epochs = int(r["epochs"])
    lr = r["learning_rates"]["lr"]
    assert lr == python_lr[epochs], f"after {epochs} epoch(s), batch {r['batches']}: lr {lr}, Python's StepLR {python_lr[epochs]}"
    seen.add(epochs)
assert seen >= {1, 2, 3}, f"reports after epochs {sorted(seen)} only"
print(f"ok: the learning rates after 1, 2 and 3 epochs are Python's StepLR's ({python_lr[1]}, {python_lr[2]}, {python_lr[3]})")
PY
