#!/usr/bin/env bash
# Usage: torchrun.sh PROGRAM CONFIG WORK_DIR PYTHON [OTHER_PYTHON]
# torchrun's elastic agent, from PYTHON's torch (the same release as the LibTorch PROGRAM links: the
# agent's rendezvous store speaks its own release's protocol), restarts a job that lost a rank:
# - one agent, --max_restarts 1, rank 1 killed with SIGKILL at batch 23 of 40 (checkpoints every 10):
#   the workers continue from the checkpoint at batch 20 and train every global batch of the
#   uninterrupted run exactly once from there on, with a restart record in metrics.jsonl;
# - the same, killed before any checkpoint: the restarted job starts its folder afresh, no record
#   doubled;
# - two agents (--nnodes 1:2), one killed with its rank (a node lost): the other goes on alone, on
#   one rank, with the 2-rank run's global batches;
# - without --output, a job torchrun may restart is refused in one sentence;
# - OTHER_PYTHON's torchrun, when its torch is another release, is refused by every rank with the
#   release it must be (its agent's store speaks another protocol).
# Exits 77 (skipped, with the reason) when PYTHON's torchrun cannot start a worker here.
set -u
program=$1 config=$2 work=$3 python=$4 other=${5:-}
source "$(dirname "$0")/lib.sh"
[ -n "$python" ] || { echo "skipped: no Python with torch was given to run torchrun with (DETTRIAL_PYTHON)"; exit 77; }
agent=("$here/../torchrun_agent.sh" "$python")
"${agent[@]}" --standalone --nproc_per_node 1 --no_python true >"$work/probe.log" 2>&1 ||
  { echo "skipped: $python's torchrun cannot start a worker here: $(tail -n 1 "$work/probe.log")"; exit 77; }

trial=(--config "$config" --timeout 30)
run reference-2 0 "$program" "${trial[@]}" --nproc 2 --output "$work/reference-2"

# One agent restarts every worker; they continue from the run folder's latest checkpoint.
torchrun=("${agent[@]}" --standalone --nproc_per_node 2 --max_restarts 1 --no_python)
ELASTIC_KILL=1:23 run torchrun 0 "${torchrun[@]}" "$program" "${trial[@]}" --output "$work/torchrun"
echo "torchrun --max_restarts 1, rank 1 killed at batch 23:"
python3 "$here/compare.py" "$work/reference-2" "$work/torchrun" "2>2" || fail "torchrun"

# Killed after the validation at batch 17 but before the first checkpoint (at 30 here): the
# restarted workers start the run folder afresh, and its records of batch 17 are not doubled.
ELASTIC_KILL=1:23 run torchrun-afresh 0 "${torchrun[@]}" "$program" "${trial[@]}" --set min_checkpoint_period.batches=30 --set checkpoint_policy=none \
  --output "$work/torchrun-afresh"
grep -q '"batches":17,' "$work/torchrun-afresh/metrics.jsonl" || fail "the afresh run has no records of batch 17 to double"
echo "torchrun --max_restarts 1, rank 1 killed at batch 23, before any checkpoint:"
python3 "$here/compare.py" "$work/reference-2" "$work/torchrun-afresh" || fail "torchrun, afresh"

# Two agents (two "nodes" on this host, one rank each, --nnodes 1:2): the second agent and its
# worker are killed at batch 23 (a node lost); the first agent restarts its worker alone, on one
# rank, which continues from the checkpoint at batch 20 with the 2-rank run's global batches. The
# first agent hosts the rendezvous store, told so (is_host): left to itself, whichever agent binds
# the port first hosts it, and when that is the agent killed, the survivor has no store to
# rendezvous on again (a loaded machine, where the first agent's Python took longer to start,
# lost that race). The second is a client whenever it starts: its store connection waits for the
# host.
port=$((20000 + RANDOM % 12000))  # below the ephemeral ports (32768 and up) other connections hold
node=("${agent[@]}" --nnodes 1:2 --nproc_per_node 1 --max_restarts 1 --rdzv_backend c10d
      --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "elastic-$$")
timeout 240 "${node[@]}" --rdzv_conf is_host=true,last_call_timeout=6 --no_python "$program" "${trial[@]}" \
  --output "$work/torchrun-nodes" >"$work/torchrun-node-a.log" 2>&1 &
first=$!
{ ELASTIC_KILL='*:23' ELASTIC_KILL_AGENT=1 timeout 240 "${node[@]}" --rdzv_conf is_host=false,last_call_timeout=6 --no_python "$program" \
    "${trial[@]}" --output "$work/torchrun-nodes" >"$work/torchrun-node-b.log" 2>&1; } 2>/dev/null
wait "$first"
status=$?
[ "$status" -eq 0 ] || { cat "$work/torchrun-node-a.log" "$work/torchrun-node-b.log"; fail "the surviving torchrun agent exited with $status"; }
echo "torchrun --nnodes 1:2, a node (agent and rank) killed at batch 23:"
python3 "$here/compare.py" "$work/reference-2" "$work/torchrun-nodes" "2>1" || fail "torchrun --nnodes 1:2"

# torchrun may restart the job, which then needs a folder that outlives an attempt (torchrun exits 1).
run torchrun-no-output 1 "${torchrun[@]}" "$program" "${trial[@]}"
grep -q "torchrun may restart this job, .* with --output DIR" "$work/torchrun-no-output.log" ||
  { cat "$work/torchrun-no-output.log"; fail "no sentence for torchrun without --output"; }

# The torchrun of another PyTorch release: the ranks cannot join its agent's store, and say why.
# (From torch's package metadata: importing torch takes seconds, four times over.)
release() { "$1" -c 'from importlib.metadata import version; print(".".join(version("torch").split(".")[:2]))' 2>/dev/null; }
other_release= this_release=
[ -n "$other" ] && other_release=$(release "$other") && this_release=$(release "$python")
if [ -n "$other_release" ] && [ -n "$this_release" ] && [ "$other_release" != "$this_release" ]; then
  run other-release 1 timeout 120 "$here/../torchrun_agent.sh" "$other" --standalone --nproc_per_node 2 --no_python "$program" --config "$config" --timeout 5 \
    --output "$work/other-release"
  grep -q "cannot join the gloo process group .* it must be the torchrun of this program's LibTorch $this_release" "$work/other-release.log" ||
    { cat "$work/other-release.log"; fail "no sentence for the torchrun of torch $other_release"; }
  echo "torchrun of torch $other_release: refused, naming LibTorch $this_release"
fi
echo "ok: torchrun's agent restarted a job that lost a rank, and one that lost a node"
