"""Every command the docs give works: each ``python train.py|eval.py|sample.py``, ``python -m tvq_exp...``,
``make``, ``torchrun`` and ``srun`` line of the fenced blocks of README.md, CONTRIBUTING.md and docs/*.md
(:mod:`tests.helpers.doc_commands`) is run at a tiny budget or composed, as it can be here:

- ``train.py``: composed and dry-run (:func:`tvq_exp.run.validation.validate`: every check a run makes before it
  reads data, on the meta device), each job of a ``-m`` sweep (the command line's and the sweeper's
  ``params``); one that continues a run (``ckpt_path=<run>/...``) runs for real, a step past the fixture run; a
  ``$ python train.py ...`` example runs and must print the output shown under it;
- ``eval.py`` and ``sample.py``: run on the fixture run's checkpoint (a few batches, a few bytes);
- ``python -m tvq_exp.X``: every ``--option`` it gives is one the command takes (its ``--help``); a study's
  file loads and its ``--runs``/``--regimes`` select jobs; a benchmark's names are known;
- ``make X``: the target exists (``make -n``), what it runs is checked as above, and a ``# = CMD`` comment is
  what it runs.

The fixture run is the README's main command (``experiment=smoke``) at two steps; ``<run>``, ``<dense run>``,
``ckpt_path=...`` and the like name it. GPU, multi-GPU, multi-node and download commands compose only.

Over 300 lines: one checker per kind of command, kept in one file so that a new kind of command is taught here.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override
from omegaconf import DictConfig

from tests.helpers.doc_commands import DocCommand, all_doc_commands
from tests.helpers.paths import CONF, REPO
from tvq_exp.tools import train_command

pytestmark = pytest.mark.xdist_group("doc_commands")  # one worker: one fixture run, one continued run
COMMANDS = all_doc_commands()
FIXTURE_STEPS = 2
BUDGET = ("trainer.val_check_interval=1", "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false")
# placeholders the docs use for a run's checkpoint, and the file the fsdp conversion above writes
CHECKPOINT_PLACEHOLDERS = re.compile(r"^(logs/runs/<run>|<run>|<dense_run>)/checkpoints/last\.ckpt$|^\.\.\.$")
CONVERTED = "last_single.ckpt"
SHELL_VARIABLES = {"$NODE_RANK": "0", "$MASTER_HOST": "127.0.0.1", "$SLURM_JOB_ID": "1"}
WORD_PLACEHOLDERS = {"<seed>": "1", "<name>": "long_context"}


@pytest.fixture(scope="module")
def fixture_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's main command (``experiment=smoke``) at ``FIXTURE_STEPS`` steps, run in a folder of its own;
    returns that folder (the run is ``logs/runs/<id>/`` in it)."""
    base = tmp_path_factory.mktemp("doc_commands")
    args = ["experiment=smoke", f"trainer.max_steps={FIXTURE_STEPS}", *BUDGET]
    run = train_command.run_train(args, base, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return base


def run_dir(base: Path) -> Path:
    (found,) = (base / "logs" / "runs").iterdir()
    return found


def filled(args: list[str], base: Path | None) -> list[str]:
    """``args`` with the docs' placeholders replaced: a run's checkpoint by the fixture run's (relative to ``base``,
    where the command runs), shell variables and ``<seed>``-like words by values."""
    out = []
    for arg in args:
        for name, value in [*SHELL_VARIABLES.items(), *WORD_PLACEHOLDERS.items()]:
            arg = arg.replace(name, value)
        key, eq, value = arg.partition("=")
        if base is not None and (CHECKPOINT_PLACEHOLDERS.match(value if eq else arg) or value == CONVERTED):
            path = (run_dir(base) / "checkpoints" / "last.ckpt").relative_to(base)
            arg = f"{key}={path}" if eq else str(path)
        out.append(arg)
    return out


def with_budget(args: list[str], budget: dict[str, str]) -> list[str]:
    """``args`` with each key of ``budget`` set to its value (replaced where given, else appended)."""
    kept = [a for a in args if a.partition("=")[0] not in budget]
    return kept + [f"{key}={value}" for key, value in budget.items()]


# --------------------------------------------------------------------------------------- train.py: compose
@contextlib.contextmanager
def hydra_dir() -> Iterator[None]:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def composed(config: str, overrides: list[str]) -> DictConfig:
    """``conf/<config>.yaml`` with ``overrides``, Hydra's own config set (as a launch sets it)."""
    cfg = compose(config, overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return cfg


def sweep_values(override: Override) -> list[str]:
    """The values a sweep override runs (an interval: its lower end)."""
    value = override.value()
    if isinstance(value, IntervalSweep):
        return [str(value.start)]
    return list(override.sweep_string_iterator())


def override_key(override: Override) -> str:
    prefix = {"ADD": "+", "FORCE_ADD": "++", "DEL": "~"}.get(override.type.name, "")
    return prefix + override.get_key_element()


def sweep_jobs(args: list[str]) -> list[list[str]]:
    """The overrides of each job of ``python train.py -m ARGS``: every value of every swept key (the others at
    their first value), the sweeper's ``params`` (``+sweep=NAME``, ``hparams_search=...``) included."""
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(args)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    sweeps = [o for o in parsed if o.is_sweep_override()]
    params = composed("train", fixed).hydra.sweeper.get("params") or {}
    sweeps += parser.parse_overrides([f"{key}={value}" for key, value in params.items()])
    firsts = {override_key(o): sweep_values(o)[0] for o in sweeps}
    jobs = [fixed + [f"{key}={value}" for key, value in firsts.items()]]
    for sweep in sweeps:
        for value in sweep_values(sweep)[1:]:
            jobs.append(
                fixed + [f"{k}={value if k == override_key(sweep) else v}" for k, v in firsts.items()]
            )
    return jobs


def compose_train(args: list[str]) -> None:
    """Compose and dry-run ``python train.py ARGS`` (each job of a ``-m`` sweep)."""
    from tvq_exp.run.validation import Command, validate  # noqa: PLC0415 - after conftest set the data root

    multirun = bool({"-m", "--multirun"} & set(args))
    args = [a for a in args if a not in ("-m", "--multirun")]
    with hydra_dir():
        for job in sweep_jobs(args) if multirun else [args]:
            validate(composed("train", job), Command.TRAIN)


def train_args(argv: list[str]) -> list[str] | None:
    """The ``train.py`` arguments of ``python train.py ...``, ``torchrun ... train.py ...``, ``srun python
    train.py ...`` (``None``: not a train command)."""
    words = argv[1:] if argv[0] == "srun" else argv
    if words[:2] == ["python", "train.py"] or (words[0] == "torchrun" and "train.py" in words):
        return words[words.index("train.py") + 1 :]
    return None


# --------------------------------------------------------------------------------------- the other commands
def run_in_process(config: str, args: list[str], base: Path) -> None:
    """``python eval.py|sample.py ARGS`` from ``base``, in this process (the task the script runs)."""
    from tvq_exp.run.evaluate import evaluate  # noqa: PLC0415
    from tvq_exp.run.sample import sample  # noqa: PLC0415

    task = {"eval": evaluate, "sample": sample}[config]
    with contextlib.chdir(base), hydra_dir(), contextlib.redirect_stdout(io.StringIO()):
        task(composed(config, args))


@cache
def module_options(module: str, sub: tuple[str, ...]) -> frozenset[str]:
    """The ``--options`` that ``python -m MODULE SUB... --help`` lists."""
    import importlib  # noqa: PLC0415

    main = importlib.import_module(module).main
    text = io.StringIO()
    with contextlib.redirect_stdout(text), pytest.raises(SystemExit):
        main([*sub, "--help"])
    return frozenset(re.findall(r"(?<![\w-])(--[\w-]+)", text.getvalue()))


def check_module_command(argv: list[str]) -> None:
    """``python -m MODULE ARGS``: its options are the command's; a study's file and selection, a benchmark's
    names, are real."""
    module, args = argv[2], argv[3:]
    module = {
        "tvq_exp.analysis": "tvq_exp.tools.analysis.cli",
        "tvq_exp.bench": "tvq_exp.tools.bench.cli",
    }.get(module, module)
    sub = tuple(args[: next((i for i, a in enumerate(args) if not re.fullmatch(r"[a-z_]+", a)), len(args))])
    unknown = {a.split("=")[0] for a in args if a.startswith("--")} - module_options(module, sub)
    assert not unknown, f"{' '.join(argv[:3] + list(sub))} takes no {sorted(unknown)}"
    if module == "tvq_exp.tools.bench.cli":
        from tvq_exp.tools.bench.cli import check_names, parser  # noqa: PLC0415

        check_names(parser().parse_args(args))
    if sub[:1] == ("study",):
        check_study(args)


def check_study(args: list[str]) -> None:
    from tvq_exp.tools.study.runner import select  # noqa: PLC0415
    from tvq_exp.tools.study.spec import load_study  # noqa: PLC0415

    study = load_study(REPO / args[2])
    options = dict(zip(args[3::2], args[4::2], strict=False))
    runs, regimes = (options.get(k, "").split(",") if options.get(k) else [] for k in ("--runs", "--regimes"))
    known = {job.run for job in study.jobs}, {job.regime for job in study.jobs}
    assert set(runs) <= known[0] and set(regimes) <= known[1], (
        f"{args[2]} has runs {known[0]}, regimes {known[1]}"
    )
    assert select(study, runs, regimes), f"{args}: selects no job"


def make_dry_run(argv: list[str]) -> list[str]:
    """The commands ``make ARGS`` would run (``make -n``), ``$(PY)`` written ``python``."""
    run = subprocess.run(["make", "-n", *argv[1:]], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, f"make -n {' '.join(argv[1:])}: {run.stderr.strip()}"
    python = re.escape(".venv/bin/python")
    return [
        re.sub(rf"^{python}\b", "python", line.strip()) for line in run.stdout.splitlines() if line.strip()
    ]


def check_make(command: DocCommand) -> None:
    lines = make_dry_run(list(command.argv))
    if command.comment.startswith("= "):
        assert command.comment[2:].strip() in lines, (
            f"`{command.text}` runs {lines}, not `{command.comment[2:]}`"
        )
    for line in lines:
        argv = shlex.split(line)
        if train_args(argv) is not None:
            compose_train(train_args(argv))
        elif argv[:2] == ["python", "-m"] and len(argv) > 2 and argv[2].startswith("tvq_exp"):
            check_module_command(argv)


def check_shown_output(command: DocCommand, cwd: Path) -> None:
    """A ``$ python train.py ...`` example (run from ``cwd``) prints what the doc shows under it."""
    run = train_command.run_train(list(command.argv[2:]), cwd, timeout=120)
    printed = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert printed == list(command.shown_output or ()), "prints:\n" + "\n".join(printed)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_a_documented_command_runs_or_composes(
    command: DocCommand, fixture_run: Path, tmp_path: Path
) -> None:
    argv = list(command.argv)
    args = train_args(argv)
    if command.shown_output is not None:
        check_shown_output(command, tmp_path)
    elif args is not None and any(
        CHECKPOINT_PLACEHOLDERS.match(a.partition("=")[2]) for a in args if a.startswith("ckpt_path=")
    ):
        continue_run(filled(args, fixture_run), fixture_run)
    elif args is not None:
        with contextlib.chdir(fixture_run):  # where the placeholders' run is
            compose_train(filled(args, fixture_run))
    elif argv[:2] == ["python", "eval.py"]:
        budget = {"limit_batches": "2", "accelerator": "cpu", "progress_bar": "false", "output": "eval.json"}
        run_in_process("eval", with_budget(filled(argv[2:], fixture_run), budget), fixture_run)
    elif argv[:2] == ["python", "sample.py"]:
        budget = {"num_bytes": "4", "device": "cpu", "output": "sample.out"}
        run_in_process("sample", with_budget(filled(argv[2:], fixture_run), budget), fixture_run)
    elif argv[:2] == ["python", "-m"]:
        check_module_command(filled(argv, None))
    elif argv[0] == "make":
        check_make(command)
    elif argv[0] == "python" and argv[1].endswith(".py"):
        assert (REPO / argv[1]).is_file(), f"{argv[1]} does not exist"
    else:
        pytest.fail(f"no way to check {command}: teach tests/test_doc_commands.py")


_CONTINUED: set[tuple[str, ...]] = (
    set()
)  # the docs' continue commands, budgeted, run once (they are one today)


def continue_run(args: list[str], base: Path) -> None:
    """Continue the fixture run one step past where it stands, as ``args`` says (budget laid on top)."""
    budgeted = with_budget(args, {"trainer.max_steps": str(FIXTURE_STEPS + 1)}) + list(BUDGET)
    if tuple(budgeted) in _CONTINUED:
        return
    run = train_command.run_train(budgeted, base, timeout=300)
    assert run.returncode == 0, f"train.py {' '.join(budgeted)}:\n{run.stderr[-3000:]}"
    assert re.search(rf"resuming \S*last\.ckpt at step {FIXTURE_STEPS}\b", run.stdout + run.stderr), (
        run.stdout
    )
    runs = list((base / "logs" / "runs").iterdir())
    assert len(runs) == 1, runs  # it went on in the checkpoint's own run dir
    _CONTINUED.add(tuple(budgeted))


def help_examples(cwd: Path) -> list[list[str]]:
    """The arguments of each ``python train.py ...`` line under "Examples:" in ``train.py --help``."""
    run = train_command.run_train(["--help"], cwd, timeout=120)
    examples = run.stdout.split("Examples:", 1)[1].split("\n\n", 1)[0]
    return [shlex.split(line.strip().split("  ")[0])[2:] for line in examples.splitlines() if line.strip()]


def test_the_help_examples_run_here(tmp_path: Path) -> None:
    """``train.py --help``'s examples compose, and its one-batch example runs on this machine's data (no
    download)."""
    examples = help_examples(tmp_path)
    assert len(examples) >= 3, examples
    for args in examples:
        compose_train(args)
    (one_batch,) = [args for args in examples if "debug=fdr" in args]
    run = train_command.run_train([*one_batch, "trainer.enable_progress_bar=false"], tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def run_dir_files() -> list[str]:
    """The paths of docs/training.md's table of what a run directory holds (``…`` read as a glob's ``*``)."""
    text = (REPO / "docs" / "training.md").read_text()
    table = text.split("Each run writes into", 1)[1].split("\n\n", 2)[1]
    cells = [line.split("|")[1] for line in table.splitlines()[2:]]
    return [path.replace("…", "*") for cell in cells for path in re.findall(r"`([^`]+)`", cell)]


def test_the_run_dir_holds_what_training_md_lists(fixture_run: Path) -> None:
    listed = run_dir_files()
    assert "config.yaml" in listed and len(listed) >= 4, listed
    missing = [path for path in listed if not list(run_dir(fixture_run).glob(path.rstrip("/")))]
    assert not missing, f"docs/training.md lists {missing}, which the README's main command does not write"
