"""`python eval.py [key=value ...]`: see conf/eval.yaml and tvq_exp.run.evaluate."""

import hydra
from omegaconf import DictConfig

from tvq_exp.run.errors import reported, run
from tvq_exp.run.evaluate import evaluate


@hydra.main(version_base="1.3", config_path="conf", config_name="eval")
@reported
def main(cfg: DictConfig) -> None:
    evaluate(cfg)


if __name__ == "__main__":
    run(main)
