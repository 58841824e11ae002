#!/usr/bin/env bash
# Usage: rank_counts.sh PROGRAM CONFIG WORK_DIR
# A run checkpointed mid-epoch on N ranks and resumed on M (2->3, 3->2, 2->1, 1->2) trains exactly
# the global batches, record for record and in order, of the same run on N ranks without a break,
# logs a restart record naming both counts, and gives each rank a generator stream of its own. A
# global batch that the new count does not divide is refused in one sentence (status 78).
set -u
program=$1 config=$2 work=$3
source "$(dirname "$0")/lib.sh"
job() {  # NAME RANKS ARGS...: runs the trial on RANKS ranks (built-in launcher), logs in WORK/NAME.log
  local name=$1 ranks=$2
  shift 2
  "$program" --nproc "$ranks" --timeout 60 "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name exited with $?"; }
}
for n in 1 2 3; do
  job "reference-$n" "$n" --config "$config" --output "$work/reference-$n"
  # Checkpointed at batch 10 of a 17-batch epoch, the run stops there.
  job "part-$n" "$n" --config "$config" --set searcher.max_length.batches=10 --output "$work/part-$n"
done
for pair in 2:3 3:2 2:1 1:2; do
  n=${pair%:*} m=${pair#*:}
  cp -r "$work/part-$n" "$work/resumed-$n-$m"
  job "resumed-$n-$m" "$m" --resume "$work/resumed-$n-$m" --set searcher.max_length.batches=40
  grep -q "keeps the global batches of the $n-rank job" "$work/resumed-$n-$m.log" ||
    [ "$n" -eq "$m" ] || { cat "$work/resumed-$n-$m.log"; fail "the $n->$m run does not say it keeps the $n-rank global batches"; }
  echo "$n ranks -> $m:"
  python3 "$here/compare.py" "$work/reference-$n" "$work/resumed-$n-$m" "$n>$m" || fail "$n->$m"
done
# 6 records do not divide among 4 ranks.
cp -r "$work/part-2" "$work/resumed-2-4"
"$program" --nproc 4 --timeout 60 --resume "$work/resumed-2-4" >"$work/resumed-2-4.log" 2>&1
status=$?
grep -q "global_batch_size 6 does not divide among 4 ranks" "$work/resumed-2-4.log" || { cat "$work/resumed-2-4.log"; fail "no sentence for 4 ranks"; }
[ "$status" -eq 78 ] || fail "resuming on 4 ranks exited with $status, expected 78"
echo "ok: resumed on another rank count, every run trained the global batches of its first count"
