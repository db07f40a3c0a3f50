"""Whole-split evaluation in contiguous segments."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from tvq_exp.batch import IGNORE_INDEX, Batch
from tvq_exp.data.samplers.tbptt import check_sequence_len

PROTOCOLS = ("segment", "sequence", "split")


class EvalSegmentSampler:
    """Whole-split evaluation in contiguous segments, under one of three protocols.

    The split is cut into ``num_streams`` contiguous streams (lengths differ by at most one byte; the
    number does not depend on the world size, so results do not either). Rank ``r`` owns streams
    ``r, r + W, r + 2W, ...`` as rows, padded with empty rows to ``ceil(num_streams / W)`` rows. Segment ``j``
    of a stream has input = bytes ``[j*T, j*T + T)`` and target = bytes ``[j*T + 1, j*T + T]``; positions past
    the stream end have input 0 and target :data:`IGNORE_INDEX`. Over all ranks every byte except the first
    of each stream is a target exactly once (:meth:`num_targets`).

    ``protocol`` says where the model's state is reset (``reset`` True; the state is carried otherwise):

    - ``segment``: at every segment of ``T`` (the official protocol: each chunk from an empty state);
    - ``sequence``: at every ``sequence_len`` tokens of a stream (TBPTT's sequences: state carried across
      the segments of one sequence);
    - ``split``: only at the start of each stream (the state carried across the whole stream; with one
      stream, ``num_streams=1``, across the whole split).

    ``position`` is the segment's distance from the last reset.
    """

    def __init__(
        self,
        data: np.ndarray,
        seq_len: int,
        num_streams: int,
        rank: int = 0,
        world_size: int = 1,
        protocol: str = "segment",
        sequence_len: int | None = None,
    ) -> None:
        if len(data) < 2 * num_streams:
            raise ValueError(
                f"{len(data)} bytes cannot be cut into {num_streams} streams of at least 2 bytes"
            )
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        if protocol == "sequence":
            check_sequence_len(sequence_len, seq_len)
        self.data = data
        self.seq_len = seq_len
        self.num_streams = num_streams
        self.protocol, self.sequence_len = protocol, sequence_len
        bounds = np.arange(num_streams + 1, dtype=np.int64) * len(data) // num_streams
        rows = math.ceil(num_streams / world_size)
        owned = np.arange(rows) * world_size + rank
        real = owned < num_streams
        self.starts = np.where(real, bounds[np.minimum(owned, num_streams - 1)], 0)
        self.ends = np.where(real, bounds[np.minimum(owned + 1, num_streams)], 0)
        self.segments = math.ceil((int(np.diff(bounds).max()) - 1) / seq_len)

    @staticmethod
    def count_targets(split_size: int, num_streams: int) -> int:
        """Targets over the whole split: every byte but the first of each stream."""
        return split_size - num_streams

    def num_targets(self) -> int:
        """Targets over the whole split, all ranks together."""
        return self.count_targets(len(self.data), self.num_streams)

    def __len__(self) -> int:
        return self.segments

    def __iter__(self) -> Iterator[Batch]:
        offsets = np.arange(self.seq_len + 1)
        for segment in range(self.segments):
            positions = self.starts[:, None] + segment * self.seq_len + offsets
            valid = positions < self.ends[:, None]
            chunk = np.where(valid, self.data[np.where(valid, positions, 0)], 0).astype(np.int64)
            target = np.where(valid[:, 1:], chunk[:, 1:], IGNORE_INDEX)
            age = self.age(segment)
            yield {
                "input": torch.from_numpy(np.ascontiguousarray(chunk[:, :-1])),
                "target": torch.from_numpy(target),
                "reset": torch.full((len(self.starts),), age == 0, dtype=torch.bool),
                "position": torch.full((len(self.starts),), age, dtype=torch.long),
            }

    def age(self, segment: int) -> int:
        """Tokens from the last state reset to the start of ``segment``."""
        start = segment * self.seq_len
        if self.protocol == "segment":
            return 0
        return start % self.sequence_len if self.protocol == "sequence" else start
