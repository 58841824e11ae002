#!/usr/bin/env bash
# Activation checkpointing measured side by side: the plain network and the one whose every block is
# recomputed (dettrial::nn::CheckpointEach), alternating, ROUNDS rounds, each in its own process.
# Prints each round, then the medians and the ratios checkpointed / plain of the memory the forward
# holds for backward (malloc's bytes in use), of the peak resident memory above what the model and
# optimizer take, and of the time per step.
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
    rows.setdefault(f[0], []).append((float(f[2]), float(f[6]) - float(f[4]), float(f[8])))
med = {m: [statistics.median(r[i] for r in v) for i in range(3)] for m, v in rows.items()}
for m, (t, peak, held) in med.items():
    print(f"{m}: {t:.0f} ms a step, {held:.0f} MiB held by the forward for backward, peak resident {peak:.0f} MiB above the model "
          f"(medians of {len(rows[m])})")
each, plain = med["each"], med["plain"]
print(f"checkpointed / plain: held for backward {each[2] / plain[2]:.2f}x, peak resident {each[1] / plain[1]:.2f}x, "
      f"time {each[0] / plain[0]:.2f}x")
'
