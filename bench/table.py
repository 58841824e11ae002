"""Turns bench/run's JSON lines into one table with the ratios the project tracks."""
import json
import platform
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
runs = {}  # every value of a repeated measurement, in the order measured
for r in rows:
    runs.setdefault(r["name"], []).append(r["value"])
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
                      if k in ("bit_identical", "equal_to_5_decimals", "batches", "accuracy", "bytes", "quartiles", "rounds", "phases"))
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
cpp_epochs = runs.get("MNIST example, one Fashion-MNIST epoch end to end: dettrial", [])
py_epochs = runs.get("MNIST example, one Fashion-MNIST epoch end to end: Python", [])
if cpp_epochs and len(cpp_epochs) == len(py_epochs):
    # Each pair ran back to back; the median of the pairs' ratios, with their range.
    pairs = sorted(p / c for c, p in zip(cpp_epochs, py_epochs))
    print(f"{'MNIST epoch end to end, Python time / dettrial time (median of ' + str(len(pairs)) + ' pairs)':76} "
          f"{pairs[len(pairs) // 2]:8.3f}x  range {pairs[0]:.3f}-{pairs[-1]:.3f}")
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
print(f"\nmachine: {platform.machine()}, {platform.processor() or 'cpu'}; python torch {rows[-1].get('torch', '?') if rows else '?'}")
