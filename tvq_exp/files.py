"""Contained writes: every file a command writes lies inside the folder it belongs in, and is whole or absent.

Over 300 lines: one module for the one rule (the check, the descriptor walk, the atomic writer, the append for logs,
the probe and the run-dir lock all share it); split, each writer would restate the checks it needs.

One rule serves every writer (run dirs, checkpoints, ``config.yaml``, eval JSON and figures, study runs and
reports, analysis reports, bench output): a path is written relative to its *root* (a run dir, a checkpoint
folder, ``--out``, the folder of a file the user named), and :func:`contained` refuses it when a part is ``..``,
when it lies outside the root, or when a part below the root is a symbolic link; a file that exists must be a
regular file (never ``/dev/null`` or ``/dev/full``). The root itself is the user's choice and may be anything.

The write (:func:`atomic_write`) walks from the root to the file's folder one part at a time with ``O_NOFOLLOW``
(a link planted after the check is refused too), creates ``.<name>.tmp-<pid>`` there with ``O_EXCL``, fsyncs it
and renames it over the file: a rename replaces a link, never what it points at, and a failed write (a full disk,
a read-only folder) leaves the previous file as it was and ends as one :class:`OutputError` line.

:func:`lock_run_dir` holds an ``fcntl`` lock on a run dir while a run writes to it; :func:`refuse_links` refuses
a folder tree holding a symbolic link; :func:`check_writable` tries a folder before a long computation.
"""

from __future__ import annotations

import errno
import fcntl
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

LOCK_FILE = ".lock"
_HELD: weakref.WeakValueDictionary[str, IO[bytes]] = (
    weakref.WeakValueDictionary()
)  # run dirs this process locks
# what a full disk, a quota, a read-only or foreign folder, or a size limit look like to a write
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})


class UnsafePathError(ValueError):
    """An output path that leaves its root, passes a symbolic link, or names something other than a file."""


class OutputError(OSError):
    """A write that failed (full disk, read-only or unwritable folder): the file it would replace is untouched."""


class RunLockedError(RuntimeError):
    """Another live process writes to this run dir."""


