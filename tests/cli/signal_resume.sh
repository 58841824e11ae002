#!/usr/bin/env bash
# Usage: signal_resume.sh PROGRAM CONFIG DATA_DIR OUTPUT_DIR
# SIGTERM during training: the program finishes the batch, checkpoints and exits with status 75;
# `--resume OUTPUT_DIR` then continues from that checkpoint's batch to the new max_length.
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
batches=$(sed -E 's/.*"steps_completed": ([0-9]+).*/\1/' "$metadata")
target=$((batches + 7))
"$program" --config "$config" --set "data.dir=$data" --set "searcher.max_length.batches=$target" --resume "$out" >"$out.resume.log" 2>&1
status=$?
cat "$out.resume.log"
[ "$status" -eq 0 ] || { echo "signal_resume: resume exited with $status"; exit 1; }
grep -q "resumed from .* at batch $batches" "$out.resume.log" || { echo "signal_resume: did not resume at batch $batches"; exit 1; }
grep -q "\"batches\":$target," "$out/metrics.jsonl" || { echo "signal_resume: metrics.jsonl does not reach batch $target"; exit 1; }
echo "signal_resume: stopped at batch $batches with status 75, resumed and finished at $target"
