"""A probe of the tensor descriptors (the GPU's bulk tile copies) the fused VQ kernels' op makes."""

from __future__ import annotations

import pytest
import torch


def count_descriptors(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[int, ...], list[int]]]:
    """The (shape, block shape) of every tensor descriptor the op makes from here on: the op constructs
    ``TensorDescriptor`` (its rows, not the tensor's, since the twenty-eighth session), looked up when it makes them.
    The CUDA test spied on ``TensorDescriptor.from_tensor`` until 2026-11-30, saw none, and failed on the H200."""
    from triton.runtime import interpreter  # noqa: F401 - binds the real class first: it tests isinstance against it
    from triton.tools import tensor_descriptor

    made, real = [], tensor_descriptor.TensorDescriptor

    def spy(base: torch.Tensor, shape: list[int], strides: list[int], block_shape: list[int]) -> object:
        made.append((tuple(shape), list(block_shape)))
        return real(base, shape, strides, block_shape)

    monkeypatch.setattr(tensor_descriptor, "TensorDescriptor", spy)
    return made
