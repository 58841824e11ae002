#!/usr/bin/env bash
# Usage: search.sh PROGRAM CONFIG_DIR WORK_DIR
# Searches whose trials run as Slurm jobs (--launcher slurm) on the test cluster (SLURM_CONF set by
# CTest), with the synthetic trial of tests/experiment:
# - a random search of 4 trials, max_concurrent_trials 2: never more than 2 of its jobs in squeue,
#   and the summary the local runner gives for the same seed (trials, hyperparameters, metrics);
# - adaptive ASHA, one trial at a time: the local runner's summary, some trials stopped by the
#   searcher (scancel --signal);
# - a trial's job cancelled from outside (scancel) after its first checkpoint: restarted from it,
#   and the search still ends with every trial completed;
# - the runner killed twice: the next one adopts the running jobs and takes the ended ones' ends.
set -u
program=$1 configs=$2 work=$3
fail() { echo "search: $*"; exit 1; }
# (No configuration file: sinfo would look for a cluster in DNS for a minute before failing.)
{ [ -f "${SLURM_CONF:-}" ] && timeout 20 sinfo -h >/dev/null 2>&1; } ||
  { echo "skipped: no Slurm cluster answers (SLURM_CONF=${SLURM_CONF:-unset})"; exit 77; }
rm -rf "$work"
mkdir -p "$work"
# The summary without what differs between runs by design: paths, and how many batches a trial
# stopped by ASHA trained before the stop reached it (its metrics at the rungs are the same).
comparable() {
  python3 - "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for t in s["trials"]:
    batches = t["batches_trained"] if t["state"] != "STOPPED_EARLY" else "-"
    print(t["id"], t["state"], batches, json.dumps(t["hparams"], sort_keys=True), t["best_metric"], t["last_metric"])
print("best", s["best_trial"])
PY
}

# Random search: local, then on Slurm while squeue is watched.
"$program" --config "$configs/random.yaml" --output "$work/random-local" --quiet || fail "the local random search failed"
"$program" --config "$configs/random.yaml" --output "$work/random-slurm" --launcher slurm >"$work/random-slurm.log" 2>&1 &
pid=$!
most=0
while kill -0 "$pid" 2>/dev/null; do
  n=$(squeue -h -t PENDING,RUNNING -o %j | grep -c '^dettrial-e.*-t[0-9]*$')
  [ "$n" -gt "$most" ] && most=$n
  sleep 0.1
done
wait "$pid"
status=$?
cat "$work/random-slurm.log"
[ "$status" -eq 0 ] || fail "the Slurm random search exited with $status"
[ "$most" -ge 1 ] && [ "$most" -le 2 ] || fail "$most trial jobs at once in squeue, expected 1 or 2 (max_concurrent_trials: 2)"
diff <(comparable "$work/random-local/summary.json") <(comparable "$work/random-slurm/summary.json") ||
  fail "the Slurm random search's summary differs from the local one's"
grep -q "srun" "$work/random-slurm/trials/1/log.txt" 2>/dev/null && fail "srun complained in trial 1's log"

# Adaptive ASHA, one trial at a time (with two, which trial reaches a rung first depends on timing,
# and ASHA's decisions with it): the local runner's summary, with trials stopped by the searcher.
asha=(--config "$configs/asha.yaml" --set searcher.max_trials=6 --set searcher.max_concurrent_trials=1)
"$program" "${asha[@]}" --output "$work/asha-local" --quiet || fail "the local ASHA search failed"
"$program" "${asha[@]}" --output "$work/asha-slurm" --launcher slurm --quiet || fail "the Slurm ASHA search failed"
comparable "$work/asha-slurm/summary.json"
diff <(comparable "$work/asha-local/summary.json") <(comparable "$work/asha-slurm/summary.json") ||
  fail "the Slurm ASHA search's summary differs from the local one's"
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); st=[t["state"] for t in s["trials"]]; assert set(st) <= {"COMPLETED", "STOPPED_EARLY"} and "STOPPED_EARLY" in st, st' \
  "$work/asha-slurm/summary.json" || fail "the Slurm ASHA search did not end with completed and stopped trials"

# A trial's job cancelled from outside after its first checkpoint: restarted from it.
# While $work/paused exists the trials wait at their next batch, their jobs running.
slow=(--config "$configs/random.yaml" --set searcher.max_length.batches=64 --set data.batch_sleep_ms=50 --set min_checkpoint_period.batches=8
      --set "data.pause_file=$work/paused")
