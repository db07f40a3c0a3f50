"""A study: named runs (overrides) crossed with training regimes and seeds, each evaluated the same way.

A study is a YAML file (``conf/study/<name>.yaml``)::

    name: long_context
    base: [experiment=longctx_cpu]            # overrides every run gets
    regimes:                                   # training regimes (overrides), crossed with the runs
      tbptt: []
      random: [data.sampler=random, data.seq_len=2048, data.batch_size=2]
    runs:
      gau_vq: {overrides: [model=gau_vq], seeds: [1, 2, 3]}
      gau_vq_s64: {overrides: [model=gau_vq, codebook_size=64], seeds: [1], regimes: [tbptt]}
    evaluate:                                  # eval.py of every run's last checkpoint
      - {name: sequence, protocol: sequence, sequence_len: 2048, limit_batches: 64}
      - {name: sequence_nocache, protocol: sequence, sequence_len: 2048, model: {attention: {use_cache: false}},
         only: [gau_vq]}

Every (run, regime, seed) is a :class:`Job` with its own run directory and its own result file, so a study
runs in parts, a killed job costs only itself, and tables are made from the result files alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of every run's last checkpoint (``eval.py`` options; ``model``: options merged into the
    run's model config for this evaluation only, e.g. the cache switched off; ``only``: the runs it applies to;
    ``regimes``: the regimes it applies to, e.g. one task's test protocol when the regimes are tasks)."""

    name: str
    options: Mapping[str, Any]
    model: Mapping[str, Any] = field(default_factory=dict)
    only: tuple[str, ...] = ()
    regimes: tuple[str, ...] = ()

    def applies_to(self, job: Job) -> bool:
        """Whether this evaluation scores ``job`` (its run is in ``only`` and its regime in ``regimes``)."""
        return (not self.only or job.run in self.only) and (not self.regimes or job.regime in self.regimes)


@dataclass(frozen=True)
class Job:
    """One training run of a study: ``run`` (its overrides) in ``regime`` with ``seed``."""

    study: str
    run: str
    regime: str
    seed: int
    overrides: tuple[str, ...]

    @property
    def id(self) -> str:
        """``<run>--<regime>--s<seed>``: the run directory's and the result file's name."""
        return f"{self.run}--{self.regime}--s{self.seed}"


@dataclass(frozen=True)
class Study:
    """A parsed study file: its name, jobs and evaluations."""

    name: str
    jobs: tuple[Job, ...]
    evaluations: tuple[Evaluation, ...]
    runs: tuple[str, ...]
    regimes: tuple[str, ...]


def load_study(path: str | Path) -> Study:
    """Read a study file; a malformed one raises ``ValueError`` naming the file and the key."""
    path = Path(path)
    spec = yaml.safe_load(path.read_text()) or {}
    for key in ("name", "runs", "evaluate"):
        if key not in spec:
            raise ValueError(f"{path}: a study needs '{key}'")
    base = list(spec.get("base") or [])
    regimes: dict[str, list[str]] = {
        k: list(v or []) for k, v in (spec.get("regimes") or {"default": []}).items()
    }
    jobs = []
    for run, item in spec["runs"].items():
        unknown = set(item.get("regimes") or []) - set(regimes)
        if unknown:
            raise ValueError(
                f"{path}: runs.{run}.regimes names unknown regimes {sorted(unknown)}; known: {sorted(regimes)}"
            )
        for regime in item.get("regimes") or regimes:
            for seed in item.get("seeds") or [1]:
                overrides = (*base, *regimes[regime], *item.get("overrides", []))
                jobs.append(Job(spec["name"], run, regime, int(seed), overrides))
    evaluations = tuple(
        Evaluation(
            e["name"],
            {k: v for k, v in e.items() if k not in ("name", "model", "only", "regimes")},
            e.get("model") or {},
            tuple(e.get("only") or ()),
            tuple(e.get("regimes") or ()),
        )
        for e in spec["evaluate"]
    )
    for e in evaluations:
        unknown = set(e.regimes) - set(regimes)
        if unknown:
            raise ValueError(
                f"{path}: evaluate.{e.name}.regimes names unknown regimes {sorted(unknown)}; known: {sorted(regimes)}"
            )
    return Study(spec["name"], tuple(jobs), evaluations, tuple(spec["runs"]), tuple(regimes))


__all__ = ["Evaluation", "Job", "Study", "load_study"]
