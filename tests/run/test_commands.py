"""Entry points: eval.py over a whole split, sample.py / generate from the streaming state, train.py run dirs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.helpers.config import compose_config, train_run
from tests.helpers.images import drawn_fraction
from tests.helpers.paths import REPO as ROOT
from tvq_exp.models.generation import filter_logits, generate, sample_next
from tvq_exp.run.evaluate import evaluate
from tvq_exp.run.sample import sample
from tvq_exp.run.validation import ConfigError

QUIET = ["trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "trainer.precision=32-true"]
NOISE = ("GPU available", "LOCAL_RANK", "Tip:", "TPU available", "Warning", "warn")

needs_data = pytest.mark.needs_data("text/tinyshakespeare.txt")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """10 steps of the tiny VQ model on tiny Shakespeare, validated on the whole validation split."""
    out = tmp_path_factory.mktemp("smoke")
    overrides = ["experiment=smoke", "data=shakespeare", "data.seq_len=64", "trainer.max_steps=10",
                 "trainer.val_check_interval=10", "trainer.limit_val_batches=null", *QUIET]  # fmt: skip
    return out, train_run(overrides, out)


def script(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


# ------------------------------------------------------------------------------------------- eval.py


@needs_data
def test_eval_covers_the_whole_split_and_reproduces_training(smoke_run: tuple[Path, dict[str, Any]]) -> None:
    out, trained = smoke_run
    ckpt = out / "checkpoints" / "last.ckpt"
    results = {}
    for split, carry in (("val", False), ("test", False), ("val", True)):
        protocol = "split" if carry else "segment"
        cfg = compose_config(
            "eval", [f"ckpt_path={ckpt}", f"split={split}", f"protocol={protocol}", "progress_bar=false"]
        )
        results[split, carry] = evaluate(cfg)
    val = results["val", False]
    assert abs(val["bpb"] - trained["val"]["bpb"]) < 1e-6 and val["tokens"] == trained["val"]["tokens"]

    datamodule = instantiate(
        OmegaConf.create(torch.load(ckpt, weights_only=False)["hyper_parameters"]["run_config"]["data"])
    )
    datamodule.setup("validate")
    assert val["tokens"] == datamodule.split_tokens("validation")
    # tiny Shakespeare's test split is its validation split (test_fraction 0)
    assert abs(results["test", False]["bpb"] - val["bpb"]) < 1e-6
    carried = results["val", True]
    assert carried["tokens"] == val["tokens"] and carried["bpb"] != val["bpb"]

    written = json.loads((out / "checkpoints" / "eval-last-val-segment.json").read_text())
    assert written["bpb"] == val["bpb"] and {"loss", "tokens", "split", "protocol", "checkpoint"} <= set(
        written
    )
    assert (out / "checkpoints" / "eval-last-val-split.json").is_file()
    assert (
        0.01 < drawn_fraction(out / "checkpoints" / "eval-last-val-split.png") < 0.5
    )  # bits against position


# ------------------------------------------------------------------------------------------- sampling


def _vq_model() -> torch.nn.Module:
    cfg = compose_config(
        "train",
        [
            "model=gau_vq",
            "model.d_model=32",
            "model.n_layers=2",
            "model.block.d_k=16",
            "model.attention.codebook_size=8",
            "model.attention.block_len=4",
            "data=shakespeare",
        ],
    )
    torch.manual_seed(0)
    return instantiate(cfg.model).eval()


def test_generate_from_state_equals_recomputing_the_prefix() -> None:
    model = _vq_model()
    prompt = torch.randint(0, 256, (2, 5))
    n = 23  # crosses several blocks of 4: window and compressive cache both in use
    tokens = generate(
        model, prompt, n, temperature=1.0, top_k=50, top_p=0.9, generator=torch.Generator().manual_seed(1)
    )
    assert tokens.shape == (2, n) and tokens.dtype == torch.long

    generator = torch.Generator().manual_seed(1)
    seq = prompt
    with torch.no_grad():
        for _ in range(n):
            logits = model(seq).logits[:, -1]
            seq = torch.cat([seq, sample_next(logits, 1.0, 50, 0.9, generator)[:, None]], dim=1)
        assert torch.equal(seq[:, 5:], tokens)
        full = model(seq).logits[:, 4:-1]
        out = model(prompt)
        stepped = [out.logits[:, -1]]
        for i in range(n - 1):
            out = model(tokens[:, i : i + 1], out.state)
            stepped.append(out.logits[:, -1])
    torch.testing.assert_close(torch.stack(stepped, dim=1), full, rtol=1e-4, atol=1e-5)


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.5)).tolist() == [[False, True, True, True]]
    assert sample_next(logits, temperature=0.0).item() == 0


@needs_data
def test_sample_produces_exactly_the_requested_bytes(
    smoke_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    ckpt = smoke_run[0] / "checkpoints" / "last.ckpt"
    cfg = compose_config(
        "sample",
        [
            f"ckpt_path={ckpt}",
            "prompt=ROMEO:",
            "num_bytes=37",
            "num_samples=3",
            "top_k=20",
            "top_p=0.95",
            f"output={tmp_path / 'out.bin'}",
        ],
    )
    samples = sample(cfg)
    assert [len(s) for s in samples] == [37, 37, 37]
    assert (tmp_path / "out.bin").read_bytes().startswith(b"ROMEO:")

    done = script("sample.py", f"ckpt_path={ckpt}", "prompt=Hello", "num_bytes=64", "temperature=0")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Hello") and not any(word in done.stdout + done.stderr for word in NOISE)


@needs_data
@pytest.mark.parametrize("command", ["sample", "eval"])
def test_torch_threads_applies_to_sample_and_eval(
    command: str, smoke_run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """``torch_threads`` sets torch's CPU threads in sample.py and eval.py as in train.py; bad values
    are refused naming the key."""
    ckpt = smoke_run[0] / "checkpoints" / "last.ckpt"
    run = sample if command == "sample" else evaluate
    extra = ["num_bytes=4"] if command == "sample" else ["limit_batches=1", f"output={tmp_path / 'e.json'}"]
    before = torch.get_num_threads()
    try:
        run(compose_config(command, [f"ckpt_path={ckpt}", "torch_threads=1", *extra]))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError, match="torch_threads=0"):
        run(compose_config(command, [f"ckpt_path={ckpt}", "torch_threads=0", *extra]))


# ------------------------------------------------------------------------------------------- train.py


@needs_data
def test_train_script_run_dirs_are_unique_and_complete(tmp_path: Path) -> None:
    args = [
        "experiment=smoke",
        "data=shakespeare",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.enable_progress_bar=false",
        "torch_threads=1",
        f"paths.log_dir={tmp_path}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        assert (run / "config.yaml").is_file() and (run / ".hydra" / "config.yaml").is_file()
        assert (run / "checkpoints" / "last.ckpt").is_file()
        assert list((run / "tensorboard").glob("events.out.tfevents.*"))
        assert OmegaConf.load(run / "config.yaml").paths.output_dir == str(run.resolve())
    for stdout, stderr in outputs:
        assert "step 2 | val/bpb" in stdout
        assert not any(word in stdout + stderr for word in NOISE), stdout + stderr
