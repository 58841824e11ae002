#!/usr/bin/env bash
# Usage: experiments.sh CASE PROGRAM CONFIG_DIR WORK_DIR
# End-to-end experiment runs of tests/experiment/synthetic_trial (see the cases below).
set -u
case_name=$1 program=$2 configs=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
fail() { echo "experiments.sh ($case_name): $*"; exit 1; }
# Runs a command with its output in LOG (then printed); fails unless it exits with STATUS.
expect_status() {
  local expected=$1 log=$2
  shift 2
  "$@" >"$log" 2>&1
  local status=$?
  cat "$log"
  [ "$status" -eq "$expected" ] || fail "$(basename "$log" .log): exit status $status, expected $expected"
}
summary() { python3 -c "import json,sys; s=json.load(open('$work/out/summary.json')); $1"; }
# No report in any trial's metrics.jsonl twice, and no validation told to the searcher twice.
no_duplicates() {
  python3 - "$work/out" <<'PY' || fail "duplicate records"
import collections, glob, json, sys
for path in glob.glob(sys.argv[1] + "/trials/*/metrics.jsonl"):
    keys = [(r["type"], r["batches"]) for r in map(json.loads, open(path))]
    twice = [k for k, n in collections.Counter(keys).items() if n > 1]
    assert not twice, (path, twice)
events = [json.loads(l) for l in open(sys.argv[1] + "/events.jsonl")]
told = [(e["trial"], e["batches"]) for e in events if e["event"] == "validation"]
assert len(told) == len(set(told)), collections.Counter(told).most_common(3)
PY
}

case "$case_name" in
random)
  "$program" --config "$configs/random.yaml" --output "$work/out" || fail "exit status $?"
  summary "assert len(s['trials']) == 4, s; assert all(t['state'] == 'COMPLETED' and t['batches_trained'] == 24 for t in s['trials']), s; \
best = min(s['trials'], key=lambda t: t['best_metric']); assert s['best_trial'] == best['id'], s; \
import glob, os; kept = glob.glob('$work/out/trials/*/checkpoints/*/metadata.json'); \
assert len(kept) == 1 and os.path.dirname(kept[0]) == best['best_checkpoint'], (kept, best); \
print('random: 4 trials completed; best', best['id'], 'and only its checkpoint kept')" || fail "bad summary"
  ;;
dist_random)
  # Each trial is a 2-rank job (the runner starts the trial's program, whose launcher starts its ranks).
  "$program" --config "$configs/dist_random.yaml" --output "$work/out" || fail "exit status $?"
  summary "assert len(s['trials']) == 2, s; assert all(t['state'] == 'COMPLETED' and t['batches_trained'] == 12 for t in s['trials']), s; \
print('dist_random: 2 trials of 2 ranks completed')" || fail "bad summary"
  # Each trial's checkpoints say the job that wrote them had 2 ranks.
  python3 - "$work/out" <<'PY' || fail "a trial did not train on 2 ranks"
import glob, json, sys
states = glob.glob(sys.argv[1] + "/trials/*/checkpoints/*/trial_state.json")
assert len({s.split("/trials/")[1].split("/")[0] for s in states}) == 2, states
for s in states:
    assert json.load(open(s))["ranks"] == 2, s
print("dist_random: every checkpoint was written by a 2-rank job")
PY
  no_duplicates
  ;;
asha)
  "$program" --config "$configs/asha.yaml" --output "$work/out" || fail "exit status $?"
  summary "t = s['trials']; stopped = [x for x in t if x['state'] == 'STOPPED_EARLY']; \
assert len(t) == 12, len(t); assert stopped, 'ASHA stopped nothing'; \
assert all(x['restarts'] == 0 for x in t), [x for x in t if x['restarts']]; \
assert all(x['batches_trained'] == 64 for x in t if x['state'] == 'COMPLETED'), t; \
assert any(x['batches_trained'] < 64 for x in stopped), 'no trial was stopped before max_time'; \
best = min((x for x in t if x['best_metric'] is not None), key=lambda x: x['best_metric']); assert s['best_trial'] == best['id']; \
import os; assert os.path.isdir(best['best_checkpoint']), best; \
print('asha:', len(stopped), 'of', len(t), 'trials stopped by the searcher; best', best['id'], best['best_metric'])" || fail "bad summary"
  ;;
