"""Transformer-VQ attention (Lingle 2023): quantised keys, an exact two-block window and a compressive
cache of per-code counts and mean values.

- :mod:`.layer`: the backend :class:`VQAttention` (blocks, carried state, the causal forward);
- :mod:`.kernel`: the fused window + cache step (chunked, recomputed in the backward);
- :mod:`.cache`: the cache's per-code running means, block by block, with an exact backward;
- :mod:`.bidirectional`: the encoder form (``causal=False``);
- :mod:`.naive`: plain references the above are tested against.
"""

from tvq_exp.attention.vq.layer import VQAttention, VQState

__all__ = ["VQAttention", "VQState"]
