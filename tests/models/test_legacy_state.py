"""Checkpoints written before the states were typed carried their training state as per-block dicts
(``{"attn": {..., "t"}, "keep", "t"}``); :func:`tvq_exp.models.legacy.upgrade_train_state` rebuilds the typed
states from them, value for value, for every backend, so a run resumed mid-sequence continues exactly."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
import torch

from tests.attention.backends import backend_class, small_options
from tvq_exp.attention import build_attention
from tvq_exp.attention.base import State
from tvq_exp.models.blocks import GAUBlock
from tvq_exp.models.decoder import Decoder
from tvq_exp.models.legacy import upgrade_train_state

OLD_NAMES = {"position": "t", "s": "S"}  # the dict keys of the fields that were renamed
# the backends whose states checkpoints held as dicts (a backend added since has only typed states)
BEFORE_TYPED_STATES = ("dense", "flash_chunk", "linear", "ovq", "vq")


def as_dicts(state: Any) -> Any:
    """A typed state in the dict form checkpoints held before (``None`` fields were absent keys)."""
    if isinstance(state, list):
        return [as_dicts(block) for block in state]
    fields = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    return {
        OLD_NAMES.get(name, name): as_dicts(value) if isinstance(value, State) else value
        for name, value in fields.items()
        if value is not None or name == "keep"
    }


@pytest.mark.parametrize("name", BEFORE_TYPED_STATES)
def test_a_dict_state_of_an_old_checkpoint_becomes_the_typed_state(name: str) -> None:
    position = "xl" if backend_class(name).supports_position_bias else "rope"
    attention = functools.partial(build_attention, name, **small_options(name, 4, 5, position_bias=False))
    block = functools.partial(GAUBlock, d_k=8, position=position)
    torch.manual_seed(0)
    model = Decoder(vocab_size=16, d_model=16, n_layers=2, block=block, attention=attention).eval()
    tokens = torch.randint(0, 16, (2, 19))
    typed = model(tokens[:, :11]).state
    upgraded = upgrade_train_state(as_dicts(typed))
    assert upgraded == typed and [type(s.attn) for s in upgraded] == [type(s.attn) for s in typed]
    assert torch.equal(model(tokens[:, 11:], upgraded).logits, model(tokens[:, 11:], typed).logits)
    assert upgrade_train_state(typed) is typed and upgrade_train_state(None) is None
