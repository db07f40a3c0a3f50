"""MQAR: Zoology's layout, the key/value halves, the power law over query slots, gap buckets, options."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chisquare

from tvq_exp.batch import IGNORE_INDEX
from tvq_exp.data.synthetic import Examples, MQARTask, SyntheticDataModule, mqar_preset
from tvq_exp.data.synthetic.mqar import mqar_examples, ordered_sample, power_law_log_weights


def generate(num_examples: int = 256, seed: int = 0, **options: object) -> tuple[MQARTask, Examples]:
    module = MQARTask(**{"seq_len": 128, "num_kv_pairs": 8, "vocab_size": 512, **options})
    return module, module.generate(np.random.default_rng(seed), num_examples, "train")


def key_positions(inputs: np.ndarray, context: int) -> dict[int, int]:
    """Key token -> its position in one row's key-value prefix."""
    return {int(inputs[i]): i for i in range(0, context, 2)}


@pytest.mark.parametrize("random_non_queries", [False, True])
def test_layout_and_vocabulary_halves(random_non_queries: bool) -> None:
    module, ex = generate(random_non_queries=random_non_queries)
    context, half = 16, 256
    keys, values = ex.input[:, 0:context:2], ex.input[:, 1:context:2]
    assert keys.min() >= 1 and keys.max() < half
    assert values.min() >= half and values.max() < 512
    assert all(len(set(row)) == 8 for row in keys) and all(len(set(row)) == 8 for row in values)
    answer = ex.target != IGNORE_INDEX
    assert not answer[:, :context].any()
    assert (answer.sum(1) == 8).all()
    rows, cols = np.nonzero(answer)
    assert ((cols - context) % 2 == 0).all()
    for row, col in zip(rows, cols, strict=True):
        pair = key_positions(ex.input[row], context)[int(ex.input[row, col])]
        assert ex.target[row, col] == ex.input[row, pair + 1]
        assert ex.bucket[row, col] == int(np.searchsorted([0, 32, 64, 128], col - pair, side="right")) - 1
    assert (ex.bucket[~answer] == -1).all()
    filler = ex.input[:, context:][~answer[:, context:]]
    if random_non_queries:
        assert filler.min() == 0 and filler.max() > half  # uniform over the whole vocabulary
    else:
        assert (filler == 0).all()  # every non-zero of the query region is a query


def test_fewer_queries_query_distinct_pairs() -> None:
    _, ex = generate(num_queries=3, random_non_queries=False)
    answer = ex.target != IGNORE_INDEX
    assert (answer.sum(1) == 3).all()
    for row in range(len(ex)):
        queried = ex.input[row][answer[row]]
        assert len(set(queried.tolist())) == 3


def test_query_slots_follow_zoologys_power_law() -> None:
    """Zoology gives power-law draw j to pair j: pair 0's slot is exactly one draw of p(g) ∝ a (g+1)^(a-1)."""
    _, ex = generate(20_000, seq_len=64, num_kv_pairs=4, random_non_queries=False)
    space = (64 - 8) // 2
    first_key = ex.input[:, :1]
    slots = (np.argmax(ex.input[:, 8:] == first_key, axis=1)) // 2
    counts = np.bincount(slots, minlength=space)
    expected = np.exp(power_law_log_weights(space, 0.01))
    expected = expected / expected.sum() * len(slots)
    assert chisquare(counts, expected).pvalue > 1e-3
    all_slots = (np.nonzero(ex.input[:, 8:])[1]) // 2
    frequencies = np.bincount(all_slots, minlength=space)
    assert frequencies[0] > 3 * frequencies[-1]
    assert (np.diff(frequencies[:6]) < 0).all()


def test_ordered_sample_is_sequential_draw_without_replacement() -> None:
    """The second draw of weights (1, 2, 7) is index 0 with P = 0.2 * 1/8 + 0.7 * 1/3 = 0.2583..."""
    draws = ordered_sample(np.random.default_rng(0), np.log([1.0, 2.0, 7.0]), 40_000, 2)
    assert (draws[:, 0] != draws[:, 1]).all()
    assert abs((draws[:, 0] == 2).mean() - 0.7) < 0.01
    assert abs((draws[:, 1] == 0).mean() - (0.2 / 8 + 0.7 / 3)) < 0.01


def test_gap_buckets_cover_the_sequence() -> None:
    module = MQARTask(seq_len=1024, num_kv_pairs=64, vocab_size=8192)
    edges = [0, 32, 64, 128, 256, 512, 1024]
    assert module.bucket_names("test") == [f"gap_{lo}_{hi}" for lo, hi in zip(edges, edges[1:], strict=False)]
    ex = mqar_examples(np.random.default_rng(1), 64, 1024, 8192, 64, 64, 0.01, True, module.edges)
    answer = ex.target != IGNORE_INDEX
    assert ex.bucket[answer].min() >= 0 and ex.bucket[answer].max() < 6


def test_presets() -> None:
    modules = [mqar_preset(name) for name in ("mqar_64", "mqar_128", "mqar_256", "mqar_1024")]
    shapes = {(m.seq_len, m.task.num_kv_pairs, m.vocab_size) for m in modules}
    assert shapes == {(64, 4, 8192), (128, 8, 8192), (256, 16, 8192), (1024, 64, 8192)}
    assert mqar_preset("mqar_64", batch_size=3).batch_size == 3
    with pytest.raises(ValueError, match="mqar_7"):
        mqar_preset("mqar_7")


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"seq_len": 65}, "seq_len=65"),
        ({"seq_len": 64, "num_kv_pairs": 17}, "num_kv_pairs=17"),
        ({"vocab_size": 16, "num_kv_pairs": 8}, "num_kv_pairs=8"),
        ({"num_queries": 17}, "num_queries=17"),
        ({"power_a": 0.0}, "power_a=0.0"),
    ],
)
def test_bad_options_name_option_and_value(options: dict[str, object], option: str) -> None:
    with pytest.raises(ValueError, match=f"MQARTask: {option}: must"):
        MQARTask(**options)


@pytest.mark.parametrize(
    ("options", "option"),
    [({"batch_size": 0}, "batch_size=0"), ({"kind": "text"}, "kind='text'"), ({"seq_len": 65}, "seq_len=65")],
)
def test_bad_loader_options_name_option_and_value(options: dict[str, object], option: str) -> None:
    """The loader options are the data module's; the row shape it gives the task is checked by the task."""
    with pytest.raises(ValueError, match=f"(SyntheticDataModule|MQARTask): {option}: must"):
        SyntheticDataModule(MQARTask, **options)
