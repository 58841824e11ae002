"""check_checkpoint.py DIR: a dettrial checkpoint is one Determined 0.38 resumes, read as Determined
reads it: state_dict.pth through torch.load with its default (weights_only=True since torch 2.6) and
no allowlist, every key Determined's PyTorchTrial._load indexes, NumPy's and Python's generator
states that np.random.set_state and random.setstate take (and equal to what np.random.seed and
random.seed give for the trial seed, as Determined seeds them), and trial_state.pkl as Determined's
_TrialState. Exits non-zero naming what Determined would trip on."""
import json
import os
import pickle
import random
import sys

import numpy as np
import torch

from determined import pytorch


def read_state(d):
    return torch.load(os.path.join(d, "state_dict.pth"), map_location="cpu")  # Determined's own call


def seed_of(state):
    """The trial seed dettrial seeded the generators with: NumPy's legacy seeding puts it first."""
    return int(state["rng_state"]["np_rng_state"][1][0])


def trial_seed(d):
    """The trial seed of the dettrial checkpoint in D."""
    return seed_of(read_state(d))


def main(argv):
    d = argv[0]
    state = read_state(d)
    for key in ("models_state_dict", "optimizers_state_dict", "lr_schedulers_state_dict", "callbacks", "rng_state"):
        if key not in state:
            sys.exit(f"state_dict.pth has no '{key}', which Determined reads")
    rng = state["rng_state"]
    for key in ("cpu_rng_state", "np_rng_state", "random_rng_state"):
        if key not in rng:
            sys.exit(f"rng_state has no '{key}', which Determined reads")
    torch.random.set_rng_state(rng["cpu_rng_state"])
    np.random.set_state(rng["np_rng_state"])
    seed = seed_of(state)
    got_np = np.random.get_state()
    np.random.seed(seed)
    want_np = np.random.get_state()
    if got_np[0] != want_np[0] or not np.array_equal(got_np[1], want_np[1]) or got_np[2:] != want_np[2:]:
        sys.exit(f"np_rng_state is not np.random.seed({seed})'s state")
    random.setstate(rng["random_rng_state"])
    got_random = random.getstate()
    random.seed(seed)
    if got_random != random.getstate():
        sys.exit(f"random_rng_state is not random.seed({seed})'s state")
    with open(os.path.join(d, "trial_state.pkl"), "rb") as f:
        trial_state = pickle.load(f)
    pytorch._TrialState(**trial_state)  # Determined's constructor: no other keys
    with open(os.path.join(d, "metadata.json")) as f:
        steps = json.load(f)["steps_completed"]
    if trial_state["batches_trained"] != steps:
        sys.exit(f"trial_state.pkl says {trial_state['batches_trained']} batches, metadata.json {steps}")
    print(f"ok: Determined reads the checkpoint (weights_only torch.load, generators seeded with {seed}, {steps} batches)")


if __name__ == "__main__":
    main(sys.argv[1:])
