"""A train run's directory holds only runs that passed validation.

Hydra creates the run directory before the task starts (``hydra.run.dir``, ``hydra.sweep.dir``/``subdir``), and
would write its record (``.hydra/``: the composed config, Hydra's own, the overrides) there at once. The tree turns
that off (``hydra.output_subdir: null`` in ``conf/hydra/default.yaml``); :func:`record_hydra_files` writes the same
three files once the config has passed, and :func:`remove_if_empty` takes back the empty folder a refused command
leaves (:func:`tvq_exp.run.errors.reported`), so a rejected command leaves no run dir.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tvq_exp.files import write_text

HYDRA_SUBDIR = ".hydra"


def record_hydra_files(run_dir: Path, cfg: DictConfig) -> None:
    """Write Hydra's record of this launch into ``run_dir/.hydra/`` as Hydra writes it: ``config.yaml`` (``cfg``,
    unresolved), ``hydra.yaml`` and ``overrides.yaml``; nothing outside a Hydra launch."""
    if not HydraConfig.initialized():
        return
    hydra = HydraConfig.get()
    record = {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(OmegaConf.create({"hydra": OmegaConf.to_container(hydra)})),
        "overrides.yaml": OmegaConf.to_yaml(OmegaConf.create(list(hydra.overrides.task))),
    }
    for name, text in record.items():  # contained: never through a link planted in the run dir
        write_text(f"{HYDRA_SUBDIR}/{name}", run_dir, text)


def remove_if_empty(run_dir: str | Path) -> None:
    """Remove ``run_dir`` when it is an empty folder other than the working directory (what Hydra created for a
    command that was then refused); anything else is left alone."""
    path = Path(run_dir)
    if path.is_dir() and path.resolve() != Path.cwd().resolve() and not any(path.iterdir()):
        path.rmdir()


__all__ = ["HYDRA_SUBDIR", "record_hydra_files", "remove_if_empty"]
