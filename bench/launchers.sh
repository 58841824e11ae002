#!/usr/bin/env bash
# The same 2-rank MNIST job (the 10,000 real digits less a 1,000 holdout, global batch 64, 282
# batches; 280 here, 7 full reports of 40) under each launcher, rounds alternating the order: the built-in launcher (--nproc 2),
# torchrun, mpirun, the built-in launcher with its ranks left unbound (--no-cpu-bind: what it did
# before it bound each rank to its share of the CPUs), and the built-in launcher with every rank
# given all the cores (--threads = cores: what ranks did before they took their share). Prints one JSON line per launcher and round
# (samples/s of the training reports after the first, which includes start-up) for bench/table.py.
#   bench/launchers.sh MNIST_BINARY MNIST10K_DIR PYTHON_VENV [ROUNDS]
set -euo pipefail
mnist=$1 data=$2 venv=$3 rounds=${4:-3}
cores=$(nproc)
config=$(dirname "$0")/../tests/cli/ddp.yaml
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
common=(--config "$config" --set "data.dir=$data" --set "searcher.max_length={batches: 280}" --set scheduling_unit=40)

run() {  # name, command...
  local name=$1
  shift
  local out="$scratch/out"
  env -u OMP_NUM_THREADS "$@" --output "$scratch/run-$RANDOM" >"$out" 2>&1 || { cat "$out" >&2; return 1; }
  python3 - "$name" "$out" <<'PY'
import json, re, statistics, sys
text = open(sys.argv[2]).read()  # mpirun may hand the ranks a terminal: live progress lines precede reports
rates = [float(m) for m in re.findall(r"\[train\][^\n]*\(([0-9.]+) samples/s\)", text)][1:]
threads = re.search(r"dettrial [0-9.]+: [^\n]*, ([0-9]+ threads? \([^\n]*\))", text)
print(json.dumps({"name": f"2-rank MNIST job, {sys.argv[1]}", "value": statistics.median(rates), "unit": "samples/s",
                  "spread": max(rates) / min(rates), "threads": threads.group(1) if threads else "?"}))
PY
}

launchers=(builtin torchrun mpirun unbound oversubscribed)
for ((round = 0; round < rounds; ++round)); do
  for ((i = 0; i < ${#launchers[@]}; ++i)); do
    launcher=${launchers[$(((i + round) % ${#launchers[@]}))]}
    case $launcher in
      builtin) run "built-in launcher (--nproc 2)" "$mnist" "${common[@]}" --nproc 2 ;;
      torchrun) run "torchrun --nproc-per-node=2" "$venv/bin/torchrun" --no-python --nproc-per-node=2 --master-port=29631 \
                  "$mnist" "${common[@]}" ;;
      mpirun) command -v mpirun >/dev/null && run "mpirun -np 2 (bound to cores)" mpirun -np 2 --allow-run-as-root \
                -x MASTER_PORT=29632 "$mnist" "${common[@]}" ;;
      unbound) run "built-in launcher, ranks unbound (--no-cpu-bind)" "$mnist" "${common[@]}" --nproc 2 --no-cpu-bind ;;
      oversubscribed) run "built-in launcher, every rank $cores threads (before threads per rank)" "$mnist" "${common[@]}" \
                        --nproc 2 --threads "$cores" ;;
    esac
  done
done
