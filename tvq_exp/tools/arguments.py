"""Command-line arguments of the tools (``python -m tvq_exp.bench``, ``python -m tvq_exp.analysis``): a parser
whose every refusal is one ``error:`` line naming the value and what is allowed (argparse prints its usage
first), and the value types they share (positive numbers that are finite, plain names, files to write)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@=+-]*")


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that refuses a bad argument with one line, ``error: <prog>: <message>``, exit 2."""

    def error(self, message: str) -> NoReturn:
        raise SystemExit(f"error: {self.prog}: {' '.join(message.split())}; see {self.prog} --help")


def _number(cast: Callable[[str], float], low: float, inclusive: bool, what: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


positive_int = _number(int, 0, False, "a positive integer")
non_negative_int = _number(int, 0, True, "an integer >= 0")
positive_float = _number(float, 0.0, False, "a positive finite number")
non_negative_float = _number(float, 0.0, True, "a finite number >= 0")


def plain_name(text: str, what: str = "name") -> str:
    """``text`` when it is one plain name (letters, digits and ``_ . @ = + -``, not starting with ``.`` or
    ``-``: never a path), else :class:`argparse.ArgumentTypeError` naming it."""
    if not isinstance(text, str) or not PLAIN_NAME.fullmatch(text) or ".." in text:
        raise argparse.ArgumentTypeError(
            f"{what} {text!r} must be one plain name (letters, digits, _ . @ = + -; no '/', no '..', not "
            "starting with '.' or '-')"
        )
    return text


def plain_names(text: str) -> list[str]:
    """A comma-separated list of :func:`plain_name` values, at least one."""
    names = [item.strip() for item in text.split(",") if item.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"must name at least one, got {text!r}")
    return [plain_name(name) for name in names]


def output_file(suffix: str) -> Callable[[str], Path]:
    """A file a tool writes: ends in ``suffix``, and is not a folder, a link or a device (``--plot DIR`` would
    write ``DIR.png``, ``--plot /dev/null`` ``/dev/null.png``)."""

    def parse(text: str) -> Path:
        path = Path(text).expanduser()
        if path.suffix != suffix:
            raise argparse.ArgumentTypeError(f"must be a file name ending in {suffix}, got {text!r}")
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise argparse.ArgumentTypeError(
                f"{text!r} is a folder, link or device; name a new or regular file"
            )
        return path

    return parse


__all__ = [
    "OneLineParser",
    "non_negative_float",
    "non_negative_int",
    "output_file",
    "plain_name",
    "plain_names",
    "positive_float",
    "positive_int",
]
