"""TBPTT batches, bounded streams and the evaluation protocols: where the state is reset, and what each
sampler covers."""

from __future__ import annotations

import numpy as np
import pytest

from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.data.samplers import EvalSegmentSampler, StreamSampler, TBPTTSampler

DATA = np.random.default_rng(0).integers(0, 256, 10_000).astype(np.uint8)


def _sampler(rank: int = 0, world_size: int = 1, **kw: int) -> TBPTTSampler:
    options = {"update_len": 16, "sequence_len": 64, "batch_size": 3} | kw
    return TBPTTSampler(DATA, seed=7, rank=rank, world_size=world_size, **options)


def test_each_sequence_is_consecutive_updates_reset_only_at_its_start() -> None:
    sampler = _sampler()
    batches = list(sampler)
    assert len(batches) == len(sampler) == sampler.batches * 4
    for index, batch in enumerate(batches):
        update = index % 4
        assert batch["input"].shape == (3, 16)
        assert bool((batch["reset"] == (update == 0)).all())
        assert bool((batch["position"] == update * 16).all())
        for row, start in enumerate(sampler.sequence_starts(0)[index // 4]):  # bytes of that sequence
            assert np.array_equal(
                batch["input"][row].numpy(), DATA[start + update * 16 : start + update * 16 + 16]
            )
            assert np.array_equal(
                batch["target"][row].numpy(), DATA[start + update * 16 + 1 : start + update * 16 + 17]
            )


def _sequence_starts(sampler: TBPTTSampler) -> list[int]:
    """Where each row's sequence starts in the data, batch after batch, in the first epoch."""
    return sampler.sequence_starts(0).flatten().tolist()


def test_sequences_cover_the_corpus_in_a_seeded_order_and_ranks_are_disjoint() -> None:
    one = _sequence_starts(_sampler())
    assert len(set(one)) == len(one) and len({s % 64 for s in one}) == 1  # whole sequences, one offset
    assert _sequence_starts(_sampler()) == one  # seeded
    ranks = [set(_sequence_starts(_sampler(rank, 2))) for rank in range(2)]
    assert not ranks[0] & ranks[1] and ranks[0] | ranks[1] <= set(one) | set(_sequence_starts(_sampler(0, 1)))
    sampler = _sampler()
    every = sampler.sequences_per_epoch(one[0] % 64)
    assert len(one) == sampler.batches * 3 and every - len(one) < 3 + 1  # all but a batch's remainder
    # each epoch draws its own offset and order, and iterating into the next epoch uses it
    second = sampler.sequence_starts(1).flatten().tolist()
    assert second != one and len({s % 64 for s in second}) == 1
    batches = list(sampler) + list(sampler)
    assert batches[len(sampler)]["input"][0].tolist() == DATA[second[0] : second[0] + 16].tolist()


def test_resume_mid_sequence_continues_exactly() -> None:
    whole = list(_sampler())
    first = _sampler()
    iterator = iter(first)
    for _ in range(6):  # stop in the middle of the second sequence batch
        next(iterator)
    resumed = _sampler()
    resumed.load_state_dict(first.state_dict())
    for expected, got in zip(whole[6:], resumed, strict=True):
        assert all((expected[key] == got[key]).all() for key in expected)


def test_sequence_must_be_whole_updates() -> None:
    with pytest.raises(ValueError, match="multiple of the update length data.seq_len=16"):
        _sampler(sequence_len=60)


def test_stream_resets_its_state_every_reset_every_tokens() -> None:
    sampler = StreamSampler(
        DATA, seq_len=16, batch_size=2, seed=0, reset_every=40
    )  # rounded up to 3 segments
    resets = [bool(batch["reset"].all()) for batch in sampler]
    ages = [int(batch["position"][0]) for batch in StreamSampler(DATA, 16, 2, 0, reset_every=40)]
    assert resets[:7] == [True, False, False, True, False, False, True]
    assert ages[:4] == [0, 16, 32, 0]
    never = [bool(batch["reset"].any()) for batch in StreamSampler(DATA, 16, 2, 0, reset_every=None)]
    assert never[0] and not any(never[1:])


@pytest.mark.parametrize(
    ("protocol", "resets", "ages"),
    [
        ("segment", [True] * 6, [0] * 6),
        ("sequence", [True, False, False, True, False, False], [0, 16, 32, 0, 16, 32]),
        ("split", [True, False, False, False, False, False], [0, 16, 32, 48, 64, 80]),
    ],
)
def test_evaluation_protocols_reset_where_they_say(
    protocol: str, resets: list[bool], ages: list[int]
) -> None:
    sampler = EvalSegmentSampler(DATA[:200], 16, num_streams=2, protocol=protocol, sequence_len=48)
    batches = list(sampler)[:6]
    assert [bool(b["reset"].all()) for b in batches] == resets
    assert [int(b["position"][0]) for b in batches] == ages
    targets = sum(int((b["target"] != IGNORE_INDEX).sum()) for b in sampler)
    assert targets == sampler.num_targets()  # every protocol scores the same targets


def test_sequence_protocol_needs_whole_segments() -> None:
    with pytest.raises(
        ValueError, match="sequence_len=40: must be a multiple of the update length data.seq_len=16"
    ):
        EvalSegmentSampler(DATA, 16, 2, protocol="sequence", sequence_len=40)