crash)
  # Reports every 2 batches, validations every 3 and checkpoints only every 4: the crash at batch 7
  # comes after records past the checkpoint at batch 4, which the restarted trial writes again.
  # Checkpoints written in the step loop: an abort three batches after a checkpoint written in the
  # background may come before its write ends (the checkpoint before it is then the latest).
  "$program" --config "$configs/crash.yaml" --set "data.marker_dir=$work" --set scheduling_unit=2 --set min_validation_period.batches=3 \
    --set checkpoint_policy=none --set checkpoint_storage.async=false --output "$work/out" || fail "exit status $?"
  [ -f "$work/crashed" ] || fail "the trial did not crash"
  summary "t = {x['hparams']['crash']: x for x in s['trials']}; c = t[1]; assert c['state'] == 'COMPLETED' and c['restarts'] == 1 and c['batches_trained'] == 16, c; \
print('crash: the crashed trial restarted once from its checkpoint and completed')" || fail "bad summary"
  no_duplicates
  # Resumed from the checkpoint at batch 4 (a restart from scratch would drop nothing and say no batch).
  grep -q "resuming at batch 4: dropped 2 record(s) of .*metrics.jsonl written after that checkpoint" "$work/out/trials/"*/log.txt || fail "the restart did not resume at batch 4, dropping the records past that checkpoint"
  ;;
restart_single)
  # A trial run on its own (searcher single) that throws once at batch 7 restarts in-process from its
  # checkpoint at batch 4 (max_restarts: 1) and completes; records past that checkpoint are redone once.
  expect_status 0 "$work/restart.log" "$program" --config "$configs/single_restart.yaml" --set "data.marker_dir=$work" --output "$work/run"
  [ -f "$work/crashed" ] || fail "the trial did not fail"
  grep -q "dettrial: the trial failed: synthetic failure at batch 7, once" "$work/restart.log" || fail "the failure is not reported"
  grep -q "restarting it from its checkpoint at batch 4: restart 1 of max_restarts 1" "$work/restart.log" || fail "no restart from batch 4"
  python3 - "$work/run/metrics.jsonl" <<'PY' || fail "bad metrics.jsonl after the restart"
import collections, json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
keys = [(r["type"], r["batches"]) for r in records]
assert not [k for k, n in collections.Counter(keys).items() if n > 1], keys
assert max(r["batches"] for r in records if r["type"] == "validation") == 16, keys
PY
  # With max_restarts 0 the same failure ends the run (exit status 1, the error on the terminal).
  rm -f "$work/crashed"
  expect_status 1 "$work/no_restart.log" "$program" --config "$configs/single_restart.yaml" --set "data.marker_dir=$work" \
    --set max_restarts=0 --output "$work/run0"
  grep -q "error: synthetic failure at batch 7, once" "$work/no_restart.log" || fail "max_restarts 0: no error"
  ! grep -q "restarting" "$work/no_restart.log" || fail "max_restarts 0 restarted"
  # A failure before the first checkpoint would only repeat: no restart, whatever max_restarts says.
  expect_status 1 "$work/early.log" "$program" --config "$configs/single_restart.yaml" --set hyperparameters.crash=2 \
    --set max_restarts=5 --output "$work/run2"
  ! grep -q "restarting" "$work/early.log" || fail "a failure before any checkpoint was restarted"
  echo "restart_single: restarted once from batch 4 and completed; no restart with max_restarts 0 or before a checkpoint"
  ;;
config_error)
  # A hyperparameter the trial reads is missing from the space: the first trial says so, the search
  # stops (no restarts, no second trial) and exits 78 with the error on the terminal.
  expect_status 78 "$work/out.log" "$program" --config "$configs/missing_hparam.yaml" --output "$work/out"
  grep -q "the search stopped: trial 1's configuration is wrong" "$work/out.log" || fail "no stop message"
  grep -q "error: .*'lr'" "$work/out.log" || fail "the trial's error (the hyperparameter lr) is not on the terminal"
  grep -q "missing_hparam.yaml" "$work/out.log" || fail "the user's config file is not named"
  [ ! -e "$work/out/trials/2" ] || fail "a second trial was started"
  [ "$(grep -c 'trial 1 started' "$work/out.log")" -eq 1 ] || fail "trial 1 was started more than once"
  # The searcher metric misspelled: the same, with a suggestion.
  expect_status 78 "$work/metric.log" "$program" --config "$configs/random.yaml" --set searcher.metric=val_loss \
    --set searcher.max_concurrent_trials=1 --output "$work/metric"
  grep -q "searcher.metric 'val_loss' is not a metric validation reports (it reported .*validation_loss); did you mean 'validation_loss'?" \
    "$work/metric.log" || fail "misspelled metric: no clear error"
  echo "config_error: both searches stopped at their first trial with exit status 78"
  ;;
failed_trial)
  # A trial that fails every time before its first checkpoint ends ERRORED without a restart (one
  # would start where it began: RestartPolicy); the experiment exits 1 and says so.
  expect_status 1 "$work/out.log" "$program" --config "$configs/failing.yaml" --output "$work/out"
  grep -q "1 of 2 trials failed" "$work/out.log" || fail "no failure count"
  grep -q "error: synthetic failure at batch 3" "$work/out.log" || fail "the trial's error is not on the terminal"
  grep -q "is not restarted: it failed before writing a new checkpoint" "$work/out.log" || fail "no reason given for not restarting"
  summary "t = {x['hparams']['crash']: x for x in s['trials']}; assert t[0]['state'] == 'COMPLETED' and t[2]['state'] == 'ERRORED' and t[2]['restarts'] == 0, t; \
print('failed_trial: ERRORED without a restart (no progress), the other completed, exit status 1')" || fail "bad summary"
  ;;
