"""compare.py DETERMINED.jsonl DETTRIAL.jsonl --first N --batches M: the two continuations of one
checkpoint must train batches N .. N+M-1, each on the same records in the same order, with the same
learning rate, the same stateful callback count (where both log it) and the same loss.

Losses must be equal to the bit: both sides run the same LibTorch kernels on the same data, weights,
optimizer state and generator state, so any difference is a state that did not come across. Set
DETTRIAL_LOSS_TOLERANCE to compare within a relative tolerance instead (for LibTorch builds whose
kernels differ, such as Debian's 1.13 against the wheel's 2.x)."""
import argparse
import json
import os
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("determined")
    p.add_argument("dettrial")
    p.add_argument("--first", type=int, required=True)
    p.add_argument("--batches", type=int, required=True)
    a = p.parse_args()
    tolerance = float(os.environ.get("DETTRIAL_LOSS_TOLERANCE", "0"))
    det, dt = read(a.determined), read(a.dettrial)
    expected = list(range(a.first, a.first + a.batches))
    for name, log in (("Determined", det), ("dettrial", dt)):
        if [r["batch"] for r in log] != expected:
            sys.exit(f"{name} trained batches {[r['batch'] for r in log]}, not {a.first}..{a.first + a.batches - 1}")
    worst = 0.0
    for d, t in zip(det, dt):
        b = d["batch"]
        if d["records"] != t["records"]:
            sys.exit(f"batch {b}: Determined trained records {d['records'][:6]}..., dettrial {t['records'][:6]}...")
        if d["lr"] != t["lr"]:
            sys.exit(f"batch {b}: learning rate {d['lr']} in Determined, {t['lr']} in dettrial")
        if "counter" in d and "counter" in t and d["counter"] != t["counter"]:
            sys.exit(f"batch {b}: the callback counted {d['counter']} in Determined, {t['counter']} in dettrial")
        difference = abs(d["loss"] - t["loss"]) / max(abs(d["loss"]), 1e-30)
        worst = max(worst, difference)
        if difference > tolerance:
            sys.exit(f"batch {b}: loss {d['loss']!r} in Determined, {t['loss']!r} in dettrial (relative difference {difference:.3g})")
    print(f"batches {a.first}..{a.first + a.batches - 1}: the same records, learning rates and losses "
          f"({'bit-equal' if worst == 0 else f'largest relative difference {worst:.3g}'})")


if __name__ == "__main__":
    main()
