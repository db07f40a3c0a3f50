"""`python train.py [key=value ...]`: see conf/train.yaml and tvq_exp.run.train."""

from omegaconf import DictConfig

from tvq_exp.run.errors import run
from tvq_exp.run.sweeps import objective
from tvq_exp.run.train import train


def main(cfg: DictConfig) -> float:
    """Train; returns the sweep objective (best val/bpb). In a multirun a failing job writes
    ``error.txt`` into its run dir and returns +inf, so the other jobs go on."""
    return objective(cfg, train)


if __name__ == "__main__":
    run("train", main)
