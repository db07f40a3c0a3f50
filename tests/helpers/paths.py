"""Where the tests find the repository and its config tree."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"

__all__ = ["CONF", "REPO"]
