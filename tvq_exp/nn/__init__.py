"""Small shared layers: norms and positional schemes."""

from tvq_exp.nn.position import XLRelativeBias, apply_rope, sinusoid_table

__all__ = ["XLRelativeBias", "apply_rope", "sinusoid_table"]
