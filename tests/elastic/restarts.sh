#!/usr/bin/env bash
# Usage: restarts.sh PROGRAM CONFIG WORK_DIR [PYTHON]
# A rank killed with SIGKILL mid-epoch (batch 23 of 40; checkpoints every 10): the job is restarted
# from its checkpoint at batch 20 and trains every global batch of the uninterrupted run exactly
# once from there on, with a restart record in metrics.jsonl:
# - the built-in launcher with --max-restarts 1, on the same 2 ranks;
# - the built-in launcher with --nproc 2:3, on the 2 slots that remain after rank 2 died, keeping
#   the 3-rank run's global batches;
# - torchrun's elastic agent (--max-restarts 1), from PYTHON's torch, when it can start workers here
#   (and, killed before any checkpoint, the restarted job starts its folder afresh, no record
#   doubled); and two agents (--nnodes 1:2) of which one is killed with its rank: the other goes on
#   alone, on one rank.
# A job whose rank dies before a new checkpoint, or with no restarts left, ends with status 1.
set -u
program=$1 config=$2 work=$3 python=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "restarts: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
run() {  # NAME EXPECTED_STATUS COMMAND...
  local name=$1 expected=$2
  shift 2
  "$@" >"$work/$name.log" 2>&1
  local status=$?
  [ "$status" -eq "$expected" ] || { cat "$work/$name.log"; fail "$name exited with $status, expected $expected"; }
}
trial=(--config "$config" --timeout 30)
run reference-2 0 "$program" "${trial[@]}" --nproc 2 --output "$work/reference-2"
run reference-3 0 "$program" "${trial[@]}" --nproc 3 --output "$work/reference-3"

ELASTIC_KILL=1:23 run builtin 0 "$program" "${trial[@]}" --nproc 2 --max-restarts 1 --output "$work/builtin"
grep -q "restarting the job from its checkpoint at batch 20 on 2 rank(s): restart 1 of max_restarts 1" "$work/builtin.log" ||
  { cat "$work/builtin.log"; fail "the built-in launcher did not say it restarts"; }
echo "built-in launcher, 2 ranks, rank 1 killed at batch 23:"
python3 "$here/compare.py" "$work/reference-2" "$work/builtin" "2>2" || fail "built-in launcher"

ELASTIC_KILL=2:23 run elastic 0 "$program" "${trial[@]}" --nproc 2:3 --max-restarts 1 --output "$work/elastic"
grep -q "slot 2 is left out from now on" "$work/elastic.log" || { cat "$work/elastic.log"; fail "the lost slot is not named"; }
echo "built-in launcher, --nproc 2:3, rank 2 killed at batch 23:"
python3 "$here/compare.py" "$work/reference-3" "$work/elastic" "3>2" || fail "--nproc 2:3"

# No restarts left: the job ends with the rank that failed named.
ELASTIC_KILL=1:23 run no-restarts 1 "$program" "${trial[@]}" --nproc 2 --max-restarts 0 --output "$work/no-restarts"
grep -q "error: rank 1 of 2 was killed by signal 9" "$work/no-restarts.log" || { cat "$work/no-restarts.log"; fail "the killed rank is not named"; }
# Killed before its first checkpoint: not restarted (it would start over where it began).
ELASTIC_KILL=1:5 run too-early 1 "$program" "${trial[@]}" --nproc 2 --max-restarts 3 --output "$work/too-early"
grep -q "failed before writing a new checkpoint: not restarted" "$work/too-early.log" || { cat "$work/too-early.log"; fail "no sentence for a job that failed before its first checkpoint"; }

# torchrun's agent restarts every worker; they continue from the run folder's latest checkpoint.
if [ -n "$python" ] && "$python" -m torch.distributed.run --standalone --nproc_per_node 1 --no_python true >"$work/probe.log" 2>&1; then
  torchrun=("$python" -m torch.distributed.run --standalone --nproc_per_node 2 --max-restarts 1 --no_python)
  ELASTIC_KILL=1:23 run torchrun 0 "${torchrun[@]}" "$program" "${trial[@]}" --output "$work/torchrun"
  echo "torchrun --max-restarts 1, rank 1 killed at batch 23:"
  python3 "$here/compare.py" "$work/reference-2" "$work/torchrun" "2>2" || fail "torchrun"
  # Killed after the validation at batch 17 but before the first checkpoint (at 30 here): the
  # restarted workers start the run folder afresh, and its records of batch 17 are not doubled.
  ELASTIC_KILL=1:23 run torchrun-afresh 0 "${torchrun[@]}" "$program" "${trial[@]}" --set min_checkpoint_period.batches=30 --set checkpoint_policy=none \
    --output "$work/torchrun-afresh"
  grep -q '"batches":17,' "$work/torchrun-afresh/metrics.jsonl" || fail "the afresh run has no records of batch 17 to double"
  echo "torchrun --max-restarts 1, rank 1 killed at batch 23, before any checkpoint:"
  python3 "$here/compare.py" "$work/reference-2" "$work/torchrun-afresh" || fail "torchrun, afresh"
  # Two agents (two "nodes" on this host, one rank each, --nnodes 1:2): the second agent and its
  # worker are killed at batch 23 (a node lost); the first agent restarts its worker alone, on one
  # rank, which continues from the checkpoint at batch 20 with the 2-rank run's global batches. (The
  # first agent hosts the rendezvous store, so it starts first.)
  port=$((20000 + RANDOM % 12000))  # below the ephemeral ports (32768 and up) other connections hold
  nodes=("$python" -m torch.distributed.run --nnodes 1:2 --nproc_per_node 1 --max-restarts 1 --rdzv-backend c10d
         --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "elastic-$$" --rdzv-conf last_call_timeout=6 --no_python)
  timeout 240 "${nodes[@]}" "$program" "${trial[@]}" --output "$work/torchrun-nodes" >"$work/torchrun-node-a.log" 2>&1 &
  first=$!
  sleep 1
  { ELASTIC_KILL='*:23' ELASTIC_KILL_AGENT=1 timeout 240 "${nodes[@]}" "$program" "${trial[@]}" --output "$work/torchrun-nodes" \
      >"$work/torchrun-node-b.log" 2>&1; } 2>/dev/null
  wait "$first"
  status=$?
  [ "$status" -eq 0 ] || { cat "$work/torchrun-node-a.log" "$work/torchrun-node-b.log"; fail "the surviving torchrun agent exited with $status"; }
  echo "torchrun --nnodes 1:2, a node (agent and rank) killed at batch 23:"
  python3 "$here/compare.py" "$work/reference-2" "$work/torchrun-nodes" "2>1" || fail "torchrun --nnodes 1:2"
  # torchrun may restart the job, which then needs a folder that outlives an attempt (torchrun exits 1).
  run torchrun-no-output 1 "${torchrun[@]}" "$program" "${trial[@]}"
  grep -q "torchrun may restart this job, .* with --output DIR" "$work/torchrun-no-output.log" ||
    { cat "$work/torchrun-no-output.log"; fail "no sentence for torchrun without --output"; }
  echo "ok: a killed rank was survived under the built-in launcher (2 ranks, and 3 -> 2) and torchrun"
else
  echo "torchrun: not run (no Python given, or its torchrun cannot start a worker: $(tail -n 1 "$work/probe.log" 2>/dev/null))"
  echo "ok: a killed rank was survived under the built-in launcher (2 ranks, and 3 -> 2)"
fi
