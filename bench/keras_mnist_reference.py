#!/usr/bin/env python3
"""The Keras side of examples/keras_mnist: the TFKerasTrial tutorial's model and training run by Keras
itself (Keras 3, PyTorch backend: `pip install keras`), on the same IDX files and for the same length
(the tutorial's const.yaml: 40 steps of 100 batches of 32, validated every 1000 batches), so the
C++ port's accuracy can be compared with what Keras reaches.
  KERAS_BACKEND=torch python3 bench/keras_mnist_reference.py [DATA_DIR] [SEEDS]
Prints one JSON line per seed: the validation accuracy after each 1000 batches."""
import gzip
import json
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "torch")
import keras  # noqa: E402
import numpy as np  # noqa: E402


def idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def split(directory, name):
    def find(kind, n):
        for candidate in (f"{name}-{kind}-idx{n}-ubyte.gz", f"{name}-{kind}-idx{n}-ubyte"):
            if os.path.exists(os.path.join(directory, candidate)):
                return os.path.join(directory, candidate)
        raise SystemExit(f"no {name} {kind} in {directory}")
    return idx(find("images", 3)).astype("float32") / 255.0, idx(find("labels", 1)).astype("int64")


def batches(x, y, size, seed):
    """Endless batches: each pass over the data in a new random order (the last batch may be partial)."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(x), size):
            index = order[start:start + size]
            yield x[index], y[index]


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
    seeds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    x_train, y_train = split(directory, "train")
    x_test, y_test = split(directory, "t10k")
    for seed in range(seeds):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])
        # 4000 batches of 32 in periods of 1000 (fit's "epochs" of 1000 steps), the data reshuffled
        # after every pass over it, as fit(shuffle=True) does and as dettrial's loader does.
        history = model.fit(batches(x_train, y_train, 32, seed), epochs=4, steps_per_epoch=1000, verbose=0,
                            validation_data=(x_test, y_test))
        print(json.dumps({"seed": seed, "val_accuracy": [round(v, 4) for v in history.history["val_accuracy"]]}), flush=True)


if __name__ == "__main__":
    main()
