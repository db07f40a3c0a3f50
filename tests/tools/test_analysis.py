"""``tvq_exp.analysis`` on a real sweep (one table row per run, plots, Markdown) and on synthetic event
files; the TensorBoard HParams plugin data holds each run's final validation metric; text samples."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from torch.utils.tensorboard import SummaryWriter

from tests.helpers.config import train_run
from tests.helpers.images import drawn_fraction
from tests.helpers.sweeps import GROUP, OK_JOBS, REPO, make_small_sweep
from tvq_exp import analysis
from tvq_exp.callbacks.train_clock import TAG as CLOCK
from tvq_exp.run.build import build_module, to_dict
from tvq_exp.tools.analysis.frontier import frontier_config
from tvq_exp.tools.analysis.runs import run_summary

SWEPT = "model.attention.codebook_size"


@pytest.fixture
def small_sweep(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """The shared small sweep (see ``sweep_fixture``)."""
    return make_small_sweep(tmp_path_factory.getbasetemp())


def _accumulator(run: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


@GROUP
def test_analysis_command_writes_table_and_plots(small_sweep: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    analysis.main([str(small_sweep), "--out", str(out)])
    table = analysis.load_sweep(small_sweep)
    assert len(table) == len(OK_JOBS) and table.attrs["swept"] == [SWEPT]
    assert sorted(table[SWEPT], key=int) == ["16", "32"] and list(table["status"]) == ["ok", "ok"]
    assert table["final val/bpb"].between(1.0, 9.0).all() and (table["steps"] == 4).all()
    assert (table["wall_time_s"] > 0).all()
    summary = (out / "summary.md").read_text()
    assert summary.count("| small_sweep/") == len(table)
    pngs = {p.name for p in out.glob("*.png")}
    assert {
        "val_bpb_vs_step.png",
        "val_bpb_vs_wall_time.png",
        "final_val_bpb_vs_model_attention_codebook_size.png",
    } <= pngs
    assert all(0.01 < drawn_fraction(out / name) < 0.5 for name in pngs)


@GROUP
def test_frontier_report_names_each_backend_run(small_sweep: Path, tmp_path: Path) -> None:
    """The frontier's report step on real runs laid out as ``runs/<model>`` (its training step is
    ``train.py`` itself): one row per model, named after its folder, and the plot."""
    runs = sorted(p for p in small_sweep.iterdir() if (p / "tensorboard").is_dir())
    (tmp_path / "runs").mkdir()
    for name, run in zip(("gau_vq", "gau_dense"), runs, strict=False):
        (tmp_path / "runs" / name).symlink_to(run, target_is_directory=True)
    table = analysis.frontier_report(tmp_path, ["gau_vq", "gau_dense"], 60)
    assert sorted(table["model"]) == ["gau_dense", "gau_vq"]
    report = (tmp_path / "frontier.md").read_text()
    assert "| gau_vq |" in report and "| gau_dense |" in report
    assert 0.01 < drawn_fraction(tmp_path / "frontier.png") < 0.5


@GROUP
def test_hparams_plugin_holds_final_validation_metric(small_sweep: Path) -> None:
    for job in OK_JOBS:
        accumulator = _accumulator(small_sweep / job)
        content = accumulator.PluginTagToContent("hparams")
        experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        metric_tags = {info.name.tag for info in experiment.metric_infos}
        assert {"final/val_bpb", "final/best_val_bpb", "final/train_loss"} <= metric_tags
        start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        hparams = start.session_start_info.hparams
        expected = yaml.safe_load((small_sweep / job / ".hydra" / "overrides.yaml").read_text())
        assert f"{SWEPT}={int(hparams[SWEPT].number_value)}" in expected
        final = accumulator.Scalars("final/val_bpb")[-1].value
        last_val = accumulator.Scalars("val/bpb")[-1].value
        assert math.isclose(final, last_val, rel_tol=1e-6)


@GROUP
def test_scalar_groups_and_text_samples_logged(small_sweep: Path) -> None:
    accumulator = _accumulator(small_sweep / OK_JOBS[0])
    tags = accumulator.Tags()["scalars"]
    for group in ("train/", "val/", "codebook/layer0/", "throughput/", "lr/"):
        assert any(tag.startswith(group) for tag in tags), group
    assert "samples/text/text_summary" in accumulator.Tags()["tensors"]
    text = accumulator.Tensors("samples/text/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert text.strip("`\n").startswith("The ")


def test_load_scalars_and_summary_on_synthetic_runs(tmp_path: Path) -> None:
    """Job 0 logs at step 0 (as VQ's codebook scalars), job 1 first at step 5 (as dense at log_every_n_steps):
    their event times start at different moments, their training clocks (``time/train_s``) alike. Times come
    from the clock: 14 s for both, and val/bpb at 7 s and 14 s in both plots."""
    for job, final in (("0", 2.0), ("1", 1.5)):
        run = tmp_path / job
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(f"- +sweep=x\n- model.block.heads={int(job) + 1}\n")
        writer = SummaryWriter(run / "tensorboard")
        if job == "0":
            writer.add_scalar("codebook/usage", 1.0, 0, walltime=90.0)
        for step, value in ((5, 3.0), (10, final)):
            writer.add_scalar("val/bpb", value, step, walltime=100.0 + step)
            writer.add_scalar(CLOCK, 1.4 * step, step, walltime=100.0 + step)
        writer.close()
    table = analysis.load_sweep(tmp_path)
    assert table.attrs["swept"] == ["model.block.heads"]
    assert list(table["final val/bpb"]) == [2.0, 1.5] and list(table["best val/bpb"]) == [2.0, 1.5]
    assert list(table["wall_time_s"]) == pytest.approx([14.0, 14.0])
    lines = analysis.plot_curves(table, "val/bpb", "wall_time").get_lines()
    assert [list(line.get_xdata()) for line in lines] == [pytest.approx([7.0, 14.0])] * 2
    markdown = analysis.markdown_table(table)
    assert markdown.splitlines()[0].startswith("| run | model.block.heads | status")
    assert len(markdown.splitlines()) == 4


@pytest.mark.parametrize("attention", ["vq", "dense"])
def test_training_time_axis_is_one_clock_from_the_start_of_training(attention: str, tmp_path: Path) -> None:
    """A real run of each backend: its time is the training clock, not its event times (VQ's first event is at
    step 0, dense's at log_every_n_steps): the summary's time is final/train_time_s, and each val/bpb point
    sits at the clock's reading for its step, after the start (> 0) and within the run."""
    train_run(
        [
            "experiment=smoke",
            f"model/attention={attention}",
            "trainer.max_steps=6",
            "trainer.val_check_interval=3",
            "trainer.log_every_n_steps=3",
            "trainer.limit_val_batches=1",
            "logger=tensorboard",
        ],
        tmp_path,
    )
    table = analysis.load_sweep(tmp_path)
    scalars = table.attrs["scalars"][str(tmp_path)]
    final_time = scalars.loc[scalars["tag"] == "final/train_time_s", "value"].item()
    assert table["wall_time_s"].item() == pytest.approx(final_time)
    (line,) = analysis.plot_curves(table, "val/bpb", "wall_time").get_lines()
    times = line.get_xdata()
    clock = scalars[scalars["tag"] == CLOCK].groupby("step")["value"].max()
    assert list(times) == pytest.approx([clock[3], clock[6]])
    assert 0 < times[0] < times[1] <= final_time


@pytest.mark.parametrize("model", frontier_config()["models"])
def test_frontier_configs_compose_at_equal_width(model: str, tmp_path: Path) -> None:
    overrides = [o for o in analysis.frontier_overrides(model, 60, tmp_path) if not o.startswith("hydra.")]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
    assert cfg.trainer.max_time == "00:00:01:00"
    assert cfg.data.sampler == "random"  # every backend trains as it is validated: from an empty state
    module = build_module(to_dict(cfg))
    assert module.model.d_model == 128
    assert len(module.model.blocks) == 4


def test_final_value_is_the_hparams_final_value_not_the_last_logged(tmp_path: Path) -> None:
    """With ``log_every_n_steps=50`` the last logged train/loss is step 450's; the HParams carry the last
    step's (``final/train_loss``): the table reports that one. Without it, the last logged value."""
    scalars = pd.DataFrame(
        {
            "tag": ["train/loss", "train/loss", "final/train_loss", "val/bpb"],
            "step": [400, 450, 499, 499],
            "wall_time": [1.0, 2.0, 3.0, 3.0],
            "value": [2.0, 1.9, 1.7, 2.5],
        }
    )
    row = run_summary(tmp_path, scalars)
    assert row["final train/loss"] == 1.7 and row["best train/loss"] == 1.9
    assert row["final val/bpb"] == 2.5
