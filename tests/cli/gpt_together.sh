#!/usr/bin/env bash
# Usage: gpt_together.sh GPT DATA OUT CONFIG
# The GPT example's features together, through dettrial::main on the suite's slice of Shakespeare
# (CONFIG, cpu.yaml, shortened; a report every 5 batches): a run stopped at batch 20 and resumed
# with --resume reaches batch 40 with the uninterrupted run's training and validation losses, bit
# for bit (the data position, AdamW's state, the cosine schedule, the clip); and 2 Gloo ranks with
# ZeRO-1 train as 2 ranks without it, bit for bit.
# Exits 77 (skipped) without the slice.
set -uo pipefail
gpt=$1 data=$2 out=$3 config=$4
[ -f "$data/train.bin" ] || { echo "skipped: no corpus slice in $data (scripts/gpt-data)"; exit 77; }
rm -rf "$out"
mkdir -p "$out"
short=(--set "data.dir=$data" --set min_validation_period.batches=20 --set min_checkpoint_period.batches=20
       --set data.eval_iters=2 --set data.sample_tokens=8 --set scheduling_unit=5)
run() {  # NAME ARGS...: one run, its output in $out/NAME
  local name=$1
  shift
  "$gpt" "$@" --output "$out/$name" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; echo "gpt_together: the $name run failed"; exit 1; }
}
# Each record's batches, type and metrics (the timings left out: they differ run to run).
losses() {
  python3 - "$1" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["type"] in ("training", "validation"):
        print(r["type"], r["batches"], json.dumps(r["metrics"], sort_keys=True))
PY
}
same() {  # WHAT A B: the two runs' records must be equal
  if ! diff <(losses "$out/$2/metrics.jsonl") <(losses "$out/$3/metrics.jsonl"); then
    echo "gpt_together: $1: the runs differ (above)"
    exit 1
  fi
  echo "ok: $1 ($(losses "$out/$2/metrics.jsonl" | wc -l) records the same)"
}

run whole --config "$config" "${short[@]}" --set searcher.max_length.batches=40
run part --config "$config" "${short[@]}" --set searcher.max_length.batches=20
run part --resume "$out/part" --set searcher.max_length.batches=40
grep -q "resumed from .* at batch 20" "$out/part.log" || { cat "$out/part.log"; echo "gpt_together: --resume did not resume at batch 20"; exit 1; }
grep -q '"type":"validation","batches":40' "$out/part/metrics.jsonl" || { echo "gpt_together: the resumed run did not reach batch 40"; exit 1; }
same "stopped at 20 and resumed to 40, as uninterrupted" whole part

run ranks --config "$config" "${short[@]}" --set searcher.max_length.batches=20 --nproc 2
run zero --config "$config" "${short[@]}" --set searcher.max_length.batches=20 --set optimizations.zero_stage=1 --nproc 2
grep -q "ZeRO stage 1: each of the 2 ranks" "$out/zero.log" || { cat "$out/zero.log"; echo "gpt_together: the ZeRO run did not shard"; exit 1; }
same "2 ranks with ZeRO-1, as 2 ranks without" ranks zero
