#!/usr/bin/env python3
"""Reads a run's TensorBoard event files with PyPI's tensorboard package: at least one text summary
under TAG (the text plugin's), whose text contains EXPECTED.

usage: read_tensorboard_text.py RUN_DIR TAG EXPECTED
Exit 0 and "ok: ..." on success, 77 when tensorboard is not installed.
"""
import glob
import os
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util
except ImportError as e:
    print(f"skipped: no tensorboard package ({e})")
    sys.exit(77)

run, tag, expected = sys.argv[1], sys.argv[2], sys.argv[3]
acc = event_accumulator.EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={event_accumulator.TENSORS: 0})
acc.Reload()
if tag not in acc.Tags().get("tensors", []):
    print(f"read_tensorboard_text: no tensor summaries tagged {tag} in {run}/tensorboard (tags: {acc.Tags()})")
    sys.exit(1)
events = acc.Tensors(tag)
texts = [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in events]
plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
if plugin != "text" or not any(expected in t for t in texts):
    print(f"read_tensorboard_text: {tag}: plugin {plugin!r}, {len(texts)} texts, none containing {expected!r}: {texts[:1]}")
    sys.exit(1)
print(f"ok: TensorBoard reads {len(texts)} text summaries tagged {tag} (steps {[e.step for e in events]})")
