#!/usr/bin/env bash
# Usage: image_resume.sh PROGRAM CONFIG IMAGE_FOLDERS OUTPUT_DIR [--set KEY=VALUE]...
# The image example through dettrial::main on real image files: 12 batches straight, and the same 12
# as 6, a stop mid-epoch (a checkpoint) and --resume. The resumed run's training and validation
# metrics after batch 6 must equal the straight run's digit for digit: the weights, the optimizer,
# the data order and every record's augmentation come back exactly.
set -u
program=$1 config=$2 folders=$3 out=$4
shift 4  # what remains: --set options every run gets
rm -rf "$out"
mkdir -p "$out"
export DETTRIAL_IMAGE_FOLDER=$folders
run() {
  local log=$1
  shift
  "$program" "$@" "${extra[@]}" >"$out/$log.log" 2>&1 || { cat "$out/$log.log"; echo "image_resume: '$log' failed"; exit 1; }
}
extra=("$@")
run straight --config "$config" --set searcher.max_length.batches=12 --output "$out/straight"
run first --config "$config" --set searcher.max_length.batches=6 --output "$out/resumed"
run second --config "$config" --set searcher.max_length.batches=12 --resume "$out/resumed"
cat "$out/second.log"
grep -q "resumed from .* at batch 6" "$out/second.log" || { echo "image_resume: did not resume at batch 6"; exit 1; }
grep -q "training data: .* read by [0-9]* worker thread" "$out/straight.log" || { cat "$out/straight.log"; echo "image_resume: no data line"; exit 1; }
python3 - "$out/straight/metrics.jsonl" "$out/resumed/metrics.jsonl" <<'PY'
import json, sys
def after(path):
    rows = [json.loads(line) for line in open(path)]
    return {(r["type"], r["batches"]): r["metrics"] for r in rows if r["batches"] > 6 and r["type"] in ("training", "validation")}
straight, resumed = after(sys.argv[1]), after(sys.argv[2])
assert straight, "no records after batch 6"
assert straight.keys() == resumed.keys(), (sorted(straight), sorted(resumed))
for key in sorted(straight):
    assert straight[key] == resumed[key], (key, straight[key], resumed[key])
print(f"image_resume: {len(straight)} records after batch 6 equal, digit for digit: {sorted(straight)}")
PY
