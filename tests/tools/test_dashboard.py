"""The dashboard as users open it: the real TensorBoard server on the logs of a small sweep, read over its HTTP
API (127.0.0.1 only): the runs, the scalars, the HParams table with the swept values and the final metrics,
the position plot image and the text samples a browser would show."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO

pytestmark = pytest.mark.needs_data("text")


def _get(base: str, path: str, **query: str) -> Any:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
    return body if path.endswith("individualImage") else json.loads(body)


def _post(base: str, path: str, payload: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        f"{base}{path}", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _start(logdir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """TensorBoard on a free port, its output in ``log`` (a file: a pipe nobody drains could fill); returns the
    process and its base URL."""
    command = [str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(logdir), "--host", "127.0.0.1",
               "--port", "0", "--reload_interval", "1"]  # fmt: skip
    with log.open("wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline and server.poll() is None:
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", log.read_text(errors="replace"))
        if match:
            return server, f"http://127.0.0.1:{match.group(1)}"
        time.sleep(0.2)
    server.kill()
    raise AssertionError(f"TensorBoard did not print its address within 60 s:\n{log.read_text()[-2000:]}")


def _stop(server: subprocess.Popen[bytes]) -> None:
    """Stop the server as a user would (Ctrl-C), or kill it if it has not exited 30 s later (a clean-clone CI run
    on two busy cores once saw it still shutting down then, after every assertion had passed)."""
    server.send_signal(signal.SIGINT)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=30)


def _finished_bpb(log_dir: Path, run: str) -> float:
    """The last validation's bits per byte of sweep job ``run`` (``"0/tensorboard"``), from its finished.json."""
    job = log_dir / "multiruns" / "dash" / run.split("/")[0]
    return json.loads((job / "finished.json").read_text())["val"]["bpb"]


def test_tensorboard_serves_a_sweeps_scalars_hparams_images_and_text(tmp_path: Path) -> None:
    sweep = [
        sys.executable, str(REPO / "train.py"), "-m", "experiment=smoke", "trainer.max_steps=4",
        "trainer.val_check_interval=2", "trainer.enable_progress_bar=false", "data.batch_size=2,4",
        "run_name=dash", f"paths.log_dir={tmp_path}",
    ]  # fmt: skip
    done = subprocess.run(sweep, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    server, base = _start(tmp_path / "multiruns" / "dash", tmp_path / "tensorboard.log")
    try:
        runs: list[str] = []
        deadline = time.time() + 60
        while time.time() < deadline:  # the logs load asynchronously
            tags = _get(base, "/data/plugin/scalars/tags")
            runs = sorted(run for run, run_tags in tags.items() if "val/bpb" in run_tags)
            if len(runs) == 2:
                break
            time.sleep(1)
        assert runs == ["0/tensorboard", "1/tensorboard"], tags
        for run in runs:
            points = _get(base, "/data/plugin/scalars/scalars", run=run, tag="val/bpb")
            assert [step for _, step, _ in points] == [2, 4]
            # the last point is the run's last validation, as its finished.json records it
            assert points[-1][2] == pytest.approx(_finished_bpb(tmp_path, run), rel=1e-6)

        experiment = _post(base, "/data/plugin/hparams/experiment", {"experimentName": ""})
        hparams = {info["name"] for info in experiment["hparamInfos"]}
        assert "data.batch_size" in hparams, sorted(hparams)
        groups = _post(base, "/data/plugin/hparams/session_groups", {
            "experimentName": "", "startIndex": 0, "sliceSize": 10,
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
            "colParams": [{"hparam": "data.batch_size", "includeInResult": True},
                          {"metric": {"tag": "final/val_bpb", "group": ""}, "includeInResult": True}],
        })["sessionGroups"]  # fmt: skip
        swept = sorted(g["hparams"]["data.batch_size"] for g in groups)
        assert swept == [2, 4], groups
        finals = sorted(_finished_bpb(tmp_path, run) for run in runs)
        values = sorted(
            m["value"] for g in groups for m in g["metricValues"] if m["name"]["tag"] == "final/val_bpb"
        )
        assert values == pytest.approx(finals, rel=1e-6)

        images = _get(base, "/data/plugin/images/images", run=runs[0], tag="val/bpb_by_position", sample="0")
        png = _get(base, "/data/plugin/images/individualImage", blob_key=images[-1]["query"].split("=", 1)[1])
        assert png[:4] == b"\x89PNG"
        texts = _get(base, "/data/plugin/text/text", run=runs[0], tag="samples/text/text_summary")
        assert texts and texts[-1]["step"] == 4 and "The " in texts[-1]["text"]
    finally:
        _stop(server)
