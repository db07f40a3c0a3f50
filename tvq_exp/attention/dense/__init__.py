"""Dense (quadratic) attention: :mod:`.layer` (the backend), :mod:`.flex` (its flex-attention kernel),
:mod:`.naive` (the plain references it is tested against)."""

from tvq_exp.attention.dense.layer import DenseAttention, DenseState

__all__ = ["DenseAttention", "DenseState"]
