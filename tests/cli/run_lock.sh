#!/usr/bin/env bash
# Usage: run_lock.sh PROGRAM CONFIG SEARCH_CONFIG DATA_DIR OUTPUT_DIR
# One process per run folder: a second process started on a live run's folder (--resume, or the
# same --output) exits with status 1 and one sentence naming the holder's pid and host, leaving the
# folder as it was; once the holder is killed with SIGKILL, --resume continues at once (the kernel
# released the lock). The same for a search's experiment folder.
set -u
program=$1 config=$2 search_config=$3 data=$4 out=$5
rm -rf "$out" "$out.search"
mkdir -p "$(dirname "$out")"
fail() { echo "run_lock: $*"; exit 1; }
wait_for_lock() {  # until FOLDER/.lock names pid PID (at most 60 s)
  for _ in $(seq 1 600); do
    grep -q "^pid $2 on host " "$1/.lock" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "'$1/.lock' never named pid $2"
}
"$program" --config "$config" --set "data.dir=$data" --set "min_checkpoint_period.batches=20" --output "$out" >"$out.log" 2>&1 &
holder=$!
wait_for_lock "$out" "$holder"
for _ in $(seq 1 600); do  # until it has a checkpoint
  ls "$out"/checkpoints/*/metadata.json >/dev/null 2>&1 && break
  sleep 0.1
done
host=$(hostname)
records=$(wc -l <"$out/metrics.jsonl")
for second in "--resume $out" "--config $config --set data.dir=$data --output $out"; do
  # shellcheck disable=SC2086
  "$program" $second >"$out.second.log" 2>&1
  status=$?
  cat "$out.second.log"
  [ "$status" -eq 1 ] || fail "a second process ($second) exited with $status, expected 1"
  grep -q "in use by pid $holder on host $host" "$out.second.log" || fail "the refusal does not name pid $holder on host $host"
  [ "$(grep -c . "$out.second.log")" -eq 1 ] || fail "the refusal is not one line"
done
# A refused --resume once dropped the live run's records after its checkpoint: they only grow.
[ "$(wc -l <"$out/metrics.jsonl")" -ge "$records" ] || fail "metrics.jsonl lost records while the second processes were refused"
kill -0 "$holder" 2>/dev/null || fail "the first run ended early (see $out.log)"
kill -KILL "$holder"
wait "$holder" 2>/dev/null
batches=$(python3 -c 'import json,sys,glob; print(max(json.load(open(f))["steps_completed"] for f in glob.glob(sys.argv[1] + "/checkpoints/*/metadata.json")))' "$out")
target=$((batches + 5))
"$program" --resume "$out" --set "searcher.max_length.batches=$target" >"$out.resume.log" 2>&1 || { cat "$out.resume.log"; fail "--resume after SIGKILL failed"; }
grep -q "resumed from .* at batch $batches" "$out.resume.log" || { cat "$out.resume.log"; fail "did not resume at batch $batches"; }
grep -q "\"batches\":$target," "$out/metrics.jsonl" || fail "metrics.jsonl does not reach batch $target"

# A search: one runner per experiment folder.
search=(--config "$search_config" --set "data.dir=$data" --set data.train_split=t10k --set data.holdout=1000 --output "$out.search")
"$program" "${search[@]}" >"$out.search.log" 2>&1 &
runner=$!
wait_for_lock "$out.search" "$runner"
"$program" "${search[@]}" >"$out.search.second.log" 2>&1
status=$?
cat "$out.search.second.log"
[ "$status" -eq 1 ] || fail "a second search runner exited with $status, expected 1"
grep -q "experiment folder '.*' is in use by pid $runner on host $host" "$out.search.second.log" || fail "the search's refusal does not name pid $runner"
kill -TERM "$runner"
wait "$runner"
echo "ok: a second process is refused in one sentence naming the holder; a SIGKILLed holder's lock is gone"
