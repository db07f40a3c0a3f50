"""Models: residual blocks (:mod:`.blocks`), the decoder with its streaming state (:mod:`.decoder`), the
Lightning module that trains and evaluates it (:mod:`.module`), generation (:mod:`.generation`) and
dense -> VQ conversion (:mod:`.dense_to_vq`)."""

from tvq_exp.models.decoder import Decoder, DecoderOutput, ModelState, detach_state
from tvq_exp.models.module import AutoregressiveLitModule

__all__ = ["AutoregressiveLitModule", "Decoder", "DecoderOutput", "ModelState", "detach_state"]
