#!/usr/bin/env bash
# Activation checkpointing measured side by side: the plain network and the one whose every block is
# recomputed (dettrial::nn::CheckpointEach), alternating, ROUNDS rounds, each in its own process.
# Prints each round, then the medians and the ratios checkpointed / plain of the training memory
# (peak resident memory above what the model and optimizer take) and of the time per step.
#   bench/activation_checkpointing.sh BENCH_BINARY [ROUNDS] [bench options...]
set -euo pipefail
bench=$1
rounds=${2:-3}
shift $(( $# >= 2 ? 2 : 1 ))
for ((r = 1; r <= rounds; ++r)); do
  for mode in plain each; do
    "$bench" --mode "$mode" "$@"
  done
done | tee /dev/stderr | python3 -c '
import statistics, sys
rows = {}
for line in sys.stdin:
    f = line.split()
    rows.setdefault(f[0], []).append((float(f[2]), float(f[6]) - float(f[4])))
med = {m: (statistics.median(t for t, _ in v), statistics.median(mem for _, mem in v)) for m, v in rows.items()}
for m, (t, mem) in med.items():
    print(f"{m}: {t:.0f} ms a step, {mem:.0f} MiB of training memory (median of {len(rows[m])})")
print(f"checkpointed / plain: memory {med[\"each\"][1] / med[\"plain\"][1]:.2f}x, time {med[\"each\"][0] / med[\"plain\"][0]:.2f}x")
'
