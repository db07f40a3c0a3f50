"""Attention backends behind one contract (:mod:`tvq_exp.attention.base`).

``build_attention(name, **options)`` builds any backend by name; :data:`BACKENDS` names them (:mod:`.registry`).
One folder per mixer, ``attention/<backend>/``, each with its backend (``layer.py``), its plain reference
(``naive.py``) and, where it has one, its flex-attention kernel (``flex.py``); import a backend's class and state
from its folder (``from tvq_exp.attention.vq import VQAttention``). Backend-free pieces: :mod:`.base` (the
contract), :mod:`.blocked`, :mod:`.flex_runtime`, :mod:`.registry`.
"""

from tvq_exp.attention.base import AttentionBackend, Aux, State
from tvq_exp.attention.registry import BACKENDS, build_attention

__all__ = ["BACKENDS", "AttentionBackend", "Aux", "State", "build_attention"]
