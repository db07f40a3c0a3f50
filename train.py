"""`python train.py [key=value ...]`: see conf/train.yaml and tvq_exp.run.train."""

import sys

from omegaconf import DictConfig

from tvq_exp.run.errors import USAGE_STATUS, fail, run
from tvq_exp.run.routes import command_line_conflict
from tvq_exp.run.sweeps import objective
from tvq_exp.run.train import train


def main(cfg: DictConfig) -> float:
    """Train; returns the sweep objective (best val/bpb). In a multirun a failing job writes
    ``error.txt`` into its run dir and returns +inf, so the other jobs go on."""
    return objective(cfg, train)


if __name__ == "__main__":
    # before a multirun launches the cross product of two routes to one option
    if (conflict := command_line_conflict(sys.argv[1:])) is not None:
        fail(conflict, USAGE_STATUS)
    run("train", main)
