"""The interface every codebook update rule implements (:mod:`.ema`, :mod:`.gradient`, :mod:`.affine`)."""

from __future__ import annotations

import abc

from torch import Tensor, nn


class CodebookUpdate(abc.ABC):
    """How a quantiser's codes learn: one small interface, one file per rule.

    A rule holds only its hyper-parameters. Its tensors live on the quantiser (``owner``), created by
    :meth:`create`, so a checkpoint names them as before the split (``quantizer.embed``,
    ``quantizer.ema_sum``, ...) and they move with the module (``.to``, DDP, FSDP). Every method takes the
    quantiser as ``owner``. Keys and codes are in the search space (l2-normalised under ``normalize``),
    fp32, head-major: ``keys (H, N, d)``, ``codes (H, N)``.
    """

    trainable: bool = False
    """True: the codes receive the gradient of the codebook loss ``||C_z - sg(k)||²`` (no EMA)."""
    sums_keys: bool = False
    """True: :meth:`accumulate` takes each forward's per-code key sums (the quantiser computes them only then)."""

    @abc.abstractmethod
    def create(self, owner: nn.Module, init: Tensor) -> None:
        """Register the rule's state on ``owner``; the codes start as ``init (H, S, d)``."""

    @abc.abstractmethod
    def codes(self, owner: nn.Module) -> Tensor:
        """The code vectors ``(H, S, d)`` (before any normalisation by the quantiser)."""

    @abc.abstractmethod
    def assign(self, owner: nn.Module, mask: Tensor, vectors: Tensor) -> None:
        """Set the codes where ``mask (H, S)`` to ``vectors (H, S, d)`` (k-means init, re-seeding); the
        usage counts ``owner.ema_count`` already hold the new codes' counts."""

    def accumulate(self, owner: nn.Module, sums: Tensor) -> None:
        """Gather one training forward's statistics: ``sums (H, S, d)`` fp32, the sum of the keys that took each
        code, given only to a rule that :attr:`sums_keys` (none by default)."""
        return None  # a rule without statistics keeps this default

    def apply(self, owner: nn.Module, decay: float | Tensor) -> None:
        """Apply the gathered statistics once per optimiser step, after ``owner.ema_count`` took this step's
        counts with ``decay`` (nothing by default)."""
        return None  # a rule without statistics keeps this default

    def discard(self, owner: nn.Module) -> None:
        """Forget the statistics gathered since the last :meth:`apply` (nothing by default)."""
        return None  # a rule without statistics keeps this default
