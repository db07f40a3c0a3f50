"""The benchmark worker: one configuration measured in a fresh process (attention call, model training step,
or the ``torch.mm`` reference)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tvq_exp.attention.base import with_position_bias
from tvq_exp.attention.flex_runtime import flex_module
from tvq_exp.attention.registry import BACKENDS, build_attention
from tvq_exp.measure.memory import PeakMemory, limit_address_space
from tvq_exp.measure.timing import time_calls

CONF_DIR = Path(__file__).resolve().parents[3] / "conf"
SCHEDULE_STEPS = 100_000  # module.max_steps of the composed model (conf/trainer/default.yaml's max_steps)


def _autocast(device: torch.device, dtype: str) -> torch.autocast:
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")


# benchmark names of a backend with a given kernel (every kernel but ``plain`` its class declares): ``dense_flex``
# is dense attention through flex attention, ``vq_flex`` Transformer-VQ's window + cache step through it
KERNEL_VARIANTS = {
    f"{name}_{kernel}": (name, kernel)
    for name, backend in BACKENDS.items()
    for kernel in backend.kernels
    if kernel != "plain"
}
# the same for model presets: ``gau_dense_flex`` is ``conf/model/gau_dense.yaml`` with ``attention.kernel=flex``
MODEL_VARIANTS = {
    f"{model}_{kernel}": (model, kernel)
    for model in ("gau_dense", "mha_dense", "gau_vq")
    for kernel in ("flex", "auto")
}


def attention_options(backend: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``build_attention`` options of ``backend`` (a :data:`KERNEL_VARIANTS` name included) for the benchmark
    settings, as its class's capabilities say: a codebook of ``codebook_size`` over blocks of ``block_len``, an
    XL bias window of ``block_len``."""
    name, kernel = KERNEL_VARIANTS.get(backend, (backend, None))
    cls = BACKENDS[name]
    opts: dict[str, Any] = {"d_k": settings["d_k"], "d_v": settings["d_v"], "heads": settings["heads"]}
    if kernel is not None:
        opts["kernel"] = kernel
    if cls.has_codebook:
        opts.update(codebook_size=settings["codebook_size"], block_len=settings["block_len"])
    if cls.supports_position_bias:
        opts["window_len"] = settings["block_len"]
    return opts


