"""The options of the commands themselves, as annotated signatures: the top level of ``train.py`` (seed, threads,
resume, ...), Lightning's ``trainer``, ``eval.py`` and ``sample.py``.

The model, data and module nodes are checked against their constructors' signatures
(:mod:`tvq_exp.run.validation`); the options below have no constructor of ours, so these functions are their
signatures: same :mod:`tvq_exp.options` annotations, same checks (types, unknown keys, ranges), same one-line
:class:`~tvq_exp.run.validation.ConfigError`. They are never called.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from tvq_exp.options import (
    AtLeast,
    AtLeastOr,
    Between,
    NewFile,
    NonNegativeFloat,
    NonNegativeInt,
    OneOf,
    PlainName,
    PositiveFloat,
    PositiveInt,
)

ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
# Lightning's precision names (``lightning.fabric.connector._PRECISION_INPUT_STR``, held equal by
# tests/run/test_validation.py), written out so that validating a config never imports Lightning
LIGHTNING_PRECISIONS = (
    "transformer-engine", "transformer-engine-float16", "16-true", "16-mixed", "bf16-true", "bf16-mixed",
    "32-true", "64-true",
)  # fmt: skip
PRECISIONS = (*LIGHTNING_PRECISIONS, "bf16", 16, 32, 64)
RESUME = ("auto",)
MAX_SAMPLE_BYTES = 10_000_000  # sample.py decodes byte by byte: 10 MB is hours on a CPU; more is a typo


def train_options(
    task_name: str = "train",
    seed: NonNegativeInt = 1234,
    ckpt_path: str | None = None,
    resume: Annotated[str, OneOf(*RESUME)] | None = None,
    run_name: Annotated[str, PlainName()] | None = None,
    init_from: str | None = None,
    allow_data_change: bool = False,
    init_batches: PositiveInt = 8,
    torch_threads: PositiveInt | None = None,
    block_len: PositiveInt | None = None,
    codebook_size: Annotated[int, AtLeast(2)] | None = None,
    global_batch_size: PositiveInt | None = None,
    optimized_metric: str | None = None,
    tags: list[str] | None = None,
    print_config: bool = True,
) -> None:
    """The top-level keys of ``train.yaml`` (the nodes ``model``, ``data``, ``module``, ... are checked apart)."""


def trainer_options(
    accelerator: Annotated[str, OneOf(*ACCELERATORS)] = "auto",
    num_nodes: PositiveInt = 1,
    devices: Annotated[Any, AtLeastOr(1, -1, "every device")] = "auto",  # or "auto", "0,1", [0, 1]
    precision: Annotated[Any, OneOf(*PRECISIONS)] = "32-true",
    max_steps: Annotated[int, AtLeast(-1)] = -1,
    max_epochs: Annotated[int, AtLeastOr(1, -1)] | None = None,  # 0 would train nothing and exit 0
    val_check_interval: PositiveFloat | None = None,
    check_val_every_n_epoch: PositiveInt | None = None,
    limit_val_batches: PositiveFloat | None = None,
    limit_train_batches: PositiveFloat | None = None,
    log_every_n_steps: PositiveInt = 50,
    accumulate_grad_batches: PositiveInt = 1,
    num_sanity_val_steps: Annotated[int, AtLeast(-1)] = 0,
    enable_model_summary: bool = False,
    enable_progress_bar: bool = True,
    benchmark: bool = False,
) -> None:
    """The ``trainer`` keys whose values tvq_exp checks (any other ``lightning.pytorch.Trainer`` argument is
    accepted by name and left to Lightning)."""


FP16 = (16, "16", "16-mixed", "16-true")
# trainer arguments tvq_exp does its own way: setting them would be ignored or overridden without a word
NOT_OURS = {
    "gradient_clip_val": "tvq_exp clips gradients itself, after its non-finite check: set module.grad_clip instead",
    "gradient_clip_algorithm": "tvq_exp clips by the global norm: set module.grad_clip instead",
}


CONFLICT_KEYS = (*NOT_OURS, "precision", "accelerator")  # what trainer_conflicts reads


def trainer_conflicts(trainer: Mapping[str, Any], cuda: bool) -> tuple[str, Any, str] | None:
    """Cross-field rules of ``trainer`` (kept apart from the signatures above, which are single-option rules):
    ``(key, value, what is allowed)`` of the first option Lightning would silently ignore or change, else
    ``None``. ``cuda``: whether a GPU is available (``accelerator=auto`` then means one)."""
    for name, why in NOT_OURS.items():
        if trainer.get(name) not in (None, 0, 0.0):
            return f"trainer.{name}", trainer[name], why
    accelerator = trainer.get("accelerator", "auto")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not cuda)
    if trainer.get("precision") in FP16 and on_cpu:
        return (
            "trainer.precision", trainer["precision"],
            "fp16 needs a GPU (on CPU Lightning would switch to bf16): use bf16-mixed or 32-true",
        )  # fmt: skip
    return None


def guard_options(max_bad_steps: PositiveInt = 10) -> None:
    """``guard``: non-finite steps in a row that stop the run (docs/reliability.md)."""


def eval_options(
    ckpt_path: str,
    split: Annotated[str, OneOf("val", "test")] = "val",
    protocol: Annotated[str, OneOf("segment", "sequence", "split")] | None = None,
    sequence_len: PositiveInt | None = None,
    seq_len: PositiveInt | None = None,
    carry_state: bool = False,
    output: Annotated[str, NewFile()] | None = None,
    data_root: str | None = None,
    allow_data_change: bool = False,
    eval_batch_size: PositiveInt | None = None,
    limit_batches: PositiveInt | None = None,
    accelerator: Annotated[str, OneOf(*ACCELERATORS)] = "auto",
    precision: Annotated[Any, OneOf(*PRECISIONS)] | None = None,
    progress_bar: bool = True,
    torch_threads: PositiveInt | None = None,
) -> None:
    """``eval.py``'s options (``conf/eval.yaml``; ``model_options`` is merged into the run's model config)."""


def sample_options(
    ckpt_path: str,
    prompt: str = "The ",
    num_bytes: Annotated[int, Between(0, MAX_SAMPLE_BYTES)] = 256,
    num_samples: PositiveInt = 1,
    temperature: NonNegativeFloat = 1.0,
    top_k: PositiveInt | None = None,
    top_p: Annotated[float, Between(0, 1, "(]")] | None = None,
    seed: NonNegativeInt = 0,
    device: str = "auto",
    output: Annotated[str, NewFile()] | None = None,
    image_nrow: PositiveInt | None = None,
    image_scale: PositiveInt = 4,
    torch_threads: PositiveInt | None = None,
) -> None:
    """``sample.py``'s options (``conf/sample.yaml``)."""
