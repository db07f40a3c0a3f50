"""Truncated backpropagation through time (TBPTT), as every Transformer-VQ result of the paper was trained.

Each batch holds ``B`` sequences of ``T = sequence_len`` tokens and is yielded as ``T / update_len``
consecutive updates of ``update_len`` tokens: update ``u`` of a batch is bytes
``[s + u·U, s + (u + 1)·U]`` of each sequence start ``s`` (inputs and next-byte targets). ``reset`` is True
at the first update of every sequence and False at the others, so the model's state (carried between
updates with stop-gradient) starts empty with every sequence and spans the whole sequence. One update is
one optimiser step.

Order (seeded, covering the corpus, like the official code's shuffled sequence chunks): each epoch the
training split, after a random start offset in ``[0, T)``, is cut into ``N = (n - offset - 1) // T``
sequences; a permutation of them (``default_rng([seed, epoch])``) is dealt out to the ranks, rank ``r``
taking every ``world_size``-th one starting at ``r``, so the ranks see disjoint sequences and together
every sequence at most once per epoch (the same number of batches every epoch: fewer than
``B·world_size + 1`` sequences of an epoch are left out). ``state_dict`` is
``(epoch, step)``: the order is re-derived from the seed, so a resume continues exactly, mid-sequence too
(the carried model state is the Lightning module's, saved in the same checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tvq_exp.batch import Batch
from tvq_exp.data.samplers.loader import EpochSampler, check_split_size, window_batch
from tvq_exp.options import OptionError


def check_sequence_len(sequence_len: int | None, update_len: int, owner: type | None = None) -> None:
    """The one rule of a sequence cut into updates (TBPTT training, the ``sequence`` evaluation protocol):
    ``sequence_len`` is a whole number of updates of ``update_len`` (``data.seq_len``); raises
    :class:`~tvq_exp.options.OptionError` on ``sequence_len`` otherwise."""
    if sequence_len is None or sequence_len % update_len:
        allowed = f"must be a multiple of the update length data.seq_len={update_len} (sampler=tbptt, eval_protocol=sequence)"
        raise OptionError("sequence_len", sequence_len, allowed, owner)


class TBPTTSampler(EpochSampler):
    """TBPTT batches over a 1-D token array (see the module docstring).

    Args:
        data: the training split ``(n,)`` uint8.
        update_len: ``U`` tokens per update (``data.seq_len``).
        sequence_len: ``T`` tokens per sequence (``data.sequence_len``), a multiple of ``update_len``.
        batch_size: ``B`` sequences per batch on this rank.
        seed, rank, world_size: the order's seed and this process's share.

    Batches: ``input``, ``target`` ``(B, U)``; ``reset`` ``(B,)`` True at a sequence's first update;
    ``position`` ``(B,)`` the update's offset in its sequence (``u·U``).
    """

    def __init__(
        self,
        data: np.ndarray,
        update_len: int,
        sequence_len: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_sequence_len(sequence_len, update_len)
        check_split_size("train", len(data), sequence_len + sequence_len)  # room for the offset too
        self.data, self.update_len, self.sequence_len = data, update_len, sequence_len
        super().__init__(batch_size, seed, rank, world_size)
        self.updates = sequence_len // update_len
        # the same number of batches in every epoch, whatever its offset (the largest leaves the fewest)
        self.batches = self.sequences_per_epoch(sequence_len - 1) // (batch_size * world_size)
        if self.batches < 1:
            raise ValueError(
                f"split 'train' has {len(data)} bytes: too few for {batch_size * world_size} sequences of "
                f"{sequence_len} tokens; lower batch_size or sequence_len"
            )

    def sequences_per_epoch(self, offset: int) -> int:
        """Whole sequences (plus one target byte) after ``offset``."""
        return (len(self.data) - offset - 1) // self.sequence_len

    def __len__(self) -> int:
        return self.batches * self.updates

    def sequence_starts(self, epoch: int) -> np.ndarray:
        """Start of every sequence this rank trains on in ``epoch``, batch after batch: ``(batches, B)``."""
        rng = np.random.default_rng([self.seed, epoch])
        offset = int(rng.integers(self.sequence_len))
        order = rng.permutation(self.sequences_per_epoch(offset))
        mine = order[self.rank :: self.world_size][: self.batches * self.batch_size]
        return (offset + mine * self.sequence_len).reshape(self.batches, self.batch_size)

    def epoch_batches(self, epoch: int, start: int) -> Iterator[Batch]:
        """The updates of ``epoch`` from update ``start`` on (a step is one update)."""
        starts = self.sequence_starts(epoch)
        for step in range(start, len(self)):
            batch, update = divmod(step, self.updates)
            yield window_batch(
                self.data, starts[batch] + update * self.update_len, self.update_len, reset=update == 0,
                position=update * self.update_len,
            )  # fmt: skip


__all__ = ["TBPTTSampler"]
