"""The vector quantiser of attention keys: nearest-code search, gradient estimator, per-step metrics,
k-means init and dead-code re-seeding, around a pluggable update rule (:mod:`.update`).

Over 300 lines: one class whose forward, statistics, update and schedules (decay warm-up, temperature, hard warm-up)
share its buffers and step counter; the search, estimators, sampling, health and update rules are their own modules.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._compile import _disable_dynamo

from tvq_exp.options import (
    AtLeast,
    Between,
    NonNegativeFloat,
    NonNegativeInt,
    OneOf,
    OptionError,
    PositiveFloat,
    PositiveInt,
    checked,
)
from tvq_exp.quantize.affine import AffineUpdate
from tvq_exp.quantize.ema import EMAUpdate, decay_into
from tvq_exp.quantize.estimators import rotation_trick, straight_through
from tvq_exp.quantize.fused_statistics import (
    CodeStatistics,
    code_statistics,
    fused_metrics,
    key_sums,
    plain_metrics,
    plain_statistics,
)
from tvq_exp.quantize.gradient import GradientUpdate
from tvq_exp.quantize.kmeans import fused_search, kmeans, nearest_code
from tvq_exp.quantize.reseed import dead_codes, sample_rows
from tvq_exp.quantize.sampling import relaxation, sampled_code, sampled_code_and_noise
from tvq_exp.quantize.sync import all_reduce_sum, broadcast_from_rank0
from tvq_exp.quantize.update import CodebookUpdate

UPDATES = ("ema", "gradient", "affine")
ESTIMATORS = ("straight_through", "rotation", "relaxed")
# whether statistics_frozen is on: a module global, which every torch.compile traces (torch 2.11's cannot trace a
# ContextVar's get: on the H200 of 2026-11-30 it broke each compiled block's graph in two at the quantiser)
_frozen = False


@contextlib.contextmanager
def statistics_frozen() -> Iterator[None]:
    """Inside this context no quantiser accumulates statistics or k-means-initialises: activation
    checkpointing recomputes each block's forward in the backward pass, and that recomputation must not
    count the step's keys a second time."""
    global _frozen
    before, _frozen = _frozen, True
    try:
        yield
    finally:
        _frozen = before


