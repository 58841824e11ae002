"""Keras itself evaluates the model a Keras-style dettrial trial validated, with the same weights, data
and batch size (90 records in batches of 32: the last one partial), and must report the val_loss and
val_accuracy dettrial reported: Keras's evaluate weights each batch by its records.

Usage: KERAS_BACKEND=torch keras_evaluate.py DIR   (DIR/evaluate.json, left by the keras unit test)"""
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")
try:
    import keras
    import numpy as np
except ImportError as e:
    print(f"skipped: Keras 3 (PyPI's keras, with the torch backend) is not installed here: {e}")
    sys.exit(77)

with open(os.path.join(sys.argv[1], "evaluate.json")) as f:
    saved = json.load(f)


def array(entry, dtype):
    return np.asarray(entry["values"], dtype=dtype).reshape(entry["shape"])


x, y = array(saved["x"], np.float32), array(saved["y"], np.int64)
w = {name: array(entry, np.float32) for name, entry in saved["weights"].items()}
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
# LibTorch's Linear keeps (out, in) weights; Keras's Dense (in, out) kernels.
model.set_weights([w["0.weight"].T, w["0.bias"], w["2.weight"].T, w["2.bias"]])
model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
result = model.evaluate(x, y, batch_size=saved["batch_size"], verbose=0, return_dict=True)
print(f"Keras {keras.__version__}: {result}; dettrial: val_loss {saved['val_loss']}, val_accuracy {saved['val_accuracy']}")
tolerance = 1e-5 * max(1.0, abs(result["loss"]))
# The check can fail: the batches' losses averaged with equal weights are farther from Keras's than that.
n, b = len(x), saved["batch_size"]
batch_losses = [model.evaluate(x[i:i + b], y[i:i + b], batch_size=b, verbose=0, return_dict=True)["loss"] for i in range(0, n, b)]
assert abs(sum(batch_losses) / len(batch_losses) - result["loss"]) > tolerance, "these data cannot tell batch means from record means"
assert abs(result["loss"] - saved["val_loss"]) <= tolerance, "val_loss differs from Keras's evaluate"
assert abs(result["accuracy"] - saved["val_accuracy"]) <= 1e-6, "val_accuracy differs from Keras's evaluate"
print("ok: Keras's evaluate reports what dettrial reported")
