"""examples/mnist's network as a Determined PyTorchTrial, run by PyPI's `determined` itself
(`determined.pytorch.init` + `Trainer.fit` in local mode), so that the suite can check dettrial
against the real thing in both directions:

- train `--batches N` from scratch and keep the checkpoint it writes (`--checkpoint-to DIR`);
- or continue a checkpoint (`--resume DIR`, Determined's or dettrial's) for `--batches M` more.

Each trained batch is logged to `--log FILE` as one JSON line: the batch index, the loss (its
float32 value, exactly) and the ids of the batch's records, so that two runs can be compared record
for record and loss for loss.

Local-mode Trainer.fit starts a resumed run's data loader at batch 0 (the master, which hands a
trial its `steps_completed` on a cluster, is absent). `--resume` passes the checkpoint's own
`steps_completed` as the master would, so the run continues as a resumed trial on a cluster does.

Several runs go in one command, separated by `--then` (`... --batches 20 --checkpoint-to C --then
--batches 22 --resume C`), and `check_checkpoint DIR` is a run too (check_checkpoint.py's checks).
torch and Determined are imported once; each run is a child forked from that process before it
trains, so it starts with nothing another run left behind, as a run of its own command does. One
command stops at its first failed run.

Data: the first `--records` images of an IDX split (gzip or not), normalised with their own mean and
spread as examples/mnist normalises its training images; batches of `--batch-size`, shuffled by
Determined's DataLoader (torch's RandomSampler over the global generator).
"""
import argparse
import gzip
import json
import logging
import os
import shutil
import struct
import sys
import tempfile
import traceback

import numpy as np
import torch
from torch import nn

import determined
from determined import pytorch

import check_checkpoint


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(directory, split, kind):
    for name in (f"{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz", f"{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte"):
        if os.path.exists(os.path.join(directory, name)):
            return os.path.join(directory, name)
    raise SystemExit(f"no {split} {kind} in {directory}")


def mnist_network(n1, n2, dropout, batch_norm=False):
    """examples/mnist's network, layer for layer (parameters in LibTorch's order); with
    `batch_norm`, a BatchNorm2d after the first convolution (running statistics and a batch count
    in the checkpoint)."""
    return nn.Sequential(nn.Conv2d(1, n1, 5), *([nn.BatchNorm2d(n1)] if batch_norm else []), nn.MaxPool2d(2), nn.ReLU(),
                         nn.Conv2d(n1, n2, 5), nn.MaxPool2d(2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(16 * n2, 50), nn.ReLU(), nn.Dropout(dropout),
                         nn.Linear(50, 10), nn.LogSoftmax(dim=1))


def make_optimizer(name, params, lr):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, amsgrad=True)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, momentum=0.5)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    raise SystemExit(f"unknown optimizer {name}")


def warmup_then_decay(step):
    """10 steps of linear warmup, then linear decay to 0 at step 100."""
    return (step + 1) / 10 if step < 10 else max(0.0, (100 - step) / 90)


class Log(pytorch.PyTorchCallback):
    """Counts the batches trained, in a state dict: a stateful callback, restored by name."""

    def __init__(self):
        self.batches = 0

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = int(state["batches"])


class MnistTrial(pytorch.PyTorchTrial):
    def __init__(self, context, args, data):
        self.context = context
        self.args = args
        self.data = data
        self.log = open(args.log, "a") if args.log else None
        self.counter = Log()
        hp = context.get_hparams()
        self.model = context.wrap_model(mnist_network(hp["n_filters1"], hp["n_filters2"], hp["dropout"], args.net == "batchnorm"))
        self.optimizer = context.wrap_optimizer(make_optimizer(args.optimizer, self.model.parameters(), hp["learning_rate"]))
        if args.scheduler == "step":
            self.scheduler = context.wrap_lr_scheduler(torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=7, gamma=0.5),
                                                       pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        elif args.scheduler == "multistep":
            # A repeated milestone: its state_dict() keeps the milestones as a Counter (30 counted twice).
            self.scheduler = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.MultiStepLR(self.optimizer, milestones=[25, 30, 30], gamma=0.5),
                pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        elif args.scheduler == "lambda":
            # Warmup and linear decay through LambdaLR, as Hugging Face's default schedule writes it.
            self.scheduler = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda=warmup_then_decay),
                pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)
        elif args.scheduler == "onecycle":
            # The 1cycle policy: its max_lr, min_lr, initial_lr and momenta live in the optimizer's groups.
            self.scheduler = context.wrap_lr_scheduler(
                torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=hp["learning_rate"] * 4, total_steps=50),
                pytorch.LRScheduler.StepMode.STEP_EVERY_BATCH)

    def build_callbacks(self):
        return {"counter": self.counter}

    def build_training_data_loader(self):
        x, y, ids = self.data["train"]
        return pytorch.DataLoader(torch.utils.data.TensorDataset(x, y, ids), batch_size=self.args.batch_size, shuffle=True)

    def build_validation_data_loader(self):
        x, y, ids = self.data["validation"]
        return pytorch.DataLoader(torch.utils.data.TensorDataset(x, y, ids), batch_size=500)

    def train_batch(self, batch, epoch_idx, batch_idx):
        x, y, ids = batch
        output = self.model(x)
        loss = nn.functional.nll_loss(output, y)
        self.context.backward(loss)
        self.context.step_optimizer(self.optimizer)
        self.counter.batches += 1
        if self.log:
            self.log.write(json.dumps({"batch": batch_idx, "loss": float(loss.item()), "lr": self.optimizer.param_groups[0]["lr"],
                                       "counter": self.counter.batches, "records": ids.tolist()}) + "\n")
            self.log.flush()
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y, ids = batch
        output = self.model(x)
        return {"validation_loss": nn.functional.nll_loss(output, y)}


