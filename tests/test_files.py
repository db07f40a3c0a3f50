"""Contained writes (:mod:`tvq_exp.files`, docs/reliability.md "Contained writes and faults"): a path with ``..``,
outside its root or through a symbolic link is refused and the file outside stays as it was; a write is whole or
absent, and a failed one (a size limit, a full device) leaves the previous file; a locked run dir refuses a
second writer."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import REPO
from tvq_exp.files import (
    OutputError,
    UnsafePathError,
    append_to,
    atomic_write,
    check_writable,
    contained,
    lock_run_dir,
    make_dirs,
    refuse_links,
    write_text,
)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the root that no write may change."""
    path = tmp_path / "outside.txt"
    path.write_text("precious")
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.mark.parametrize("name", ["../outside.txt", "a/../../outside.txt", "..", "a/.."])
def test_dot_dot_is_refused(name: str, root: Path, outside: Path) -> None:
    with pytest.raises(UnsafePathError, match=r"'\.\.' is not allowed"):
        write_text(name, root, "x")
    assert outside.read_text() == "precious"


def test_an_absolute_path_outside_the_root_is_refused(root: Path, outside: Path) -> None:
    with pytest.raises(UnsafePathError, match="lies outside"):
        write_text(outside, root, "x")
    assert outside.read_text() == "precious"
    assert contained(root / "a" / "b.txt", root) == root / "a" / "b.txt"


def test_a_link_as_the_file_or_a_folder_on_the_way_is_refused(root: Path, outside: Path) -> None:
    (root / "config.yaml").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        write_text("config.yaml", root, "x")
    (root / "checkpoints").symlink_to(outside.parent)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        write_text("checkpoints/outside.txt", root, "x")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        make_dirs("checkpoints/deeper", root)
    assert outside.read_text() == "precious" and not (outside.parent / "deeper").exists()
    with pytest.raises(UnsafePathError, match=r"checkpoints: is a symbolic link \(to "):
        refuse_links(root)


