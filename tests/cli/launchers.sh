#!/usr/bin/env bash
# Usage: launchers.sh PROGRAM CONFIG DATA_DIR WORK_DIR [PYTHON]
# The 2-rank MNIST job under each launcher this machine has (dettrial's built-in one, mpirun,
# torchrun from PYTHON's torch): every rank's computing thread pools (intra-op, the BLAS library's
# own) get the same sizes under all of them, and the job ends with the same validation
# metrics, so results do not depend on the launcher. (Slurm's srun is compared in srun_ddp.sh.)
set -u
program=$1 config=$2 data=$3 work=$4 python=${5:-}
fail() { echo "launchers: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
# The pools that compute: intra-op and the BLAS library's own. (The inter-op pool, which dettrial's
# loop does not use, is LibTorch's default for the CPUs the rank sees: 1 on a bound rank.)
pools() { sed -n 's/.* threads\{0,1\} (.*: \(intra-op [^)]*\), inter-op [0-9]*).*/\1/p' "$1" | head -n 1; }
last_validation() { python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "validation"][-1]["metrics"])' "$1"; }
# On a machine with a GPU every job has deterministic kernels: there LibTorch's default kernels may
# end two identical jobs apart (an H200's ended 4e-7 apart in the validation loss), and what is
# compared here is the launchers. On a CPU the defaults are compared, as a user leaves them.
deterministic=()
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  deterministic=(--set reproducibility.deterministic=true)
fi
run() {  # NAME COMMAND...: runs the job, prints its pools and metrics
  local name=$1
  shift
  "$@" --config "$config" --set "data.dir=$data" "${deterministic[@]}" --output "$work/$name" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "the $name job failed"; }
  grep -m1 "^dettrial [0-9]" "$work/$name.log"
}
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS
run builtin "$program"
reference_pools=$(pools "$work/builtin.log")
[ -n "$reference_pools" ] || fail "the built-in launcher's first line names no thread pools"
reference=$(last_validation "$work/builtin/metrics.jsonl")
echo "built-in: $reference_pools; $reference"
compared=0
if command -v mpirun >/dev/null; then
  # Unbound, as the other launchers leave a rank's share: Open MPI binds each of 2 ranks to one core
  # by default, and a rank bound to one core computes with one thread (the unit tests' "threads per
  # rank"), where the built-in launcher gives each half the node (8 threads each on 16 cores).
  run mpirun mpirun -np 2 --bind-to none --allow-run-as-root --oversubscribe -x MASTER_PORT=29531 "$program"
  compared=$((compared + 1))
fi
# torchrun from PYTHON's torch, probed first.
torchrun=("$(dirname "$0")/../torchrun_agent.sh" "$python")
if [ -n "$python" ] && "${torchrun[@]}" --standalone --nproc_per_node 1 --no_python true >"$work/probe.log" 2>&1; then
  # torchrun sets OMP_NUM_THREADS=1 in each rank unless it is set: set to the built-in launcher's
  # intra-op count, it leaves dettrial every other pool to size (on 2 cores both are 1).
  intra_op=${reference_pools#intra-op }
  OMP_NUM_THREADS=${intra_op%%,*} run torchrun "${torchrun[@]}" --standalone --nproc_per_node 2 --no_python "$program"
  compared=$((compared + 1))
fi
[ -f "$work/torchrun.log" ] || echo "torchrun: not compared (no Python given, or its torchrun cannot start a worker: $(tail -n 1 "$work/probe.log" 2>/dev/null))"
[ "$compared" -gt 0 ] || { echo "skipped: neither mpirun nor a Python with torch.distributed.run is here to compare with"; exit 77; }
for name in mpirun torchrun; do
  [ -f "$work/$name.log" ] || continue
  got_pools=$(pools "$work/$name.log")
  got=$(last_validation "$work/$name/metrics.jsonl")
  echo "$name: $got_pools; $got"
  [ "$got_pools" = "$reference_pools" ] || fail "$name's ranks got thread pools '$got_pools', the built-in launcher's '$reference_pools'"
  [ "$got" = "$reference" ] || fail "$name's job validated differently from the built-in launcher's"
done
echo "ok: $((compared + 1)) launchers, the same thread pools ($reference_pools) and the same metrics"
