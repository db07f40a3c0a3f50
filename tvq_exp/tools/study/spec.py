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
    compare:                                   # the report's comparisons, paired by seed (optional)
      - {run: gau_vq_s64, against: gau_vq, regime: tbptt}

Every (run, regime, seed) is a :class:`Job` with its own run directory and its own result file, so a study
runs in parts, a killed job costs only itself, and tables are made from the result files alone.
"""

from __future__ import annotations

import re
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
class Comparison:
    """``run`` against ``against`` in ``regime``, paired by seed: a table of the report (its first evaluation)."""

    run: str
    against: str
    regime: str


@dataclass(frozen=True)
class Study:
    """A parsed study file: its name, jobs, evaluations and the comparisons its report makes."""

    name: str
    jobs: tuple[Job, ...]
    evaluations: tuple[Evaluation, ...]
    runs: tuple[str, ...]
    regimes: tuple[str, ...]
    comparisons: tuple[Comparison, ...] = ()


STUDY_KEYS = ("name", "base", "regimes", "runs", "evaluate", "compare")
RUN_KEYS = ("overrides", "seeds", "regimes")
COMPARE_KEYS = ("run", "against", "regime")
RUNNER_KEYS = ("hydra.", "paths.", "run_name", "ckpt_path", "output", "resume")  # the runner's own
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+=@-]*")  # a file name's part: no '/', no leading '.'


def load_study(path: str | Path) -> Study:
    """Read a study file; a malformed one raises ``ValueError`` naming the file, the key and what is allowed
    (plain YAML; run, regime and evaluation names are plain names, since they name folders and files)."""
    path = Path(path)
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        first = " ".join(str(error).split())[:160]
        raise ValueError(
            f"{path}: not plain YAML data ({first}); a study file holds plain values only"
        ) from None
    if not isinstance(spec, dict):
        raise ValueError(
            f"{path}: a study is a mapping of {', '.join(STUDY_KEYS)}, got {type(spec).__name__}"
        )
    for key in ("name", "runs", "evaluate"):
        if key not in spec:
            raise ValueError(f"{path}: a study needs '{key}'")
    _keys(path, "the study", spec, STUDY_KEYS)
    _name(path, "name", spec["name"])
    base = _overrides(path, "base", spec.get("base"))
    regimes = {
        _name(path, "regimes", k): _overrides(path, f"regimes.{k}", v)
        for k, v in _mapping(path, "regimes", spec.get("regimes") or {"default": []}).items()
    }
    jobs = []
    for run, item in _mapping(path, "runs", spec["runs"]).items():
        _name(path, "runs", run)
        item = _mapping(path, f"runs.{run}", item or {})
        _keys(path, f"runs.{run}", item, RUN_KEYS)
        unknown = set(_strings(path, f"runs.{run}.regimes", item.get("regimes"))) - set(regimes)
        if unknown:
            raise ValueError(
                f"{path}: runs.{run}.regimes names unknown regimes {sorted(unknown)}; known: {sorted(regimes)}"
            )
        seeds = item.get("seeds") or [1]
        if not isinstance(seeds, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                  for x in seeds):  # fmt: skip
            raise ValueError(f"{path}: runs.{run}.seeds={seeds!r}: must be a list of integers >= 0")
        for regime in item.get("regimes") or regimes:
            for seed in seeds:
                overrides = (
                    *base,
                    *regimes[regime],
                    *_overrides(path, f"runs.{run}.overrides", item.get("overrides")),
                )
                jobs.append(Job(spec["name"], run, regime, int(seed), overrides))
    if not isinstance(spec["evaluate"], list) or not all(isinstance(e, dict) for e in spec["evaluate"]):
        raise ValueError(f"{path}: evaluate must be a list of mappings, each with a name")
    evaluations = tuple(
        Evaluation(
            _name(path, "evaluate", e.get("name")),
            {k: v for k, v in e.items() if k not in ("name", "model", "only", "regimes")},
            _mapping(path, f"evaluate.{e.get('name')}.model", e.get("model") or {}),
            tuple(_strings(path, f"evaluate.{e.get('name')}.only", e.get("only"))),
            tuple(_strings(path, f"evaluate.{e.get('name')}.regimes", e.get("regimes"))),
        )
        for e in spec["evaluate"]
    )
    for e in evaluations:
        unknown = set(e.regimes) - set(regimes)
        if unknown:
            raise ValueError(
                f"{path}: evaluate.{e.name}.regimes names unknown regimes {sorted(unknown)}; known: {sorted(regimes)}"
            )
        _overrides(path, f"evaluate.{e.name}", [f"{k}={v}" for k, v in e.options.items()])
        bad = [k for k, v in e.options.items() if not isinstance(v, str | int | float | bool) or v is None]
        if bad:
            raise ValueError(f"{path}: evaluate.{e.name}.{bad[0]}: must be a plain value (text or number)")
    comparisons = _comparisons(path, spec.get("compare"), tuple(spec["runs"]), tuple(regimes))
    return Study(spec["name"], tuple(jobs), evaluations, tuple(spec["runs"]), tuple(regimes), comparisons)


def _comparisons(
    path: Path, value: object, runs: tuple[str, ...], regimes: tuple[str, ...]
) -> tuple[Comparison, ...]:
    """``compare``: a list of ``{run, against, regime}``, each naming the study's runs and one of its regimes."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise ValueError(f"{path}: compare must be a list of mappings {{run, against, regime}}")
    comparisons = []
    for i, item in enumerate(value):
        _keys(path, f"compare[{i}]", item, COMPARE_KEYS)
        missing = [k for k in COMPARE_KEYS if k not in item]
        if missing:
            raise ValueError(
                f"{path}: compare[{i}] needs {', '.join(missing)} (keys: {', '.join(COMPARE_KEYS)})"
            )
        for key, known in (("run", runs), ("against", runs), ("regime", regimes)):
            if item[key] not in known:
                raise ValueError(
                    f"{path}: compare[{i}].{key}={item[key]!r}: not one of the study's "
                    f"{'regimes' if key == 'regime' else 'runs'} ({', '.join(known)})"
                )
        comparisons.append(Comparison(item["run"], item["against"], item["regime"]))
    return tuple(comparisons)


