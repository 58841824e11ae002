#!/usr/bin/env bash
# continue.sh DIRECTION TRIAL DETERMINED_PYTHON CONFIG DATA WORK OPTIMIZER SCHEDULER LIBTORCH_VERSION [NET]
# (NET: plain, or batchnorm for a BatchNorm2d after the first convolution)
# One direction of moving a run between Determined and dettrial, against PyPI's `determined`:
#   from-determined: Determined trains N batches and checkpoints; Determined continues that
#     checkpoint for M batches, and so does dettrial (TRIAL --resume); the two continuations must
#     train the same records in the same batches with the same losses.
#   to-determined: dettrial trains N batches from scratch (which must be what Determined trains
#     from scratch with the same trial seed) and checkpoints; dettrial continues it for M batches,
#     and so does Determined (Trainer.fit(latest_checkpoint=...)); the same comparison.
# N = 20 and M = 22 with 1000 records in batches of 64 (16 a epoch, the last of 40): the checkpoint
# falls mid-epoch, and the continuation crosses two epoch ends.
set -euo pipefail
direction=$1 trial=$2 python=$3 config=$4 data=$5 work=$6 optimizer=$7 scheduler=$8 libtorch=${9:-} net=${10:-plain}
here=$(cd "$(dirname "$0")" && pwd)
# The torch Determined runs on, from its package metadata (importing torch takes seconds, and each
# Python below pays it once already).
if [ -z "$python" ] || ! python_torch=$("$python" -c 'import determined; from importlib.metadata import version; print(version("torch").split("+")[0])' 2>/dev/null); then
  echo "skipped: PyPI's determined is not installed (the suite's determined venv; scripts/test installs it)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
# Bit-equal losses need the same kernels: a LibTorch of another release than the torch Determined
# runs on (Debian's 1.13 against the wheel's 2.x) rounds some of them differently in the last bit.
if [ -z "${DETTRIAL_LOSS_TOLERANCE:-}" ] && [ "$python_torch" != "$libtorch" ]; then
  echo "LibTorch $libtorch here, torch $python_torch under Determined: losses compared to 1e-6 relative"
  export DETTRIAL_LOSS_TOLERANCE=1e-6
fi
n=20 m=22
# Determined's runs, in one command (determined_mnist.py imports torch and Determined once, and
# forks each run): "--then" starts the next run, which names this test's trial again.
det() { "$python" "$here/determined_mnist.py" "$@"; }
trial_args=(--data "$data" --optimizer "$optimizer" --scheduler "$scheduler" --net "$net")
# determined_mnist.py's learning rates: 0.03 for SGD, 0.002 for the others.
lr=0.002
[ "$optimizer" = sgd ] && lr=0.03
dt() {
  "$trial" --config "$config" --quiet --threads 1 --set data.dir="$data" --set data.optimizer="$optimizer" --set data.scheduler="$scheduler" \
    --set data.net="$net" \
    --set hyperparameters.learning_rate=$lr "$@"
}
case $direction in
  from-determined)
    det "${trial_args[@]}" --batches $n --checkpoint-to "$work/checkpoint" --log "$work/first.jsonl" --then \
        "${trial_args[@]}" --batches $m --resume "$work/checkpoint" --log "$work/determined.jsonl" >/dev/null
    dt --resume "$work/checkpoint" --output "$work/dettrial-run" --set searcher.max_length.batches=$((n + m)) \
       --set data.log="$work/dettrial.jsonl"
    # Its weights alone, as a warm start (dettrial::load_weights on the checkpoint directory).
    dt --output "$work/warm-start" --set data.weights_from="$work/checkpoint" --set searcher.max_length.batches=1
    if [ "$optimizer" = adam ]; then
      # Adam's state does not go into SGD: an error naming it, or with --resume-fresh-parts one warning.
      if out=$(dt --resume "$work/checkpoint" --output "$work/into-sgd" --set data.optimizer=sgd --set searcher.max_length.batches=$((n + 1)) 2>&1); then
        echo "an Adam checkpoint was resumed into SGD without a word"; exit 1
      fi
      grep -q "optimizer 0, group 0 has option 'betas', which SGD does not have" <<<"$out" || { echo "$out"; exit 1; }
      out=$(dt --resume "$work/checkpoint" --output "$work/into-sgd-fresh" --set data.optimizer=sgd \
               --set searcher.max_length.batches=$((n + 1)) --resume-fresh-parts 2>&1) || { echo "$out"; exit 1; }
      grep -q "warning: optimizer 0 starts fresh" <<<"$out" || { echo "$out"; exit 1; }
    fi
    if [ "$optimizer" = adamw ]; then
      # AdamW's decoupled weight decay is another update than Adam's L2: refused by name, never
      # trained on as Adam (torch 2.x writes decoupled_weight_decay: True in AdamW's groups).
      if out=$(dt --resume "$work/checkpoint" --output "$work/into-adam" --set data.optimizer=adam --set searcher.max_length.batches=$((n + 1)) 2>&1); then
        echo "an AdamW checkpoint was resumed into Adam without a word"; exit 1
      fi
      grep -q "decoupled_weight_decay: True, which the trial's Adam does not do" <<<"$out" || { echo "$out"; exit 1; }
    fi ;;
  to-determined)
    dt --output "$work/first-run" --set searcher.max_length.batches=$n --set data.log="$work/first.jsonl"
    checkpoint=$(ls -d "$work"/first-run/checkpoints/*/ | head -n 1)
    dt --resume "$checkpoint" --output "$work/dettrial-run" --set searcher.max_length.batches=$((n + m)) \
       --set data.log="$work/dettrial.jsonl"
    # Determined reads the checkpoint (check_checkpoint.py), trains from scratch seeded with
    # dettrial's trial seed (the one the checkpoint's generators were seeded with), which must be
    # dettrial's first batches, and continues the checkpoint: three runs of one command.
    det check_checkpoint "$checkpoint" --then \
        "${trial_args[@]}" --batches $n --seed-from "$checkpoint" --log "$work/first-determined.jsonl" --then \
        "${trial_args[@]}" --batches $m --resume "$checkpoint" --log "$work/determined.jsonl"
    /usr/bin/python3 "$here/compare.py" "$work/first-determined.jsonl" "$work/first.jsonl" --first 0 --batches $n ;;
  *) echo "unknown direction $direction" >&2; exit 2 ;;
esac
/usr/bin/python3 "$here/compare.py" "$work/determined.jsonl" "$work/dettrial.jsonl" --first $n --batches $m
