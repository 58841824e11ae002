"""Keras's own callbacks act on the same eight epochs' logs as dettrial's keras::ReduceLROnPlateau,
EarlyStopping, ModelCheckpoint(save_best_only) and CSVLogger did, and must do the same: the same
learning rate after each epoch, the same stopping epoch, the same files saved under the same
formatted names, the same CSV text byte for byte.

Usage: KERAS_BACKEND=torch keras_callbacks.py DIR   (DIR/callbacks.json, left by the keras unit test)"""
import json
import os
import sys
import tempfile

os.environ.setdefault("KERAS_BACKEND", "torch")
try:
    import keras
    import numpy as np
except ImportError as e:
    print(f"skipped: Keras 3 (PyPI's keras, with the torch backend) is not installed here: {e}")
    sys.exit(77)

with open(os.path.join(sys.argv[1], "callbacks.json")) as f:
    saved = json.load(f)
logs = saved["logs"]
problems = []


def model_with(lr):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr), loss="mse", metrics=["accuracy"])
    # Keras's mode "auto" reads the direction of the compiled metrics, which exist once it has run.
    model.evaluate(np.zeros((2, 2), np.float32), np.zeros((2, 1), np.float32), verbose=0)
    return model


# ReduceLROnPlateau: the learning rate after each epoch.
r = saved["reduce_lr"]
model = model_with(r["initial_lr"])
cb = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=r["factor"], patience=r["patience"],
                                       cooldown=r["cooldown"], min_lr=r["min_lr"])
cb.set_model(model)
cb.on_train_begin()
lrs = []
for epoch, entry in enumerate(logs):
    cb.on_epoch_end(epoch, dict(entry))
    lrs.append(float(keras.ops.convert_to_numpy(model.optimizer.learning_rate)))
# Keras keeps rates in float32 variables (its 0.01 is 0.009999999776...); dettrial rounds the rates
# it sets to float32 as Keras does, and the optimizer's first rate is the user's double.
if [np.float32(v) for v in lrs] != [np.float32(v) for v in r["lrs"]]:
    problems.append(f"ReduceLROnPlateau: Keras's rates {lrs}, dettrial's {r['lrs']}")

# EarlyStopping: the first epoch that asks to stop.
e = saved["early_stopping"]
model = model_with(0.01)
cb = keras.callbacks.EarlyStopping(monitor=e["monitor"], min_delta=e["min_delta"], patience=e["patience"])
cb.set_model(model)
cb.on_train_begin()
stopped = -1
for epoch, entry in enumerate(logs):
    cb.on_epoch_end(epoch, dict(entry))
    if model.stop_training and stopped < 0:
        stopped = epoch
if stopped != e["stopped_epoch"]:
    problems.append(f"EarlyStopping: Keras stops at epoch {stopped}, dettrial at {e['stopped_epoch']}")

# ModelCheckpoint(save_best_only): which files, under which names (Keras insists on its suffix).
m = saved["model_checkpoint"]
model = model_with(0.01)
written = []
model.save = lambda filepath, overwrite=True, **kwargs: written.append(os.path.basename(filepath))
with tempfile.TemporaryDirectory() as tmp:
    cb = keras.callbacks.ModelCheckpoint(os.path.join(tmp, m["filepath"].removesuffix(".pt") + ".keras"),
                                         monitor="val_loss", save_best_only=True)
    cb.set_model(model)
    cb.on_train_begin()
    for epoch, entry in enumerate(logs):
        cb.on_epoch_end(epoch, dict(entry))
written = [name.removesuffix(".keras") + ".pt" for name in written]
if written != m["saved"]:
    problems.append(f"ModelCheckpoint: Keras saves {written}, dettrial saved {m['saved']}")

# CSVLogger: the file's bytes.
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "log.csv")
    cb = keras.callbacks.CSVLogger(path)
    cb.set_model(model_with(0.01))
    cb.on_train_begin()
    for epoch, entry in enumerate(logs):
        cb.on_epoch_end(epoch, dict(entry))
    cb.on_train_end()
    with open(path, newline="") as f:
        text = f.read()
if text != saved["csv"]:
    problems.append(f"CSVLogger: Keras writes {text!r}, dettrial wrote {saved['csv']!r}")

print(f"Keras {keras.__version__}: rates {lrs}, stop at epoch {stopped}, saved {written}")
if problems:
    print("\n".join(problems))
    sys.exit(1)
print("ok: Keras's callbacks act as dettrial's did")
