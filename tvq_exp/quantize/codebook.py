"""Vector quantiser of attention keys with pluggable codebook strategies."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tvq_exp.options import Above, AtLeast, Between, OneOf, checked
from tvq_exp.quantize.kmeans import kmeans, nearest_code
from tvq_exp.quantize.sync import all_reduce_sum, broadcast_from_rank0

STRATEGIES = ("ema", "gradient")
_FROZEN: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tvq_codebook_statistics_frozen", default=False
)


@contextlib.contextmanager
def statistics_frozen() -> Iterator[None]:
    """Inside this context no quantiser accumulates statistics or k-means-initialises: activation
    checkpointing recomputes each block's forward in the backward pass, and that recomputation must not
    count the step's keys a second time."""
    token = _FROZEN.set(True)
    try:
        yield
    finally:
        _FROZEN.reset(token)


class VectorQuantizer(nn.Module):
    """Per-head codebook ``C: (H, S, d)`` that quantises keys ``k: (B, H, T, d)``.

    ``forward(k)`` returns ``(k_hat, codes, aux)``: ``k_hat = sg(C[z]) + k - sg(k)`` (straight-through),
    ``codes: (B, H, T)`` with ``z = argmin_s ||k - C_s||²`` computed in fp32, and ``aux`` holding
    ``commit_loss`` (``β·||k - sg(k_hat)||²`` summed over heads and key dimensions, averaged over batch and
    positions, as the official code), ``codebook_loss`` (gradient strategy) and detached metrics
    (code-usage perplexity, relative quantisation error, dead codes).

    Strategies:
        ``ema``: ``C = ema_sum / max(ema_count, count_floor)`` with EMA decay (the official read-out; with
        ``smoothing > 0`` the counts are Laplace-smoothed first); statistics accumulate over the forward
        passes of one optimiser step and are applied once by :meth:`update` (all-reduced under DDP).
        The codebook receives no task gradient.
        ``gradient``: ``C`` is a parameter trained by ``||sg(k) - C_z||²``.
    Any strategy: ``dead_code_threshold`` re-seeds codes whose EMA usage count falls below it from
    keys of the current (rank 0) batch; ``kmeans_init`` initialises the codebook from the first
    training batch's keys. The codebook starts as ``N(0, init_std²)`` (default ``1/sqrt(H·S)``, the
    official fan-in initialisation) with counts of one.
    """

    @checked
    def __init__(
        self,
        heads: Annotated[int, AtLeast(1)],
        codebook_size: Annotated[int, AtLeast(2)],
        dim: Annotated[int, AtLeast(1)],
        strategy: Annotated[str, OneOf(*STRATEGIES)] = "ema",
        decay: Annotated[float, Between(0, 1, "()")] = 0.99,
        smoothing: Annotated[float, AtLeast(0)] = 0.0,
        count_floor: Annotated[float, Above(0)] = 0.01,
        init_std: Annotated[float, Above(0)] | None = None,
        commit_weight: Annotated[float, AtLeast(0)] = 1e-4,
        codebook_weight: Annotated[float, AtLeast(0)] = 1.0,
        dead_code_threshold: Annotated[float, AtLeast(0)] = 0.0,
        kmeans_init: bool = False,
        kmeans_iters: Annotated[int, AtLeast(1)] = 10,
        sample_keys: Annotated[int, AtLeast(1)] = 4096,
    ) -> None:
        super().__init__()
        self.heads, self.codebook_size, self.dim = heads, codebook_size, dim
        self.strategy, self.decay, self.smoothing, self.count_floor = strategy, decay, smoothing, count_floor
        self.commit_weight, self.codebook_weight = commit_weight, codebook_weight
        self.dead_code_threshold, self.kmeans_init, self.kmeans_iters = (
            dead_code_threshold,
            kmeans_init,
            kmeans_iters,
        )
        self.sample_keys = sample_keys
        init = torch.randn(heads, codebook_size, dim) * (init_std or (heads * codebook_size) ** -0.5)
        if strategy == "gradient":
            self.embed = nn.Parameter(init)
        else:
            self.register_buffer("embed", init.clone())
            self.register_buffer("ema_sum", init.clone())
        self.register_buffer("ema_count", torch.ones(heads, codebook_size))
        self.register_buffer("initialized", torch.tensor(not kmeans_init))
        self.register_buffer("pending_count", torch.zeros(heads, codebook_size), persistent=False)
        self.register_buffer("pending_sum", torch.zeros(heads, codebook_size, dim), persistent=False)
        self.recent_keys: Tensor | None = None

    @property
    def codebook(self) -> Tensor:
        """The code vectors in use, ``(H, S, d)``."""
        return self.embed

    def search_keys(self, k: Tensor) -> Tensor:
        """The keys as the nearest-code search sees them (here unchanged), in the space of :attr:`codebook`."""
        return k

    def forward(self, k: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        b, h, t, d = k.shape
        if h != self.heads or d != self.dim:
            raise ValueError(
                f"keys {tuple(k.shape)} do not match the codebook ({self.heads} heads, dim {self.dim})"
            )
        flat = k.detach().float().transpose(0, 1).reshape(h, b * t, d)
        learning = self.training and torch.is_grad_enabled() and not _FROZEN.get()
        if learning and self.kmeans_init and not bool(self.initialized):
            self.init_from_keys(flat)
        codes = nearest_code(flat, self.embed)  # (H, N)
        quant = torch.gather(self.embed, 1, codes[..., None].expand(h, b * t, d))  # (H, N, d)
        quant = quant.view(h, b, t, d).transpose(0, 1)
        codes = codes.view(h, b, t).transpose(0, 1)
        counts = self._counts(codes)
        if learning:
            self._accumulate(flat, codes, counts)
        aux = self._aux(k, quant, counts)
        k_hat = quant.detach().to(k.dtype) + k - k.detach()
        return k_hat, codes, aux

    def _counts(self, codes: Tensor) -> Tensor:
        h = codes.shape[1]
        flat = codes.transpose(0, 1).reshape(h, -1)
        return torch.zeros(h, self.codebook_size, device=codes.device).scatter_add_(
            1, flat, torch.ones_like(flat, dtype=torch.float32)
        )

    def _accumulate(self, flat: Tensor, codes: Tensor, counts: Tensor) -> None:
        h, n, d = flat.shape
        self.pending_count += counts
        if self.strategy == "ema":
            idx = codes.transpose(0, 1).reshape(h, n)
            self.pending_sum.scatter_add_(1, idx[..., None].expand(h, n, d), flat.to(self.pending_sum.dtype))
        if self.dead_code_threshold > 0:
            take = torch.randperm(n, device=flat.device)[: self.sample_keys]
            self.recent_keys = flat[:, take]

    def _aux(self, k: Tensor, quant: Tensor, counts: Tensor) -> dict[str, Tensor]:
        kf = k.float()
        commit = F.mse_loss(kf, quant.detach().float())
        aux = {
            "commit_loss": self.commit_weight * commit * (self.heads * self.dim)
        }  # summed over heads, dims
        if self.strategy == "gradient":
            aux["codebook_loss"] = self.codebook_weight * F.mse_loss(quant.float(), kf.detach())
        p = counts / counts.sum(-1, keepdim=True).clamp_min(1)
        entropy = -(p * p.clamp_min(1e-12).log()).sum(-1)
        aux["perplexity"] = entropy.exp().mean().detach()
        aux["quant_error"] = (commit / kf.pow(2).mean().clamp_min(1e-12)).detach()
        aux["dead_codes"] = (
            (self.ema_count < max(self.dead_code_threshold, 1e-3)).float().sum(-1).mean().detach()
        )
        return aux

    @torch.no_grad()
    def init_from_keys(self, keys: Tensor) -> None:
        """k-means-initialise the codebook from ``keys: (H, N, d)`` (synchronised across ranks)."""
        centroids = kmeans(keys.float(), self.codebook_size, self.kmeans_iters)
        self.embed.data.copy_(centroids)
        self.ema_count.fill_(1.0)
        if self.strategy == "ema":
            self.ema_sum.copy_(centroids)
        self.initialized.fill_(True)

    @torch.no_grad()
    def update(self) -> None:
        """Apply the statistics gathered since the last call: one optimiser step.

        Sums pending counts (and key sums) over all ranks, updates the EMA, recomputes the
        codebook (``ema``), then re-seeds dead codes. Identical on every rank.
        """
        all_reduce_sum(self.pending_count)
        d = self.decay
        self.ema_count.mul_(d).add_(self.pending_count, alpha=1 - d)
        if self.strategy == "ema":
            all_reduce_sum(self.pending_sum)
            self.ema_sum.mul_(d).add_(self.pending_sum, alpha=1 - d)
            counts = self.ema_count
            if self.smoothing > 0:
                total = counts.sum(-1, keepdim=True)
                counts = (counts + self.smoothing) / (total + self.codebook_size * self.smoothing) * total
            self.embed.copy_(self.ema_sum / counts.clamp_min(self.count_floor)[..., None])
        if self.dead_code_threshold > 0 and self.recent_keys is not None:
            self._reset_dead_codes(self.recent_keys)
        self.discard_pending()

    @torch.no_grad()
    def discard_pending(self) -> None:
        """Forget the statistics (and sampled keys) gathered since the last :meth:`update`."""
        self.pending_count.zero_()
        self.pending_sum.zero_()
        self.recent_keys = None

    def _reset_dead_codes(self, keys: Tensor) -> None:
        dead = self.ema_count < self.dead_code_threshold  # (H, S)
        dead = broadcast_from_rank0(dead.to(torch.uint8)).bool()
        if not dead.any():
            return
        h, n, d = keys.shape
        pick = torch.randint(0, n, (h, self.codebook_size), device=keys.device)
        seeds = broadcast_from_rank0(
            torch.gather(keys, 1, pick[..., None].expand(h, self.codebook_size, d)).contiguous()
        )
        live_mean = (self.ema_count * ~dead).sum(-1, keepdim=True) / (~dead).sum(-1, keepdim=True).clamp_min(
            1
        )
        new_count = torch.maximum(live_mean, torch.full_like(live_mean, self.dead_code_threshold)).expand_as(
            dead
        )
        self.embed.data.copy_(torch.where(dead[..., None], seeds.to(self.embed.dtype), self.embed.data))
        self.ema_count.copy_(torch.where(dead, new_count, self.ema_count))
        if self.strategy == "ema":
            self.ema_sum.copy_(torch.where(dead[..., None], seeds * new_count[..., None], self.ema_sum))
