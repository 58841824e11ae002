#!/usr/bin/env bash
# Debian's LibTorch does its matrix products through libblas.so.3, which on a fresh Debian machine is
# netlib's reference BLAS; libopenblas0-pthread takes that alternative over. The Trainer on the MLP
# and on the MNIST example network (one thread, batches in memory) with each BLAS, chosen for this
# process only through LD_LIBRARY_PATH, rounds alternating. One JSON line per run.
#   bench/blas.sh TRAINER_BENCH_BUILT_AGAINST_DEBIANS_LIBTORCH [ROUNDS]
set -euo pipefail
trainer_bench=$1 rounds=${2:-3}
lib=/usr/lib/x86_64-linux-gnu
declare -A dirs=([reference]="$lib/blas" [OpenBLAS]="$lib/openblas-pthread")
for blas in reference OpenBLAS; do
  if [ ! -e "${dirs[$blas]}/libblas.so.3" ]; then
    echo "skipped: Debian LibTorch per BLAS (${dirs[$blas]}/libblas.so.3 is absent)" >&2
    exit 0
  fi
done
for ((round = 0; round < rounds; ++round)); do
  for model in mlp mnist; do
    for blas in reference OpenBLAS; do
      out=$(LD_LIBRARY_PATH="${dirs[$blas]}" "$trainer_bench" --profile trainer --model "$model" --batches "$([ $model = mlp ] && echo 3000 || echo 60)")
      python3 -c 'import json, re, sys
us = float(re.search(r"([0-9.]+) us/batch", sys.argv[1]).group(1))
print(json.dumps({"name": f"Debian LibTorch, Trainer, {sys.argv[2]} batch, 1 thread: {sys.argv[3]} BLAS", "value": us, "unit": "us/batch", "spread": 1.0}))' \
        "$out" "$model" "$blas"
    done
  done
done
