#!/usr/bin/env python3
"""Reads a run's TensorBoard event files with PyPI's tensorboard package and checks them against the
run's metrics.jsonl: every training and validation metric, samples/s, learning rate and phase timing
is there at its batch, exactly once, equal to float32 of the logged value, and each system metrics
report's values at their batch; the hyperparameters are
the hparams plugin's session; every record passes TensorBoard's CRC checks.

usage: read_tensorboard.py RUN_DIR [NAME=VALUE ...]   (expected hyperparameters)
Exit 0 and "ok: ..." on success, 77 when tensorboard is not installed.
"""
import collections
import glob
import json
import math
import os
import struct
import sys

try:
    from tensorboard import data_compat
    from tensorboard.compat.proto import event_pb2
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
    from tensorboard.plugins.hparams import metadata as hparams_metadata
    from tensorboard.plugins.hparams import plugin_data_pb2
    from tensorboard.util import tensor_util
except ImportError as e:
    print(f"skipped: no tensorboard package ({e})")
    sys.exit(77)


def fail(message):
    print(f"read_tensorboard: {message}")
    sys.exit(1)


def events_of(path):
    """Every event of a file, through TensorBoard's own record reader, which checks both CRCs and
    raises DataLossError on a bad one (its loader would only log it)."""
    reader = pywrap_tensorflow.PyRecordReader_New(path.encode())
    out = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return out
        out.append(event_pb2.Event.FromString(reader.record()))


def main():
    run_dir = sys.argv[1]
    expected_hparams = dict(arg.split("=", 1) for arg in sys.argv[2:])
    files = sorted(glob.glob(os.path.join(run_dir, "tensorboard", "events.out.tfevents.*")))
    if not files:
        fail(f"no event files in {run_dir}/tensorboard")
    scalars = collections.Counter()
    values = {}
    system_values = collections.defaultdict(list)
    sessions, ends = [], []
    for path in files:
        events = events_of(path)
        if not events or events[0].file_version != "brain.Event:2":
            fail(f"{path} does not start with the file_version event")
        for event in events[1:]:
            for value in event.summary.value:
                # TensorBoard's own migration: simple_value becomes a scalar tensor of the scalars plugin.
                migrated = data_compat.migrate_value(value)
                plugin = migrated.metadata.plugin_data.plugin_name
                if plugin == "scalars" and migrated.tag.startswith("system/"):
                    # The system metrics report by time: several may share a batch (during a
                    # validation, say), so they are compared as lists.
                    system_values[(migrated.tag, event.step)].append(float(tensor_util.make_ndarray(migrated.tensor)))
                elif plugin == "scalars":
                    key = (migrated.tag, event.step)
                    scalars[key] += 1
                    values[key] = float(tensor_util.make_ndarray(migrated.tensor))
                elif plugin == hparams_metadata.PLUGIN_NAME:
                    data = plugin_data_pb2.HParamsPluginData.FromString(migrated.metadata.plugin_data.content)
                    if migrated.tag == hparams_metadata.SESSION_START_INFO_TAG:
                        sessions.append(data.session_start_info)
                    elif migrated.tag == hparams_metadata.SESSION_END_INFO_TAG:
                        ends.append(data.session_end_info)
    twice = [k for k, n in scalars.items() if n > 1]
    if twice:
        fail(f"scalars written more than once: {twice[:5]}")

    def expect(tag, step, logged):
        key = (tag, step)
        if key not in values:
            fail(f"no scalar {tag} at step {step}")
        got, want = values[key], logged
        if want is None:  # NaN, written as null in metrics.jsonl
            if not math.isnan(got):
                fail(f"{tag} at {step}: {got}, expected NaN")
            return
        want32 = struct.unpack("f", struct.pack("f", want))[0]
        if got != want32:
            fail(f"{tag} at {step}: {got!r}, expected float32({want!r}) = {want32!r}")

    checked = 0
    system_logged = collections.defaultdict(list)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    for r in records:
        step = r["batches"]
        if r["type"] == "training":
            for name, v in r["metrics"].items():
                if name not in ("batches", "epochs"):
                    expect("train/" + name, step, v)
                    checked += 1
            expect("train/samples_per_second", step, r["samples_per_second"])
            for name, v in r.get("learning_rates", {}).items():
                expect("train/" + name, step, v)
                checked += 1
            for phase, v in r["seconds"].items():
                expect(f"timing/{phase}_seconds", step, v)
                checked += 1
        elif r["type"] == "validation":
            for name, v in r["metrics"].items():
                if name not in ("batches", "epochs"):
                    expect("validation/" + name, step, v)
                    checked += 1
            expect("timing/validation_seconds", step, r["seconds"])
        elif r["type"] == "checkpoint":
            expect("timing/checkpoint_seconds", step, r["seconds"])
            expect("timing/checkpoint_write_seconds", step, r["write_seconds"])
        elif r["type"] == "system":
            for name, v in r.items():
                if name in ("type", "batches", "epochs", "time"):
                    continue
                for label, x in (v.items() if isinstance(v, dict) else [(None, v)]):
                    tag = f"system/{name}" + (f"/{label}" if label else "")
                    system_logged[(tag, step)].append(struct.unpack("f", struct.pack("f", x))[0])
                    checked += 1
        checked += 1
    for key, logged in system_logged.items():
        if sorted(system_values.get(key, [])) != sorted(logged):
            fail(f"{key[0]} at step {key[1]}: {system_values.get(key, [])} in TensorBoard, {logged} in metrics.jsonl")
    if set(system_values) - set(system_logged):
        fail(f"system scalars metrics.jsonl has no record of: {sorted(set(system_values) - set(system_logged))[:5]}")
    # Nothing in the event files that metrics.jsonl lacks (a resumed run drops both alike), except
    # the trial's own scalars (tags outside train/, validation/, timing/).
    logged_steps = {r["batches"] for r in records}
    for tag, step in values:
        if tag.split("/")[0] in ("train", "validation", "timing") and step not in logged_steps:
            fail(f"scalar {tag} at step {step}, a batch metrics.jsonl has no record of")

    if len(sessions) != 1:
        fail(f"{len(sessions)} hparams sessions, expected 1")
    hparams = sessions[0].hparams
    for name, text in expected_hparams.items():
        if name not in hparams:
            fail(f"hyperparameter {name} is not in the hparams session (it has {sorted(hparams)})")
        value = hparams[name]
        kind = value.WhichOneof("kind")
        got = {"number_value": lambda: value.number_value, "string_value": lambda: value.string_value,
               "bool_value": lambda: value.bool_value}[kind]()
        want = {"number_value": float, "string_value": str, "bool_value": lambda t: t == "true"}[kind](text)
        if got != want:
            fail(f"hyperparameter {name}: {got!r} in TensorBoard, expected {want!r}")
    if len(ends) != 1 or ends[0].status != 1:
        fail(f"expected one successful session end, found {[e.status for e in ends]}")
    print(f"ok: {len(values)} scalars in {len(files)} event file(s), {checked} values equal to metrics.jsonl, "
          f"{len(hparams)} hyperparameters")


if __name__ == "__main__":
    main()
