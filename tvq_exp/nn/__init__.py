"""Small layers shared by the blocks: norms, LayerDrop, positional schemes (XL bias, RoPE, image positions)."""

from tvq_exp.nn.dropout import StochasticDepth
from tvq_exp.nn.image_position import ImagePositionEmbedding, raster_coordinates
from tvq_exp.nn.norms import rms_normalize
from tvq_exp.nn.position import XLRelativeBias, apply_rope, sinusoid_table

__all__ = [
    "ImagePositionEmbedding",
    "StochasticDepth",
    "XLRelativeBias",
    "apply_rope",
    "raster_coordinates",
    "rms_normalize",
    "sinusoid_table",
]
