"""Batch samplers over a 1-D byte array: random windows, TBPTT sequences, contiguous streams, whole-split
evaluation."""

from tvq_exp.data.samplers.evaluation import EvalSegmentSampler
from tvq_exp.data.samplers.loader import (
    EpochSampler,
    TrainLoader,
    TrainSampler,
    check_split_size,
    window_batch,
)
from tvq_exp.data.samplers.stream import StreamSampler
from tvq_exp.data.samplers.tbptt import TBPTTSampler
from tvq_exp.data.samplers.windows import RandomWindowSampler

__all__ = [
    "EpochSampler",
    "EvalSegmentSampler",
    "RandomWindowSampler",
    "StreamSampler",
    "TBPTTSampler",
    "TrainLoader",
    "TrainSampler",
    "check_split_size",
    "window_batch",
]
