"""Weights of checkpoints written before the model followed the official code's parametrisation.

Format 1 (every checkpoint without ``tvq_format``) differs from the current format 2 in two places, each a
reparametrisation that :func:`upgrade_checkpoint` undoes exactly:

- the XL bias's ``u``, ``v`` and sinusoid projection were used unscaled: they are divided by the
  ``d_k^-1/4`` scale the bias now applies (its sinusoids' width, ``d_k``, is kept by the run config's
  upgrade: :mod:`tvq_exp.run.legacy`);
- norms had no bias: zero biases are added.

Optimiser moments follow their parameters (re-indexed for the added biases, rescaled with them), so a
resumed run continues. The norms' epsilon moved from 1.2e-7 to 1e-6: outputs change in the seventh digit.

The carried training state of a checkpoint (``train_state``, a TBPTT sequence cut mid-way) was a list of dicts
before the states were typed; :func:`upgrade_train_state` rebuilds the typed states from them, value for value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from tvq_exp.attention.base import State
from tvq_exp.attention.dense import DenseState
from tvq_exp.attention.flash_chunk import FlashChunkState
from tvq_exp.attention.linear import LinearState
from tvq_exp.attention.ovq import OVQState
from tvq_exp.attention.vq import VQState
from tvq_exp.models.blocks.common import BlockState
from tvq_exp.nn.position import XLRelativeBias

FORMAT = 2
PREFIX = "model."


def upgrade_checkpoint(checkpoint: dict[str, Any], module: nn.Module) -> None:
    """Bring a format-1 Lightning ``checkpoint`` (in place) to the weights of ``module`` (the Lightning
    module, built from the upgraded run config, with ``.model`` the decoder); a current one is left alone."""
    if checkpoint.get("tvq_format", 1) >= FORMAT:
        return
    state, model = checkpoint["state_dict"], module.model
    rescale: dict[str, float] = {}
    for name, m in model.named_modules():
        if isinstance(m, XLRelativeBias):
            rescale |= {f"{PREFIX}{name}.{p}": 1.0 / m.scale for p in ("u", "v", "proj.weight")}
    for key, factor in rescale.items():
        state[key] = state[key] * factor
    own = module.state_dict()
    added = [key for key in own if key not in state]
    for key in added:
        if not key.endswith("norm.bias") and not key.endswith(("norm1.bias", "norm2.bias")):
            raise KeyError(f"a format-1 checkpoint lacks {key}, which is not a norm bias: cannot upgrade it")
        state[key] = torch.zeros_like(own[key])
    _upgrade_optimizer(checkpoint, module, set(added), rescale)
    checkpoint["tvq_format"] = FORMAT


def _upgrade_optimizer(
    checkpoint: dict[str, Any], module: nn.Module, added: set[str], rescale: dict[str, float]
) -> None:
    """Re-index the AdamW state for the added parameters and rescale the moments of rescaled ones."""
    optimizers = checkpoint.get("optimizer_states")
    if not optimizers:
        return
    names = {id(p): f"{PREFIX}{n}" for n, p in module.model.named_parameters()}
    groups = [[names[id(p)] for p in group["params"]] for group in module.parameter_groups()]
    old = [name for group in groups for name in group if name not in added]
    new = {name: i for i, name in enumerate(name for group in groups for name in group)}
    saved = optimizers[0]
    if sum(len(g["params"]) for g in saved["param_groups"]) != len(old):
        raise KeyError("the optimiser state does not match the model's parameters: cannot upgrade it")
    state = {}
    for i, name in enumerate(old):
        if i in saved["state"]:
            moments = dict(saved["state"][i])
            factor = rescale.get(name, 1.0)
            for key, power in (("exp_avg", 1), ("exp_avg_sq", 2)):
                if key in moments:
                    moments[key] = moments[key] / factor**power
            state[new[name]] = moments
    saved["state"] = state
    for group, group_names in zip(saved["param_groups"], groups, strict=True):
        group["params"] = [new[name] for name in group_names]


def upgrade_train_state(saved: Any) -> list[BlockState] | None:
    """A checkpoint's carried training state, typed: the plain data of :meth:`State.to_plain`, or the per-block dicts ``{"attn", "keep", "t"}`` of earlier
    checkpoints become :class:`BlockState` s, their attention dicts the backend's state (told apart by their
    keys); a typed state (or None) is returned as it is."""
    if not saved or not isinstance(saved[0], Mapping):
        return saved
    if "state" in saved[0]:  # plain data (State.to_plain), as checkpoints are written now
        return [State.from_plain(block) for block in saved]  # type: ignore[misc]
    return [
        BlockState(int(block["t"]), _attention_state(block["attn"]), block.get("keep")) for block in saved
    ]


def _attention_state(old: Mapping[str, Any]) -> State:
    """The typed state of a backend's state dict (its position under ``"t"``)."""
    fields, position = {key: value for key, value in old.items() if key != "t"}, int(old["t"])
    if "codes" in fields:
        return VQState(position, **fields)
    if "counts" in fields:
        return OVQState(position, **fields)
    if "kv" in fields:
        return FlashChunkState(position, fields["k"], fields["v"], fields["kv"], int(fields["n"]))
    if "S" in fields:
        return LinearState(position, fields["S"], fields["z"])
    if "k" in fields:
        return DenseState(position, fields["k"], fields["v"])
    return State(position)


__all__ = ["FORMAT", "upgrade_checkpoint", "upgrade_train_state"]


def legacy_guard_counts(checkpoint: Mapping[str, Any]) -> dict[str, int]:
    """Bad-step counters of a checkpoint written before they lived in the module (in the guard
    callback's state), else zeros."""
    states = checkpoint.get("callbacks") or {}
    return next(
        (s for key, s in states.items() if "NumericsGuard" in str(key)), {"skipped": 0, "consecutive": 0}
    )
