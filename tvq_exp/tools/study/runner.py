"""Running a study's jobs: train (resumable), evaluate, and write one result file per job.

Each job trains with ``train.py`` in ``<out>/runs/<job id>`` (``run_name`` + ``resume=auto``: a killed job
continues from its last checkpoint, a finished one is not trained again), then runs every evaluation with
``eval.py``, then writes ``<out>/results/<job id>.json`` (atomically): the job, its resolved config, the
training summary and every evaluation's JSON. A job whose result file exists is skipped, so
``run`` can be called again and again until the study is complete, in as many parts as needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from tvq_exp.files import append_to, write_text
from tvq_exp.tools.study.spec import Evaluation, Job, Study

REPO = Path(__file__).resolve().parents[3]


def result_path(out: Path, job: Job) -> Path:
    return out / "results" / f"{job.id}.json"


def run_dir(out: Path, job: Job) -> Path:
    return out / "runs" / job.id


def flatten(options: dict[str, Any], prefix: str) -> list[str]:
    """``{"attention": {"use_cache": False}}`` -> ``["+<prefix>.attention.use_cache=false"]`` (Hydra overrides)."""
    items = []
    for key, value in options.items():
        if isinstance(value, dict):
            items += flatten(value, f"{prefix}.{key}")
        else:
            items.append(f"+{prefix}.{key}={json.dumps(value) if isinstance(value, bool) else value}")
    return items


def run_logged(command: list[str], log: Path, threads: int, out: Path) -> None:
    """Run ``command`` in the repository with ``threads`` CPU threads, its output appended to ``log`` (inside the
    study folder ``out``, never through a link)."""
    env = os.environ | {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
    }
    with append_to(os.path.abspath(log), os.path.abspath(out)) as handle:
        handle.write("$ " + " ".join(command) + "\n")
        handle.flush()
        done = subprocess.run(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode:
        raise RuntimeError(f"exit {done.returncode}: {' '.join(command[:3])}... (log: {log})")


def train_job(job: Job, out: Path, threads: int) -> dict[str, Any]:
    """Train (or resume, or skip when finished) the job; returns its ``finished.json`` summary."""
    directory = run_dir(out, job)
    command = [
        sys.executable, "train.py", *job.overrides, f"seed={job.seed}", f"run_name={job.id}", "resume=auto",
        f"hydra.run.dir={directory}", f"torch_threads={threads}", "trainer.enable_progress_bar=false",
    ]  # fmt: skip
    run_logged(command, directory / "job.log", threads, out)
    return json.loads((directory / "finished.json").read_text())


def evaluate_job(job: Job, evaluation: Evaluation, out: Path, threads: int) -> dict[str, Any]:
    """One evaluation of the job's last checkpoint (its JSON, cached in the run directory)."""
    directory = run_dir(out, job)
    output = directory / f"eval-{evaluation.name}.json"
    if not output.is_file():
        options = [f"{key}={value}" for key, value in evaluation.options.items()]
        command = [
            sys.executable, "eval.py", f"ckpt_path={directory / 'checkpoints' / 'last.ckpt'}", f"output={output}",
            "progress_bar=false", *options, *flatten(dict(evaluation.model), "model_options"),
        ]  # fmt: skip
        run_logged(command, directory / "job.log", threads, out)
    return json.loads(output.read_text())


def run_job(study: Study, job: Job, out: Path, threads: int) -> Path:
    """Train, evaluate and write the job's result file (skipped when it exists). ``out`` may be relative to the
    working directory: it is made absolute first (the writers take a path inside it as relative to it)."""
    out = Path(os.path.abspath(out))
    path = result_path(out, job)
    if path.is_file():
        return path
    start = time.time()
    summary = train_job(job, out, threads)
    evaluations = {e.name: evaluate_job(job, e, out, threads) for e in study.evaluations if e.applies_to(job)}
    config = yaml.safe_load((run_dir(out, job) / "config.yaml").read_text())
    result = {
        "study": study.name, "run": job.run, "regime": job.regime, "seed": job.seed, "id": job.id,
        "overrides": list(job.overrides), "config": config, "train": summary, "evaluations": evaluations,
        "seconds": time.time() - start,
    }  # fmt: skip
    result = repo_relative(result, REPO)
    return write_text(path, out, json.dumps(result, indent=1) + "\n")


def repo_relative(value: Any, root: Path) -> Any:
    """``value`` (nested dicts and lists) with every absolute path under ``root`` written relative to it, so a
    committed result file names no machine's directories (``studies/x/runs/a/checkpoints/last.ckpt``)."""
    if isinstance(value, dict):
        return {key: repo_relative(item, root) for key, item in value.items()}
    if isinstance(value, list):
        return [repo_relative(item, root) for item in value]
    prefix = str(root).rstrip("/") + "/"
    return value[len(prefix) :] if isinstance(value, str) and value.startswith(prefix) else value


def select(
    study: Study, runs: Sequence[str] = (), regimes: Sequence[str] = (), seeds: Sequence[int] = ()
) -> list[Job]:
    """The study's jobs, filtered by run, regime and seed (empty filters keep everything)."""
    return [
        job for job in study.jobs
        if (not runs or job.run in runs) and (not regimes or job.regime in regimes) and (not seeds or job.seed in seeds)
    ]  # fmt: skip


def run_jobs(
    study: Study, jobs: Iterable[Job], out: Path, parallel: int = 1, cores: int | None = None
) -> list[str]:
    """Run ``jobs`` (``parallel`` at a time, the cores shared among them); returns one line per job: its
    result file or why it failed. A failed job does not stop the others."""
    threads = max(1, (cores or os.cpu_count() or 1) // parallel)

    def one(job: Job) -> str:
        try:
            return f"{job.id}: {run_job(study, job, out, threads)}"
        except RuntimeError as error:
            return f"{job.id}: failed, {error}"

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        return list(pool.map(one, jobs))


__all__ = [
    "evaluate_job",
    "run_logged",
    "repo_relative",
    "result_path",
    "run_dir",
    "run_job",
    "run_jobs",
    "select",
    "train_job",
]
