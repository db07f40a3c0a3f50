"""Residual blocks: GAU and multi-head attention + GLU."""

from tvq_exp.models.blocks.common import BlockState
from tvq_exp.models.blocks.gau import GAUBlock
from tvq_exp.models.blocks.mha import GLUFeedForward, MHABlock

__all__ = ["BlockState", "GAUBlock", "GLUFeedForward", "MHABlock"]
