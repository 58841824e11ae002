#!/usr/bin/env bash
# Usage: restarts.sh PROGRAM CONFIG WORK_DIR
# A rank killed with SIGKILL mid-epoch (batch 23 of 40; checkpoints every 10): the job is restarted
# from its checkpoint at batch 20 and trains every global batch of the uninterrupted run exactly
# once from there on, with a restart record in metrics.jsonl:
# - the built-in launcher with --max-restarts 1, on the same 2 ranks;
# - the built-in launcher with --nproc 2:3, on the 2 slots that remain after rank 2 died, keeping
#   the 3-rank run's global batches;
# A job whose rank dies before a new checkpoint, or with no restarts left, ends with status 1.
# torchrun's agent is tested by torchrun.sh.
set -u
program=$1 config=$2 work=$3
source "$(dirname "$0")/lib.sh"
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
grep -q "is not restarted: it failed before writing a new checkpoint" "$work/too-early.log" || { cat "$work/too-early.log"; fail "no sentence for a job that failed before its first checkpoint"; }
echo "ok: a killed rank was survived under the built-in launcher (2 ranks, and 3 -> 2)"