progressing)
  # A trial that fails after progress every time (at batches 5, 9 and 13, checkpointing every 2):
  # max_restarts 2 is the trial's whole life, spent by the runner alone: 3 attempts, from batch 0,
  # 4 and 8, then ERRORED; its process never restarts itself (the runner starts it with --max-restarts 0).
  expect_status 1 "$work/out.log" "$program" --config "$configs/progressing.yaml" --set "data.marker_dir=$work" --output "$work/out"
  log=$(ls "$work"/out/trials/*/log.txt)
  failures=$(grep -o "synthetic failure at batch [0-9]*" "$log" | sort -u | tr '\n' ' ')
  [ "$failures" = "synthetic failure at batch 13 synthetic failure at batch 5 synthetic failure at batch 9 " ] ||
    fail "the attempts failed at: $failures (expected batches 5, 9 and 13: three attempts)"
  ! grep -q "restarting it from its checkpoint" "$log" || fail "the trial's own process restarted it too"
  grep -q "failed (.*) after 2 restart(s) and is not restarted: it used its 2 restart(s) (max_restarts)" "$work/out.log" ||
    fail "no sentence for the spent restarts"
  summary "t = s['trials'][0]; assert t['state'] == 'ERRORED' and t['restarts'] == 2 and t['batches_trained'] == 12, t; \
print('progressing: 3 attempts (restarts 2 of max_restarts 2, by the runner alone), ERRORED at batch 12')" || fail "bad summary"
  ;;
ctrl_c)
  # Ctrl-C in a terminal signals the whole foreground process group: the runner and, unless they have
  # groups of their own, every trial (which then also gets the runner's SIGTERM and aborts).
  setsid "$program" --config "$configs/random.yaml" --set searcher.max_length.batches=400 --set data.batch_sleep_ms=10 \
    --set scheduling_unit=5 --output "$work/out" >"$work/first.log" 2>&1 &
  pid=$!
  # Both trials training (one training report each), so that both have their stop handlers.
  for _ in $(seq 1 600); do
    [ "$(grep -c training "$work/out/trials/1/metrics.jsonl" 2>/dev/null)" -ge 1 ] &&
      [ "$(grep -c training "$work/out/trials/2/metrics.jsonl" 2>/dev/null)" -ge 1 ] && break
    sleep 0.1
  done
  kill -INT -- "-$pid"
  wait "$pid"
  status=$?
  cat "$work/first.log"
  [ "$status" -eq 75 ] || fail "interrupted experiment exited with $status, expected 75"
  for trial in 1 2; do
    log="$work/out/trials/$trial/log.txt"
    [ "$(grep -c 'stop signal received' "$log")" -eq 1 ] || { cat "$log"; fail "trial $trial did not get exactly one stop signal"; }
    [ -n "$(ls "$work/out/trials/$trial/checkpoints")" ] || fail "trial $trial left no checkpoint"
  done
  summary "assert [t['state'] for t in s['trials'][:2]] == ['INTERRUPTED', 'INTERRUPTED'], s" || fail "bad summary"
  "$program" --config "$configs/random.yaml" --set searcher.max_length.batches=400 --set scheduling_unit=5 --output "$work/out" \
    >"$work/second.log" 2>&1 || { cat "$work/second.log"; fail "the second run failed"; }
  summary "assert len(s['trials']) == 4 and all(t['state'] == 'COMPLETED' and t['batches_trained'] == 400 for t in s['trials']), s" || fail "bad summary"
  no_duplicates
  echo "ctrl_c: both trials checkpointed on one signal each; the second run completed them without a repeated record"
  ;;
resume)
  # Interrupt the experiment once its first trial has ended, then run the same command again.
  "$program" --config "$configs/random.yaml" --set searcher.max_concurrent_trials=1 --output "$work/out" >"$work/first.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q '"event":"end"' "$work/out/events.jsonl" 2>/dev/null && break
    sleep 0.1
  done
  kill -INT "$pid"
  wait "$pid"
  status=$?
  cat "$work/first.log"
  [ "$status" -eq 75 ] || fail "interrupted experiment exited with $status, expected 75"
  ended_before=$(grep -c '"event":"end"' "$work/out/events.jsonl")
  "$program" --config "$configs/random.yaml" --set searcher.max_concurrent_trials=1 --output "$work/out" || fail "the second run failed"
  ends=$(grep -c '"event":"end"' "$work/out/events.jsonl")
  [ "$ends" -eq 4 ] || fail "$ends trials ended in all, expected 4 (each once)"
  summary "assert len(s['trials']) == 4 and all(t['state'] == 'COMPLETED' for t in s['trials']), s; \
print('resume: continued after', $ended_before, 'ended trial(s); 4 completed, none redone')" || fail "bad summary"
  ;;
*) fail "unknown case" ;;
esac
