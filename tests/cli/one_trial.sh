#!/usr/bin/env bash
# Usage: one_trial.sh PROGRAM SEARCH_CONFIG DATA_DIR OUTPUT_DIR
# A search config trains one trial where Determined does: with --test-mode (as `det experiment
# create --test`), and under searcher `single` over a search space (one point drawn from it, seeded
# by experiment_seed: the same point twice). A run that stopped before its first checkpoint is
# started afresh by --resume with a notice, its stale records dropped; without --config that is a
# clear error.
set -u
program=$1 config=$2 data=$3 out=$4
rm -rf "$out"
mkdir -p "$out"
small=(--set "data.dir=$data" --set data.train_split=t10k --set data.holdout=1000)
fail() { echo "one_trial: $*"; exit 1; }
drawn() {  # the hyperparameters in a run's checkpoint (load_data.json), one line
  python3 -c 'import json, sys, glob; p = sorted(glob.glob(sys.argv[1] + "/checkpoints/*/load_data.json"))[-1]; print(json.dumps(json.load(open(p))["experiment_config"]["hyperparameters"], sort_keys=True))' "$1"
}

"$program" --config "$config" "${small[@]}" --test-mode --output "$out/test-mode" >"$out/test-mode.log" 2>&1
status=$?
cat "$out/test-mode.log"
[ "$status" -eq 0 ] || fail "--test-mode of a search exited with $status"
grep -q -- "--test-mode of a search: one trial, with hyperparameters drawn from the space: {" "$out/test-mode.log" || fail "no notice for --test-mode of a search"
grep -q '"type":"validation"' "$out/test-mode/metrics.jsonl" || fail "--test-mode of a search did not validate"
# Drawn values are constants: the search space's maps are gone from the run's config.
hp=$(drawn "$out/test-mode") || fail "no checkpoint with load_data.json"
echo "drawn: $hp"
case $hp in *minval*|*'"type"'*) fail "the run's config still holds a search space: $hp" ;; esac

for run in single-a single-b; do
  "$program" --config "$config" "${small[@]}" --set searcher.name=single --set searcher.max_length.batches=3 \
    --set min_validation_period.batches=3 --output "$out/$run" >"$out/$run.log" 2>&1
  status=$?
  cat "$out/$run.log"
  [ "$status" -eq 0 ] || fail "searcher single over a space exited with $status"
  grep -q "searcher 'single' over a search space: one trial, with hyperparameters drawn from the space" "$out/$run.log" || fail "no notice for single over a space"
done
[ "$(drawn "$out/single-a")" = "$(drawn "$out/single-b")" ] || fail "the same experiment_seed drew different points"

# A run killed before its first checkpoint: a folder with a stale record and no checkpoint.
mkdir -p "$out/killed"
echo '{"type":"training","batches":40,"epochs":0,"metrics":{"loss":1.0}}' > "$out/killed/metrics.jsonl"
"$program" --resume "$out/killed" >"$out/killed-no-config.log" 2>&1
status=$?
cat "$out/killed-no-config.log"
[ "$status" -ne 0 ] || fail "--resume of a run without checkpoint and without --config succeeded"
grep -q "holds no checkpoint yet (the run stopped before its first), so it has no config of its own to resume with; give --config FILE" \
  "$out/killed-no-config.log" || fail "no clear error for --resume without checkpoint and config"
"$program" --config "$config" "${small[@]}" --test-mode --resume "$out/killed" >"$out/killed.log" 2>&1
status=$?
cat "$out/killed.log"
[ "$status" -eq 0 ] || fail "--resume of a run without checkpoint exited with $status"
grep -q "holds no checkpoint yet (the run stopped before its first): starting it afresh there" "$out/killed.log" || fail "no notice"
grep -q '"batches":40' "$out/killed/metrics.jsonl" && fail "the stale record is still in metrics.jsonl"
grep -q '"type":"validation"' "$out/killed/metrics.jsonl" || fail "the fresh run wrote no validation into the run's folder"
[ -n "$(ls "$out"/killed/checkpoints/*/metadata.json 2>/dev/null)" ] || fail "the fresh run wrote no checkpoint into the run's folder"
echo "ok: one trial from a search config (test mode, single over a space), a run without checkpoint started afresh"
