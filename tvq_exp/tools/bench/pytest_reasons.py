"""A pytest plugin for the GPU check's tests section (``-p tvq_exp.tools.bench.pytest_reasons``): each test that
fails or errors has its reason written on its own line the moment pytest knows it, not in the failures' report at
the end of the run, which a run stopped at its budget never prints. On the H200 of 2026-11-30 two CUDA tests failed
in a section stopped at its budget, and the check kept their names and nothing of why.

A line is :data:`PREFIX`, the test's id (an id may hold spaces), a tab, the phase (``setup``, ``call``,
``teardown``) and the crash's message, cut to :data:`LIMIT` characters, on one line."""

from __future__ import annotations

import pytest

PREFIX = "tvq-reason "
LIMIT = 600

_terminal: object | None = None


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered (in its own pytest_configure)
def pytest_configure(config: pytest.Config) -> None:
    global _terminal
    _terminal = config.pluginmanager.get_plugin("terminalreporter")


def reason(report: pytest.TestReport) -> str:
    """The failure's message on one line: the crash's (``E`` lines) where pytest has one, else the report's last
    line (a collection or fixture error)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else (str(report.longrepr).strip().splitlines() or [""])[-1]
    return " ".join(text.split())[:LIMIT]


@pytest.hookimpl(trylast=True)  # after the terminal's own verdict, so the verbose line stays whole
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and _terminal is not None:
        line = f"{PREFIX}{report.nodeid}\t{report.when}: {reason(report)}"
        _terminal.write_line(line, flush=True)  # type: ignore[attr-defined]