def load(args):
    images = read_idx(find(args.data, args.split, "images"))[:args.records + args.validation_records]
    labels = read_idx(find(args.data, args.split, "labels"))[:args.records + args.validation_records]
    x = torch.from_numpy(images.copy()).to(torch.float32).div_(255.0)
    train_x, val_x = x[:args.records], x[args.records:]
    mean, spread = train_x.mean().item(), train_x.std().item()
    y = torch.from_numpy(labels.astype(np.int64))
    ids = torch.arange(len(x), dtype=torch.int64)
    return {"train": (train_x.sub(mean).div_(spread).unsqueeze(1).contiguous(), y[:args.records], ids[:args.records]),
            "validation": (val_x.sub(mean).div_(spread).unsqueeze(1).contiguous(), y[args.records:], ids[args.records:])}


def train(argv):
    p = argparse.ArgumentParser(prog="determined_mnist.py")
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="t10k")
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--validation-records", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, required=True, help="batches to train in this run")
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--scheduler", default="none", choices=["none", "step", "multistep", "lambda", "onecycle"])
    p.add_argument("--net", default="plain", choices=["plain", "batchnorm"])
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--seed-from", help="seed as the trial seed of this dettrial checkpoint (check_checkpoint.py's)")
    p.add_argument("--resume", help="a checkpoint directory to continue")
    p.add_argument("--checkpoint-to", help="copy the checkpoint written at the end here")
    p.add_argument("--log", help="append one JSON line per trained batch")
    args = p.parse_args(argv)
    if args.seed_from:
        args.seed = check_checkpoint.trial_seed(args.seed_from)
    for name in ("data", "resume", "checkpoint_to", "log"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))
    logging.disable(logging.WARNING)
    # Determined 0.38 saves NumPy's generator state as an ndarray, which torch >= 2.6's default
    # `torch.load(weights_only=True)` refuses: Determined cannot resume its own checkpoints there.
    # What torch's error message recommends, for NumPy's array types only.
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([np._core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))])
    torch.set_num_threads(1)
    data = load(args)
    hparams = {"global_batch_size": args.batch_size, "learning_rate": 0.03 if args.optimizer == "sgd" else 0.002,
               "n_filters1": 8, "n_filters2": 16, "dropout": 0.3}
    start = 0
    if args.resume:
        with open(os.path.join(args.resume, "metadata.json")) as f:
            start = int(json.load(f)["steps_completed"])
        # What the master hands a resumed trial on a cluster (local mode hands 0).
        original = pytorch._PyTorchTrialController.__init__

        def with_steps_completed(self, *a, **kw):
            kw["steps_completed"] = start
            original(self, *a, **kw)
        pytorch._PyTorchTrialController.__init__ = with_steps_completed
    else:
        # A fresh trial on a cluster is seeded with its trial seed (local mode seeds nothing).
        determined.pytorch._trainer._set_random_seeds(args.seed)
    with tempfile.TemporaryDirectory() as storage:
        # Local mode stores checkpoints under the user's data directory, and copies the working
        # directory into each checkpoint's code/: both go to this run's own folder.
        os.environ["XDG_DATA_HOME"] = os.path.join(storage, "data")
        os.makedirs(os.path.join(storage, "code"))
        os.chdir(os.path.join(storage, "code"))
        storage = os.path.join(storage, "data", "determined")
        latest = None
        if args.resume:  # local mode resumes a checkpoint by its id in the checkpoint storage
            latest = "resumed-" + os.path.basename(args.resume.rstrip("/"))
            shutil.copytree(args.resume, os.path.join(storage, latest))
        exp_conf = {"checkpoint_storage": {"type": "shared_fs", "host_path": storage},
                    "hyperparameters": hparams, "reproducibility": {"experiment_seed": args.seed}}
        with pytorch.init(hparams=hparams, exp_conf=exp_conf, enable_tensorboard_logging=False) as context:
            trial = MnistTrial(context, args, data)
            trainer = pytorch.Trainer(trial, context)
            total = pytorch.Batch(start + args.batches)
            trainer.fit(max_length=total, checkpoint_period=total, validation_period=total, reporting_period=pytorch.Batch(10 ** 9),
                        latest_checkpoint=latest, checkpoint_policy="all")
        if args.checkpoint_to:
            checkpoints = [os.path.join(storage, d) for d in os.listdir(storage) if d != latest]
            newest = max(checkpoints, key=lambda d: json.load(open(os.path.join(d, "metadata.json")))["steps_completed"])
            shutil.copytree(newest, args.checkpoint_to)
    print(json.dumps({"determined": determined.__version__, "torch": torch.__version__, "batches": args.batches}))


def run(argv):
    """One run in this process: a training run, or `check_checkpoint DIR`."""
    if argv[:1] == ["check_checkpoint"]:
        return check_checkpoint.main(argv[1:])
    return train(argv)


def run_in_child(argv):
    """One run in a child forked from this process; its exit status."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = run(argv) or 0
        except SystemExit as e:  # argparse's and sys.exit("message")'s: say it as Python would
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main():
    runs = [[]]
    for token in sys.argv[1:]:
        if token == "--then":
            runs.append([])
        else:
            runs[-1].append(token)
    if len(runs) == 1:
        return run(runs[0])
    # torch.optim's first optimizer imports torch's compiler stack (seconds): here, once, for all.
    import torch._dynamo  # noqa: F401
    for index, argv in enumerate(runs):
        code = run_in_child(argv)
        if code != 0:
            print(f"determined_mnist.py: run {index + 1} of {len(runs)} ({' '.join(argv)}) ended with status {code}", file=sys.stderr)
            return code if code > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
