"""Checkpoint files that survive crashes: atomic writes, truncation checks, ``resume=auto``'s choice.

Over 300 lines: the one reader of every kind of checkpoint (file, sharded folder, ``init_from`` weights) with the
refusals they share (damaged, foreign, untrusted: one error wrapping); split, each reader would repeat them.

* :class:`AtomicCheckpointIO` (a Lightning ``CheckpointIO`` plugin) writes every checkpoint to a temporary
  file in the same folder, fsyncs it and ``os.replace``-s it into place; the file it overwrites
  (``last.ckpt``) is kept as ``last.prev.ckpt``. Loading refuses a truncated or corrupt file with a
  :class:`CheckpointError` naming it.
* A *sharded* checkpoint (``trainer=fsdp`` with ``save_distributed_checkpoint=true``) is a folder named like a
  file (``last.ckpt/``): one ``.distcp`` shard per rank plus ``meta.pt`` (everything but the weights and
  optimiser states). :func:`read_checkpoint` reads its ``meta.pt``, :func:`gather_checkpoint` the whole of it
  in one process; ``resume=auto`` and ``ckpt_path`` take either kind.
* :func:`remove_stale_temporaries` deletes what a save killed half-way (``kill -9``) left, at the start of a run.
* :func:`newest_good_checkpoint` picks the newest checkpoint of a run folder that loads; a run that ended
  normally leaves ``finished.json`` (:func:`mark_finished`), so relaunching it skips it.
* Which checkpoints are written is :class:`~tvq_exp.callbacks.checkpoint.BestAndLastCheckpoint`'s job, the
  RNG states in them :class:`~tvq_exp.callbacks.rng_state.RngState`'s.

See ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tvq_exp.callbacks.checkpoint import CHECKPOINT_DIR, LAST
from tvq_exp.files import atomic_write, write_text
from tvq_exp.run.safe_load import UntrustedError, check_dcp_metadata, check_tensors_only, load_plain
from tvq_exp.run.stored import StoredConfigError, stored_run

PREVIOUS_SUFFIX = ".prev"
FINISHED = "finished.json"
REQUIRED_KEYS = ("state_dict", "global_step")
SHARDED_METADATA = "meta.pt"  # Lightning's ModelParallelStrategy: a sharded checkpoint's non-tensor part
SAVED_AT = "saved_at"  # the time.time() a checkpoint was saved at
DCP_METADATA = ".metadata"  # torch.distributed.checkpoint's index of the shards (a pickle)
# a sharded checkpoint's optimiser values (in meta.pt; its shards hold tensors only)
PARAM_GROUPS = "optimizer_param_groups"


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be used (truncated, corrupt, not a Lightning checkpoint)."""


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint that asks for more than plain data (code in its pickle, a bytes item in a sharded one, a stored
    config that is not data: :mod:`tvq_exp.run.safe_load`, :mod:`tvq_exp.run.stored`): never skipped over quietly,
    always the end of the command."""


def previous_path(path: Path) -> Path:
    """Where the checkpoint that ``path`` replaces is kept: ``last.ckpt`` -> ``last.prev.ckpt``."""
    return path.with_name(f"{path.stem}{PREVIOUS_SUFFIX}{path.suffix}")


def is_sharded(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a sharded checkpoint (a folder with ``meta.pt`` and the ranks' shards)."""
    return Path(path).is_dir() and (Path(path) / SHARDED_METADATA).is_file()