def contained(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """``path`` (relative to ``root``, or absolute inside it) as an absolute path, after checking that no part
    is ``..``, that it lies under ``root``, that no existing part below ``root`` is a symbolic link and that an
    existing ``path`` is a regular file or folder (:class:`UnsafePathError` naming the path otherwise)."""
    base = Path(os.path.abspath(os.fspath(root)))
    given = Path(os.fspath(path))
    if ".." in given.parts:
        raise UnsafePathError(f"{given}: a path with '..' is not allowed here; name a file inside {base}")
    target = given if given.is_absolute() else base / given
    target = Path(os.path.abspath(target))
    if target != base and base not in target.parents:
        raise UnsafePathError(f"{given}: lies outside {base}; only files inside it are written")
    current = base
    for part in target.relative_to(base).parts:
        current = current / part
        if current.is_symlink():
            raise UnsafePathError(
                f"{current}: is a symbolic link (to {os.readlink(current)}); a write never follows one: "
                "remove the link"
            )
    if target.exists() and not (target.is_file() or target.is_dir()):
        raise UnsafePathError(f"{target}: is not a regular file (a device, pipe or socket); name a file")
    return target


def _parts_below(path: Path, root: str | os.PathLike[str]) -> tuple[Path, tuple[str, ...]]:
    """The absolute root and the parts of ``path`` below it (checked by :func:`contained`)."""
    base = Path(os.path.abspath(os.fspath(root)))
    return base, contained(path, base).relative_to(base).parts


def _open_folder(base: Path, parts: tuple[str, ...], create: bool) -> int:
    """A descriptor of ``base/parts...``, each part opened with ``O_NOFOLLOW`` (created when ``create``)."""
    flags = os.O_RDONLY | os.O_DIRECTORY
    try:
        if create:
            base.mkdir(parents=True, exist_ok=True)
        fd = os.open(base, flags)
    except (FileExistsError, NotADirectoryError):
        raise UnsafePathError(f"{base}: is a file, not a folder; name a folder to write in") from None
    try:
        for part in parts:
            try:
                child = _open_part(part, fd, flags, create)
            except (NotADirectoryError, OSError) as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise UnsafePathError(
                    f"{base.joinpath(*parts)}: its part {part!r} is a symbolic link or a file; a write never "
                    "follows a link"
                ) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_part(part: str, fd: int, flags: int, create: bool) -> int:
    """A descriptor of the folder ``part`` of the folder ``fd``, opened with ``O_NOFOLLOW``; made first when missing
    and ``create`` (made meanwhile by a writer beside this one, two study jobs starting together: taken as it is)."""
    try:
        return os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    with suppress(FileExistsError):
        os.mkdir(part, dir_fd=fd)
    return os.open(part, flags | os.O_NOFOLLOW, dir_fd=fd)


def make_dirs(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """Create the folder ``path`` inside ``root`` (and the folders between), never through a link; returns it."""
    base, parts = _parts_below(Path(path), root)
    try:
        os.close(_open_folder(base, parts, create=True))
    except OSError as error:
        raise _output_error(base.joinpath(*parts), error) from None
    return base.joinpath(*parts)


@contextmanager
def atomic_write(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str],
    mode: str = "wb",
    keep_previous: str | None = None,
) -> Iterator[IO[Any]]:
    """Yield a file (``mode`` ``"wb"`` or ``"w"``) whose content replaces ``path`` (inside ``root``, folders
    created) when the block ends without error; the file it replaces is kept as ``keep_previous`` (a name in the
    same folder) when given. See the module docstring: no link is followed, a failure leaves the old file."""
    base, parts = _parts_below(Path(path), root)
    if not parts:
        raise UnsafePathError(f"{base}: is a folder; name a file inside it")
    target = base.joinpath(*parts)
    name, temporary = parts[-1], f".{parts[-1]}.tmp-{os.getpid()}"
    try:
        folder = _open_folder(base, parts[:-1], create=True)
    except OSError as error:
        raise _output_error(target, error) from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        _check_target(folder, name, target)
        try:
            try:
                fd = os.open(temporary, flags, 0o644, dir_fd=folder)
            except FileExistsError:  # this process's own leftover (a failed earlier write)
                os.unlink(temporary, dir_fd=folder)
                fd = os.open(temporary, flags, 0o644, dir_fd=folder)
            with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as handle:
                recording = _Recording(handle)
                try:
                    yield recording
                except Exception:
                    if (
                        recording.failure is not None
                    ):  # a writer that wraps the disk's error (torch.save does)
                        raise recording.failure from None
                    raise
                handle.flush()
                os.fsync(handle.fileno())
            _check_target(folder, name, target)
            if keep_previous is not None and _is_file(folder, name):
                os.replace(name, keep_previous, src_dir_fd=folder, dst_dir_fd=folder)
            os.replace(temporary, name, src_dir_fd=folder, dst_dir_fd=folder)
            os.fsync(folder)
        except OSError as error:
            raise _output_error(target, error) from None
        finally:
            try:
                os.unlink(temporary, dir_fd=folder)
            except (FileNotFoundError, PermissionError):  # renamed into place, or never created
                pass
    finally:
        os.close(folder)


class _Recording:
    """A file that remembers the first ``OSError`` its ``write`` met (everything else passes through), so that a
    writer reporting a full disk as its own error (``torch.save``: "unexpected pos") still ends as that error."""

    def __init__(self, file: IO[Any]) -> None:
        self._file = file
        self.failure: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._file.write(data)
        except OSError as error:
            self.failure = self.failure or error
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def _is_file(folder: int, name: str) -> bool:
    try:
        return os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode & 0o170000 == 0o100000
    except FileNotFoundError:
        return False


def _check_target(folder: int, name: str, target: Path) -> None:
    """The file to replace is absent or a regular file (never a link, folder or device)."""
    try:
        mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode & 0o170000
    except FileNotFoundError:
        return
    if mode != 0o100000:
        what = {0o120000: "a symbolic link", 0o040000: "a folder"}.get(mode, "a device, pipe or socket")
        raise UnsafePathError(f"{target}: is {what}, not a regular file; a write never replaces one")


def write_text(path: str | os.PathLike[str], root: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write` ``text`` (UTF-8) to ``path`` inside ``root``; returns the absolute path."""
    with atomic_write(path, root, "w") as handle:
        handle.write(text)
    return contained(path, root)


def write_bytes(path: str | os.PathLike[str], root: str | os.PathLike[str], data: bytes) -> Path:
    """:func:`atomic_write` ``data`` to ``path`` inside ``root``; returns the absolute path."""
    with atomic_write(path, root, "wb") as handle:
        handle.write(data)
    return contained(path, root)


def append_to(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> IO[str]:
    """``path`` inside ``root`` (folders created) opened to append text, never through a link (a log)."""
    target = make_dirs(Path(path).parent, root) / Path(path).name
    contained(target, root)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnsafePathError(f"{target}: is a symbolic link; a write never follows one") from None
        raise _output_error(target, error) from None
    return os.fdopen(fd, "a", encoding="utf-8")


def _output_error(path: Path, error: OSError) -> OSError:
    """A write's ``OSError`` as one :class:`OutputError` line naming ``path`` (other errors unchanged)."""
    if isinstance(error, UnsafePathError | OutputError) or error.errno not in DISK_ERRNOS:
        return error
    return OutputError(
        f"{path}: cannot write ({os.strerror(error.errno or 0)}); free space or choose a writable folder, "
        "nothing was replaced",
    )


def check_writable(folder: str | os.PathLike[str], root: str | os.PathLike[str] | None = None) -> Path:
    """Create ``folder`` (inside ``root``, default itself) and write and delete a probe file there, before a long
    computation: :class:`OutputError` (or :class:`UnsafePathError`) now rather than after it."""
    folder = Path(os.path.abspath(os.fspath(folder)))
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        with atomic_write(probe, root if root is not None else folder) as handle:
            handle.write(b"probe")
    except OutputError as error:  # name the folder the user gave, not the probe
        raise OutputError(str(error).replace(str(probe), str(folder), 1)) from None
    probe.unlink()
    return folder


def refuse_links(folder: str | os.PathLike[str]) -> None:
    """:class:`UnsafePathError` naming the first symbolic link inside ``folder`` (any depth; ``folder`` itself
    may be one): a run dir from elsewhere could otherwise send a write outside it."""
    for current, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = Path(current) / name
            if path.is_symlink():
                raise UnsafePathError(
                    f"{path}: is a symbolic link (to {os.readlink(path)}) inside {folder}; a run writes only "
                    "real files in its folder: remove the link"
                )


def lock_run_dir(folder: str | os.PathLike[str]) -> IO[bytes]:
    """Take the run dir's lock (``<folder>/.lock``, ``fcntl``; the folder is created), held until the returned
    file is closed or dropped, or the process ends; :class:`RunLockedError` when another live process holds it
    (a lock this process still holds is handed back: runs in one process are sequential)."""
    folder = make_dirs(folder, folder)
    held = _HELD.get(str(folder))
    if (
        held is not None and not held.closed
    ):  # this process's own earlier run (kept alive by a traceback, say)
        return held
    path = contained(LOCK_FILE, folder)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        raise _output_error(path, error) from None
    handle = os.fdopen(fd, "r+b")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise RunLockedError(
            f"run dir {folder} is in use by another run (its {LOCK_FILE} is locked); wait for it to end or choose "
            "another run_name"
        ) from None
    _HELD[str(folder)] = handle
    return handle


__all__ = [
    "DISK_ERRNOS",
    "append_to",
    "LOCK_FILE",
    "OutputError",
    "RunLockedError",
    "UnsafePathError",
    "atomic_write",
    "check_writable",
    "contained",
    "lock_run_dir",
    "make_dirs",
    "refuse_links",
    "write_bytes",
    "write_text",
]
