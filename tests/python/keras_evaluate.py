"""Keras itself evaluates the model a Keras-style dettrial trial validated, with the same weights, data
and batch size (90 records in batches of 32: the last one partial), and must report the val_loss and
val_accuracy dettrial reported: Keras's evaluate weights each batch by its records.

Also: each of Keras's losses with sample weights, as keras::WeightedSequence weighs them
(DIR/weighted_losses.json); and models of two inputs given as a list and by name
(DIR/multi_input_list.json, multi_input_dict.json).

Usage: KERAS_BACKEND=torch keras_evaluate.py DIR   (DIR/evaluate.json and weighted_losses.json, left by the keras unit tests)"""
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

# Sample-weighted losses (keras::WeightedSequence): each of Keras's losses with sample_weight.
classes = {"sparse_categorical_crossentropy": keras.losses.SparseCategoricalCrossentropy,
           "categorical_crossentropy": keras.losses.CategoricalCrossentropy,
           "binary_crossentropy": keras.losses.BinaryCrossentropy}
with open(os.path.join(sys.argv[1], "weighted_losses.json")) as f:
    cases = json.load(f)
for case in cases:
    name = case["loss"]
    loss = classes[name](from_logits=case["from_logits"]) if name in classes else \
        {"mean_squared_error": keras.losses.MeanSquaredError, "mean_absolute_error": keras.losses.MeanAbsoluteError}[name]()
    y_true = array(case["y_true"], np.int64 if name == "sparse_categorical_crossentropy" else np.float32)
    value = float(loss(y_true, array(case["y_pred"], np.float32), sample_weight=array(case["sample_weight"], np.float32)))
    print(f"{name} (from_logits={case['from_logits']}): Keras {value}, dettrial {case['value']}")
    assert abs(value - case["value"]) <= 1e-5 * max(1.0, abs(value)), f"{name}: the weighted loss differs from Keras's"
# Models of several inputs (DIR/multi_input_list.json, multi_input_dict.json): Keras's functional
# model (two Inputs, Concatenate, Dense) with dettrial's weights, given its inputs as a list or by name.
for name in ("multi_input_list.json", "multi_input_dict.json"):
    path = os.path.join(sys.argv[1], name)
    if not os.path.exists(path):
        print(f"FAIL: {path} is missing (the keras unit test writes it)")
        sys.exit(1)
    with open(path) as f:
        saved = json.load(f)
    a_in, b_in = keras.Input((2,), name="a"), keras.Input((3,), name="b")
    out = keras.layers.Dense(3)(keras.layers.Concatenate()([a_in, b_in]))
    by_name = saved["by_name"]
    model = keras.Model(inputs={"a": a_in, "b": b_in} if by_name else [a_in, b_in], outputs=out)
    model.set_weights([array(saved["kernel"], np.float32).T, array(saved["bias"], np.float32)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    xa, xb = array(saved["a"], np.float32), array(saved["b"], np.float32)
    x = {"a": xa, "b": xb} if by_name else [xa, xb]
    result = model.evaluate(x, array(saved["y"], np.int64), batch_size=saved["batch_size"], verbose=0, return_dict=True)
    print(f"{name}: Keras {result}; dettrial val_loss {saved['val_loss']}, val_accuracy {saved['val_accuracy']}")
    if abs(result["loss"] - saved["val_loss"]) > 1e-5 * max(1.0, abs(result["loss"])) or abs(result["accuracy"] - saved["val_accuracy"]) > 1e-6:
        print(f"FAIL: Keras's evaluate of the {'named' if by_name else 'listed'} inputs differs from dettrial's validation")
        sys.exit(1)
print(f"ok: Keras's evaluate reports what dettrial reported; {len(cases)} sample-weighted losses as Keras computes them; models of several inputs, listed and named")
