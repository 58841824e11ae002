#!/usr/bin/env bash
# The GPT example against nanoGPT's loop on this machine, side by side in one run, rounds
# alternating: examples/gpt on cpu.yaml (nanoGPT README's CPU run) through dettrial::main, and
# tests/python/nanogpt_reference.py (nanoGPT's model and train.py loop) eager and under
# torch.compile, the same config, threads and torch; then each one's model FLOPs utilization
# against this machine's measured float32 matrix-multiply peak (one thread and all), as nanoGPT's
# estimate_mfu counts a token's FLOPs (6 N + 12 L T C).
#   bench/gpt.sh BUILD [ITERS] [ROUNDS]       (BUILD: a build folder with examples/gpt)
# DETTRIAL_BENCH_THREADS sets the threads of both (default: every CPU); nothing else may run beside
# it: on 2 cores, two busy compilers beside it made the two-thread runs 5x slower, unevenly.
# The Python is the one of BUILD's LibTorch (DETTRIAL_PYTHON in its CMake cache); tokens/s are
# over the iterations after the first 100 (dettrial: its training reports after the first; Python:
# after the first 10%, which holds torch.compile's compilation).
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1 iters=${2:-500} rounds=${3:-2}
python=$(sed -n 's/^DETTRIAL_PYTHON:FILEPATH=//p' "$build/CMakeCache.txt")
[ -x "$python" ] || { echo "bench/gpt.sh: $build has no DETTRIAL_PYTHON" >&2; exit 1; }
data=$(scripts/gpt-data)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
threads=${DETTRIAL_BENCH_THREADS:-$(nproc)}
config='{"block_size": 64, "vocab_size": 84, "n_layer": 4, "n_head": 4, "n_embd": 128, "dropout": 0.0, "bias": false, "batch_size": 12,
         "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 100, "lr_decay_iters": 2000, "weight_decay": 0.1, "beta1": 0.9,
         "beta2": 0.99, "grad_clip": 1.0}'
results=$scratch/results.jsonl
for round in $(seq "$rounds"); do
  out=$scratch/run-$round
  "$build/examples/gpt" --config examples/gpt/cpu.yaml --set "data.dir=$data" --set "searcher.max_length.batches=$iters" \
    --set min_validation_period.batches=100000000 --set data.sample_tokens=0 --threads "$threads" --output "$out" >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; exit 1; }
  "$python" - "$out/metrics.jsonl" "$round" >>"$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"training"' in l]
rates = [r["samples_per_second"] for r in rows[1:]] or [rows[-1]["samples_per_second"]]
print(json.dumps({"who": "dettrial", "round": int(sys.argv[2]), "tokens_per_second": 64 * sum(rates) / len(rates)}))
PY
  for mode in eager compile; do
    if NANOGPT_THREADS=$threads "$python" tests/python/nanogpt_reference.py bench "$scratch/py" 1337 "$config" "$data" 5 "$iters" \
         $([ "$mode" = compile ] && echo compile) >"$scratch/py.log" 2>&1; then
      tail -n 1 "$scratch/py.log" | "$python" -c "import json,sys; r=json.loads(sys.stdin.read()); r.update(who='python $mode', round=$round); print(json.dumps(r))" >>"$results"
    else
      echo "{\"who\": \"python $mode\", \"round\": $round, \"failed\": $(tail -n 3 "$scratch/py.log" | "$python" -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}" >>"$results"
    fi
  done
done
"$python" - "$results" "$threads" <<'PY'
import json, statistics, sys, time
import torch
rows = [json.loads(l) for l in open(sys.argv[1])]
threads = int(sys.argv[2])
def peak(n_threads, n=1024, reps=20):
    torch.set_num_threads(n_threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 * reps / best
peaks = {1: peak(1), threads: peak(threads)}
L, T, C, V = 4, 64, 128, 84
params = V * C + L * (12 * C * C + 2 * C) + C  # wte (the tied head), the blocks, ln_f: nanoGPT's non-embedding count (wpe left out)
flops_per_token = 6 * params + 12 * L * T * C
def median(who):
    values = [r["tokens_per_second"] for r in rows if r["who"] == who and "tokens_per_second" in r]
    return statistics.median(values) if values else None
d, e, c = median("dettrial"), median("python eager"), median("python compile")
print(f"GPT, nanoGPT README's CPU config (block 64, batch 12, 4 layers, 4 heads, 128 wide), {threads} threads, torch {torch.__version__}")
print(f"{'':40s}{'tokens/s (median)':>20s}{'rounds':>30s}{'MFU':>10s}")
for who, v in (("dettrial (examples/gpt)", d), ("nanoGPT's loop, eager", e), ("nanoGPT's loop, torch.compile", c)):
    key = {"dettrial (examples/gpt)": "dettrial", "nanoGPT's loop, eager": "python eager", "nanoGPT's loop, torch.compile": "python compile"}[who]
    rounds = " ".join(f"{r['tokens_per_second']:.0f}" for r in rows if r["who"] == key and "tokens_per_second" in r)
    if v is None:
        failed = [r.get("failed", "") for r in rows if r["who"] == key]
        print(f"{who:40s}{'did not run':>20s}   {failed[0][-200:] if failed else ''}")
        continue
    print(f"{who:40s}{v:20.0f}{rounds:>30s}{v * flops_per_token / peaks[threads]:10.3f}")
print(f"ratio dettrial / eager: {d / e:.2f}" + (f"; dettrial / compiled: {d / c:.2f}" if c else ""))
print(f"float32 matmul peak (1024^3): {peaks[1] / 1e9:.1f} GFLOP/s on 1 thread, {peaks[threads] / 1e9:.1f} on {threads} (MFU's);"
      f" {flops_per_token:,} FLOPs a token")
PY
