#!/usr/bin/env bash
# Usage: srun_ddp.sh PROGRAM CONFIG DATA_DIR WORK_DIR
# Under the test cluster (SLURM_CONF set by CTest): the 2-rank MNIST job runs as `srun --ntasks=2`,
# reads its ranks and rendezvous from Slurm's environment, and ends with exactly the metrics of the
# same job under dettrial's built-in launcher; so do the job with one task on each of two nodes, and
# the same job submitted with sbatch (a batch script running srun). A task that fails ends the job step, and Slurm names it.
set -u
program=$1 config=$2 data=$3 work=$4
fail() { echo "srun_ddp: $*"; exit 1; }
# (No configuration file: sinfo would look for a cluster in DNS for a minute before failing.)
{ [ -f "${SLURM_CONF:-}" ] && timeout 20 sinfo -h >/dev/null 2>&1; } ||
  { echo "skipped: no Slurm cluster answers (SLURM_CONF=${SLURM_CONF:-unset})"; exit 77; }
rm -rf "$work"
mkdir -p "$work"
last_validation() { python3 -c 'import json,sys; print([r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "validation"][-1]["metrics"])' "$1"; }

# The thread pools that compute (intra-op, the BLAS library's own) as a run's first line names them.
pools() { sed -n 's/.* threads\{0,1\} (.*: \(intra-op [^)]*\), inter-op [0-9]*).*/\1/p' "$1" | head -n 1; }
"$program" --config "$config" --set "data.dir=$data" --output "$work/builtin" >"$work/builtin.log" 2>&1 ||
  { cat "$work/builtin.log"; fail "the built-in launcher's run failed"; }
builtin_pools=$(pools "$work/builtin.log")
[ -n "$builtin_pools" ] || fail "the built-in launcher's first line names no thread pools"
srun --ntasks=2 --kill-on-bad-exit=1 "$program" --config "$config" --set "data.dir=$data" --output "$work/srun" >"$work/srun.log" 2>&1
status=$?
cat "$work/srun.log"
[ "$status" -eq 0 ] || fail "srun exited with $status"
grep -q "2 processes (Slurm, gloo)" "$work/srun.log" || fail "the job did not run as Slurm's 2 ranks"
# Slurm's ranks here are not bound to CPUs (task/none): each must still size every pool as the
# built-in launcher's bound ranks do, the BLAS library's own included.
[ "$(pools "$work/srun.log")" = "$builtin_pools" ] ||
  fail "srun's ranks got thread pools '$(pools "$work/srun.log")', the built-in launcher's '$builtin_pools'"
echo "thread pools under both: $builtin_pools"
builtin=$(last_validation "$work/builtin/metrics.jsonl") srun_metrics=$(last_validation "$work/srun/metrics.jsonl")
echo "built-in launcher: $builtin"
echo "srun:              $srun_metrics"
[ "$builtin" = "$srun_metrics" ] || fail "the srun job's validation differs from the built-in launcher's"

# Two nodes (the test cluster's two slurmd, both on this host): one task on each node. Rank 0 runs
# on the first node of SLURM_JOB_NODELIST, which is the rendezvous address every rank derives.
srun --partition=two --nodes=2 --ntasks=2 --ntasks-per-node=1 sh -c 'echo "$SLURM_PROCID $SLURMD_NODENAME $SLURM_JOB_NODELIST"' \
  | sort >"$work/nodes.txt" || fail "a 2-node step failed"
cat "$work/nodes.txt"
read -r _ first_node nodelist < "$work/nodes.txt"
[ "$(cut -d' ' -f2 "$work/nodes.txt" | sort -u | wc -l)" -eq 2 ] || fail "the 2-node step's tasks did not run on two nodes"
[ "${nodelist%%,*}" = "$first_node" ] || fail "rank 0 ran on $first_node, not on the nodelist's first node ($nodelist)"
# (One rank per node would take both cores: --threads 1 keeps the built-in run's threads, and so its sums.)
srun --partition=two --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 "$program" --config "$config" --set "data.dir=$data" \
  --threads 1 --output "$work/two-nodes" >"$work/two-nodes.log" 2>&1
status=$?
cat "$work/two-nodes.log"
[ "$status" -eq 0 ] || fail "the 2-node job exited with $status"
grep -q "2 processes (Slurm, gloo), rendezvous at $first_node:[0-9]*," "$work/two-nodes.log" ||
  fail "the 2-node job did not meet at rank 0's node ($first_node)"
two_nodes=$(last_validation "$work/two-nodes/metrics.jsonl")
echo "two nodes:         $two_nodes"
[ "$two_nodes" = "$builtin" ] || fail "the 2-node job's validation differs from the built-in launcher's"

# sbatch: a batch script whose srun starts the ranks; --wait returns the job's exit status.
cat >"$work/job.sh" <<JOB
#!/bin/sh
#SBATCH --ntasks=2
#SBATCH --output=$work/sbatch.log
srun "$program" --config "$config" --set "data.dir=$data" --output "$work/sbatch"
JOB
sbatch --wait --parsable "$work/job.sh" >/dev/null || { cat "$work/sbatch.log"; fail "the sbatch job failed"; }
[ "$(last_validation "$work/sbatch/metrics.jsonl")" = "$builtin" ] || fail "the sbatch job's validation differs from the built-in launcher's"

# Rank 1 fails before the rendezvous: the step ends (rank 0 does not wait out the timeout) and Slurm names the task.
start=$(date +%s)
srun --ntasks=2 --kill-on-bad-exit=1 sh -c 'if [ "$SLURM_PROCID" = 1 ]; then echo "rank 1 fails"; exit 3; fi; exec "$0" "$@"' \
  "$program" --config "$config" --set "data.dir=$data" --output "$work/failed" --timeout 120 >"$work/failed.log" 2>&1
status=$?
elapsed=$(( $(date +%s) - start ))
cat "$work/failed.log"
[ "$status" -ne 0 ] || fail "a job step with a failed task exited 0"
grep -q "task 1: Exited with exit code 3" "$work/failed.log" || fail "Slurm did not name the failed task"
[ "$elapsed" -lt 60 ] || fail "the step took ${elapsed} s to end after rank 1 failed"
echo "ok: srun (one node and two) and sbatch jobs train as the built-in launcher does; a failed task ends the step in ${elapsed} s"
