#!/usr/bin/env bash
# Usage: gpt_example.sh GPT GPT_SAMPLE DATA OUT CONFIG
# The GPT example on the suite's slice of Shakespeare through dettrial::main (CONFIG, cpu.yaml,
# shortened to 60 batches), its samples at each validation, then gpt_sample continuing a prompt
# from its checkpoint. Exits 77 (skipped) without the slice.
set -uo pipefail
gpt=$1 sample=$2 data=$3 out=$4 config=$5
[ -f "$data/train.bin" ] || { echo "skipped: no corpus slice in $data (scripts/gpt-data)"; exit 77; }
rm -rf "$out"
"$gpt" --config "$config" --set "data.dir=$data" --set searcher.max_length.batches=60 --set min_validation_period.batches=30 \
  --set data.eval_iters=4 --set data.sample_tokens=80 --output "$out" || exit 1
grep -q -- "---- batch 60" "$out/samples.txt" || { echo "gpt_example: no samples of batch 60 in $out/samples.txt"; exit 1; }
"$sample" "$out/checkpoints" --prompt "ROMEO:" --tokens 40 --seed 3 >"$out/sample.txt" || exit 1
cat "$out/sample.txt"
[ "$(head -c 6 "$out/sample.txt")" = "ROMEO:" ] && [ "$(wc -c <"$out/sample.txt")" -ge 46 ] ||
  { echo "gpt_example: gpt_sample did not continue the prompt with 40 characters"; exit 1; }
"$sample" "$out/checkpoints" --prompt "ROMEO:" --tokens 40 --seed 3 | cmp -s - "$out/sample.txt" ||
  { echo "gpt_example: gpt_sample with the same seed wrote other text"; exit 1; }