def is_checkpoint(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a checkpoint file or a sharded checkpoint folder (not whether it loads)."""
    return Path(path).is_file() or is_sharded(path)


def read_checkpoint(path: str | os.PathLike[str], map_location: Any = "cpu") -> dict[str, Any]:
    """Load a checkpoint written by this project; raise :class:`CheckpointError` if it is unusable or asks for
    more than plain data (loaded ``weights_only`` by :mod:`tvq_exp.run.safe_load`; its run config checked as data
    by :func:`~tvq_exp.run.stored.stored_run`). Of a sharded checkpoint, its ``meta.pt``: everything but
    ``state_dict`` and ``optimizer_states`` (the run config, the step, the loops', callbacks' and samplers'
    states); :func:`gather_checkpoint` reads the rest."""
    path = Path(path)
    sharded = is_sharded(path)
    if not (sharded or path.is_file()):
        raise CheckpointError(f"checkpoint {path} does not exist; check ckpt_path")
    if sharded:
        check_shards(path)  # its index, before anything of it is read
    checkpoint = _load(path, path / SHARDED_METADATA if sharded else path, map_location)
    required = [key for key in REQUIRED_KEYS if not (sharded and key == "state_dict")]
    missing = [key for key in required if not isinstance(checkpoint, dict) or key not in checkpoint]
    config = checkpoint.get("hyper_parameters", {}) if isinstance(checkpoint, dict) else {}
    if not missing and not (isinstance(config, dict) and isinstance(config.get("run_config"), dict)):
        missing = ["hyper_parameters.run_config"]
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is not a tvq_exp training checkpoint (no {', '.join(missing)})"
        )
    _check_stored(config["run_config"], path)
    return checkpoint


def _check_stored(config: Any, path: Path) -> None:
    """:func:`~tvq_exp.run.stored.stored_run` as an :class:`UntrustedCheckpointError` naming ``path``."""
    try:
        stored_run(config, f"checkpoint {path}")
    except StoredConfigError as error:
        raise UntrustedCheckpointError(str(error)) from None


def read_weights(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The tensors of a torch file for ``init_from``: a training checkpoint or a bare state dict, loaded
    ``weights_only`` (:class:`CheckpointError` naming the file when it is damaged, foreign or holds code)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; check init_from")
    loaded = _load(path, path, "cpu")
    config = loaded.get("hyper_parameters", {}) if isinstance(loaded, dict) else {}
    if isinstance(config, dict) and isinstance(config.get("run_config"), dict):
        # init_from builds nothing from it, but a stored config that is not data says the file was tampered with
        _check_stored(config["run_config"], path)
    state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not state or not all(torch.is_tensor(v) for v in state.values()):
        raise CheckpointError(
            f"checkpoint {path} holds no state dict of tensors (a torch file of another kind)"
        )
    return loaded


def _load(path: Path, file: Path, map_location: Any) -> Any:
    """:func:`~tvq_exp.run.safe_load.load_plain` with its failures as :class:`CheckpointError` naming ``path``."""
    try:
        return load_plain(file, map_location=map_location)
    except UntrustedError as error:
        raise UntrustedCheckpointError(f"checkpoint {path} {error}") from None
    except Exception as error:  # torch raises RuntimeError, EOFError, UnpicklingError, ... for bad files
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({type(error).__name__}: {_first_line(error)}); "
            f"delete it and resume from an older one (resume=auto picks the newest good one)"
        ) from None


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else ""


def gather_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The whole checkpoint at ``path`` in this process (no process group): a file as :func:`read_checkpoint`
    reads it; a sharded folder with every rank's weights and optimiser states gathered into full tensors."""
    checkpoint = read_checkpoint(path)
    if not is_sharded(path):
        return checkpoint
    path = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        gathered = Path(tmp) / "state.pt"
        try:
            dcp_to_torch_save(path, gathered)
        except Exception as error:  # a missing or damaged shard
            raise CheckpointError(
                f"sharded checkpoint {path} cannot be gathered ({type(error).__name__}: {_first_line(error)})"
            ) from None
        state = _load(path, gathered, "cpu")
    checkpoint["state_dict"] = state.pop("state_dict")
    optimizers = sorted(key for key in state if key.startswith("optimizer_"))
    groups = checkpoint.pop(PARAM_GROUPS, [None] * len(optimizers))
    checkpoint["optimizer_states"] = [
        {**state.pop(key), **({"param_groups": group} if group is not None else {})}
        for key, group in zip(optimizers, groups, strict=False)
    ]
    return checkpoint


def check_shards(path: Path) -> None:
    """A sharded checkpoint's ``.metadata`` holds plain data (:func:`~tvq_exp.run.safe_load.check_dcp_metadata`),
    indexes tensors only (:func:`~tvq_exp.run.safe_load.check_tensors_only`) and names only shards that are
    present: :class:`CheckpointError` naming the folder otherwise. Called before any shard is read."""
    metadata = path / DCP_METADATA
    if not metadata.is_file():
        raise CheckpointError(f"sharded checkpoint {path} has no {DCP_METADATA} (an incomplete copy?)")
    try:
        index = check_dcp_metadata(metadata)
        check_tensors_only(index)
    except UntrustedError as error:
        raise UntrustedCheckpointError(f"sharded checkpoint {path}: its {DCP_METADATA} {error}") from None
    except Exception as error:  # a truncated or corrupt pickle
        raise CheckpointError(
            f"sharded checkpoint {path}: its {DCP_METADATA} is truncated or corrupt "
            f"({type(error).__name__}: {_first_line(error)})"
        ) from None
    named = {str(info.relative_path) for info in (getattr(index, "storage_data", None) or {}).values()}
    missing = sorted(name for name in named if not (path / name).is_file())
    if missing or not named:
        raise CheckpointError(
            f"sharded checkpoint {path} lacks its shard(s) {', '.join(missing) or '(none listed)'}: "
            "an incomplete copy; copy the whole folder"
        )


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint file or a sharded checkpoint folder (nothing if absent)."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``torch.save`` to a temporary file, fsync, then ``os.replace``: a checkpoint is whole or absent.

    An overwritten checkpoint is kept as ``<stem>.prev.ckpt`` (the fallback when the new one is damaged
    on disk later). Loading goes through :func:`read_checkpoint` (clear error for truncated files).
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike[str], storage_options: Any | None = None
    ) -> None:
        path = Path(os.path.abspath(path))
        checkpoint[SAVED_AT] = time.time()  # where a resumed run cuts its logs (tvq_exp.run.loggers)
        # whole or absent, no link followed below the run dir (tvq_exp.files.atomic_write); Lightning hands a
        # resolved path, so a linked checkpoint folder is refused by fit's scan of the run dir (refuse_links)
        where = Path(path.parent.name, path.name)
        with atomic_write(where, path.parent.parent, keep_previous=previous_path(path).name) as file:
            torch.save(checkpoint, file)

    def load_checkpoint(
        self, path: str | os.PathLike[str], map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return read_checkpoint(path, map_location or "cpu")


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the half-written ``.<name>.tmp-<pid>`` files a killed :class:`AtomicCheckpointIO` save left in
    ``folder`` (the writer ``<pid>`` no longer runs; a live writer's file is left alone); the deleted paths."""
    removed = []
    for path in folder.glob(".*.ckpt.tmp-*") if folder.is_dir() else []:
        pid = path.name.rpartition("-")[2]
        if path.is_file() and pid.isdigit() and not _running(int(pid)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():  # this process writes no checkpoint yet: its own pid is a recycled leftover
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def saved_at(path: str | os.PathLike[str], checkpoint: dict[str, Any]) -> float:
    """When the checkpoint at ``path`` was saved: its ``saved_at``, else (older checkpoints) the file's time."""
    return float(checkpoint.get(SAVED_AT) or _written_ns(Path(path)) / 1e9)


def _written_ns(path: Path) -> int:
    return (path / SHARDED_METADATA if is_sharded(path) else path).stat().st_mtime_ns


def checkpoint_candidates(folder: Path) -> list[Path]:
    """Every checkpoint (file or sharded folder) in ``folder``, newest first (``last.ckpt`` before others
    written at the same time); hidden names (a save in progress) are not checkpoints."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("*.ckpt") if is_checkpoint(p) and not p.name.startswith(".")]
    return sorted(found, key=lambda p: (_written_ns(p), p.name == LAST), reverse=True)


def newest_good_checkpoint(folder: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint in ``folder`` that loads, and one line per newer file that was refused (damaged);
    a checkpoint holding code or a foreign ``_target_`` is not skipped: its :class:`UntrustedCheckpointError`
    ends the search."""
    refused: list[str] = []
    for path in checkpoint_candidates(folder):
        try:
            read_checkpoint(path)
        except UntrustedCheckpointError:
            raise
        except CheckpointError as error:
            refused.append(str(error))
            continue
        return path, refused
    return None, refused


def mark_finished(run_dir: Path, summary: dict[str, Any]) -> None:
    """Record that the run in ``run_dir`` reached its last step (``resume=auto`` then skips it)."""
    write_text(FINISHED, run_dir, json.dumps(summary, indent=2) + "\n")


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a finished run in ``run_dir``, or ``None`` when it has not finished."""
    marker = run_dir / FINISHED
    return json.loads(marker.read_text()) if marker.is_file() else None


__all__ = [
    "CHECKPOINT_DIR",
    "PARAM_GROUPS",
    "AtomicCheckpointIO",
    "CheckpointError",
    "check_shards",
    "checkpoint_candidates",
    "finished_summary",
    "gather_checkpoint",
    "is_checkpoint",
    "is_sharded",
    "mark_finished",
    "newest_good_checkpoint",
    "read_checkpoint",
    "read_weights",
    "remove_checkpoint",
    "remove_stale_temporaries",
    "saved_at",
    "UntrustedCheckpointError",
]
