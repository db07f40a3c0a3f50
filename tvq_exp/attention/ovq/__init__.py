"""Online vector-quantised attention (OVQ-attention; Alonso, Figliolia & Millidge 2026): an exact
two-block window plus key and value dictionaries learned inside each sequence by online k-means.

- :mod:`.layer`: the backend :class:`OVQAttention` (growth, seeding, assignment, the blockwise read);
- :mod:`.naive`: the plain token-loop reference it is tested against.
"""

from tvq_exp.attention.ovq.layer import OVQAttention, OVQState

__all__ = ["OVQAttention", "OVQState"]
