"""Turns bench/run's JSON lines into one table with the ratios the project tracks."""
import json
import os
import platform
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
# Repeated measurements (parity rounds, end-to-end epochs) are reduced to their median.
merged = {}
for r in rows:
    merged.setdefault(r["name"], []).append(r)
rows = []
for name, group in merged.items():
    values = sorted(g["value"] for g in group)
    row = dict(sorted(group, key=lambda g: g["value"])[len(group) // 2])  # the median run, with its notes
    if len(values) > 1 and values[0] > 0:
        row["spread"] = values[-1] / values[0]
    rows.append(row)
by_name = {r["name"]: r for r in rows}
print()
print(f"{'measurement':64} {'median':>12} {'unit':10} {'spread':>7}  notes")
for r in rows:
    notes = ", ".join(f"{k}={v}" for k, v in r.items()
                      if k in ("bit_identical", "equal_to_5_decimals", "batches", "accuracy", "bytes", "quartiles", "rounds", "phases",
                               "threads"))
    print(f"{r['name']:64} {r['value']:12.4g} {r['unit']:10} {r['spread']:7.3f}  {notes}")


def ratio(a, b, label):
    if a in by_name and b in by_name:
        print(f"{label:76} {by_name[a]['value'] / by_name[b]['value']:8.2f}x")


print()
print("ratios (higher is better for dettrial)")
ratio("dettrial DataLoader (workers 0)", "torch::data::DataLoader (workers 0)", "dettrial / torch::data::DataLoader, batches/s (workers 0)")
ratio("dettrial DataLoader (workers 2)", "torch::data::DataLoader (workers 2)", "dettrial / torch::data::DataLoader, batches/s (workers 2)")
ratio("dettrial DataLoader (workers 0)", "torch.utils.data.DataLoader, TensorDataset (workers 0)",
      "dettrial / Python DataLoader over TensorDataset, batches/s")
ratio("dettrial DataLoader (workers 0)", "torch.utils.data.DataLoader, per-example Dataset (workers 0)",
      "dettrial / Python DataLoader over a per-example Dataset, batches/s")
if "MNIST example: Trainer + DataLoader" in by_name:
    t = by_name["MNIST example: Trainer + DataLoader"]["value"]
    p = by_name["MNIST example: pre-batched loop"]["value"]
    print(f"{'MNIST example time per batch, Trainer + DataLoader / pre-batched loop':76} {t / p:8.3f}")
# Images (bench/image): dettrial's pipeline against torchvision's best worker count, and against the
# bare decode rate times the cores (the limit).
imagenet_train = "ImageNet-sized JPEGs, RandomResizedCrop(224)"
for folder, ours_name, files in (("PNG folder 28x28", "dettrial", "PNG folder 28x28"),
                                 ("JPEG folder 64x64", "dettrial", "JPEG folder 64x64"),
                                 (imagenet_train, "dettrial, the crop's window decoded", "ImageNet-sized JPEGs"),
                                 ("ImageNet-sized JPEGs, Resize(256) CenterCrop(224)", "dettrial", "ImageNet-sized JPEGs")):
    ours = by_name.get(f"image pipeline, {folder}: {ours_name}")
    theirs = [r for r in rows if r["name"].startswith(f"image pipeline, {folder}: torchvision")]
    limit = next((r for r in rows if r["name"].startswith(f"image decode alone, {files}: one thread")), None)
    if ours and theirs:
        best = max(theirs, key=lambda r: r["value"])
        print(f"{'image pipeline, ' + folder + ', dettrial / torchvision best (workers ' + str(best['workers']) + ')':76} "
              f"{ours['value'] / best['value']:8.2f}x  peak memory {ours['peak_mib']:.0f} / {best['peak_mib']:.0f} MiB")
        print(f"{'image pipeline, ' + folder + ', resident memory at the end / at a tenth of the epoch':76} "
              f"{ours['rss_end_mib'] / ours['rss_tenth_mib']:8.2f}")
    if ours and limit:
        print(f"{'image pipeline, ' + folder + ', dettrial / the limit (decode alone x cores)':76} {ours['value'] / limit['value']:8.2f}")
window = by_name.get(f"image pipeline, {imagenet_train}: dettrial, the crop's window decoded")
whole = by_name.get(f"image pipeline, {imagenet_train}: dettrial, decoded whole")
if window and whole:
    print(f"{'image pipeline, ' + imagenet_train + ', the window decoded / decoded whole':76} {window['value'] / whole['value']:8.2f}")
    print(f"{'image pipeline, ' + imagenet_train + ', dettrial per core (images/s)':76} "
          f"{window['value'] / max(1, len(os.sched_getaffinity(0))):8.0f}")
for size in (224, 160):
    crop = f"ImageNet-sized JPEGs, RandomResizedCrop({size})"
    exact = by_name.get(f"image pipeline, {crop}: dettrial, the crop's window decoded")
    reduced = by_name.get(f"image pipeline, {crop}: dettrial, reduced_decode (not torchvision's pixels)")
    if exact and reduced:
        print(f"{'image pipeline, ' + crop + ', reduced_decode / exact':76} {reduced['value'] / exact['value']:8.2f}")
trained = by_name.get("image example training, ResNet-8 on PNG: batches from the pipeline")
decoded = by_name.get("image example training, ResNet-8 on PNG: batches decoded beforehand")
if trained and decoded:
    print(f"{'image example training rate, pipeline / decoded beforehand':76} {trained['value'] / decoded['value']:8.2f}")
# End to end (bench/e2e.sh): per round, each side's time over dettrial's, at each thread setting.
e2e = [r for r in (json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")) if "e2e_side" in r]
for threads in dict.fromkeys(r["e2e_threads"] for r in e2e):
    by_round, ran_with = {}, {}
    for r in e2e:
        if r["e2e_threads"] == threads:
            by_round.setdefault(r["e2e_round"], {})[r["e2e_side"]] = r["value"]
            ran_with.setdefault(r["e2e_side"], set()).add(r.get("threads", "?"))
    # The intra-op threads each side reported, so a side that ran with other threads than asked shows.
    counts = lambda side: "/".join(str(t) for t in sorted(ran_with.get(side, {"?"}), key=str))
    for side, label in (("python", "plain PyTorch loop"), ("determined", "Determined's Trainer")):
        pairs = sorted(sides[side] / sides["dettrial"] for sides in by_round.values() if side in sides and "dettrial" in sides)
        if pairs:
            what = f"end to end, {label} time / dettrial time, {threads} threads ({len(pairs)} rounds)"
            mismatch = "  THREADS DIFFER" if ran_with.get(side) != ran_with.get("dettrial") else ""
            print(f"{what:76} {pairs[len(pairs) // 2]:8.3f}x  range {pairs[0]:.3f}-{pairs[-1]:.3f}"
                  f"  (threads: dettrial {counts('dettrial')}, {side} {counts(side)}){mismatch}")
for model in ("mlp", "mnist"):
    ref = by_name.get(f"Debian LibTorch, Trainer, {model} batch, 1 thread: reference BLAS")
    fast = by_name.get(f"Debian LibTorch, Trainer, {model} batch, 1 thread: OpenBLAS BLAS")
    if ref and fast:
        print(f"{'Debian LibTorch, ' + model + ' batch time, reference BLAS / OpenBLAS':76} {ref['value'] / fast['value']:8.2f}x")
if "data parallel MLP step, 1 process, batch 64" in by_name:
    one = by_name["data parallel MLP step, 1 process, batch 64"]["value"]
    two = by_name["data parallel MLP step, 2 Gloo ranks, 32 each"]["value"]
    ar = by_name["data parallel gradient all-reduce per step (2 ranks)"]["value"]
    print(f"{'data parallel step time, 2 ranks / 1 process (same 2 cores)':76} {two / one:8.2f}")
    print(f"{'share of a rank step spent in the gradient all-reduce':76} {ar / two:8.2f}")
launcher_rows = [r for r in rows if r["name"].startswith("2-rank MNIST job, ")]
if launcher_rows:
    best = max(r["value"] for r in launcher_rows)
    for r in launcher_rows:
        label = r["name"].removeprefix("2-rank MNIST job, ")
        print(f"{'2-rank MNIST job samples/s, ' + label[:36] + ' / best launcher':76} {r['value'] / best:8.2f}  ({r.get('threads', '?')})")
compile_base = by_name.get("compile time at -O2: plain LibTorch loop")
if compile_base:
    print("compile time (lower is better; CPU seconds; the target is a trial TU in separate compilation at most 1.3x the plain LibTorch TU)")
    for side in ("dettrial trial TU, no command line", "dettrial trial TU, separate compilation",
                 "dettrial MNIST example main", "dettrial MNIST example main, separate compilation",
                 "dettrial MNIST example main, main.hpp precompiled",
                 "dettrial's compiled part (once per build, separate compilation)"):
        if f"compile time at -O2: {side}" in by_name:
            print(f"{'compile time at -O2, ' + side + ' / plain LibTorch loop':112} {by_name['compile time at -O2: ' + side]['value'] / compile_base['value']:8.2f}x")
torch_version = next((r["torch"] for r in rows if "torch" in r), "?")
print(f"\nmachine: {platform.machine()}, {platform.processor() or 'cpu'}, {__import__('os').cpu_count()} cores; python torch {torch_version}")
