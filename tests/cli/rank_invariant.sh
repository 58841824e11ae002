#!/usr/bin/env bash
# Usage: rank_invariant.sh PROGRAM CONFIG DATA_DIR WORK_DIR PYTHON
# reproducibility.rank_invariant as a user runs it, with the default thread counts (no --threads,
# no OMP_NUM_THREADS): the MNIST example at global batch 30 on 1 rank aggregating 2 batches, and at
# global batch 60 on 2 ranks (the same per-slot batch, the same records per update), ends with
# bit-identical weights. PYTHON (a torch) reads both runs' last checkpoints.
set -u
program=$1 config=$2 data=$3 work=$4 python=$5
fail() { echo "rank_invariant: $*"; exit 1; }
"$python" -c 'import torch' 2>/dev/null || { echo "skipped: no Python with torch to read the checkpoints ($python)"; exit 77; }
rm -rf "$work"
mkdir -p "$work"
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS MKL_NUM_THREADS
common=(--config "$config" --set "data.dir=$data" --set reproducibility.rank_invariant=true)
run() {  # NAME ARGS...
  local name=$1
  shift
  "$program" "${common[@]}" "$@" --output "$work/$name" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "the $name run failed"; }
  grep -m1 "^dettrial [0-9]" "$work/$name.log"
}
run one-rank --set resources.slots_per_trial=1 --set hyperparameters.global_batch_size=30 \
  --set optimizations.aggregation_frequency=2 --set "searcher.max_length={batches: 20}"
run two-ranks --set resources.slots_per_trial=2 --set hyperparameters.global_batch_size=60 --set "searcher.max_length={batches: 10}"
# The start line names the rule that sized the pools.
grep -q "rank_invariant" "$work/one-rank.log" || fail "the start line does not say that rank_invariant chose the thread count"
"$python" - "$work/one-rank" "$work/two-ranks" <<'PY' || exit 1
import pathlib, sys, torch
def last_weights(run):
    files = sorted(pathlib.Path(run, "checkpoints").glob("*/state_dict.pth"), key=lambda p: p.stat().st_mtime)
    if not files:
        sys.exit(f"rank_invariant: {run} wrote no checkpoint")
    return torch.load(files[-1], map_location="cpu")["models_state_dict"][0]
a, b = (last_weights(r) for r in sys.argv[1:3])
assert a.keys() == b.keys(), (list(a), list(b))
worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
if not all(torch.equal(a[k], b[k]) for k in a):
    sys.exit(f"rank_invariant: 1 rank and 2 ranks end {worst:.3g} apart (max over the weights); expected bit-identical")
print(f"ok: 1 rank aggregating 2 batches and 2 ranks end with bit-identical weights ({len(a)} tensors)")
PY
