"""Codebook health over every validation's keys, per VQ layer: usage perplexity, dead codes, and the regret
against a fresh k-means (:mod:`tvq_exp.quantize.health`), logged as ``codebook/layerN/val_*``; a console warning
when a layer's usage stays below S/8 for several validations in a row. ``eval.py`` uses it for its JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from tvq_exp.console import say
from tvq_exp.options import Between, PositiveInt, checked
from tvq_exp.quantize.health import (
    DEAD_SHARE,
    REGRET_ITERS,
    code_counts,
    codebook_regret,
    dead_fraction,
    usage_perplexity,
)
from tvq_exp.quantize.sync import all_reduce_sum

SAMPLE_KEYS = 8192  # keys per head kept for the regret's k-means
LOW_USAGE = 1 / 8  # a layer using fewer than S/8 codes (perplexity) is warned about
ADVICE = "docs/codebooks.md (codebook=healthy)"


class KeyTally:
    """One quantiser's keys over an evaluation: code counts ``(H, S)`` over every key, and a uniform sample
    (without replacement) of at most ``capacity`` key positions, the same positions for every head, in the
    order they arrived. Each position draws a priority from ``generator`` and the highest ``capacity``
    are kept (bottom-k sampling), so the sample does not depend on how the keys are batched.

    A forward hook :meth:`offer`s a batch's keys and codes, and :meth:`flush` adds what was offered: the hook runs
    inside a compiled block, where the sampling (a CPU generator's draws, a pool whose size changes with every
    batch) would break the block's graph, so it only keeps the tensors, and the callback adds them after the batch.

    Args:
        codebook: the quantiser's codebook ``(H, S, d)`` (its shape and device).
        capacity: the most key positions kept.
        generator: a CPU generator for the priorities.
    """

    def __init__(self, codebook: Tensor, capacity: int, generator: torch.Generator) -> None:
        h, s, d = codebook.shape
        self.capacity, self.generator = capacity, generator
        self.counts = torch.zeros(h, s, device=codebook.device)
        self.keys = torch.zeros(h, 0, d, device=codebook.device)
        self.priority = torch.zeros(0)
        self.pending: list[tuple[Tensor, Tensor]] = []

    def offer(self, keys: Tensor, codes: Tensor) -> None:
        """Keep ``keys (H, N, d)`` and ``codes (H, N)`` for :meth:`flush` (no work: traced whole inside a compiled
        graph, as a list append)."""
        self.pending.append((keys, codes))

    def flush(self) -> None:
        """:meth:`add` what was offered since the last flush, in order."""
        for keys, codes in self.pending:
            self.add(keys, codes)
        self.pending = []

    def add(self, keys: Tensor, codes: Tensor) -> None:
        """Count ``codes (H, N)`` and offer ``keys (H, N, d)`` (search space) to the sample."""
        self.counts = self.counts + code_counts(codes, self.counts.shape[1])
        priority = torch.cat([self.priority, torch.rand(keys.shape[1], generator=self.generator)])
        keep = priority.topk(min(self.capacity, priority.numel())).indices.sort().values  # in arrival order
        pool = torch.cat([self.keys, keys.detach().float()], dim=1)
        self.keys, self.priority = pool[:, keep.to(pool.device)], priority[keep]


def vq_layers(model: nn.Module) -> dict[str, nn.Module]:
    """``{"layerN": quantiser}`` for every block ``N`` of ``model`` (a Decoder) that has a vector quantiser
    (``layerN.j`` if a block has several); empty for other models."""
    quantizers = {id(q) for q in getattr(model, "quantizers", list)()}
    layers: dict[str, nn.Module] = {}
    for i, block in enumerate(getattr(model, "blocks", []) if quantizers else []):
        found = [m for m in block.modules() if id(m) in quantizers]
        for j, q in enumerate(found):
            layers[f"layer{i}" if len(found) == 1 else f"layer{i}.{j}"] = q
    return layers


def _observer(tally: KeyTally) -> Callable[..., None]:
    """A forward hook (with kwargs) feeding a quantiser's keys ``k: (B, H, T, d)`` and its codes
    ``(B, H, T)`` (the second output) to ``tally``."""

    def observe(quantizer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        k = quantizer.search_keys((args[0] if args else kwargs["k"]).detach())
        h, d = k.shape[1], k.shape[-1]
        tally.offer(k.transpose(0, 1).reshape(h, -1, d), output[1].detach().transpose(0, 1).reshape(h, -1))

    return observe


class CodebookHealth(Callback):
    """Per VQ layer, over the keys of each whole validation (and test): the usage perplexity (mean over
    heads), the fraction of dead codes (used under ``dead_share`` of their fair share N/S), the relative
    quantisation error, that of a fresh k-means on a sample of the keys, their ratio, the regret, and the
    k-means' usage perplexity on that sample (a reference for the codebook's; see :mod:`tvq_exp.quantize.health`).
    Logged as ``codebook/layerN/{val,test}_{perplexity,dead_fraction,quant_error,kmeans_error,regret,
    kmeans_perplexity}`` at the current step, kept in :attr:`results`. During ``fit``, one
    console warning when a layer's perplexity has been below S/8 for ``patience`` validations in a row
    (again only after it recovers and falls again). Does nothing for models without quantisers.

    Under DDP the counts are summed over ranks and the k-means runs over every rank's sample (every rank
    computes the same numbers); the keys are gathered by forward hooks on the quantisers, so any quantiser
    whose forward takes ``k: (B, H, T, d)`` and returns its codes second, with ``search_keys`` and
    ``codebook``, is measured.

    Args:
        patience: validations in a row below S/8 before the warning.
        dead_share: the fraction of its fair share under which a code is dead.
        sample_keys: key positions per layer sampled (uniformly over the validation) for the regret.
        kmeans_iters: Lloyd iterations of the reference k-means.
        seed: seed of the sampling and k-means++ generators (the same at every validation).
    """

    @checked
    def __init__(
        self,
        patience: PositiveInt = 3,
        dead_share: Annotated[float, Between(0, 1)] = DEAD_SHARE,
        sample_keys: PositiveInt = SAMPLE_KEYS,
        kmeans_iters: PositiveInt = REGRET_ITERS,
        seed: int = 0,
    ) -> None:
        self.patience, self.dead_share, self.sample_keys = patience, dead_share, sample_keys
        self.kmeans_iters, self.seed = kmeans_iters, seed
        self.results: dict[str, dict[str, float]] = {}
        self.streaks: dict[str, int] = {}
        self._layers: dict[str, nn.Module] = {}
        self._tallies: dict[str, KeyTally] = {}
        self._hooks: list[RemovableHandle] = []

    # ------------------------------------------------------------------------------------ Lightning hooks

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.start(getattr(pl_module, "model", pl_module))

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start(getattr(pl_module, "model", pl_module))

    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        idx: int,
        dl: int = 0,
    ) -> None:
        self._flush()

    on_test_batch_end = on_validation_batch_end  # the test loop's batches, likewise

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.finish(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.finish(trainer, pl_module, "test")

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.check_usage()  # after the validation's summary line

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._remove_hooks()

    def state_dict(self) -> dict[str, Any]:
        return {"streaks": dict(self.streaks)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.streaks = dict(state_dict.get("streaks", {}))

    # ------------------------------------------------------------------------------------ measuring

    def start(self, model: nn.Module) -> None:
        """Hook every quantiser of ``model``: from now on its keys are counted and sampled."""
        self._remove_hooks()
        self._layers = vq_layers(model)
        sampling = torch.Generator().manual_seed(self.seed)
        self._tallies = {
            name: KeyTally(q.codebook.detach(), self.sample_keys, sampling)
            for name, q in self._layers.items()
        }
        self._hooks = [
            q.register_forward_hook(_observer(self._tallies[name]), with_kwargs=True)
            for name, q in self._layers.items()
        ]

    def measure(self) -> dict[str, dict[str, float]]:
        """Unhook and compute every layer's health from what was gathered since :meth:`start` (collective
        under DDP: every rank calls it)."""
        self._remove_hooks()
        self._flush()
        results = {}
        for name, tally in self._tallies.items():
            counts = all_reduce_sum(tally.counts.clone())
            regret = codebook_regret(
                tally.keys,
                self._layers[name].codebook.detach(),
                self.kmeans_iters,
                torch.Generator().manual_seed(self.seed),
            )
            results[name] = {
                "perplexity": float(usage_perplexity(counts).mean()),
                "dead_fraction": float(dead_fraction(counts, self.dead_share).mean()),
                **regret._asdict(),
                "codebook_size": counts.shape[1],
            }
        self._tallies = {}
        return results

    def finish(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Measure and log to every logger."""
        if not self._tallies:
            return
        self.results = self.measure()
        metrics = {
            f"codebook/{name}/{stage}_{key}": value
            for name, result in self.results.items()
            for key, value in result.items()
            if key != "codebook_size"
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    def check_usage(self) -> None:
        """Count each layer's validations in a row below S/8; say so once when the count reaches ``patience``."""
        for name, result in self.results.items():
            size, usage = result["codebook_size"], result["perplexity"]
            low = usage < LOW_USAGE * size
            self.streaks[name] = self.streaks.get(name, 0) + 1 if low else 0
            if self.streaks[name] == self.patience:
                say(
                    f"warning: codebook {name} uses {usage:.1f} of {size} codes (< S/8) for {self.patience} "
                    f"validations in a row; see {ADVICE}"
                )

    def _flush(self) -> None:
        """Add every tally's offered keys (after each batch: the hooks only keep them)."""
        for tally in self._tallies.values():
            tally.flush()

    def _remove_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


__all__ = ["CodebookHealth", "KeyTally", "vq_layers"]
