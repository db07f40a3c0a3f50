"""Codebooks for vector-quantised keys: the quantiser (:mod:`.codebook`), its update rules (:mod:`.ema`,
:mod:`.gradient`, :mod:`.affine`), gradient estimators, k-means init and dead-code re-seeding."""

from tvq_exp.quantize.affine import AffineUpdate
from tvq_exp.quantize.codebook import VectorQuantizer, statistics_frozen
from tvq_exp.quantize.ema import EMAUpdate
from tvq_exp.quantize.estimators import rotation_trick, straight_through
from tvq_exp.quantize.gradient import GradientUpdate
from tvq_exp.quantize.kmeans import kmeans, nearest_code
from tvq_exp.quantize.reseed import dead_codes
from tvq_exp.quantize.update import CodebookUpdate

__all__ = [
    "AffineUpdate",
    "CodebookUpdate",
    "EMAUpdate",
    "GradientUpdate",
    "VectorQuantizer",
    "dead_codes",
    "kmeans",
    "nearest_code",
    "rotation_trick",
    "statistics_frozen",
    "straight_through",
]
