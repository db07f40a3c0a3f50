"""Codebook health metrics against hand-computed values: usage perplexity, dead codes, relative error, regret."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tvq_exp.quantize.health import (
    REGRET_FLOOR,
    assigned_counts,
    code_counts,
    codebook_regret,
    dead_fraction,
    relative_error,
    squared_error,
    usage_perplexity,
)
from tvq_exp.quantize.kmeans import kmeans, nearest_code


def _clusters(centres: torch.Tensor, per_centre: int, noise: float, seed: int = 0) -> torch.Tensor:
    """``per_centre`` noisy copies of each centre ``(H, S, d)`` -> keys ``(H, S·per_centre, d)``."""
    g = torch.Generator().manual_seed(seed)
    keys = centres.repeat_interleave(per_centre, dim=1)
    return keys + noise * torch.randn(keys.shape, generator=g)


def _centres(heads: int = 2, codes: int = 8, dim: int = 4, seed: int = 1) -> torch.Tensor:
    return 10 * torch.randn(heads, codes, dim, generator=torch.Generator().manual_seed(seed))


def test_code_counts_and_usage_perplexity_by_hand() -> None:
    codes = torch.tensor([[0, 0, 0, 1], [2, 2, 3, 3]])
    counts = code_counts(codes, 4)
    assert counts.tolist() == [[3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 2.0, 2.0]]
    # head 0: p = (3/4, 1/4): exp(-(3/4 ln 3/4 + 1/4 ln 1/4)) = 4 / 3^(3/4); head 1: two equal codes
    expected = [4 / 3**0.75, 2.0]
    torch.testing.assert_close(usage_perplexity(counts), torch.tensor(expected), rtol=1e-6, atol=0)
    assert usage_perplexity(torch.full((1, 64), 5.0)).item() == pytest.approx(64.0, rel=1e-6)
    assert usage_perplexity(torch.tensor([[0.0, 9.0, 0.0]])).item() == pytest.approx(1.0)
    # nearest codes of 0, 2 and 10 among 1, 11 and 100: 1, 1, 11
    keys, codebook = torch.tensor([[[0.0], [2.0], [10.0]]]), torch.tensor([[[1.0], [11.0], [100.0]]])
    assert assigned_counts(keys, codebook).tolist() == [[2.0, 1.0, 0.0]]


def test_dead_fraction_is_relative_to_the_fair_share() -> None:
    counts = torch.tensor([[200.0, 199.0, 1.0, 0.0]])  # N = 400, S = 4: fair share 100
    assert dead_fraction(counts, 0.0).item() == 0.25  # only the unused code
    assert dead_fraction(counts, 0.01).item() == 0.25  # threshold 1: a code used once is alive
    assert dead_fraction(counts, 0.02).item() == 0.5  # threshold 2
    assert dead_fraction(counts, 1.0).item() == 0.5  # below the fair share: 1 and 0
    with pytest.raises(ValueError, match=r"share=1.5: must be in \[0, 1\]"):
        dead_fraction(counts, 1.5)


def test_dead_fraction_counts_exactly_the_codes_made_unused() -> None:
    centres = _centres(heads=2, codes=16)
    keys = _clusters(centres, per_centre=20, noise=0.1)
    codebook = centres.clone()
    unused = {0: [3, 7, 11], 1: [0, 1, 2, 3, 4]}
    for head, codes in unused.items():
        codebook[head, codes] = 1e4  # far from every key: never the nearest
    counts = code_counts(nearest_code(keys, codebook), 16)
    expected = torch.tensor([3 / 16, 5 / 16])
    torch.testing.assert_close(dead_fraction(counts), expected)
    assert [(counts[h] == 0).nonzero().flatten().tolist() for h in (0, 1)] == [unused[0], unused[1]]


def test_relative_error_by_hand() -> None:
    keys = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    codebook = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    assert squared_error(keys, codebook).tolist() == [1.0]  # 0 + (2 - 1)²
    assert relative_error(keys, codebook) == pytest.approx(1 / 5)  # over 1² + 2²
    assert relative_error(torch.zeros(1, 3, 2), codebook) == 0.0


def test_a_codebook_equal_to_the_kmeans_solution_has_regret_one() -> None:
    keys = _clusters(_centres(), per_centre=30, noise=1.0)
    solution = kmeans(keys, 8, 15, torch.Generator().manual_seed(3))
    result = codebook_regret(keys, solution, 15, torch.Generator().manual_seed(3))
    assert result.regret == 1.0 and result.quant_error == result.kmeans_error > 0
    assert result.quant_error == pytest.approx(relative_error(keys, solution))


def test_a_collapsed_codebook_has_a_large_regret_and_perplexity_one() -> None:
    centres = _centres()
    keys = _clusters(centres, per_centre=30, noise=0.1)
    collapsed = torch.full_like(centres, 1e4)
    collapsed[:, 0] = keys.mean(1)  # one code at the mean takes every key
    counts = code_counts(nearest_code(keys, collapsed), 8)
    assert usage_perplexity(counts).tolist() == [1.0, 1.0]
    assert dead_fraction(counts).tolist() == [7 / 8, 7 / 8]
    result = codebook_regret(keys, collapsed, 15, torch.Generator().manual_seed(0))
    centred = (keys - keys.mean(1, keepdim=True)).pow(2).sum() / keys.pow(2).sum()
    assert result.quant_error == pytest.approx(centred.item(), rel=1e-5)  # the error of the mean
    # k-means finds the clusters: noise 0.1 in 4 dims against centres of norm ~20
    assert result.kmeans_error < REGRET_FLOOR and result.regret == pytest.approx(
        result.quant_error / REGRET_FLOOR
    )  # k-means all but exact: the ratio's denominator is the floor, not round-off
    assert result.regret > 100


def test_kmeans_perplexity_is_the_usage_of_the_clusters_kmeans_finds() -> None:
    # 8 well-separated clusters of unequal sizes: k-means with 8 codes finds them, so its usage perplexity is
    # that of the sizes, whatever the codebook measured (here collapsed onto one code)
    centres = _centres(heads=1, codes=8)
    sizes = [5, 10, 15, 20, 25, 30, 35, 40]
    g = torch.Generator().manual_seed(4)
    keys = torch.cat(
        [c + 0.01 * torch.randn(n, 4, generator=g) for c, n in zip(centres[0], sizes, strict=True)]
    )
    collapsed = torch.full_like(centres, 1e4)
    collapsed[0, 0] = keys.mean(0)
    result = codebook_regret(keys[None], collapsed, 15, torch.Generator().manual_seed(0))
    p = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
    assert result.kmeans_perplexity == pytest.approx(math.exp(-(p * p.log()).sum().item()), rel=1e-6)
    # two clusters of 30 and 90 keys, two heads: the mean over heads of each head's k-means usage
    two = torch.cat([_clusters(centres[:, :1], 30, 0.01), _clusters(centres[:, 1:2], 90, 0.01)], 1)
    result = codebook_regret(torch.cat([two, two.flip(1)]), torch.zeros(2, 2, 4), 10)
    assert result.kmeans_perplexity == pytest.approx(4 / 3**0.75, rel=1e-6)  # p = (1/4, 3/4) in both heads


def test_regret_is_deterministic_and_edge_cases() -> None:
    keys = _clusters(_centres(), per_centre=10, noise=1.0)
    codebook = _centres(seed=5)
    first = codebook_regret(keys, codebook, 10, torch.Generator().manual_seed(7))
    again = codebook_regret(keys, codebook, 10, torch.Generator().manual_seed(7))
    assert first == again and first.regret > 1
    # no more keys than codes: k-means is exact, the reference is the floor (0/floor = 0, x/floor finite)
    few = keys[:, :5]
    assert codebook_regret(few, torch.cat([few, few[:, :3]], 1), 5).regret == 0.0
    bad = codebook_regret(few, codebook, 5)
    assert bad.kmeans_error == 0 and bad.regret == bad.quant_error / REGRET_FLOOR > 1
    assert all(math.isnan(v) for v in codebook_regret(keys[:, :0], codebook, 5))
    with pytest.raises(ValueError, match=r"keys \(2, 80, 4\) do not match the codebook \(3, 8, 4\)"):
        codebook_regret(keys, torch.zeros(3, 8, 4))


# ------------------------------------------------------------------------------------------- under DDP


def _ddp_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        keys, codebook = _ddp_keys()
        mine = keys[:, :50] if rank == 0 else keys[:, 50:]
        results = {
            "regret": codebook_regret(mine, codebook, 10, torch.Generator().manual_seed(0)),
            # rank 1 without keys: both ranks return NaN, neither waits for the other
            "one_empty": codebook_regret(mine if rank == 0 else mine[:, :0], codebook, 10),
        }
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _ddp_keys() -> tuple[torch.Tensor, torch.Tensor]:
    return _clusters(_centres(), per_centre=15, noise=1.0), _centres(seed=5)


def test_regret_under_ddp_is_identical_on_every_rank_and_never_hangs(tmp_path: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_ddp_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert ranks[0]["regret"] == ranks[1]["regret"]
    keys, codebook = _ddp_keys()
    union = ranks[0]["regret"]
    assert union.quant_error == pytest.approx(
        relative_error(keys, codebook), rel=1e-6
    )  # over both ranks' keys
    assert 0 < union.kmeans_error < union.quant_error
    # the k-means' usage is counted over both ranks' keys (the ranks hold different clusters, so per-rank counts
    # would differ between the ranks, and the tuples are equal above)
    assert 1 < union.kmeans_perplexity <= 8
    assert all(math.isnan(v) for r in ranks for v in r["one_empty"])
