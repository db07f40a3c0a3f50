"""`python sample.py [key=value ...]`: see conf/sample.yaml and tvq_exp.run.sample."""

import hydra
from omegaconf import DictConfig

from tvq_exp.run.errors import reported, run
from tvq_exp.run.sample import sample


@hydra.main(version_base="1.3", config_path="conf", config_name="sample")
@reported
def main(cfg: DictConfig) -> None:
    sample(cfg)


if __name__ == "__main__":
    run(main)
