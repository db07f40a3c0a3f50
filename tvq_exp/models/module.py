"""The LightningModule: losses, whole-split metrics, AdamW + warmup/cosine, clipping, carried state.

Over 300 lines: Lightning wants every hook (training, evaluation, optimiser step, checkpoints) on one
class, and they share its carried state and step counters; the arithmetic they call is already in
``decoder.py``, ``metrics.py``, ``optim.py`` and ``legacy.py``.

Batches and what the data module offers follow the data contract (:mod:`tvq_exp.batch`).
Losses are in nats per target; bits per byte (or per dim for images) = nats / ln 2.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim import AdamW, Optimizer
from torch.optim.lr_scheduler import LambdaLR

from tvq_exp.batch import IGNORE_INDEX, DataContract
from tvq_exp.models.decoder import Decoder, ModelState, detach_state, moved_state
from tvq_exp.models.interval_sums import IntervalSums
from tvq_exp.models.legacy import FORMAT, legacy_guard_counts, upgrade_checkpoint, upgrade_train_state
from tvq_exp.models.metrics import BucketAccuracy, PositionBits
from tvq_exp.models.optim import all_finite, full_tensor, parameter_groups, warmup_cosine
from tvq_exp.options import (
    Between,
    NonNegativeFloat,
    NonNegativeInt,
    OneOf,
    OptionError,
    PositiveFloat,
    PositiveInt,
    checked,
)
from tvq_exp.quantize.sync import all_reduce_sum

EVAL_STAGES = ("val", "test")
# torch.compile's modes (``module.compile_mode``); those that replay CUDA graphs
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def logging_step(trainer: L.Trainer, step: int) -> bool:
    """Whether the optimiser step that ends at ``step`` (``global_step`` after it) is one where values are logged,
    as Lightning's logger connector decides (every ``log_every_n_steps``): the only steps that read the device."""
    return step % max(1, trainer.log_every_n_steps) == 0


def _each_update(quantizers: Sequence[nn.Module], updates: Mapping[type, Any], apply: Tensor) -> None:
    """Every quantiser's codebook update through the compiled ``updates`` of its class (``compile_scope=blocks``)."""
    for q in quantizers:
        updates[type(q)](q, apply)


def finite_state(state: ModelState | None) -> ModelState | None:
    """The carried state with every non-finite float replaced by 0 (after a skipped step it may hold NaN: on the
    device, without a host read, it is cleaned rather than dropped)."""
    if state is None:
        return None
    clean = lambda x: torch.nan_to_num(x, 0.0, 0.0, 0.0) if x.is_floating_point() else x  # noqa: E731
    return [s.map(clean) for s in state]


def copy_state(state: ModelState | None) -> ModelState | None:
    """The carried state detached, every tensor copied (out of a CUDA graph's memory, which its next replay
    reuses)."""
    return None if state is None else [s.map(lambda t: t.detach().clone()) for s in state]


def state_on(state: ModelState, device: torch.device) -> ModelState:
    """``state`` on ``device``: itself where its tensors are there already (in training and evaluation: the last
    step made it there), else a copy with each tensor moved (a state restored from a checkpoint). Not moved every
    step: Lightning's ``move_data_to_device`` copies each block's dataclass, host time in every step."""
    first = next((t for s in state for t in s.tensors()), None)
    if first is None or first.device == device:
        return state
    return [s.map(lambda t: t.to(device)) for s in state]


