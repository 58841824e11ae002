#!/usr/bin/env bash
# ZeRO-1 against unsharded data parallel, side by side: bench/zero_bench (Adam on a 100.7-million-
# parameter network) as a 2-rank and a 4-rank Gloo job on this machine, each mode in its own
# processes, alternating, ROUNDS rounds. Prints every rank's line, then per rank count the medians
# of: the highest peak resident memory of a rank, the optimizer state a rank keeps, and the time of
# an update; and ZeRO-1 / unsharded for each (the state against 1/N).
#   bench/zero.sh BENCH_BINARY [ROUNDS] [RANK_COUNTS...]   (defaults: 1 round; 2 and 4 ranks)
set -euo pipefail
bench=$1
rounds=${2:-1}
shift $(( $# >= 2 ? 2 : 1 ))
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(2 4)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for ((r = 1; r <= rounds; ++r)); do
  for ranks in "${counts[@]}"; do
    for mode in unsharded zero1; do
      port=$(free_port)
      pids=()
      for ((rank = 0; rank < ranks; ++rank)); do
        RANK=$rank WORLD_SIZE=$ranks LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$ranks MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
          "$bench" --mode "$mode" --output "$work/run" &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid"; done
      rm -rf "$work/run"
    done
  done
done | tee /dev/stderr | python3 -c '
import statistics, sys
runs = {}  # (ranks, mode) -> list of per-run (peak, state, time), each over the ranks of one job
lines = [l.split() for l in sys.stdin if l.strip()]
for i in range(0, len(lines)):
    f = lines[i]
    key = (int(f[2]), f[0])
    runs.setdefault(key, []).append((float(f[4]), float(f[6]), float(f[8]), int(f[10])))
def median_of_jobs(rows, ranks):
    jobs = [rows[j:j + ranks] for j in range(0, len(rows), ranks)]
    return [statistics.median(max(r[i] for r in job) for job in jobs) for i in range(3)]
for ranks in sorted({k[0] for k in runs}):
    u = median_of_jobs(runs[(ranks, "unsharded")], ranks)
    z = median_of_jobs(runs[(ranks, "zero1")], ranks)
    for name, m in (("unsharded", u), ("ZeRO-1", z)):
        print(f"{ranks} ranks, {name}: peak resident {m[0]:.0f} MiB (highest rank), optimizer state {m[1]:.0f} MiB a rank, "
              f"{m[2]:.0f} ms an update")
    print(f"{ranks} ranks, ZeRO-1 / unsharded: optimizer state {z[1] / u[1]:.3f}x (1/{ranks} = {1 / ranks:.3f}), "
          f"peak resident {z[0] / u[0]:.2f}x ({100 * (1 - z[0] / u[0]):.0f}% less), time an update {z[2] / u[2]:.2f}x")
'
