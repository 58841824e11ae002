#!/usr/bin/env bash
# Usage: signal_resume.sh PROGRAM CONFIG DATA_DIR OUTPUT_DIR
# SIGTERM during training: the program finishes the batch, checkpoints and exits with status 75;
# `--resume OUTPUT_DIR` then continues from that checkpoint's batch to the new max_length (saying
# which fields of the given config differ from the run's own); `--resume` alone reads the run's own
# config (with its overrides) from the checkpoint, and says so when nothing is left to train.
set -u
program=$1 config=$2 data=$3 out=$4
rm -rf "$out"
mkdir -p "$(dirname "$out")"
"$program" --config "$config" --set "data.dir=$data" --output "$out" >"$out.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do  # until two training reports are written (at most 60 s)
  [ -f "$out/metrics.jsonl" ] && [ "$(grep -c training "$out/metrics.jsonl")" -ge 2 ] && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
status=$?
cat "$out.log"
[ "$status" -eq 75 ] || { echo "signal_resume: exit status $status after SIGTERM, expected 75"; exit 1; }
metadata=$(ls "$out"/checkpoints/*/metadata.json 2>/dev/null | head -n 1)
[ -n "$metadata" ] || { echo "signal_resume: no checkpoint after SIGTERM"; exit 1; }
batches=$(sed -nE 's/.*"steps_completed": ([0-9]+).*/\1/p' "$metadata")
target=$((batches + 7))
"$program" --config "$config" --set "data.dir=$data" --set "searcher.max_length.batches=$target" --resume "$out" >"$out.resume.log" 2>&1
status=$?
cat "$out.resume.log"
[ "$status" -eq 0 ] || { echo "signal_resume: resume exited with $status"; exit 1; }
grep -q "resumed from .* at batch $batches" "$out.resume.log" || { echo "signal_resume: did not resume at batch $batches"; exit 1; }
grep -q "\"batches\":$target," "$out/metrics.jsonl" || { echo "signal_resume: metrics.jsonl does not reach batch $target"; exit 1; }
grep -q "searcher.max_length.batches: 100000 -> $target" "$out.resume.log" || { echo "signal_resume: the changed max_length is not reported"; exit 1; }
# --resume alone: the run's config (data.dir and the new length included); nothing is left to train.
"$program" --resume "$out" >"$out.again.log" 2>&1 || { cat "$out.again.log"; echo "signal_resume: --resume alone failed"; exit 1; }
cat "$out.again.log"
grep -q "nothing left to train: the checkpoint is at batch $target" "$out.again.log" || { echo "signal_resume: no 'nothing left to train'"; exit 1; }
# --resume with an override only: trains 3 more batches with the run's own config.
"$program" --resume "$out" --set "searcher.max_length.batches=$((target + 3))" >"$out.more.log" 2>&1 || { cat "$out.more.log"; echo "signal_resume: --resume --set failed"; exit 1; }
grep -q "\"batches\":$((target + 3))," "$out/metrics.jsonl" || { echo "signal_resume: metrics.jsonl does not reach batch $((target + 3))"; exit 1; }
python3 - "$out/metrics.jsonl" <<'PY' || { echo "signal_resume: a record appears twice"; exit 1; }
import collections, json, sys
keys = [(r["type"], r["batches"]) for r in map(json.loads, open(sys.argv[1]))]
assert not [k for k, n in collections.Counter(keys).items() if n > 1], collections.Counter(keys).most_common(2)
PY
echo "signal_resume: stopped at batch $batches with status 75, resumed and finished at $target, then at $((target + 3)) from --resume alone"
