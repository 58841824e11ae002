#!/usr/bin/env bash
# Usage: slurm_requeue.sh PROGRAM CONFIG WORK_DIR
# Under the test cluster (SLURM_CONF set by CTest): a 2-task job submitted with `sbatch --requeue`
# is requeued by Slurm (`scontrol requeue`, as when its node fails or it is preempted) after its
# checkpoint at batch 20; Slurm starts it again with SLURM_RESTART_COUNT=1, and it continues from that
# checkpoint, training exactly the global batches of the same job run without a break.
set -u
program=$1 config=$2 work=$3
# (No configuration file: sinfo would look for a cluster in DNS for a minute before failing.)
{ [ -f "${SLURM_CONF:-}" ] && timeout 20 sinfo -h >/dev/null 2>&1; } ||
  { echo "skipped: no Slurm cluster answers (SLURM_CONF=${SLURM_CONF:-unset})"; exit 77; }
source "$(dirname "$0")/lib.sh"
"$program" --config "$config" --nproc 2 --output "$work/reference" >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; fail "the reference run failed"; }
# Each batch sleeps, so that the job is still training when it is requeued.
cat >"$work/job.sh" <<JOB
#!/bin/sh
#SBATCH --ntasks=2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=$work/job.log
srun --kill-on-bad-exit=1 "$program" --config "$config" --set data.batch_sleep_ms=150 --timeout 60 --output "$work/requeued"
JOB
job=$(sbatch --parsable "$work/job.sh") || fail "sbatch failed"
state() { scontrol show job "$job" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
# Requeued once its checkpoint at batch 20 is written (at most 120 s).
for _ in $(seq 1 1200); do
  grep -qs '"type":"checkpoint","batches":20,' "$work/requeued/metrics.jsonl" && break
  sleep 0.1
done
grep -qs '"type":"checkpoint","batches":20,' "$work/requeued/metrics.jsonl" || { scancel "$job"; cat "$work/job.log"; fail "no checkpoint at batch 20"; }
scontrol requeue "$job" || { scancel "$job"; fail "scontrol requeue failed"; }
echo "job $job requeued after its checkpoint at batch 20"
# Slurm holds a requeued job back before it starts it again (its begin time moves on): let it start
# now (once it is pending again). It then runs to the end.
for _ in $(seq 1 100); do
  [ "$(state)" = PENDING ] && { scontrol update jobid="$job" StartTime=now 2>/dev/null; break; }
  sleep 0.1
done
for _ in $(seq 1 300); do
  case $(state) in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
  sleep 1
done
final=$(state)
cat "$work/job.log"
[ "$final" = COMPLETED ] || { scancel "$job" 2>/dev/null; fail "the requeued job ended $final"; }
grep -q '"type":"restart",.*"restart":1' "$work/requeued/metrics.jsonl" || fail "no restart record with Slurm's restart count"
python3 "$here/compare.py" "$work/reference" "$work/requeued" "2>2" || fail "the requeued job"
echo "ok: a Slurm job requeued mid-run continued from its checkpoint"
