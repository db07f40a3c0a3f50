"""Synthetic recall and long-range probes: one seeded data module (:class:`SyntheticDataModule`, the loader
options and the seeding) composed with a task (:class:`SyntheticTask`): MQAR (Zoology), passkey retrieval in
Gutenberg text, selective copying (Mamba) and induction heads (H3); their accuracy is
:class:`tvq_exp.models.metrics.BucketAccuracy`.

Batches follow :mod:`tvq_exp.batch` and add ``bucket`` ``(B, T)`` int64: the bucket id at every answer
position, -1 elsewhere (:mod:`.base`).
"""

from tvq_exp.data.synthetic.base import Examples, SyntheticDataModule, SyntheticTask
from tvq_exp.data.synthetic.induction import InductionTask
from tvq_exp.data.synthetic.mqar import PRESETS as MQAR_PRESETS
from tvq_exp.data.synthetic.mqar import MQARTask, mqar_preset
from tvq_exp.data.synthetic.passkey import PasskeyTask
from tvq_exp.data.synthetic.selective_copy import SelectiveCopyTask

__all__ = [
    "MQAR_PRESETS",
    "Examples",
    "InductionTask",
    "MQARTask",
    "PasskeyTask",
    "SelectiveCopyTask",
    "SyntheticDataModule",
    "SyntheticTask",
    "mqar_preset",
]
