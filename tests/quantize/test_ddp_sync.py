"""Under DDP (2 gloo processes on CPU) every rank holds the identical codebook, equal to the
single-process codebook trained on the union of the ranks' batches."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tvq_exp.attention import build_attention

STEPS = 4


def _make(**codebook) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_attention(
        "vq", d_k=4, d_v=3, heads=2, codebook_size=16, block_len=4, window_bias=False, codebook=codebook
    )


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (
        torch.randn(2, 2, 12, 4, generator=g),
        torch.randn(2, 2, 12, 4, generator=g),
        torch.randn(2, 2, 12, 3, generator=g),
    )


def _worker(rank: int, world: int, init_file: str, out_dir: str, codebook: dict) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        attn = _make(**codebook).train()
        for step in range(STEPS):
            attn(*_batch(step, rank))
            attn.quantizer.update()
        torch.save(attn.quantizer.state_dict(), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_ddp(tmp_path: Path, codebook: dict) -> list[dict]:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path), codebook), nprocs=2, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]


def test_ddp_codebooks_identical_and_equal_to_global_batch(tmp_path: Path) -> None:
    ranks = _run_ddp(tmp_path, {"decay": 0.9})
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), key
    single = _make(decay=0.9).train()
    for step in range(STEPS):
        parts = [_batch(step, r) for r in range(2)]
        single(*(torch.cat(xs, 0) for xs in zip(*parts, strict=True)))
        single.quantizer.update()
    assert torch.allclose(single.quantizer.embed, ranks[0]["embed"], atol=1e-5)
    assert torch.allclose(single.quantizer.ema_count, ranks[0]["ema_count"], atol=1e-5)


def test_ddp_dead_code_reset_and_kmeans_init_stay_in_sync(tmp_path: Path) -> None:
    ranks = _run_ddp(
        tmp_path, {"decay": 0.5, "dead_code_threshold": 0.9, "kmeans_init": True, "kmeans_iters": 3}
    )
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), key
    assert bool(ranks[0]["initialized"])
