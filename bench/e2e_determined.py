"""The MNIST example as a Determined PyTorchTrial, run by Determined's own Trainer in local mode
(`determined.pytorch.init` + `Trainer.fit`, no cluster), end to end as trainer_bench --epoch runs it
in C++ and e2e_epoch.py in plain PyTorch: read Fashion-MNIST's IDX files, normalise, train the seed
network (40/40 filters, dropout 0.3, SGD lr 0.03 momentum 0.9, batch 64, shuffled) for one epoch or
--batches N, then validate on the 10,000 test images in batches of 500. No checkpoints, no
TensorBoard files (the C++ side writes neither). Prints one JSON object: wall seconds and accuracy."""
import argparse
import json
import logging
import sys
import tempfile
import time

import torch
from torch import nn

import determined
from determined import pytorch

import networks
from e2e_epoch import DIR, read_idx


class MnistTrial(pytorch.PyTorchTrial):
    def __init__(self, context, data):
        self.context = context
        self.data = data
        self.model = context.wrap_model(networks.mnist(40, 40, 0.3))
        self.optimizer = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=0.03, momentum=0.9))

    def build_training_data_loader(self):
        x, y = self.data["train"]
        return pytorch.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)

    def build_validation_data_loader(self):
        x, y = self.data["test"]
        return pytorch.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=500)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y = batch
        output = self.model(x)
        loss = nn.functional.nll_loss(output, y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        return {"loss": loss, "train_error": 1.0 - (output.argmax(1) == y).float().mean()}

    def evaluate_batch(self, batch):
        x, y = batch
        output = self.model(x)
        error = 1.0 - (output.argmax(1) == y).float().mean()
        return {"validation_loss": nn.functional.nll_loss(output, y), "validation_error": error, "accuracy": 1.0 - error}


class Phases(pytorch.PyTorchCallback):
    def __init__(self):
        self.training_start = self.validation_start = self.validation_end = None

    def on_training_start(self):
        self.training_start = time.perf_counter()

    def on_validation_start(self):
        self.validation_start = time.perf_counter()

    def on_validation_end(self, metrics):
        self.validation_end = time.perf_counter()
        self.accuracy = metrics["accuracy"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=0, help="train this many batches instead of one epoch")
    args = parser.parse_args()
    logging.disable(logging.INFO)  # the C++ side runs quiet too
    torch.manual_seed(17)
    start = time.perf_counter()
    train_x = torch.from_numpy(read_idx(f"{DIR}/train-images-idx3-ubyte.gz")).to(torch.float32).div_(255.0)
    train_y = torch.from_numpy(read_idx(f"{DIR}/train-labels-idx1-ubyte.gz")).to(torch.int64)
    test_x = torch.from_numpy(read_idx(f"{DIR}/t10k-images-idx3-ubyte.gz")).to(torch.float32).div_(255.0)
    test_y = torch.from_numpy(read_idx(f"{DIR}/t10k-labels-idx1-ubyte.gz")).to(torch.int64)
    mean, std = train_x.mean().item(), train_x.std().item()
    data = {"train": (train_x.sub(mean).div_(std).unsqueeze(1).contiguous(), train_y),
            "test": (test_x.sub_(mean).div_(std).unsqueeze(1).contiguous(), test_y)}
    phases = Phases()
    with tempfile.TemporaryDirectory() as storage:
        with pytorch.init(hparams={"global_batch_size": 64}, enable_tensorboard_logging=False,
                          exp_conf={"checkpoint_storage": {"type": "shared_fs", "host_path": storage}}) as context:
            trial = MnistTrial(context, data)
            trial.build_callbacks = lambda: {"phases": phases}
            trainer = pytorch.Trainer(trial, context)
            length = pytorch.Batch(args.batches) if args.batches else pytorch.Epoch(1)
            trainer.fit(max_length=length, reporting_period=pytorch.Batch(100), validation_period=length,
                        checkpoint_period=pytorch.Batch(10 ** 9), checkpoint_policy="none")
    seconds = time.perf_counter() - start
    what = f"{args.batches} batches" if args.batches else "one Fashion-MNIST epoch"
    print(json.dumps({"name": f"MNIST example, {what} end to end: Determined's Trainer", "value": seconds, "unit": "s",
                      "spread": 1.0, "accuracy": round(float(phases.accuracy), 4), "determined": determined.__version__,
                      "threads": torch.get_num_threads(),
                      "phases": f"load {phases.training_start - start:.2f} s, "
                                f"train {phases.validation_start - phases.training_start:.2f} s, "
                                f"validate {phases.validation_end - phases.validation_start:.2f} s"}))


if __name__ == "__main__":
    sys.exit(main())