class AutoregressiveLitModule(L.LightningModule):
    """Next-token training and evaluation of a :class:`~tvq_exp.models.decoder.Decoder`, for text (bytes) and
    images (sub-pixels).

    Args:
        model: the decoder.
        lr, betas, eps: AdamW settings (paper: betas (0.9, 0.98), eps 1e-9).
        weight_decay: decoupled weight decay of the decayed group (never codebooks).
        weight_decay_mode: ``adamw``: torch's AdamW, ``p ← p·(1 - lr·s(t)·wd)`` on weight matrices only (no
            decay on norms, biases, embeddings); ``official``: the official code's ``p ← p - lr·s(t)·update -
            wd·p`` (not scaled by the learning rate or its schedule) on every tensor that is not a vector
            (weight matrices, embeddings, scalars).
        warmup_steps, max_steps, min_lr_ratio: linear warmup then cosine decay to ``min_lr_ratio * lr``.
        grad_clip: max global gradient norm over every parameter except codebooks (0 = off).
        kind: ``"text"``, ``"image"`` (also logs ``bpd``) or ``"synthetic"`` (the probes: accuracy too).
        position_bucket_len: ``u``, the unit of the log-spaced position buckets of the evaluation metrics
            (``[0, u), [u, 2u), [2u, 4u), ...`` tokens since the last state reset).
        compile: ``torch.compile`` the training step's forward and loss (:meth:`training_loss`) and the codebook
            update (``torch._dynamo``: one graph each, no graph break; a carried state's new position or shape
            compiles once more, and the step hands the state over at the model's equivalent position
            (:meth:`step_loss`), so a VQ model's TBPTT compiles twice: its first segment, then every later one, of
            equal length). Validation runs eager.
        compile_scope: what ``compile`` compiles: ``step`` (the whole step, as above) or ``blocks`` (regional
            compilation: each block's forward, with its backward; the blocks share one code, so the compiler's
            work is one block's however deep the model, where a whole 48-layer step takes minutes per TBPTT
            position; the embedding, head and loss run eager around them), and each quantiser's codebook update
            (one code, which every quantiser runs). The compiled blocks run in validation too, which hands its
            carried state over at the equivalent position as well (:meth:`equivalent`).
        compile_mode: ``torch.compile``'s mode for the forward and backward ``compile`` compiles (the codebook
            update, which changes buffers in place, keeps the default): ``default``; ``reduce-overhead``: CUDA
            graphs (inductor's CUDA graph trees: each compiled graph's kernels replayed in one launch, against a
            step the host's launches bound: the paper step on an H200 launched 7,100 kernels a step and kept the
            device busy two thirds of it); ``max-autotune`` (autotuned kernels, with CUDA graphs) or
            ``max-autotune-no-cudagraphs``. A replay overwrites its outputs, so with CUDA graphs every carried
            state is copied out of them and each training step marks its start
            (``torch.compiler.cudagraph_mark_step_begin``). On CPU inductor makes no CUDA graphs: the modes differ
            only in autotuning.
        run_config: the resolved run configuration, stored in checkpoints so ``eval``/``sample`` can rebuild
            the model.

    The defaults are the bare optimiser (no weight decay, warmup or clipping); ``conf/train.yaml`` adds the
    platform's training recipe on purpose (``weight_decay 0.01``, ``warmup_steps 1000``, ``grad_clip 1.0``).

    The model's state is carried (detached) from one batch to the next and dropped where a batch says
    ``reset`` (all rows reset together): random windows reset every batch, TBPTT at every sequence,
    streams every ``reset_every`` tokens, evaluation per its protocol (see the data module).

    Logged: ``train/{loss,bpb,aux_loss,grad_norm}``, ``lr/lr``, ``{val,test}/{loss,bpb[,bpd]}`` over the
    whole split (token-weighted, DDP-reduced) and ``{val,test}/bpb_pos/<start>-<end>`` per position bucket,
    ``codebook/layerN/*`` averaged over each logging interval.
    """

    @checked
    def __init__(
        self,
        model: Decoder,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 0.0,
        weight_decay_mode: Annotated[str, OneOf("adamw", "official")] = "adamw",
        betas: Sequence[float] = (0.9, 0.98),
        eps: PositiveFloat = 1e-9,
        warmup_steps: NonNegativeInt = 0,
        max_steps: PositiveInt = 1,
        min_lr_ratio: Annotated[float, Between(0, 1)] = 0.1,
        grad_clip: NonNegativeFloat = 0.0,
        kind: Annotated[str, OneOf("text", "image", "synthetic")] = "text",
        position_bucket_len: PositiveInt = 128,
        compile: bool = False,
        compile_scope: Annotated[str, OneOf("step", "blocks")] = "step",
        compile_mode: Annotated[str, OneOf(*COMPILE_MODES)] = "default",
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise OptionError("betas", list(betas), "must be two numbers in [0, 1)", type(self))
        self.save_hyperparameters(ignore=["model"])
        self.model = model
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, tuple(betas), eps
        self.weight_decay_mode = weight_decay_mode
        # a partial keeps no state in the scheduler's state_dict: a resumed run follows its own max_steps
        self.schedule = functools.partial(
            warmup_cosine, warmup_steps=warmup_steps, max_steps=max_steps, min_ratio=min_lr_ratio
        )
        self.grad_clip = grad_clip
        self.kind = kind
        self.compile, self.compile_scope, self.compile_mode = compile, compile_scope, compile_mode
        self._training_loss: Any = None  # compiled by compile_step (None: eager)
        self._codebook_step: Any = None
        self.train_state: ModelState | None = None
        self.eval_state: ModelState | None = None
        self.eval_bits = nn.ModuleDict({stage: PositionBits(position_bucket_len) for stage in EVAL_STAGES})
        self.eval_accuracy = (
            nn.ModuleDict()
        )  # per stage, for data with answer buckets (made at the stage's start)
        self.bucket_names: dict[str, list[str]] = {}
        self.answer_buckets = False  # the data's batches carry answer buckets (set from the data contract)
        self.eval_results: dict[str, dict[str, Any]] = {}
        self._codebook_sums = IntervalSums()  # the logging interval's codebook metrics, on the device
        self._resets: bool | None = None  # the next batch's reset flag, read on the host before its transfer
        # skipped steps (total, in a row), counted on the device: read only when the numerics guard reports
        self.bad_steps = torch.zeros(2, dtype=torch.long)

    # ------------------------------------------------------------------------------------ forward / loss

    def configure_model(self) -> None:
        """Under ``trainer=fsdp`` the strategy shards the decoder per block (its ``parallelize``); under
        every other strategy there is nothing to do."""
        parallelize = getattr(self._trainer.strategy, "parallelize", None) if self._trainer else None
        if parallelize is not None:
            self.model = parallelize(self.model)

    def forward(self, tokens: Tensor, state: ModelState | None = None) -> Any:
        """``tokens (B, T)`` -> :class:`~tvq_exp.models.decoder.DecoderOutput`."""
        return self.model(tokens, state)

    def _step(self, batch: Mapping[str, Tensor], state: ModelState | None) -> tuple[Tensor, Any]:
        """Run the model on a batch; returns ``(nats per target (B, T), zero where ignored, output)``."""
        out = self.model(batch["input"], state)
        logits = out.logits.float()
        nats = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            batch["target"].reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="none",
        )
        return nats.view_as(batch["target"]), out

    def training_loss(self, tokens: Tensor, target: Tensor, state: ModelState | None) -> tuple[Tensor, Any]:
        """The training step's forward and loss: ``tokens, target (B, T)`` -> ``(mean nats over the targets,
        the model's output)`` (what :meth:`compile_step` compiles)."""
        nats, out = self._step({"input": tokens, "target": target}, state)
        return nats.sum() / (target != IGNORE_INDEX).sum().clamp_min(1), out

    def compile_step(self, backend: str = "inductor", fullgraph: bool = False) -> None:
        """Compile :meth:`training_loss` and the model's codebook update with ``torch.compile`` (``backend``;
        ``fullgraph=True`` raises at a graph break instead of splitting the graph: the tests use it); with
        ``compile_scope="blocks"`` each block instead (in place: ``nn.Module.compile``) and each quantiser's update
        (one compiled :meth:`~tvq_exp.quantize.VectorQuantizer.update` per quantiser class, run by all of them: a
        deep model's updates are a few kernels each, not a few dozen eager ops). The forward and backward take
        :attr:`compile_mode`."""
        mode = {} if self.compile_mode == "default" else {"mode": self.compile_mode}
        # a carried position is a constant of the compiled code where the model's positions repeat (their
        # equivalent positions); where they do not (RoPE, absolute embeddings, an OVQ dictionary that never fills), it
        # would compile once per position up to dynamo's recompile limit and then run eagerly: there its ints become
        # symbolic from their second value (automatic dynamic)
        dynamic = False if self.model.positions_repeat() else None
        if self.compile_scope == "blocks":
            for block in self.model.blocks:
                block.compile(backend=backend, fullgraph=fullgraph, dynamic=dynamic, **mode)
            self._training_loss = self.training_loss
            updates = {
                type(q): torch.compile(type(q).update, backend=backend, fullgraph=fullgraph, dynamic=False)
                for q in self.model.quantizers()
            }
            self._codebook_step = functools.partial(_each_update, self.model.quantizers(), updates)
            return
        self._training_loss = torch.compile(
            self.training_loss, backend=backend, fullgraph=fullgraph, dynamic=dynamic, **mode
        )
        self._codebook_step = torch.compile(
            self.model.codebook_step, backend=backend, fullgraph=fullgraph, dynamic=False
        )

    def cuda_graphs(self) -> bool:
        """Whether the compiled step replays CUDA graphs (:attr:`compile_mode`; on a CUDA device)."""
        return self.compile and self.compile_mode in CUDA_GRAPH_MODES

    def start_step(self) -> None:
        """A training step begins: with CUDA graphs, the last step's graph outputs are dead from here (their memory
        is the next replay's)."""
        if self.cuda_graphs():
            torch.compiler.cudagraph_mark_step_begin()

    def carried(self, state: ModelState | None) -> ModelState | None:
        """The state a step's output hands to the next batch: detached; with CUDA graphs also copied out of the
        graphs' memory, which the next replay overwrites while it reads the state."""
        return copy_state(state) if self.cuda_graphs() else detach_state(state)

    def equivalent(self, state: ModelState | None) -> tuple[ModelState | None, int]:
        """``state`` moved to the model's :meth:`~tvq_exp.models.decoder.Decoder.equivalent_position`, and how far
        it moved: the amount that moves the output's state back to where it is. Compiled code guards on the carried
        position, so the training and evaluation steps hand the state over there (outside compiled code): one
        compile for all of a sequence's segments after the first."""
        shift = 0 if state is None else state[0].position - self.model.equivalent_position(state[0].position)
        return moved_state(state, -shift), shift

    def step_loss(self, tokens: Tensor, target: Tensor, state: ModelState | None) -> tuple[Tensor, Any]:
        """:meth:`training_loss`, compiled after :meth:`compile_step`, of ``state`` at its :meth:`equivalent`
        position and its output's state moved back."""
        state, shift = self.equivalent(state)
        loss, out = (self._training_loss or self.training_loss)(tokens, target, state)
        out.state = moved_state(out.state, shift)
        return loss, out

    def codebook_update(self, apply: Tensor) -> None:
        """The model's codebook update (``apply``: the step's finiteness verdict), compiled after
        :meth:`compile_step`."""
        (self._codebook_step or self.model.codebook_step)(apply)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Read the batch's ``reset`` flags while they are still on the host (after the transfer, reading them
        would wait for the device)."""
        if isinstance(batch, Mapping) and "reset" in batch:
            self._resets = bool(batch["reset"].any())
        return batch

    def _continue(self, state: ModelState | None, batch: Mapping[str, Tensor]) -> ModelState | None:
        """The carried state (on the batch's device) unless the batch resets it (all rows reset together; a
        batch without ``reset`` starts fresh). The flag comes from :meth:`on_before_batch_transfer` where it ran
        (a batch handed over directly is read here)."""
        resets, self._resets = self._resets, None
        if state is None or "reset" not in batch:
            return None
        if resets if resets is not None else bool(batch["reset"].any()):
            return None
        return state_on(state, batch["input"].device)

    def training_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        if self.compile and self._training_loss is None:
            self.compile_step()
        self.start_step()
        loss, out = self.step_loss(batch["input"], batch["target"], self._continue(self.train_state, batch))
        self.train_state = self.carried(out.state)
        if self.answer_buckets:  # a probe: accuracy at its answer positions
            answer = batch["target"] != IGNORE_INDEX
            right = (out.logits.argmax(-1) == batch["target"]) & answer
            self.log("train/acc", right.sum() / answer.sum().clamp_min(1))
        aux_loss = out.aux["loss"]
        self._accumulate_codebook_metrics(out.aux)
        bits = loss.detach() / math.log(2)
        # device tensors, read by Lightning only at its logging steps (a progress-bar value would be read at every
        # step: QuietProgressBar shows train/loss at the logging steps instead)
        self.log("train/loss", loss.detach())
        self.log("train/bpb", bits)
        if self.kind == "image":
            self.log("train/bpd", bits)
        self.log("train/aux_loss", aux_loss.detach())
        if logging_step(self.trainer, self.global_step + 1):  # a number logged makes a host-to-device copy
            self.log("lr/lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss + aux_loss

    # ------------------------------------------------------------------------------------ evaluation

    def eval_stage(self) -> str:
        """``test`` in the test loop, else ``val`` (validation, sanity check): the two loops run the same hooks
        and differ only in the names of their metrics."""
        return "test" if self.trainer.testing else "val"

    def validation_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> None:
        stage = self.eval_stage()
        # at its equivalent position: with compile_scope=blocks the blocks run compiled here too
        state, shift = self.equivalent(self._continue(self.eval_state, batch))
        nats, out = self._step(batch, state)
        self.eval_state = self.carried(moved_state(out.state, shift))
        target = batch["target"]
        start = batch.get("position", torch.zeros(target.shape[0], dtype=torch.long, device=target.device))
        positions = start[:, None] + torch.arange(target.shape[1], device=target.device)
        self.eval_bits[stage].update(nats, target != IGNORE_INDEX, positions)
        if stage in self.eval_accuracy:
            self.eval_accuracy[stage].update(out.logits.argmax(-1), target, batch["bucket"], nats)

    def data(self) -> DataContract | None:
        """The attached trainer's data module (:class:`~tvq_exp.batch.DataContract`), if any."""
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    def setup(self, stage: str) -> None:
        data = self.data()
        self.answer_buckets = data is not None and bool(data.bucket_names("train"))

    def on_validation_epoch_start(self) -> None:
        """A fresh state, and accuracy counters when the data has answer buckets (the probes)."""
        stage = self.eval_stage()
        self.eval_state = None
        data = self.data()
        names = data.bucket_names("validation" if stage == "val" else stage) if data is not None else []
        if names:
            self.bucket_names[stage] = names
            self.eval_accuracy[stage] = BucketAccuracy(len(names)).to(self.device)

    def on_validation_epoch_end(self) -> None:
        stage = self.eval_stage()
        result = self.eval_bits[stage].compute()
        self.eval_bits[stage].reset()
        self.eval_state = None
        loss = torch.tensor(result["loss"], dtype=torch.float32)
        bits = loss / math.log(2)
        metrics = {f"{stage}/loss": loss, f"{stage}/bpb": bits}
        if self.kind == "image":
            metrics[f"{stage}/bpd"] = bits
        # callback metrics (checkpointing, progress bar) through Lightning (the sums are already global:
        # sync_dist averages identical values); the loggers get the values at the optimiser step they
        # belong to (Lightning would use the step before)
        by_position = {f"{stage}/bpb_pos/{b['start']}-{b['end']}": b["bpb"] for b in result["buckets"]}
        accuracy = self._accuracy(stage)
        if accuracy is not None:
            metrics |= {
                f"{stage}/acc": torch.tensor(accuracy["accuracy"]),
                f"{stage}/acc_seq": torch.tensor(accuracy["sequence_accuracy"]),
            }
            by_position |= {
                f"{stage}/{metric}_bucket/{b['name']}": b[key]
                for b in accuracy["buckets"] if b["count"]
                for metric, key in (("acc", "accuracy"), ("bpb", "bpb"))
            }  # fmt: skip
        # Lightning all-reduces what it is given: on the module's device (NCCL reduces device tensors only)
        on_device = {k: v.to(self.device) for k, v in metrics.items()}
        self.log_dict(on_device, prog_bar=stage == "val", logger=False, sync_dist=True)
        for logger in self.loggers:
            logger.log_metrics(
                {**{k: float(v) for k, v in metrics.items()}, **by_position}, step=self.global_step
            )
        self.eval_results[stage] = {
            **{k.split("/")[1]: float(v) for k, v in metrics.items()},
            "tokens": result["tokens"],
            "position_buckets": result["buckets"],
            **({"accuracy": accuracy} if accuracy is not None else {}),
        }

    def _accuracy(self, stage: str) -> dict[str, Any] | None:
        """The stage's accuracy (overall, per sequence, per named bucket) and reset counters; ``None`` without
        answer buckets."""
        if stage not in self.eval_accuracy:
            return None
        result = self.eval_accuracy[stage].compute()
        self.eval_accuracy[stage].reset()
        per_bucket = [  # torchmetrics squeezes one-element results to 0-d: one bucket is still a list
            result[key].reshape(-1).tolist()
            for key in ("bucket_accuracy", "bucket_sequence_accuracy", "bucket_count", "bucket_bpb")
        ]
        buckets = [
            {"name": name, "accuracy": acc, "sequence_accuracy": seq, "count": int(count), "bpb": bpb}
            for name, acc, seq, count, bpb in zip(self.bucket_names[stage], *per_bucket, strict=True)
        ]
        return {
            "accuracy": float(result["accuracy"]),
            "sequence_accuracy": float(result["sequence_accuracy"]),
            "buckets": buckets,
        }

    # the test loop runs the validation hooks (eval_stage names its metrics)
    on_test_epoch_start = on_validation_epoch_start
    test_step = validation_step
    on_test_epoch_end = on_validation_epoch_end

    # ------------------------------------------------------------------------------------ optimisation

    def codebook_parameter_ids(self) -> set[int]:
        """``id`` of every codebook parameter (``gradient`` strategy): no decay, no clipping."""
        return {id(p) for q in self.model.quantizers() for p in q.parameters()}

    def parameter_groups(self) -> list[dict[str, Any]]:
        """AdamW groups (see :func:`~tvq_exp.models.optim.parameter_groups`)."""
        return parameter_groups(
            self.model, self.weight_decay, self.weight_decay_mode, self.codebook_parameter_ids()
        )

    def configure_optimizers(self) -> dict[str, Any]:
        """Fused AdamW: its step state stays on the device, and it skips a step the device marks ``found_inf``
        (:meth:`optimizer_step`) without the host reading anything."""
        optimizer = AdamW(self.parameter_groups(), lr=self.lr, betas=self.betas, eps=self.eps, fused=True)
        scheduler = LambdaLR(optimizer, self.schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the global norm of every gradient except the codebook's to ``grad_clip``; log the norm."""
        skip = self.codebook_parameter_ids()
        params = [p for p in self.model.parameters() if p.grad is not None and id(p) not in skip]
        if not params:
            return
        max_norm = self.grad_clip if self.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        self.log("train/grad_norm", full_tensor(norm))

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        """One optimiser step, then the codebook update (exactly once per step, also with accumulation).

        Forward and backward run first; a step whose loss or gradients are not finite (on any rank) changes
        nothing: the fused optimiser skips it (``found_inf``), the codebook update keeps every buffer, the
        weight decay multiplies by 1, the carried state's non-finite values become 0 and the step's codebook
        metrics are dropped. All of it is decided on the device, so the step never waits for it; the step is
        counted in :attr:`bad_steps` (total, in a row), which the NumericsGuard callback reads when it reports.
        """
        loss = optimizer_closure()
        finite = all_reduce_sum((~all_finite(loss, self.model.parameters())).long()) == 0  # on every rank
        self.bad_steps = self.bad_steps.to(finite.device)
        bad = (~finite).long()
        self.bad_steps = torch.stack([self.bad_steps[0] + bad, (self.bad_steps[1] + 1) * bad])
        if self.weight_decay_mode == "official" and self.weight_decay > 0:
            with torch.no_grad():  # p ← p - wd·p, then AdamW (no decay of its own) adds -lr·s(t)·update
                keep = torch.where(finite, 1.0 - self.weight_decay, 1.0)
                torch._foreach_mul_(optimizer.param_groups[0]["params"], keep)
        # read by the fused AdamW kernel (set on torch's optimizer, not on Lightning's wrapper of it)
        getattr(optimizer, "optimizer", optimizer).found_inf = bad.float()
        super().optimizer_step(epoch, batch_idx, optimizer, lambda: loss)
        self.codebook_update(finite)
        self.train_state = finite_state(self.train_state)
        # a bad step drops the interval's codebook metrics so far (as if none had been gathered)
        self._codebook_sums.keep_if(finite)
        if logging_step(
            self.trainer, self.global_step + 1
        ):  # global_step counts this step only after the hook
            self._log_codebook_metrics(self.global_step + 1)

    def bad_step_counts(self) -> tuple[int, int]:
        """Skipped steps so far and in a row up to the latest step (reads the device: call it when reporting)."""
        skipped, consecutive = self.bad_steps.tolist()
        return int(skipped), int(consecutive)

    # ------------------------------------------------------------------------------------ codebook metrics

    def _accumulate_codebook_metrics(self, aux: Mapping[str, Tensor]) -> None:
        """Add the batch's metrics to the interval's sums (on the device: nothing is read here)."""
        self._codebook_sums.add({name: value for name, value in aux.items() if name != "loss"})

    def _log_codebook_metrics(self, step: int) -> None:
        """Log the interval's mean of each metric at ``step`` (one read of the device) and start a new interval."""
        means = self._codebook_sums.means()
        if not means:
            return
        metrics = {f"codebook/{name}": mean for name, mean in means.items()}
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    # ------------------------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # what was logged before the checkpoint is in the log files before it is written (a kill -9 after it
        # loses none): TensorBoard writes its events from a thread, and Lightning waits for it (``save()``) only
        # after its own ``self.log`` values, not after a callback's direct writes (samples, codebook health)
        for logger in self.loggers:
            logger.save()
        checkpoint["tvq_format"] = FORMAT
        checkpoint["train_state"] = (
            None if self.train_state is None else [s.to_plain() for s in self.train_state]
        )
        checkpoint["codebook_metrics"] = (self._codebook_sums.sums(), self._codebook_sums.batches)
        skipped, consecutive = self.bad_step_counts()
        checkpoint["bad_steps"] = {"skipped": skipped, "consecutive": consecutive}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        upgrade_checkpoint(checkpoint, self)  # weights written before the official parametrisation
        for optimizer in checkpoint.get("optimizer_states", []):  # written before AdamW was fused: fused now
            for group in optimizer.get("param_groups", []):
                group["fused"], group["foreach"] = True, None
        saved = checkpoint.get("train_state") if checkpoint.get("tvq_format") == FORMAT else None
        self.train_state = upgrade_train_state(
            saved
        )  # typed, also when written as dicts before the states were
        self._codebook_sums.load(*checkpoint.get("codebook_metrics", ({}, 0)))
        bad = checkpoint.get("bad_steps") or legacy_guard_counts(checkpoint)
        self.bad_steps = torch.tensor([int(bad["skipped"]), int(bad["consecutive"])])
