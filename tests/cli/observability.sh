#!/usr/bin/env bash
# Usage: observability.sh PROGRAM DATA_DIR OUTPUT_DIR TENSORBOARD_PYTHON
# The MNIST example trains 40 batches with the profiler on over batches 3-5 and the system metrics
# sampled, then resumes from its checkpoint at batch 20 and trains to 50. Then:
# - Python's TensorBoard reader returns every metric of metrics.jsonl at its batch, once (the stopped
#   run's events after batch 20 are gone), each system metrics report at its batch, and the
#   hyperparameters as one hparams session;
# - trace.json is a Chrome trace naming the model's operators and dettrial's phases;
# - TensorBoard's server serves the run's scalars, and its page's screenshot is written.
set -u
program=$1 data=$2 out=$3 python=$4
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "observability: $*"; exit 1; }
rm -rf "$out"
mkdir -p "$(dirname "$out")"
# The profiling section, absent from the file, is made by --set.
"$program" --config "$here/observability.yaml" --set "data.dir=$data" --set profiling.enabled=true \
  --set profiling.begin_on_batch=3 --set profiling.end_after_batch=5 --set profiling.sampling_interval=0.2 \
  --set profiling.samples_per_report=2 --output "$out" >"$out.log" 2>&1
status=$?
cat "$out.log"
[ "$status" -eq 0 ] || fail "the first run exited with $status"
grep -q "profiled batches 3-5: .*trace.json" "$out.log" || fail "no line saying what was profiled"
grep -q "system metrics (profiling.enabled) sampled every 0.2 s" "$out.log" || fail "no line saying the system metrics are sampled"
grep -q '"type":"system".*"cpu_util_simple"' "$out/metrics.jsonl" || fail "no system metrics in metrics.jsonl"
metadata=$(grep -l '"steps_completed": 20,' "$out"/checkpoints/*/metadata.json | head -n 1)
[ -n "$metadata" ] || fail "no checkpoint at batch 20"
# The resumed run samples too (a report every 0.1 s): its system records, past the checkpoint, are
# what the reader below compares with TensorBoard's (no batch of it is traced: trace.json stays the first run's).
"$program" --config "$here/observability.yaml" --set "data.dir=$data" --set searcher.max_length.batches=50 \
  --set profiling.enabled=true --set profiling.begin_on_batch=1000 \
  --set profiling.sampling_interval=0.1 --set profiling.samples_per_report=1 --resume "$(dirname "$metadata")" >"$out.resume.log" 2>&1
status=$?
cat "$out.resume.log"
[ "$status" -eq 0 ] || fail "the resumed run exited with $status"
grep -q "dropped .* event(s) .* written after that checkpoint" "$out.resume.log" || fail "the resume did not drop the stopped run's events"
grep -q '"type":"system".*"cpu_util_simple"' "$out/metrics.jsonl" || fail "no system metrics in the resumed run's metrics.jsonl"
"$python" "$here/../python/read_tensorboard.py" "$out" learning_rate=0.05 dropout=0.2 n_filters1=8 global_batch_size=64 ||
  fail "TensorBoard's reader disagrees with metrics.jsonl"
python3 - "$out/trace.json" <<'PY' || fail "bad trace.json"
import collections, json, sys
trace = json.load(open(sys.argv[1]))
# Host-side events only: on CUDA, Kineto also draws each annotation on the GPU's timeline.
names = collections.Counter(e.get("name") for e in trace["traceEvents"] if isinstance(e, dict) and e.get("cat") != "gpu_user_annotation")
assert names["dettrial::train_batch"] == 3, names["dettrial::train_batch"]  # batches 3, 4 and 5
assert names["aten::conv2d"] >= 6, names["aten::conv2d"]  # the network's two convolutions
print(f"ok: trace.json has {sum(names.values())} events, {names['aten::conv2d']} convolutions")
PY
# TensorBoard itself shows the run: its server lists the run's scalars (its own HTTP API), its
# scalars page renders in headless Chromium, and the screenshot is OUTPUT_DIR/tensorboard.png (the
# one docs/observability.md shows).
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -n "$browser" ]; then
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$python" -m tensorboard.main --logdir "$out/tensorboard" --host 127.0.0.1 --port "$port" >"$out.tensorboard.log" 2>&1 &
  board=$!
  trap 'kill $board 2>/dev/null' EXIT
  "$python" - "$port" <<'PY' || fail "TensorBoard does not serve the run's scalars"
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/data/plugin/scalars/tags"
for _ in range(300):  # the server starts, then loads the event files
    try:
        tags = {tag for run in json.load(urllib.request.urlopen(url, timeout=5)).values() for tag in run}
        if {"train/loss", "validation/accuracy"} <= tags:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit(1)
PY
  timeout 180 "$browser" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --no-default-browser-check \
    --user-data-dir="$out.chromium" --virtual-time-budget=25000 --window-size=1400,1000 --screenshot="$out/tensorboard.png" \
    "http://127.0.0.1:$port/#scalars&tagFilter=train%2Floss%7Cvalidation%2Faccuracy" >/dev/null 2>&1
  [ "$(stat -c %s "$out/tensorboard.png" 2>/dev/null || echo 0)" -gt 20000 ] || fail "no screenshot of TensorBoard's page"
  kill $board 2>/dev/null
  echo "ok: TensorBoard serves and shows the run ($out/tensorboard.png)"
else
  echo "not run here: TensorBoard's page in a browser (no Chromium on the PATH)"
fi
echo "ok: TensorBoard files, hparams and trace of a resumed run"
