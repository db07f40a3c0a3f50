"""The commands the docs give: every ``python ...``, ``make ...``, ``torchrun ...`` and ``srun ...`` line of the
fenced code blocks of README.md, CONTRIBUTING.md and docs/*.md, with the output a ``$ command`` example shows.

A command continued with ``\\`` is joined; ``# comments`` are dropped (their text is kept: ``make X  # = CMD``
states what ``make X`` runs). Inline Python (``python - <<EOF``, ``python -c``) and shell-only lines are not
commands here."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

from tests.helpers.paths import REPO

DOCS = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md")])
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
LANGUAGES = {"", "bash", "sh", "shell", "console"}
STARTS = re.compile(r"^(\$ )?(time )?(python|make|torchrun|srun)\b")
INLINE = re.compile(r"^python (-|-c)(\s|$)")
SPACED_PLACEHOLDER = re.compile(r"<([\w ]+ [\w ]+)>")  # "<dense run>" read as one word: "<dense_run>"
OPTIONAL = re.compile(r"(?<=\s)\[[^\]]*\]")  # "[key=value ...]": what the reader may add


@dataclasses.dataclass(frozen=True)
class DocCommand:
    """One command of a doc: where it is, its words (comment dropped), its comment, and the output shown under a
    ``$ command`` example (``None``: none shown)."""

    doc: str
    line: int
    argv: tuple[str, ...]
    comment: str
    shown_output: tuple[str, ...] | None

    @property
    def text(self) -> str:
        return " ".join(self.argv)

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def split_comment(line: str) -> tuple[str, str]:
    """``(command, comment)``: the first `` #`` outside quotes starts the comment."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def block_commands(doc: str, first_line: int, body: str) -> list[DocCommand]:
    """The commands of one fenced block whose first body line is line ``first_line`` of ``doc``."""
    lines = body.splitlines()
    commands: list[DocCommand] = []
    i = 0
    while i < len(lines):
        start, text = i, lines[i].strip()
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1].rstrip() + " " + lines[i].strip()
        i += 1
        if not STARTS.match(text) or INLINE.match(text.removeprefix("$ ")):
            continue
        prompt = text.startswith("$ ")
        shown = None
        if prompt:
            shown_lines = []
            while i < len(lines) and not lines[i].startswith("$ ") and lines[i].strip():
                shown_lines.append(lines[i].rstrip())
                i += 1
            shown = tuple(shown_lines)
        command, comment = split_comment(text.removeprefix("$ ").removeprefix("time "))
        command = OPTIONAL.sub("", command).removesuffix(" ...")
        command = SPACED_PLACEHOLDER.sub(lambda m: "<" + m.group(1).replace(" ", "_") + ">", command)
        commands.append(DocCommand(doc, first_line + start, tuple(shlex.split(command)), comment, shown))
    return commands


def doc_commands(path: Path) -> list[DocCommand]:
    """Every command of the fenced shell blocks of ``path``."""
    text = path.read_text()
    name = str(path.relative_to(REPO))
    found = []
    for match in FENCE.finditer(text):
        if match.group(1) in LANGUAGES:
            first_line = text.count("\n", 0, match.start(2)) + 1
            found += block_commands(name, first_line, match.group(2))
    return found


def all_doc_commands() -> list[DocCommand]:
    """The commands of every doc (:data:`DOCS`)."""
    return [command for doc in DOCS for command in doc_commands(doc)]


__all__ = ["DOCS", "DocCommand", "all_doc_commands", "block_commands", "doc_commands", "split_comment"]
