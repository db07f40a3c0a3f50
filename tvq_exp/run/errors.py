"""Running a Hydra entry point so that user errors end in one line on stderr, not a traceback.

``train.py``, ``eval.py`` and ``sample.py`` hand their task and config name to :func:`run`, which composes
``conf/<name>.yaml`` with the command line (``@hydra.main``) and calls the task through :func:`reported`. Errors a user can fix (bad config, override, data or
checkpoint) print ``error: <message>`` on one line of stderr and exit with status 2; the numerics guard
stopping a run exits with status 1 the same way; Ctrl-C (SIGINT) says so in one line and exits with status 130. :func:`run` turns Hydra's own reporting off
(``HYDRA_FULL_ERROR=1``) so composition errors (unknown key, unknown group option) reach it unchanged;
:func:`reported` catches errors inside the task, before Hydra adds its "Error executing job" line.
Anything else is a bug and keeps its traceback.

The error classes are looked up among the modules already imported when an error arrives (a module that was
never imported cannot have raised one), so refusing a bad config never imports Lightning
(docs/reliability.md, "Fast refusal").
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, TypeVar

import hydra
from omegaconf import DictConfig, OmegaConf

from tvq_exp.files import DISK_ERRNOS, OutputError
from tvq_exp.run import schema
from tvq_exp.run.validation import TRAIN_NODES

# errors a user can fix, by the module that defines them (exit USAGE_STATUS), and the guard's stop (FAILURE_STATUS)
USAGE_ERRORS = {
    "tvq_exp.run.validation": ("ConfigError",),
    "hydra.errors": ("HydraException",),
    "omegaconf.errors": ("OmegaConfBaseException",),
    "tvq_exp.data.paths": ("DataNotFoundError", "CorruptFileError"),
    "tvq_exp.data.download": ("ChecksumError",),
    "tvq_exp.run.checkpoints": ("CheckpointError",),
    "tvq_exp.files": ("UnsafePathError", "RunLockedError"),
    "tvq_exp.run.stored": ("StoredConfigError",),
}
FAILURE_ERRORS = {"tvq_exp.callbacks.numerics_guard": ("NumericsError",), "tvq_exp.files": ("OutputError",)}
USAGE_STATUS = 2
FAILURE_STATUS = 1
INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
CONF = Path(__file__).resolve().parents[2] / "conf"
T = TypeVar("T")


def loaded(classes: dict[str, tuple[str, ...]]) -> tuple[type[BaseException], ...]:
    """The classes named in ``classes`` (module -> class names) whose module is already imported."""
    return tuple(
        getattr(sys.modules[module], name)
        for module, names in classes.items()
        if module in sys.modules
        for name in names
    )


def one_line(error: BaseException) -> str:
    """The error's message, and its cause's first line when that adds something, as one line."""
    message = " ".join(str(error).split())
    cause = error.__cause__
    first = str(cause).strip().splitlines()[0].strip() if cause is not None and str(cause).strip() else ""
    return f"{message} ({first})" if first and first not in message else message


def typo_hint(message: str) -> str:
    """For Hydra's "Could not override 'KEY'" on a misspelt ``trainer.*`` or top-level key: the nearest real
    key, so the user is not sent to add a ``+`` and meet a second error."""
    match = re.search(r"Could not override '([\w.]+)'", message)
    if match is None:
        return ""
    parent, _, name = match.group(1).rpartition(".")
    if parent == "trainer":
        import lightning.pytorch as pl

        known = set(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}
    elif not parent:
        known = set(inspect.signature(schema.train_options).parameters) | TRAIN_NODES
    else:
        return ""
    if name in known:  # a real key the preset leaves out: Hydra's own advice (add it with +) is right
        return ""
    near = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean {parent + '.' if parent else ''}{near[0]}?" if near else ""


@functools.cache
def group_routes() -> dict[str, str]:
    """``{config key: group}`` for every node of ``conf/model/attention/*.yaml`` that is a whole config group
    (``codebook: ${codebook}``): Hydra cannot set a key through it, and says "use +", then "remove +"."""
    routes = {}
    for path in sorted((CONF / "model" / "attention").glob("*.yaml")):
        for line in path.read_text().splitlines():
            found = re.match(r"(\w+):\s*\$\{(\w+)\}", line)
            if found and (CONF / found.group(2)).is_dir():
                routes[f"model.attention.{found.group(1)}"] = found.group(2)
    return routes


def routed(message: str) -> str | None:
    """For Hydra's "Could not override / append" on a key below a node that is a whole group
    (:func:`group_routes`): the one message that works, instead of Hydra's advice to add (or remove) a ``+``."""
    match = re.search(r"(?:Could not override|An item is already at) '([\w.]+)'", message)
    value = re.search(r"=(\S*?)'?(?: |$|\))", message[match.end() :]) if match else None
    for node, group in group_routes().items():
        if match and match.group(1).startswith(node + "."):
            name = match.group(1)[len(node) + 1 :]
            given = value.group(1) if value else "..."
            return (
                f"{match.group(1)}: {node} is the {group} group (${{{group}}}), set it there: {group}.{name}={given} "
                f"(to change a stored run's with ckpt_path: ++{match.group(1)}={given})"
            )
    return None


def fail(error: BaseException, status: int) -> NoReturn:
    """Print ``error: <message>`` on one line of stderr and exit with ``status``."""
    message = one_line(error)
    message = routed(message) or f"{message}{typo_hint(message)}"
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(status)


def reported(task: Callable[[DictConfig], T]) -> Callable[[DictConfig], T]:
    """Decorate a Hydra task function: user errors and guard stops end as one line (see module doc)."""

    @functools.wraps(task)
    def wrapper(cfg: DictConfig) -> T:
        try:
            return task(cfg)
        except loaded(USAGE_ERRORS) as error:
            _take_back_run_dir()
            fail(error, USAGE_STATUS)
        except loaded(FAILURE_ERRORS) as error:
            fail(error, FAILURE_STATUS)
        except OSError as error:  # a full disk or read-only folder met by a writer outside tvq_exp.files
            if error.errno not in DISK_ERRNOS:
                raise
            fail(
                OutputError(f"{error.filename or 'a file'}: cannot write ({error.strerror})"), FAILURE_STATUS
            )

    return wrapper


def _take_back_run_dir() -> None:
    """The empty run dir Hydra made for a command that was refused (:mod:`tvq_exp.run.run_dir`)."""
    from hydra.core.hydra_config import HydraConfig  # noqa: PLC0415

    from tvq_exp.run.run_dir import remove_if_empty  # noqa: PLC0415

    if not HydraConfig.initialized():
        return
    # missing outside a Hydra launch (a composed config, as in tests): nothing was made
    output_dir = OmegaConf.select(
        HydraConfig.get(), "runtime.output_dir", default=None, throw_on_missing=False
    )
    if output_dir:
        remove_if_empty(output_dir)


def raised_in(error: BaseException, package: str) -> bool:
    """Whether ``error`` was raised inside ``package`` (its innermost frame), not by our code."""
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and f"{os.sep}{package}{os.sep}" in frames[-1].filename


def run(config_name: str, task: Callable[[DictConfig], object]) -> None:
    """Run a command: ``task`` on ``conf/<config_name>.yaml`` composed with the command line's overrides (Hydra
    names the job after the file that defines ``task`` unless the config sets ``hydra.job.name``, as
    conf/eval.yaml does); user errors, composition errors included, end as one
    line with status 2."""
    os.environ["HYDRA_FULL_ERROR"] = "1"
    main = hydra.main(version_base="1.3", config_path=str(CONF), config_name=config_name)(reported(task))
    try:
        main()
    except loaded(USAGE_ERRORS) as error:
        fail(error, USAGE_STATUS)
    except ValueError as error:  # Hydra's parser refusing an override (``=5``) with a ValueError of its own
        if not raised_in(error, "hydra"):
            raise
        fail(error, USAGE_STATUS)
    except KeyboardInterrupt:
        print(
            "error: interrupted (SIGINT); a run continues from its last checkpoint (resume=auto or ckpt_path)",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(INTERRUPTED_STATUS)


__all__ = [
    "FAILURE_ERRORS",
    "FAILURE_STATUS",
    "INTERRUPTED_STATUS",
    "loaded",
    "USAGE_ERRORS",
    "USAGE_STATUS",
    "fail",
    "one_line",
    "reported",
    "run",
]
