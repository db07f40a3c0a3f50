"""Synthetic recall and long-range probes as seeded data modules: MQAR (Zoology), passkey retrieval in
Gutenberg text, selective copying (Mamba) and induction heads (H3); their accuracy is :class:`tvq_exp.models.metrics.BucketAccuracy`.

Batches follow :mod:`tvq_exp.batch` and add ``bucket`` ``(B, T)`` int64: the bucket id at every answer
position, -1 elsewhere (:mod:`.base`).
"""

from tvq_exp.data.synthetic.base import Examples, SyntheticDataModule
from tvq_exp.data.synthetic.induction import InductionDataModule
from tvq_exp.data.synthetic.mqar import PRESETS as MQAR_PRESETS
from tvq_exp.data.synthetic.mqar import MQARDataModule
from tvq_exp.data.synthetic.passkey import PasskeyDataModule
from tvq_exp.data.synthetic.selective_copy import SelectiveCopyDataModule

__all__ = [
    "MQAR_PRESETS",
    "Examples",
    "InductionDataModule",
    "MQARDataModule",
    "PasskeyDataModule",
    "SelectiveCopyDataModule",
    "SyntheticDataModule",
]
