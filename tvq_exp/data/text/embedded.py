"""The corpus shipped in the package: tiny Shakespeare, so the main command runs on any machine, offline.

``tvq_exp/data/text/shipped/tinyshakespeare.txt`` is Karpathy's tiny Shakespeare (1,115,394 bytes, public
domain; :data:`SHA256`). :class:`OrEmbedded` wraps a larger corpus (the smoke preset's Gutenberg books): where
the data root does not hold it, one line says so and the shipped file is used instead, split 90/10 as
``data=shakespeare`` splits it (validation is also the test split).
"""

from __future__ import annotations

from pathlib import Path

from tvq_exp.console import say
from tvq_exp.data.paths import resolve
from tvq_exp.data.text.corpus import ByteCorpus, Splits
from tvq_exp.data.text.local import SingleFileCorpus

EMBEDDED = Path(__file__).resolve().parent / "shipped" / "tinyshakespeare.txt"
SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"


class OrEmbedded(ByteCorpus):
    """``corpus`` where the data root holds its ``path``, else the shipped tiny Shakespeare (one line says so).

    Only a corpus that is absent altogether is replaced: a present but incomplete or corrupt one still stops
    the run with its own error."""

    def __init__(self, corpus: ByteCorpus) -> None:
        self.corpus = corpus
        self.name = corpus.name
        self.path = getattr(corpus, "path", None)

    def chosen(self, root: Path) -> ByteCorpus:
        """The wrapped corpus when ``root`` holds its path, else the shipped one."""
        if self.path is None or resolve(self.path, root).exists():
            return self.corpus
        say(
            f"data: no {self.name} under {root} ({self.path}): training on the tiny Shakespeare shipped in the "
            f"package ({EMBEDDED.stat().st_size:,} bytes); set TVQ_DATA_DIR to a data root that holds it"
        )
        self.name, self.path = "shakespeare (shipped)", str(EMBEDDED)
        return SingleFileCorpus(path=str(EMBEDDED), name="shakespeare")

    def prepare(self, root: Path) -> None:
        if self.path is not None and resolve(self.path, root).exists():
            self.corpus.prepare(root)

    def load(self, root: Path) -> Splits:
        return self.chosen(root).load(root)


__all__ = ["EMBEDDED", "SHA256", "OrEmbedded"]
