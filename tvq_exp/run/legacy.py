"""Run configs written by earlier versions, upgraded to the current layout so their checkpoints still load.

A checkpoint stores its resolved run config (``hyper_parameters.run_config``); ``eval.py``, ``sample.py``
and resuming rebuild the model and data from it by ``_target_``. Two things moved since the first
checkpoints were written:

- the package was arranged by job (``tvq_exp.model`` -> ``tvq_exp.models.decoder``, ``tvq_exp.lit`` ->
  ``tvq_exp.models.module``, ``tvq_exp.data.bytes`` -> ``tvq_exp.data.text.*``, ...): old ``_target_``
  paths are rewritten by :data:`MOVED`;
- the codebook options moved from ``model.codebook`` to the attention that owns them,
  ``model.attention.codebook``;
- the codebook's Laplace smoothing ``eps`` is ``smoothing`` (its read-out otherwise follows the official
  code);
- the codebook's ``strategy`` is ``update``, ``kmeans_init: true`` is ``init: kmeans``, and the absolute
  ``dead_code_threshold`` gave way to the relative ``reseed_fraction`` (dropped: evaluation never re-seeds);
- the module's ``carry_state`` / ``eval_carry_state`` gave way to the batches' ``reset`` flags: the data
  module's sampler and ``eval_protocol`` (``eval_carry_state: true`` is ``data.eval_protocol: split``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

# old dotted path -> new dotted path (whole paths)
MOVED = {
    "tvq_exp.model.Decoder": "tvq_exp.models.decoder.Decoder",
    "tvq_exp.blocks.GAUBlock": "tvq_exp.models.blocks.GAUBlock",
    "tvq_exp.blocks.MHABlock": "tvq_exp.models.blocks.MHABlock",
    "tvq_exp.blocks.gau.GAUBlock": "tvq_exp.models.blocks.GAUBlock",
    "tvq_exp.blocks.mha.MHABlock": "tvq_exp.models.blocks.MHABlock",
    "tvq_exp.lit.LanguageModel": "tvq_exp.models.module.AutoregressiveLitModule",
    "tvq_exp.data.module.TextDataModule": "tvq_exp.data.text.module.TextDataModule",
    "tvq_exp.data.module.ImageDataModule": "tvq_exp.data.images.module.ImageDataModule",
    "tvq_exp.data.bytes.MahoneyCorpus": "tvq_exp.data.text.enwik8.MahoneyCorpus",
    "tvq_exp.data.bytes.GutenbergCorpus": "tvq_exp.data.text.gutenberg.GutenbergCorpus",
    "tvq_exp.data.bytes.PG19Corpus": "tvq_exp.data.text.pg19.PG19Corpus",
    "tvq_exp.data.bytes.TextFilesCorpus": "tvq_exp.data.text.local.TextFilesCorpus",
    "tvq_exp.data.bytes.SingleFileCorpus": "tvq_exp.data.text.local.SingleFileCorpus",
    "tvq_exp.data.bytes.KJVCorpus": "tvq_exp.data.text.local.KJVCorpus",
}


def upgrade_run_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` in the current layout (unchanged if it already is)."""
    config = copy.deepcopy(dict(config))
    if isinstance(config.get("model"), dict) and config["model"].get("_target_") == "tvq_exp.model.Decoder":
        _first_format(config["model"])
    config = _retarget(config)
    module, data = config.get("module"), config.get("data")
    if isinstance(module, dict):
        module.pop("carry_state", None)  # the batches decide now (reset), see the data module
        if module.pop("eval_carry_state", False) and isinstance(data, dict):
            data["eval_protocol"] = "split"
    model = config.get("model")
    if isinstance(model, dict) and isinstance(model.get("codebook"), Mapping):
        codebook = model.pop("codebook")
        attention = model.get("attention")
        if isinstance(attention, dict) and attention.get("name") == "vq":
            attention.setdefault("codebook", dict(codebook))
    codebook = model.get("attention", {}).get("codebook") if isinstance(model, dict) else None
    if isinstance(codebook, dict):
        _codebook_options(codebook)
    return config


def _first_format(model: dict[str, Any]) -> None:
    """A model of the first layout, in the options that keep its function (see :mod:`tvq_exp.models.legacy`
    for its weights): the XL bias's sinusoids were ``d_k`` wide."""
    block = model.get("block") or {}
    if block.get("position", "xl") == "xl":
        d_k = (
            block.get("key_size")
            or block.get("d_k")
            or block.get("head_size")
            or model["d_model"] // block.get("heads", 4)
        )
        block["sinusoid_dim"] = d_k + d_k % 2


def _codebook_options(codebook: dict[str, Any]) -> None:
    """Earlier codebook options, renamed in place."""
    if "eps" in codebook:  # Laplace smoothing was ``eps`` (1e-5 by default)
        codebook["smoothing"] = codebook.pop("eps")
    if "strategy" in codebook:
        codebook["update"] = codebook.pop("strategy")
    if "kmeans_init" in codebook:
        codebook["init"] = "kmeans" if codebook.pop("kmeans_init") else "random"
    codebook.pop("dead_code_threshold", None)


def _retarget(node: Any) -> Any:
    """Rewrite every moved ``_target_`` below ``node`` (in place for dicts and lists)."""
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str) and target in MOVED:
            node["_target_"] = MOVED[target]
        for value in node.values():
            _retarget(value)
    elif isinstance(node, list):
        for value in node:
            _retarget(value)
    return node


__all__ = ["MOVED", "upgrade_run_config"]
