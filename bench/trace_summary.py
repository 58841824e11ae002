"""Compares two Chrome traces of the same training (trainer_bench --epoch --trace, e2e_epoch.py
--trace): per operator, the total time inside it (nested operators count in their callers too) and
how often it ran, side by side, largest first; and the time outside any operator (the framework's
own loop, data loading, Python). Where the traces hold the GPU's work (CUDA activities: kernels,
copies, fills, those a CUDA graph replays too), the same per kernel, and the GPU's busy time; and
the host's calls into the CUDA runtime and driver (a graph's launch, a synchronization that makes
the host wait for the GPU), per call.
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


GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver", "Runtime", "Driver")


def load_activities(path, categories=GPU_CATEGORIES):
    """Per kernel (or copy, or fill) name on the GPU: total ms and count; and the GPU's busy ms
    (the union of their intervals). With RUNTIME_CATEGORIES, the same of the host's CUDA calls."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    work = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat") in categories]
    totals, counts = defaultdict(float), defaultdict(int)
    for e in work:
        totals[e["name"]] += float(e["dur"])
        counts[e["name"]] += 1
    busy, end = 0.0, -1.0
    for start, stop in sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in work):
        if start >= end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    return totals, counts, busy


def print_side_by_side(title, a, b, top):
    names = sorted(set(a[0]) | set(b[0]), key=lambda n: -max(a[0].get(n, 0), b[0].get(n, 0)))[:top]
    print(f"{title:40} {'first ms':>10} {'calls':>7} {'second ms':>10} {'calls':>7} {'second/first':>12}")
    for n in names:
        x, y = a[0].get(n, 0) / 1e3, b[0].get(n, 0) / 1e3
        print(f"{n[:40]:40} {x:10.3f} {a[1].get(n, 0):7d} {y:10.3f} {b[1].get(n, 0):7d} {y / x if x else float('nan'):12.3f}")


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    print_side_by_side("operator", a, b, top)
    for label, (_, _, inside, span) in (("first", a), ("second", b)):
        print(f"{label}: {span / 1e3:.1f} ms from the first operator to the last, {inside / 1e3:.1f} ms inside operators, "
              f"{(span - inside) / 1e3:.1f} ms outside ({(span - inside) / span:.1%})")
    ga, gb = load_activities(sys.argv[1]), load_activities(sys.argv[2])
    print()
    if not ga[0] and not gb[0]:
        print("no GPU work in either trace (a CPU run, or the profiler recorded no CUDA activities)")
        return
    print_side_by_side("on the GPU", ga, gb, top)
    for label, (totals, counts, busy) in (("first", ga), ("second", gb)):
        print(f"{label}: the GPU busy {busy / 1e3:.3f} ms, {sum(counts.values())} kernels, copies and fills")
    ra, rb = load_activities(sys.argv[1], RUNTIME_CATEGORIES), load_activities(sys.argv[2], RUNTIME_CATEGORIES)
    print()
    print_side_by_side("CUDA runtime and driver calls", ra, rb, top)
    for label, (totals, counts, busy) in (("first", ra), ("second", rb)):
        print(f"{label}: the host in CUDA calls {busy / 1e3:.3f} ms, {sum(counts.values())} calls")


if __name__ == "__main__":
    main()
