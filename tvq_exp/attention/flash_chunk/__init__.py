"""FLASH mixed chunk attention: :mod:`.layer` (the backend), :mod:`.naive` (the plain reference)."""

from tvq_exp.attention.flash_chunk.layer import FlashChunkAttention, FlashChunkState

__all__ = ["FlashChunkAttention", "FlashChunkState"]