class VectorQuantizer(nn.Module):
    """Per-head codebook ``C: (H, S, d)`` that quantises keys ``k: (B, H, T, d)``.

    ``forward(k)`` returns ``(k_hat, codes, aux)``. ``codes: (B, H, T)`` is ``z = argmin_s ||k' - C_s||²``
    in fp32, where ``k' = search_keys(k)`` (``k`` itself, or ``k/||k||`` under ``normalize``); ``k_hat``
    equals ``C[z]`` exactly, with the gradient of the ``estimator``: ``straight_through``
    (``sg(C_z) + k' - sg(k')``), ``rotation`` (the rotation trick, :func:`.estimators.rotation_trick`) or, with
    ``assignment=sampled`` only, ``relaxed``: ``k_hat = sg(C_z) + (k' - sg(k')) + (soft - sg(soft))``, ``soft =
    Σ_s y_s C_s``, ``y = softmax(ℓ + g)`` relaxing the draw ``z = argmax_s(ℓ_s + g_s)`` on the SAME noise ``g``
    (:func:`.sampling.relaxation`): straight-through's gradient plus the relaxation's; none at temperature 0.
    ``aux`` holds ``commit_loss`` (``β·||k' - sg(C_z)||²`` summed over heads and key dimensions, averaged
    over batch and positions, as the official code), ``codebook_loss`` (trainable rules:
    ``codebook_weight·mean ||C_z - sg(k')||²``) and detached metrics: code-usage perplexity, relative
    quantisation error, dead codes (codes the batch used under 1% of their fair share ``N/S``).

    How the codes learn (``update``, :mod:`.update`): ``ema`` (:class:`.EMAUpdate`, the official read-out
    ``ema_sum / max(ema_count, count_floor)``, ``smoothing > 0`` Laplace-smooths it), ``gradient``
    (:class:`.GradientUpdate`) or ``affine`` (:class:`.AffineUpdate`, SimVQ: frozen basis × learnt map).
    Remedies, options every rule takes:
        ``decay`` of the usage counts ``ema_count (H, S)`` (and of the EMA sums), warming up linearly from
        ``decay_start`` over the first ``decay_warmup`` optimiser steps (0: no warm-up);
        ``init``: ``random`` (``N(0, init_std²)``, by default ``1/sqrt(H·S)``, the official fan-in
        initialisation, counts of one) or ``kmeans`` (k-means of the first training batch's keys);
        ``reseed_fraction``: after each optimiser step, a code that took fewer than this fraction of its fair
        share ``N/S`` of the step's ``N`` keys (all ranks, :func:`.reseed.dead_codes`) is re-seeded from a
        key of the step (rank 0's) and given the mean usage count (0: off);
        ``normalize``: l2-normalised (cosine) keys and codes in the search and the read-out;
        ``estimator``: ``straight_through``, ``rotation`` or ``relaxed`` (needs ``assignment=sampled``);
        ``assignment``: ``nearest`` (the official search) or ``sampled``: in training each key draws its code
        from ``softmax(-||k' - C_s||² / (τ·m))`` (:func:`.sampling.sampled_code`; ``m`` the batch's mean squared
        distance to the nearest code), ``τ = temperature`` falling linearly to 0 (the nearest code) over the
        first ``temperature_anneal`` optimiser steps (0: no annealing); evaluation always takes the nearest.
        A training step's quantised keys, commitment loss, statistics and metrics use the drawn codes;
        ``hard_warmup``: a soft-to-hard schedule of the value the attention reads: in training ``k_hat`` is
        ``α·C_z + (1 - α)·k'`` in value, ``α = (steps - hard_warmup_delay) / hard_warmup`` clipped to [0, 1]: the
        key itself for the first ``hard_warmup_delay`` optimiser steps, then moving linearly to its code over
        ``hard_warmup`` steps; the estimator's gradient throughout; evaluation reads the code (``hard_warmup=0``:
        off, the official). A small component of a key moves the scores early, while codes and keys settle;
        ``fit_weight``: how much each key counts in the codebook's statistics (counts, EMA sums, the keys that
        re-seed dead codes): ``uniform`` (the official: one each) or ``fisher``: the squared norm of the loss's
        gradient at its ``k_hat``, scaled to mean 1 over the forward's keys (the diagonal-Fisher-weighted k-means
        of SqueezeLLM, Kim et al. 2023, applied to the keys): the codes go where the reads' loss is sensitive,
        not where keys are many. Gathered by a gradient hook in the backward pass, registered outside any compiled
        graph: a compiled step breaks its graph there, once per quantiser, and gathers eager's statistics; ``ema``
        rule only. ``fit_floor`` (fisher only): the weight is ``fit_floor + (1 - fit_floor)·w``, a share of the
        uniform fit kept for the keys the loss does not weigh (0: none).
    ``fused_pass``: after the search, the per-key work (the codes' rows in the keys' layout, the commitment loss and
    its gradient, the norms, counts and EMA sums) in one Triton kernel where :meth:`fuses_statistics` (eager, CUDA
    with Triton): one read of the keys for about fifteen ATen launches over key-sized tensors; False: torch's ops
    everywhere (the reference; the GPU check times both).
    Statistics accumulate over the forward passes of one optimiser step (training mode, gradients on, not
    inside :func:`statistics_frozen`) and are applied once by :meth:`update` (all-reduced under DDP).
    """

    @checked
    def __init__(
        self,
        heads: PositiveInt,
        codebook_size: Annotated[int, AtLeast(2)],
        dim: PositiveInt,
        update: Annotated[str, OneOf(*UPDATES)] = "ema",
        decay: Annotated[float, Between(0, 1, "()")] = 0.99,
        decay_start: Annotated[float, Between(0, 1, "[)")] = 0.9,
        decay_warmup: NonNegativeInt = 0,
        smoothing: NonNegativeFloat = 0.0,
        count_floor: PositiveFloat = 0.01,
        init: Annotated[str, OneOf("random", "kmeans")] = "random",
        init_std: PositiveFloat | None = None,
        kmeans_iters: PositiveInt = 10,
        reseed_fraction: Annotated[float, Between(0, 1, "[)")] = 0.0,
        sample_keys: PositiveInt = 4096,
        normalize: bool = False,
        estimator: Annotated[str, OneOf(*ESTIMATORS)] = "straight_through",
        assignment: Annotated[str, OneOf("nearest", "sampled")] = "nearest",
        temperature: PositiveFloat = 1.0,
        temperature_anneal: NonNegativeInt = 0,
        hard_warmup: NonNegativeInt = 0,
        hard_warmup_delay: NonNegativeInt = 0,
        fit_weight: Annotated[str, OneOf("uniform", "fisher")] = "uniform",
        fit_floor: Annotated[float, Between(0, 1, "[)")] = 0.0,
        commit_weight: NonNegativeFloat = 1e-4,
        codebook_weight: NonNegativeFloat = 1.0,
        fused_pass: bool = True,
    ) -> None:
        super().__init__()
        if estimator == "relaxed" and assignment != "sampled":
            allowed = f"needs assignment='sampled' (not {assignment!r}); else straight_through or rotation"
            raise OptionError("estimator", estimator, allowed, type(self))
        self.heads, self.codebook_size, self.dim = heads, codebook_size, dim
        self.decay, self.decay_start, self.decay_warmup = decay, decay_start, decay_warmup
        self.init, self.kmeans_iters = init, kmeans_iters
        self.reseed_fraction, self.sample_keys = reseed_fraction, sample_keys
        self.normalize, self.estimator = normalize, estimator
        self.assignment = assignment
        self.temperature, self.temperature_anneal = temperature, temperature_anneal
        if hard_warmup_delay and not hard_warmup:
            allowed = "needs hard_warmup > 0 (the schedule it delays); else 0"
            raise OptionError("hard_warmup_delay", hard_warmup_delay, allowed, type(self))
        self.hard_warmup, self.hard_warmup_delay = hard_warmup, hard_warmup_delay
        if fit_weight != "uniform" and update != "ema":
            allowed = f"needs update='ema' (not {update!r}: its codes learn by gradient); else 'uniform'"
            raise OptionError("fit_weight", fit_weight, allowed, type(self))
        if fit_floor and fit_weight != "fisher":
            allowed = (
                f"needs fit_weight='fisher' (not {fit_weight!r}: the floor mixes into its weights); else 0"
            )
            raise OptionError("fit_floor", fit_floor, allowed, type(self))
        self.fit_weight, self.fit_floor = fit_weight, fit_floor
        self.commit_weight, self.codebook_weight = commit_weight, codebook_weight
        self.fused_pass = fused_pass
        self.rule = _rule(update, smoothing, count_floor)
        self.rule.create(
            self, torch.randn(heads, codebook_size, dim) * (init_std or (heads * codebook_size) ** -0.5)
        )
        self.register_buffer("ema_count", torch.ones(heads, codebook_size))
        self.register_buffer("initialized", torch.tensor(init != "kmeans"))
        if self.counts_steps:
            self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.register_buffer("pending_count", torch.zeros(heads, codebook_size), persistent=False)
        self.recent_keys: Tensor | None = None
        # ``initialized`` as the host knows it (set here, by the k-means init and when a state dict is loaded):
        # reading the buffer in every forward would wait for the device
        self.initialized_on_host = init != "kmeans"
        self.register_load_state_dict_post_hook(_read_initialized)

    @property
    def counts_steps(self) -> bool:
        """Whether a schedule (decay warm-up, temperature annealing, hard warm-up) needs the optimiser step,
        ``steps``."""
        sampled = self.assignment == "sampled" and bool(self.temperature_anneal)
        return bool(self.decay_warmup) or sampled or bool(self.hard_warmup)

    @property
    def codebook(self) -> Tensor:
        """The code vectors in use, ``(H, S, d)``, in the space of :meth:`search_keys`."""
        codes = self.rule.codes(self)
        return F.normalize(codes, dim=-1) if self.normalize else codes

    def search_keys(self, k: Tensor) -> Tensor:
        """Keys ``(..., d)`` as the nearest-code search sees them: ``k``, or ``k/||k||`` under ``normalize``."""
        return F.normalize(k, dim=-1) if self.normalize else k

    def forward(self, k: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        b, h, t, d = k.shape
        if h != self.heads or d != self.dim:
            raise ValueError(
                f"keys {tuple(k.shape)} do not match the codebook ({self.heads} heads, dim {self.dim})"
            )
        k = self.search_keys(k)
        training = self.training and torch.is_grad_enabled()
        fused = self.fuses_statistics(k, training)
        # (H, N, d), the layout of the search, the statistics and the losses (none needs (B, H, T, d)): a view where
        # the keys come as (B, T, H, d), else one copy in their dtype
        kh = k.transpose(0, 1).reshape(h, b * t, d)
        # the fused pass reads the keys as they are; else cast once, for the search and the losses (a bf16 key tensor
        # cast once, not twice)
        kf = kh if fused else kh.float()  # once
        flat = kf.detach()
        learning = training and not _frozen
        if learning and not self.initialized_on_host:
            self.init_from_keys(flat)
        codebook = self.codebook
        # bf16 keys reach the fused search as they are (a view where they come as (B, T, H, d)), not as the fp32
        # copy: half the bytes read; its distances are fp32 either way
        bf16 = k.dtype == torch.bfloat16 and fused_search(k)
        keys = kh.detach() if bf16 else flat
        codes = nearest = nearest_code(keys, codebook.detach())  # (H, N)
        noise = None
        # a drawn code in training (also in a checkpoint's recompute, which replays the draw), else the nearest
        if training and self.assignment == "sampled":
            codes, noise = self._draw(flat, codebook.detach(), nearest)
        weighted = self.fit_weight == "fisher"
        sums = learning and not weighted and self.rule.sums_keys
        if fused:
            quant, stats = None, code_statistics(k, codes, codebook, sums)
        else:
            index = codes[..., None].expand(h, b * t, d)
            quant = torch.gather(codebook, 1, index)  # (H, N, d), for the losses and the statistics
            stats = plain_statistics(k, codes, codebook, sums, kf, quant)
        if learning and not weighted:
            self._accumulate(flat, stats)
        aux = self._aux(stats, k.numel(), quant, kf, fused)
        estimate = rotation_trick if self.estimator == "rotation" else straight_through
        k_hat = estimate(k, stats.rows.detach())
        if noise is not None:  # relaxed: + (soft - sg(soft)), zero in value
            x = kh.to(torch.promote_types(k.dtype, torch.float32))
            term = relaxation(x, codebook, nearest, noise, self.current_temperature())
            k_hat = k_hat + term.view(h, b, t, d).transpose(0, 1).to(k.dtype)
        if training and self.hard_warmup:  # + (1 - α)·sg(k' - C_z): the value moves from the key to the code
            soft = 1 - self.hard_fraction()
            quant = quant.view(h, b, t, d).transpose(0, 1)
            k_hat = k_hat + (soft * (k.detach().float() - quant.detach().float())).to(k.dtype)
        if learning and weighted and k_hat.requires_grad:
            _weigh_in_backward(k_hat, functools.partial(self._accumulate_weighted, flat, codes))
        return k_hat, codes.view(h, b, t).transpose(0, 1), aux

    def fuses_statistics(self, k: Tensor, training: bool) -> bool:
        """Whether this forward takes its statistics and losses from keys ``k`` in one fused pass
        (:func:`.fused_statistics.code_statistics`): with ``fused_pass``, eagerly where the search is fused (CUDA with
        Triton; compiled, inductor fuses the plain ops), for the rules whose codes learn no gradient, and not where the
        fp32 gathered codes or keys are needed (the hard warm-up's blend, a drawn code, the Fisher weights)."""
        special = training and (self.hard_warmup or self.assignment == "sampled")
        eager = self.fused_pass and fused_search(k) and not torch.compiler.is_compiling()
        return eager and not self.rule.trainable and not special and self.fit_weight == "uniform"

    def _draw(self, flat: Tensor, codebook: Tensor, nearest: Tensor) -> tuple[Tensor, Tensor | None]:
        """Codes drawn at :meth:`current_temperature` (the ``nearest (H, N)`` where it has annealed to 0), and
        under the ``relaxed`` estimator the draw's Gumbel noise ``(H, N, S)`` (else ``None``)."""
        temperature = self.current_temperature()
        annealed = isinstance(temperature, Tensor)
        drawing = temperature.clamp_min(1e-30) if annealed else temperature
        if self.estimator == "relaxed":
            drawn, noise = sampled_code_and_noise(flat, codebook, nearest, drawing)
        else:
            drawn, noise = sampled_code(flat, codebook, nearest, drawing), None
        return (torch.where(temperature > 0, drawn, nearest) if annealed else drawn), noise  # no host read

    def _accumulate(self, flat: Tensor, stats: CodeStatistics) -> None:
        self.pending_count += stats.counts
        if stats.sums is not None:
            self.rule.accumulate(self, stats.sums)
        if self.reseed_fraction > 0:
            take = torch.randperm(flat.shape[1], device=flat.device)[: self.sample_keys]
            self.recent_keys = flat[:, take].float()

    def _accumulate_weighted(self, flat: Tensor, codes: Tensor, grad: Tensor) -> None:
        """``fit_weight=fisher``: :meth:`_accumulate` with each key weighted by ``||∂L/∂k_hat||²`` (``grad (B, H, T,
        d)``), scaled to mean 1 per head and mixed with ``fit_floor`` of the uniform weight; the re-seeding sample
        drawn with the same weights."""
        h, n, d = flat.shape
        weight = grad.detach().float().pow(2).sum(-1).transpose(0, 1).reshape(h, n)
        weight = weight / weight.mean(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
        weight = self.fit_floor + (1 - self.fit_floor) * weight
        weight = weight.to(self.pending_count.dtype)
        self.pending_count += torch.zeros_like(self.pending_count).scatter_add_(1, codes, weight)
        if self.rule.sums_keys:
            self.rule.accumulate(
                self, key_sums(flat * weight[..., None].to(flat.dtype), codes, self.codebook_size)
            )
        if self.reseed_fraction > 0:
            # (H, K), drawn with the weights (uniform only where every weight is 0)
            take = torch.multinomial(weight.float() + 1e-12, min(n, self.sample_keys), replacement=True)
            self.recent_keys = flat.gather(1, take[..., None].expand(h, take.shape[1], d))

    def _aux(
        self, stats: CodeStatistics, numel: int, quant: Tensor | None, kf: Tensor, fused: bool
    ) -> dict[str, Tensor]:
        """The losses and metrics of this forward's :class:`.CodeStatistics` over ``numel`` key values (``fused``: the
        metrics in one launch, :func:`.fused_metrics`); ``quant`` (the gathered codes, ``(H, N, d)``, None where fused)
        and ``kf`` (the keys, ``(H, N, d)`` fp32) for the trainable rules' codebook loss."""
        # the mean squared error, summed over heads and dims
        aux = {"commit_loss": stats.sq_error * (self.commit_weight * self.heads * self.dim / numel)}
        if self.rule.trainable:
            aux["codebook_loss"] = self.codebook_weight * F.mse_loss(quant.float(), kf.detach())
        metrics = (fused_metrics if fused else plain_metrics)(stats, numel)
        aux.update(metrics._asdict())
        return aux

    @torch.no_grad()
    def init_from_keys(self, keys: Tensor) -> None:
        """k-means-initialise the codebook from ``keys: (H, N, d)`` (synchronised across ranks)."""
        centroids = kmeans(self.search_keys(keys.float()), self.codebook_size, self.kmeans_iters)
        self.ema_count.fill_(1.0)
        self.rule.assign(self, torch.ones_like(self.ema_count, dtype=torch.bool), centroids)
        self.initialized.fill_(True)
        self.initialized_on_host = True

    def current_decay(self) -> float | Tensor:
        """The decay of this optimiser step: ``decay``, after a linear warm-up from ``decay_start`` (then a 0-d
        tensor on the codebook's device, from the step counter ``steps``: no host read)."""
        if not self.decay_warmup:
            return self.decay
        done = (self.steps / self.decay_warmup).clamp(max=1.0)
        return self.decay_start + (self.decay - self.decay_start) * done

    def current_temperature(self) -> float | Tensor:
        """The assignment temperature of this optimiser step: 0 (nearest code) unless ``assignment=sampled``;
        then ``temperature``, falling linearly to 0 over the first ``temperature_anneal`` steps (a 0-d tensor
        from the step counter ``steps``)."""
        if self.assignment != "sampled":
            return 0.0
        if not self.temperature_anneal:
            return self.temperature
        return self.temperature * (1 - self.steps / self.temperature_anneal).clamp_min(0.0)

    def hard_fraction(self) -> float | Tensor:
        """``α`` of ``hard_warmup`` in this optimiser step: ``(steps - hard_warmup_delay) / hard_warmup`` clipped to
        [0, 1] (a 0-d tensor from the step counter, no host read); 1.0 (the code) without the warm-up."""
        if not self.hard_warmup:
            return 1.0
        return ((self.steps - self.hard_warmup_delay) / self.hard_warmup).clamp(0.0, 1.0)

    @torch.no_grad()
    def update(self, apply: Tensor | None = None) -> None:
        """Apply the statistics gathered since the last call: one optimiser step.

        Sums the pending counts over all ranks, updates the usage EMA, lets the rule apply its statistics
        (``ema``: the key sums and the codebook), then re-seeds dead codes. Identical on every rank.
        ``apply`` (a 0-d bool tensor): where False (a skipped step) every buffer keeps its value, decided on
        the device, with no host read.
        """
        before = (
            None if apply is None else {n: b.clone() for n, b in self.named_buffers() if "pending" not in n}
        )
        all_reduce_sum(self.pending_count)
        decay = self.current_decay()
        decay_into(self.ema_count, self.pending_count, decay)
        self.rule.apply(self, decay)
        if self.reseed_fraction > 0 and self.recent_keys is not None:
            self._reseed(dead_codes(self.pending_count, self.reseed_fraction), self.recent_keys)
        if self.counts_steps:
            self.steps += 1
        if before is not None:
            for name, buffer in self.named_buffers():
                if name in before:
                    buffer.copy_(torch.where(apply, buffer, before[name]))
        self.discard_pending()

    @torch.no_grad()
    def discard_pending(self) -> None:
        """Forget the statistics (and sampled keys) gathered since the last :meth:`update`."""
        self.pending_count.zero_()
        self.rule.discard(self)
        self.recent_keys = None

    def _reseed(self, dead: Tensor, keys: Tensor) -> None:
        """Re-seed the codes where ``dead (H, S)`` from ``keys (H, N, d)``, at the mean usage count."""
        dead = broadcast_from_rank0(dead.to(torch.uint8)).bool()  # no early return when none is: no host read
        fair = self.ema_count.mean(-1, keepdim=True).expand_as(self.ema_count)
        self.ema_count.copy_(torch.where(dead, fair, self.ema_count))
        self.rule.assign(self, dead, sample_rows(keys, self.codebook_size))


@_disable_dynamo  # torch.compiler.disable, which imports torch._dynamo at its first call, not at this import
def _weigh_in_backward(k_hat: Tensor, hook: functools.partial) -> None:
    """Register ``hook`` on ``k_hat``'s gradient, outside any compiled graph: Dynamo refuses a hook that updates
    the codebook's buffers inside the model's graph ("Unsafe side effect"), so a compiled step breaks its graph
    here, and only where ``fit_weight=fisher``. Importing ``torch._dynamo`` takes 2.5 s on this project's CPU: a
    command line refused before training (no Lightning, no compile) no longer waits for it."""
    k_hat.register_hook(hook)


def _read_initialized(module: nn.Module, incompatible: object) -> None:
    """After a state dict is loaded: the host's copy of ``initialized`` (a load runs outside the training step)."""
    module.initialized_on_host = bool(module.initialized)


def _rule(update: str, smoothing: float, count_floor: float) -> CodebookUpdate:
    """The update rule named ``update``."""
    if update == "ema":
        return EMAUpdate(smoothing, count_floor)
    return GradientUpdate() if update == "gradient" else AffineUpdate()
