#!/usr/bin/env bash
# Usage: experiments.sh CASE PROGRAM CONFIG_DIR WORK_DIR
# End-to-end experiment runs of tests/experiment/synthetic_trial (see the cases below).
set -u
case_name=$1 program=$2 configs=$3 work=$4
rm -rf "$work"
mkdir -p "$work"
fail() { echo "experiments.sh ($case_name): $*"; exit 1; }
summary() { python3 -c "import json,sys; s=json.load(open('$work/out/summary.json')); $1"; }

case "$case_name" in
random)
  "$program" --config "$configs/random.yaml" --output "$work/out" || fail "exit status $?"
  summary "assert len(s['trials']) == 4, s; assert all(t['state'] == 'COMPLETED' and t['batches_trained'] == 24 for t in s['trials']), s; \
best = min(s['trials'], key=lambda t: t['best_metric']); assert s['best_trial'] == best['id'], s; \
import glob, os; kept = glob.glob('$work/out/trials/*/checkpoints/*/metadata.json'); \
assert len(kept) == 1 and os.path.dirname(kept[0]) == best['best_checkpoint'], (kept, best); \
print('random: 4 trials completed; best', best['id'], 'and only its checkpoint kept')" || fail "bad summary"
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
  "$program" --config "$configs/crash.yaml" --set "data.marker_dir=$work" --output "$work/out" || fail "exit status $?"
  [ -f "$work/crashed" ] || fail "the trial did not crash"
  summary "t = {x['hparams']['crash']: x for x in s['trials']}; c = t[1]; assert c['state'] == 'COMPLETED' and c['restarts'] == 1 and c['batches_trained'] == 16, c; \
print('crash: the crashed trial restarted once from its checkpoint and completed')" || fail "bad summary"
  grep -q "resumed from" "$work/out/trials/"*/log.txt 2>/dev/null || true
  ;;
resume)
  # Interrupt the experiment once its first trial has ended, then run the same command again.
  "$program" --config "$configs/random.yaml" --set searcher.max_concurrent_trials=1 --output "$work/out" >"$work/first.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q '"event": "end"' "$work/out/events.jsonl" 2>/dev/null && break
    sleep 0.1
  done
  kill -INT "$pid"
  wait "$pid"
  status=$?
  cat "$work/first.log"
  [ "$status" -eq 75 ] || fail "interrupted experiment exited with $status, expected 75"
  ended_before=$(grep -c '"event": "end"' "$work/out/events.jsonl")
  "$program" --config "$configs/random.yaml" --set searcher.max_concurrent_trials=1 --output "$work/out" || fail "the second run failed"
  ends=$(grep -c '"event": "end"' "$work/out/events.jsonl")
  [ "$ends" -eq 4 ] || fail "$ends trials ended in all, expected 4 (each once)"
  summary "assert len(s['trials']) == 4 and all(t['state'] == 'COMPLETED' for t in s['trials']), s; \
print('resume: continued after', $ended_before, 'ended trial(s); 4 completed, none redone')" || fail "bad summary"
  ;;
*) fail "unknown case" ;;
esac
