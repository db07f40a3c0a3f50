"""The SLURM launcher preset, tested as far as it goes without a cluster: the composed launcher config and the
sbatch script submitit writes from it (resources, the preemption signal, the job's environment and command).
The local launchers run real two-job sweeps in tests/run/test_reliability.py."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from submitit.slurm.slurm import _make_sbatch_string

from tests.helpers.paths import CONF


def test_slurm_preset_writes_the_sbatch_script_a_cluster_would_run(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TVQ_DATA_DIR", "/data/shared")
    overrides = ["hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=4"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smoke", *overrides], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    params = {
        k: OmegaConf.select(cfg, f"hydra.launcher.{k}") for k in ("partition", "gpus_per_node", "nodes")
    }
    assert params == {"partition": "gpu", "gpus_per_node": 4, "nodes": 1}
    assert cfg.hydra.launcher.tasks_per_node == 4  # one task per GPU: Lightning's DDP under SLURM
    script = _make_sbatch_string(
        command="python -u -m submitit.core._submit " + str(tmp_path),
        folder=tmp_path,
        partition=cfg.hydra.launcher.partition,
        time=cfg.hydra.launcher.timeout_min,
        nodes=cfg.hydra.launcher.nodes,
        ntasks_per_node=cfg.hydra.launcher.tasks_per_node,
        cpus_per_task=cfg.hydra.launcher.cpus_per_task,
        gpus_per_node=cfg.hydra.launcher.gpus_per_node,
        mem=f"{cfg.hydra.launcher.mem_gb}GB",
        signal_delay_s=cfg.hydra.launcher.signal_delay_s,
        setup=list(cfg.hydra.launcher.setup),
    )
    for line in (
        "#SBATCH --partition=gpu",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --time=1440",
        "#SBATCH --signal=USR2@300",  # submitit requeues on it; resume=auto continues from last.ckpt
        "export TVQ_DATA_DIR=/data/shared",
    ):
        assert line in script, (line, script)
    assert "srun" in script and "submitit.core._submit" in script
