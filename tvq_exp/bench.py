"""``python -m tvq_exp.bench``: the attention and model benchmarks (kept at this path; the code is in
:mod:`tvq_exp.tools.bench`)."""

from tvq_exp.tools.bench.cli import main, parser

__all__ = ["main", "parser"]

if __name__ == "__main__":
    main()
