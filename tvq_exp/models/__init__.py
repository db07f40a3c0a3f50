"""Models: residual blocks (:mod:`.blocks`), the decoder with its streaming state (:mod:`.decoder`), the
Lightning module that trains and evaluates it (:mod:`.module`), generation (:mod:`.generation`) and
dense -> VQ conversion (:mod:`.dense_to_vq`).

The package does not import :mod:`.module` (Lightning): building and validating a model needs only torch,
so a bad config is refused before Lightning is imported (docs/reliability.md)."""

from tvq_exp.models.decoder import Decoder, DecoderOutput, ModelState, detach_state

__all__ = ["Decoder", "DecoderOutput", "ModelState", "detach_state"]
