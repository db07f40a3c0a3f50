"""Codebooks for vector-quantised keys: EMA and gradient strategies, dead-code reset, k-means init."""

from tvq_exp.quantize.codebook import VectorQuantizer
from tvq_exp.quantize.kmeans import kmeans, nearest_code

__all__ = ["VectorQuantizer", "kmeans", "nearest_code"]
