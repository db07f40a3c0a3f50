"""Rewrite committed study result files once so that the absolute paths of the machine that ran them
(``/work/main/studies/...``) become relative to the repository (``studies/...``), as the study runner now
writes them. `python tools/relative_study_paths.py studies/*/results/*.json` (idempotent)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tvq_exp.tools.study.runner import repo_relative


def machine_root(text: str) -> Path | None:
    """The repository root a result file was written under: the prefix of its first ``/.../studies/`` path."""
    start = text.find('"/')
    while start >= 0:
        path = text[start + 1 : text.find('"', start + 1)]
        if "/studies/" in path:
            return Path(path[: path.index("/studies/")])
        start = text.find('"/', start + 1)
    return None


def main(paths: list[str]) -> None:
    for name in paths:
        path = Path(name)
        text = path.read_text()
        root = machine_root(text)
        if root is None:
            continue
        path.write_text(json.dumps(repo_relative(json.loads(text), root), indent=1) + "\n")
        print(f"{path}: paths under {root} made relative")


if __name__ == "__main__":
    main(sys.argv[1:])