def plain_name(value: object) -> bool:
    """Whether ``value`` can name a folder or file of a study (no ``/``, no ``..``, no leading ``.``; no ``--``,
    which joins the parts of a job id)."""
    return isinstance(value, str) and bool(NAME.fullmatch(value)) and ".." not in value and "--" not in value


def _name(path: Path, where: str, value: object) -> str:
    if not plain_name(value):
        raise ValueError(
            f"{path}: {where} name {value!r} must be a plain name (letters, digits, _ . + = @ -; no '/', '..', "
            "'--' or leading '.'): it names folders and files"
        )
    return str(value)


def _mapping(path: Path, where: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{path}: {where} must be a mapping, got {type(value).__name__} {value!r:.60}")
    return value


def _strings(path: Path, where: str, value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str | int | float) for x in value):
        raise ValueError(f"{path}: {where} must be a list of overrides (text), got {value!r:.80}")
    return [str(x) for x in value]


def _overrides(path: Path, where: str, value: object) -> list[str]:
    """A list of ``train.py`` / ``eval.py`` overrides that leave where the runner puts its files alone."""
    items = _strings(path, where, value)
    for item in items:
        key = item.split("=", 1)[0].lstrip("+~")
        if key.startswith(RUNNER_KEYS) or key in RUNNER_KEYS:
            raise ValueError(
                f"{path}: {where}: {item!r}: a study may not set {key} (the runner places every run dir and "
                f"output under --out; not allowed: {', '.join(RUNNER_KEYS)})"
            )
    return items


def _keys(path: Path, where: str, value: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise ValueError(f"{path}: {where} has unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")


__all__ = ["Evaluation", "Job", "Study", "load_study", "plain_name"]