def test_a_folder_made_meanwhile_by_a_writer_beside_this_one_is_taken(
    root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two study jobs starting together both find ``runs/`` missing and make it: the second's ``mkdir`` meets the
    first's folder, and its write goes on into it (it stopped the whole study, 2026-11-30); a link made there
    meanwhile is still refused."""
    import tvq_exp.files as files

    real_mkdir = os.mkdir

    def beside(made: Callable[[str, int], None]) -> Callable[..., None]:
        def mkdir(part: str, *args: Any, dir_fd: int | None = None) -> None:
            if dir_fd is not None:  # a part below the root: the other writer makes it first
                made(part, dir_fd)
            real_mkdir(part, *args, dir_fd=dir_fd)

        return mkdir

    monkeypatch.setattr(files.os, "mkdir", beside(lambda part, fd: real_mkdir(part, dir_fd=fd)))
    assert make_dirs("runs/a", root) == root / "runs" / "a" and (root / "runs" / "a").is_dir()
    write_text("logs/job.log", root, "x")
    assert (root / "logs" / "job.log").read_text() == "x"
    monkeypatch.setattr(
        files.os, "mkdir", beside(lambda part, fd: os.symlink(outside.parent, part, dir_fd=fd))
    )
    with pytest.raises(UnsafePathError, match="symbolic link"):
        make_dirs("checkpoints/deeper", root)
    assert not (outside.parent / "deeper").exists()


def test_a_link_planted_after_the_check_is_not_followed(root: Path, outside: Path) -> None:
    """The write holds its folder open (reached with ``O_NOFOLLOW``): a folder swapped for a link while the file
    is written does not send it outside, and a link planted at the file's name is refused, never written through."""
    (root / "logs").mkdir()
    with atomic_write("logs/x.txt", root, "w") as handle:
        (root / "logs").rename(root / "moved")
        (root / "logs").symlink_to(outside.parent)
        handle.write("x")
    assert not (outside.parent / "x.txt").exists() and (root / "moved" / "x.txt").read_text() == "x"
    (root / "logs").unlink()
    (root / "logs").mkdir()
    with pytest.raises(UnsafePathError, match="is a symbolic link, not a regular file"):
        with atomic_write("logs/y.txt", root, "w") as handle:
            (root / "logs" / "y.txt").symlink_to(outside)
            handle.write("x")
    assert outside.read_text() == "precious"


@pytest.mark.parametrize("device", ["/dev/null", "/dev/full"])
def test_a_device_is_never_written(device: str) -> None:
    with pytest.raises(UnsafePathError, match="not a regular file"):
        write_text(Path(device).name, Path(device).parent, "x")
    assert not Path(device + ".png").exists()


def test_a_write_is_whole_and_keeps_the_previous_file(root: Path) -> None:
    write_text("a.ckpt", root, "one")
    with atomic_write("a.ckpt", root, "w", keep_previous="a.prev.ckpt") as handle:
        handle.write("two")
    assert (root / "a.ckpt").read_text() == "two" and (root / "a.prev.ckpt").read_text() == "one"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_write("a.ckpt", root, "w") as handle:
            handle.write("three, half")
            raise RuntimeError("boom")
    assert (root / "a.ckpt").read_text() == "two"
    assert sorted(p.name for p in root.iterdir()) == ["a.ckpt", "a.prev.ckpt"]


def test_a_write_that_fails_on_disk_leaves_the_last_file_and_ends_in_one_line(root: Path) -> None:
    """A real write failure: the process's file-size limit (``RLIMIT_FSIZE``; the kernel answers ``EFBIG`` as it
    answers ``ENOSPC`` on a full disk) cut a checkpoint-sized write; the previous file stays whole."""
    write_text("last.ckpt", root, "good")
    script = (
        "import resource, signal, sys\n"
        "from tvq_exp.files import OutputError, atomic_write\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        f"    with atomic_write('last.ckpt', {str(root)!r}) as f:\n"
        "        f.write(b'x' * 100_000)\n"
        "except OutputError as error:\n"
        "    sys.exit(f'error: {error}')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "last.ckpt: cannot write (File too large)" in lines[0] and "nothing was replaced" in lines[0]
    assert (root / "last.ckpt").read_text() == "good"
    assert sorted(p.name for p in root.iterdir()) == ["last.ckpt"]


def test_an_unwritable_folder_is_found_before_the_work() -> None:
    with pytest.raises(OutputError, match="cannot write"):
        check_writable("/sys")  # sysfs takes no new file, even from root


def test_a_locked_run_dir_refuses_a_second_writer(root: Path) -> None:
    """Another process is refused while the lock is held; this process's own later run gets it back; a closed
    holder releases it."""
    script = (
        "import sys\nfrom tvq_exp.files import RunLockedError, lock_run_dir\n"
        f"try:\n    lock_run_dir({str(root / 'run')!r})\n"
        "except RunLockedError as error:\n    sys.exit(f'error: {error}')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def second() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
        )

    held = lock_run_dir(root / "run")
    assert lock_run_dir(root / "run") is held
    refused = second()
    assert refused.returncode == 1 and "is in use by another run" in refused.stderr, refused.stderr
    held.close()
    assert second().returncode == 0


def test_a_log_is_appended_to_never_through_a_link(root: Path, outside: Path) -> None:
    with append_to("runs/a/job.log", root) as handle:
        handle.write("one\n")
    with append_to("runs/a/job.log", root) as handle:
        handle.write("two\n")
    assert (root / "runs" / "a" / "job.log").read_text() == "one\ntwo\n"
    (root / "runs" / "b").mkdir()
    (root / "runs" / "b" / "job.log").symlink_to(outside)
    with pytest.raises(UnsafePathError, match="symbolic link"):
        append_to("runs/b/job.log", root)
    assert outside.read_text() == "precious"
