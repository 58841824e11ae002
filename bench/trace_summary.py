"""Compares two Chrome traces of the same training (trainer_bench --epoch --trace, e2e_epoch.py
--trace): per operator, the total time inside it (nested operators count in their callers too) and
how often it ran, side by side, largest first; and the time outside any operator (the framework's
own loop, data loading, Python).
  python3 bench/trace_summary.py dettrial.json python.json [TOP]"""
import json
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    ops = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat", "cpu_op") in ("cpu_op", "Operator", "")]
    totals, counts = defaultdict(float), defaultdict(int)
    for e in ops:
        totals[e["name"]] += float(e["dur"])
        counts[e["name"]] += 1
    # Top-level operators: not inside another operator of the same thread.
    top = 0.0
    by_thread = defaultdict(list)
    for e in ops:
        by_thread[e.get("tid")].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    first, last = float("inf"), 0.0
    for spans in by_thread.values():
        spans.sort()
        end = -1.0
        for start, stop in spans:
            first, last = min(first, start), max(last, stop)
            if start >= end:
                top += stop - start
                end = stop
            else:
                end = max(end, stop)
    return totals, counts, top, last - first


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    names = sorted(set(a[0]) | set(b[0]), key=lambda n: -max(a[0].get(n, 0), b[0].get(n, 0)))[:top]
    print(f"{'operator':40} {'first ms':>10} {'calls':>7} {'second ms':>10} {'calls':>7} {'second/first':>12}")
    for n in names:
        x, y = a[0].get(n, 0) / 1e3, b[0].get(n, 0) / 1e3
        print(f"{n[:40]:40} {x:10.1f} {a[1].get(n, 0):7d} {y:10.1f} {b[1].get(n, 0):7d} {y / x if x else float('nan'):12.3f}")
    for label, (_, _, inside, span) in (("first", a), ("second", b)):
        print(f"{label}: {span / 1e3:.1f} ms from the first operator to the last, {inside / 1e3:.1f} ms inside operators, "
              f"{(span - inside) / 1e3:.1f} ms outside ({(span - inside) / span:.1%})")


if __name__ == "__main__":
    main()