# Starts the slow search into $work/$1 in the background (pid), once trial 1 has a checkpoint sets
# id to the experiment's id (its jobs are dettrial-e<id>-t<trial>).
start_slow_search() {
  "$program" "${slow[@]}" --output "$work/$1" --launcher slurm >"$work/$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    ls "$work/$1"/trials/1/checkpoints/*/metadata.json >/dev/null 2>&1 && break
    sleep 0.1
  done
  id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$work/$1/experiment.json")
}
start_slow_search cancel
scancel --name="dettrial-e$id-t1" || fail "scancel failed"
wait "$pid"
status=$?
cat "$work/cancel.log"
[ "$status" -eq 0 ] || fail "the search with a cancelled trial exited with $status"
grep -q "trial 1 failed (.*); restart 1 of" "$work/cancel.log" || fail "the cancelled trial was not restarted"
python3 - "$work/cancel/summary.json" <<'PY' || fail "bad summary after the cancel"
import json, sys
s = json.load(open(sys.argv[1]))
t1 = s["trials"][0]
assert t1["restarts"] == 1 and t1["state"] == "COMPLETED" and t1["batches_trained"] == 64, t1
assert all(t["state"] == "COMPLETED" for t in s["trials"]), s
PY
# The runner killed (SIGKILL) while its trials' jobs run on, twice. A new runner adopts the jobs
# still running (no second job for a trial, no restart); a trial whose job ended while no runner
# watched it ends as that job did (nothing started again). Every job of the experiment is recorded.
watch_jobs() { while :; do squeue -h -o '%i %j' >>"$work/jobs.txt" 2>/dev/null; sleep 0.1; done; }
watch_jobs &
watcher=$!
trap 'kill $watcher 2>/dev/null' EXIT
wait_for_checkpoints() {  # of trials $@ in $work/killed
  for _ in $(seq 1 600); do
    local all=1
    for t in "$@"; do ls "$work/killed/trials/$t/checkpoints/"*/metadata.json >/dev/null 2>&1 || all=0; done
    [ $all -eq 1 ] && return 0
    sleep 0.1
  done
  return 1
}
start_slow_search killed
# The jobs held running until the next runner has looked at them (on a loaded machine they could
# otherwise end before it starts: a trial trains for about 3 s).
touch "$work/paused"
kill -KILL "$pid"
wait "$pid" 2>/dev/null
"$program" "${slow[@]}" --output "$work/killed" --launcher slurm >"$work/adopting.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ "$(grep -c "adopting its Slurm job" "$work/adopting.log")" -ge 2 ] && break
  sleep 0.1
done
rm -f "$work/paused"
wait_for_checkpoints 3 4 || { cat "$work/adopting.log"; fail "the runner that adopted trials 1 and 2 did not go on to trials 3 and 4"; }
kill -KILL "$pid"
wait "$pid" 2>/dev/null
cat "$work/adopting.log"
for t in 1 2; do
  grep -q "trial $t: adopting its Slurm job [0-9]* (RUNNING) from an earlier runner" "$work/adopting.log" || fail "trial $t's running job was not adopted"
done
# Trials 3 and 4 end on their own while no runner watches them.
ended=0
for _ in $(seq 1 300); do
  [ -z "$(squeue -h -t PENDING,RUNNING,COMPLETING -o %j | grep "^dettrial-e$id-t")" ] && { ended=1; break; }
  sleep 0.1
done
[ $ended -eq 1 ] || fail "trials 3 and 4's jobs were still running after 30 s: $(squeue -h -o '%i %j %T')"
"$program" "${slow[@]}" --output "$work/killed" --launcher slurm >"$work/continued.log" 2>&1 || { cat "$work/continued.log"; fail "the continued search failed"; }
cat "$work/continued.log"
for t in 3 4; do
  grep -q "trial $t's Slurm job [0-9]* ended while no runner watched it (COMPLETED)" "$work/continued.log" || fail "trial $t's ended job was not taken as its end"
done
python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); assert all(t["state"] == "COMPLETED" and t["batches_trained"] == 64 and t["restarts"] == 0 for t in s["trials"]), s' \
  "$work/killed/summary.json" || fail "the continued search did not complete every trial once, without restarts"
kill $watcher 2>/dev/null
wait $watcher 2>/dev/null
# One job per trial over the three runners (a second would have trained the trial twice).
python3 - "$work/jobs.txt" "dettrial-e$id-t" <<'PY' || fail "a trial ran as more than one Slurm job"
import collections, sys
jobs = collections.defaultdict(set)
for line in open(sys.argv[1]):
    job, _, name = line.strip().partition(" ")
    if name.startswith(sys.argv[2]):
        jobs[name].add(job)
print({name: sorted(ids) for name, ids in sorted(jobs.items())})
assert len(jobs) == 4 and all(len(ids) == 1 for ids in jobs.values()), jobs
PY
echo "ok: searches run as Slurm jobs end as the local runner's; a cancelled trial is restarted from its checkpoint; a restarted runner adopts its trials' jobs"
