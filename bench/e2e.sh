#!/usr/bin/env bash
# The MNIST example end to end (read Fashion-MNIST, build the trial, train BATCHES batches, validate
# on the 10,000 test images) by dettrial, by a plain PyTorch loop in Python, and by Determined's own
# Trainer (local mode) when a Python with `determined` is given. This machine's speed drifts by more
# than the differences measured, so the sides run in short segments, ROUNDS times, the order rotated
# each round, and table.py reports the distribution of the per-round ratios. Once with the default
# thread count and once with OMP_NUM_THREADS=1. One JSON line per run.
#   bench/e2e.sh TRAINER_BENCH PYTHON [DETERMINED_PYTHON|-] [ROUNDS] [BATCHES]
set -euo pipefail
trainer_bench=$1 python=$2 determined=${3:--} rounds=${4:-7} batches=${5:-300}
here=$(cd "$(dirname "$0")" && pwd)
sides=(dettrial python)
[ "$determined" != - ] && sides+=(determined)

run() {  # side, threads ("default" or a number)
  local side=$1 threads=$2 env=(env -u OMP_NUM_THREADS)
  [ "$threads" != default ] && env=(env "OMP_NUM_THREADS=$threads")
  local line
  case $side in
    dettrial) line=$("${env[@]}" "$trainer_bench" --epoch --batches "$batches") ;;
    python) line=$(cd "$here" && "${env[@]}" "$python" e2e_epoch.py --batches "$batches") ;;
    determined) line=$(cd "$here" && "${env[@]}" "$determined" e2e_determined.py --batches "$batches") ;;
  esac
  python3 -c 'import json, sys; r = json.loads(sys.argv[1]); r.update(e2e_side=sys.argv[2], e2e_threads=sys.argv[3], e2e_round=int(sys.argv[4])); r["name"] += f", {sys.argv[3]} threads"; print(json.dumps(r))' \
    "$line" "$side" "$threads" "$round"
}

for threads in default 1; do
  for ((round = 0; round < rounds; ++round)); do
    n=${#sides[@]}
    for ((k = 0; k < n; ++k)); do run "${sides[(round + k) % n]}" "$threads"; done
  done
done
