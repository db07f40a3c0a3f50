"""`experiment=quickstart` (shortened): val bits/dim falls, sample grids land in the run dir and in
TensorBoard, and sample.py turns the image checkpoint into a PNG grid."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers.config import compose_config, train_run
from tvq_exp.data.images.render import grid_shape
from tvq_exp.run.sample import sample

NUM_SAMPLES, NUM_COMPLETIONS, SCALE = 9, 4, 3
STEPS, VAL_EVERY = 60, 30


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The quickstart shortened to 60 steps, validated (and sampled) at steps 30 and 60."""
    out = tmp_path_factory.mktemp("quickstart")
    samples = {"num_samples": NUM_SAMPLES, "num_completions": NUM_COMPLETIONS, "scale": SCALE}
    overrides = [
        f"trainer.max_steps={STEPS}",
        f"trainer.val_check_interval={VAL_EVERY}",
        "module.warmup_steps=10",
    ]
    overrides += [f"callbacks.image_samples.{key}={value}" for key, value in samples.items()]
    return out, train_run(["experiment=quickstart", "trainer.enable_progress_bar=false", *overrides], out)


def events(run_dir: Path) -> list[EventAccumulator]:
    paths = sorted(run_dir.rglob("events.out.tfevents.*"))
    assert paths, f"no TensorBoard event files under {run_dir}"
    accumulators = [EventAccumulator(str(path), size_guidance={"scalars": 0, "images": 0}) for path in paths]
    for acc in accumulators:
        acc.Reload()
    return accumulators


def png_size(path: Path) -> tuple[int, int]:
    """``(height, width)`` of an RGB PNG (decoded in full)."""
    with Image.open(path) as png:
        pixels = np.asarray(png.convert("RGB"))
    return pixels.shape[0], pixels.shape[1]


def test_quickstart_lowers_val_bits_per_dim(quickstart: tuple[Path, dict[str, Any]]) -> None:
    out, summary = quickstart
    bpd = sorted(
        (e.step, e.value)
        for acc in events(out)
        if "val/bpd" in acc.Tags()["scalars"]
        for e in acc.Scalars("val/bpd")
    )
    assert [step for step, _ in bpd] == [VAL_EVERY, STEPS]
    assert bpd[1][1] < bpd[0][1] < math.log2(18)  # better than the first validation, and than uniform
    assert summary["val"]["bpd"] == pytest.approx(bpd[1][1], rel=1e-5)


def test_quickstart_writes_sample_grids(quickstart: tuple[Path, dict[str, Any]]) -> None:
    out, _ = quickstart
    for step in (VAL_EVERY, STEPS):
        samples = out / "samples" / f"step_{step:06d}.png"
        completed = out / "samples" / f"step_{step:06d}_completed.png"
        assert png_size(samples) == grid_shape(NUM_SAMPLES, 8, 8, nrow=3, scale=SCALE) == (80, 80)
        assert png_size(completed) == grid_shape(2 * NUM_COMPLETIONS, 8, 8, nrow=NUM_COMPLETIONS, scale=SCALE)
    tags = {tag for acc in events(out) for tag in acc.Tags()["images"]}
    assert {"samples/unconditional", "samples/completed"} <= tags


def test_sample_writes_png_grid_for_image_checkpoint(
    quickstart: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, _ = quickstart
    target = tmp_path / "grid.png"
    cfg = compose_config(
        "sample",
        [
            f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}",
            "num_samples=6",
            "image_nrow=3",
            "image_scale=2",
            f"output={target}",
        ],
    )
    assert sample(cfg) == target
    assert png_size(target) == grid_shape(6, 8, 8, nrow=3, scale=2) == (38, 56)
