#!/usr/bin/env bash
# Usage: default_threads.sh TRAINER_BENCH
# bench/e2e.sh's dettrial row (trainer_bench --epoch) trains as a user's run does, at the default
# thread count (every CPU this process may use, as Python's side), and its JSON line says so.
set -u
unset OMP_NUM_THREADS
line=$("$1" --epoch --batches 5) || { echo "trainer_bench --epoch failed"; exit 1; }
echo "$line"
cpus=$(nproc)
threads=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["threads"])' "$line") || exit 1
[ "$threads" = "$cpus" ] || { echo "the end-to-end row trained with $threads threads; this process may use $cpus CPUs"; exit 1; }
echo "ok: the default threads, $cpus"
