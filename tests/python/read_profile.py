"""Reads a run's profiler traces as TensorBoard's profile plugin (torch-tb-profiler) reads them.

Usage: read_profile.py DIR CYCLES STEPS_PER_CYCLE
Passes when DIR holds CYCLES files named as the plugin expects (<worker>.<span>.pt.trace.json), each
of which the plugin's own parser and run generator take, finding STEPS_PER_CYCLE profiler steps
(the ProfilerStep#<n> ranges) in it, in increasing order, the cycles one after another."""
import os
import sys
import tempfile

directory, cycles, steps_per_cycle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
try:
    from torch_tb_profiler import consts
    from torch_tb_profiler.profiler.data import RunProfileData
    from torch_tb_profiler.profiler.run_generator import RunGenerator
except ImportError as e:
    print(f"skipped: TensorBoard's profile plugin (PyPI's torch-tb-profiler) is not installed here: {e}")
    sys.exit(77)

names = sorted(n for n in os.listdir(directory) if consts.WORKER_PATTERN.match(n))
assert len(names) == cycles, f"{len(names)} trace files the plugin would list in {directory}, expected {cycles}: {os.listdir(directory)}"
seen = []
for name in names:
    worker, span = consts.WORKER_PATTERN.match(name).group(1), consts.WORKER_PATTERN.match(name).group(2)
    with tempfile.TemporaryDirectory() as cache:
        data = RunProfileData.parse(worker, span[1:] if span else None, os.path.join(directory, name), cache)
        profile = RunGenerator(worker, span, data).generate_run_profile()
    assert profile is not None, name
    # The plugin names each step by the number of its ProfilerStep#<n> range.
    steps = [int(s) for s in data.steps_names or []]
    assert len(steps) == steps_per_cycle, f"{name}: the plugin found steps {data.steps_names}, expected {steps_per_cycle}"
    assert steps == sorted(steps), f"{name}: steps out of order: {steps}"
    seen.append(steps)
flat = [s for steps in seen for s in steps]
assert flat == sorted(flat) and len(set(flat)) == len(flat), f"cycles overlap or are out of order: {seen}"
print(f"ok: TensorBoard's profile plugin reads {cycles} traces of {steps_per_cycle} steps each: {seen}")
