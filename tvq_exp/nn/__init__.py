"""Small shared layers: norms and positional schemes."""

from tvq_exp.nn.image_position import ImagePositionEmbedding, raster_coordinates
from tvq_exp.nn.position import XLRelativeBias, apply_rope, sinusoid_table

__all__ = ["ImagePositionEmbedding", "XLRelativeBias", "apply_rope", "raster_coordinates", "sinusoid_table"]
