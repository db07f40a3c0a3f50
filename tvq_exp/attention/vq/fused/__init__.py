"""Transformer-VQ's window + cache step as fused Triton kernels, forward and backward (``VQAttention(kernel="triton")``).

- :mod:`.op`: the autograd function and its launches (the algorithm in its docstring);
- :mod:`.support`: where it runs (CUDA, or the interpreter), ``kernel=auto``'s choice, the kernels loaded per mode;
- :mod:`.kernels`: the Triton kernels (loaded per mode: compiled, or Triton's interpreter on CPU);
- :mod:`.prefix` (its kernels in :mod:`.prefix_kernels`): the cache's running code means, forward and backward;
- :mod:`.config`: the tile sizes, and the configurations shipped for the GPU;
- :mod:`.report`: the sm_90a compile report of those configurations (``make kernel-report``).

The plain references are :mod:`tvq_exp.attention.vq.kernel` (and :mod:`tvq_exp.attention.vq.naive`) and
:mod:`tvq_exp.attention.vq.cache`; tests/attention/test_vq_triton.py and test_vq_cache_triton.py hold them equal under
the interpreter.
"""

from tvq_exp.attention.vq.fused.op import fused_window_cache_attention
from tvq_exp.attention.vq.fused.support import unsupported

__all__ = ["fused_window_cache_attention", "unsupported"]
