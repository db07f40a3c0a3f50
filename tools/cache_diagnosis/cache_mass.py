"""``python tools/cache_diagnosis/cache_mass.py OUT.json [eval.py overrides]``: ``eval.py``, recording per VQ layer
how much of the attention goes to the compressive cache.

For every window + cache call the share of each query row's softmax that falls on the cache columns is the
kernel's output with the window values set to 0 and the cache means to 1 (one extra call of the same kernel, so
the share is exact, not re-derived). Rows are counted where the cache holds at least one key (a sequence's
first two blocks see none). Writes ``{"layers": {i: {"mean": share, "rows": n}}}`` to ``OUT.json`` at exit.
A diagnostic, not a model option: it patches :mod:`tvq_exp.attention.vq.layer` in this process only; layers are
numbered in build order modulo ``$TVQ_LAYERS`` (default 4, ``experiment=longctx_cpu``).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import runpy
import sys
from pathlib import Path

import torch
from torch import Tensor

from tvq_exp.attention.vq import layer as vq_layer
from tvq_exp.attention.vq.kernel import WindowInputs

LAYERS = int(os.environ.get("TVQ_LAYERS", "4"))
_attend = vq_layer.window_cache_attention
_init, _forward = vq_layer.VQAttention.__init__, vq_layer.VQAttention.forward
_built, _current = [0], [0]
_sums: dict[int, float] = {}
_rows: dict[int, int] = {}


def cache_share(inputs: WindowInputs, prev_grad: bool) -> Tensor | None:
    """``(K, R)``: the softmax share on the cache of every query row of the ``K`` items whose cache holds a key
    (None without a cache)."""
    if inputs.cache is None:
        return None
    zeros = inputs.vb.new_zeros(*inputs.vb.shape[:-1], 1)
    ones = inputs.cache.mu.new_ones(*inputs.cache.mu.shape[:-1], 1)
    share = _attend(inputs._replace(vb=zeros, cache=inputs.cache._replace(mu=ones)), prev_grad=prev_grad)[
        ..., 0
    ]
    return share[torch.isfinite(inputs.cache.log_n).any(-1)]


@functools.wraps(_attend)
def _recording_attend(inputs: WindowInputs, prev_grad: bool) -> Tensor:
    share = cache_share(inputs, prev_grad)
    if share is not None and share.numel():
        layer = _current[0]
        _sums[layer] = _sums.get(layer, 0.0) + float(share.double().sum())
        _rows[layer] = _rows.get(layer, 0) + share.numel()
    return _attend(inputs, prev_grad=prev_grad)


@functools.wraps(_init)  # keeps the signature: the config validation reads the options from it
def _numbered_init(self: vq_layer.VQAttention, *args: object, **kwargs: object) -> None:
    _init(self, *args, **kwargs)
    self.layer_index = _built[0] % LAYERS
    _built[0] += 1


@functools.wraps(_forward)
def _numbered_forward(self: vq_layer.VQAttention, *args: object, **kwargs: object) -> object:
    _current[0] = self.layer_index
    return _forward(self, *args, **kwargs)


def _write(path: Path) -> None:
    layers = {i: {"mean": _sums[i] / _rows[i], "rows": _rows[i]} for i in sorted(_sums)}
    path.write_text(json.dumps({"argv": sys.argv[1:], "layers": layers}, indent=1) + "\n")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    vq_layer.window_cache_attention = _recording_attend
    vq_layer.VQAttention.__init__, vq_layer.VQAttention.forward = _numbered_init, _numbered_forward
    atexit.register(_write, out)
    root = Path(__file__).resolve().parents[2]
    sys.argv = [str(root / "eval.py"), *sys.argv[2:]]
    runpy.run_path(str(root / "eval.py"), run_name="__main__")