def attention_case(spec: dict[str, Any], device: torch.device) -> tuple[Callable[[], None], int | None]:
    """The timed call of one attention configuration and its FLOPs (the backend's ``flops()``)."""
    s, t = spec["settings"], spec["seq_len"]
    dtype = torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    opts = attention_options(spec["backend"], s)
    attn = build_attention(KERNEL_VARIANTS.get(spec["backend"], (spec["backend"],))[0], **opts)
    if spec["window_bias"] and attn.supports_position_bias:
        with_position_bias(attn)  # as a block with position=xl builds it
    attn = attn.to(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    b, h, dk, dv = s["batch"], s["heads"], s["d_k"], s["d_v"]
    # GAU scaling: unit-RMS rows times d_k^-1/4, as the blocks feed the backends
    q, k = (torch.randn(b, h, t, dk, generator=gen) * dk**-0.25 for _ in range(2))
    v = torch.randn(b, h, t, dv, generator=gen)
    train = spec["mode"] == "fwdbwd"
    q, k, v = (x.to(device, dtype).requires_grad_(train) for x in (q, k, v))
    grad_out = torch.randn(b, h, t, dv, generator=gen).to(device, dtype) if train else None

    def call() -> None:
        with torch.set_grad_enabled(train), _autocast(device, spec["dtype"]):
            out, _, _ = attn(q, k, v)
        if grad_out is not None:
            out.backward(grad_out)  # a dense gradient: ``out.sum()`` would give a stride-0 one

    call.kernel = lambda: getattr(attn, "last_kernel", "plain")  # type: ignore[attr-defined]
    return call, attn.flops(t, b, backward=train)


def split_codebook(name: str) -> tuple[str, str]:
    """``"gau_vq@healthy"`` -> ``("gau_vq", "healthy")``: a model name with the ``conf/codebook`` preset its VQ
    attention uses (``ema``, the official settings, when none is named)."""
    model, _, codebook = name.partition("@")
    return model, codebook or "ema"


def compose_model(name: str, settings: dict[str, Any]) -> Any:
    """The Hydra preset ``conf/model/<name>.yaml`` at the benchmark's width and depth, with the
    ``settings["overrides"]`` (``key=value`` below ``model.``) applied (a DictConfig); a :data:`MODEL_VARIANTS`
    name is its preset with the variant's attention kernel; ``<name>@<codebook>`` picks the codebook preset."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    name, codebook = split_codebook(name)
    name, kernel = MODEL_VARIANTS.get(name, (name, None))
    if not (CONF_DIR / "model" / f"{name}.yaml").is_file():
        raise LookupError(f"unknown model preset {name!r}: no conf/model/{name}.yaml yet")
    overrides = [*([f"attention.kernel={kernel}"] if kernel else []), *settings.get("overrides", ())]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(overrides=[f"+model={name}", f"+codebook={codebook}", *map(hydra_override, overrides)])
    with open_dict(cfg):
        cfg.data = OmegaConf.create({"vocab_size": settings["vocab_size"]})
        # the schedule a codebook's own may scale with (codebook=sampled): a long run's, whose first steps are timed
        cfg.module = OmegaConf.create({"max_steps": SCHEDULE_STEPS})
        cfg.block_len, cfg.codebook_size = settings["block_len"], settings["codebook_size"]  # the one route
        cfg.model.d_model, cfg.model.n_layers = settings["d_model"], settings["n_layers"]
        backend = BACKENDS.get(cfg.model.attention.get("name"))
        if backend is not None and backend.has_codebook:
            cfg.model.attention.codebook_size = settings["codebook_size"]
            cfg.model.attention.block_len = settings["block_len"]
    return cfg


def _last_kernels(model: torch.nn.Module) -> str:
    """The attention kernels the model's latest call ran (``plain``, ``flex``; ``plain`` for backends with one)."""
    kernels = {getattr(m, "last_kernel", None) for m in model.modules()} - {None}
    return ",".join(sorted(kernels)) or "plain"


def model_case(spec: dict[str, Any], device: torch.device) -> tuple[Callable[[], None], int | None]:
    """One training step (forward, backward, AdamW step, codebook step) of a model preset (mode ``train``), or
    one inference forward pass from an empty state (mode ``fwd``: evaluation mode, no gradients)."""
    from hydra.utils import instantiate

    s, t = spec["settings"], spec["seq_len"]
    train = spec["mode"] == "train"
    model = instantiate(compose_model(spec["backend"], s).model).to(device).train(train)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens = torch.randint(0, s["vocab_size"], (s["batch"], t + 1), generator=gen).to(device)

    def forward() -> None:
        with torch.no_grad(), _autocast(device, spec["dtype"]):
            model(tokens[:, :-1])

    def call() -> None:
        with _autocast(device, spec["dtype"]):
            out = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                out.logits.flatten(0, 1).float(), tokens[:, 1:].flatten()
            )
        (loss + out.aux["loss"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.codebook_step()

    timed = call if train else forward
    timed.kernel = lambda: _last_kernels(model)  # type: ignore[attr-defined]
    return timed, model.flops(t, s["batch"], backward=train)


def mm_case(spec: dict[str, Any], device: torch.device) -> tuple[Callable[[], None], int]:
    """A square ``torch.mm`` of size ``spec['size']`` in the benchmark's dtype."""
    n, dtype = spec["size"], torch.bfloat16 if spec["dtype"] == "bf16" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return (lambda: torch.mm(a, b)), 2 * n**3


CASES = {"attention": attention_case, "model": model_case, "mm": mm_case}


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration in this process: ``{ms, ms_min, reps, peak_mem_mb, flops}``."""
    device = torch.device(spec["device"])
    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    if spec.get("mem_limit_mb"):
        flex_module()  # torch's flex attention, which the layers import on first use: loaded before the cap
        limit_address_space(spec["mem_limit_mb"])
    call, flops = CASES[spec["kind"]](spec, device)
    mem = PeakMemory(device)
    mem.start()
    times = time_calls(call, device, spec["reps"], spec["budget_s"])
    return {
        "ms": statistics.median(times),
        "ms_min": min(times),
        "reps": len(times),
        "peak_mem_mb": mem.peak_mb(),
        "flops": flops,
        **({"kernel": call.kernel()} if hasattr(call, "kernel") else {}),  # which kernel the backend ran
    }


def worker_main(spec_json: str) -> None:
    try:
        result = run_worker(json.loads(spec_json))
    except (torch.OutOfMemoryError, MemoryError) as err:
        result = {"error": f"out of memory ({type(err).__name__})"}
    except RuntimeError as err:
        if "alloc" not in str(err).lower() and "memory" not in str(err).lower():
            raise
        result = {"error": f"out of memory ({str(err).splitlines()[0][:120]})"}
    except LookupError as err:
        result = {"error": str(err)}
    print("RESULT " + json.dumps(result), flush=True)


def hydra_override(item: str) -> str:
    """``KEY=VALUE`` below ``model.`` as a Hydra override; ``+KEY=VALUE`` adds a key the preset does not state (as
    Hydra's own ``+``), so a misspelt key is still refused by name; ``codebook.KEY=VALUE`` sets a field of the codebook
    group (which a VQ model's ``attention.codebook`` reads) as it is."""
    if item.startswith("codebook."):
        return item
    return f"+model.{item[1:]}" if item.startswith("+") else f"model.{item}"
