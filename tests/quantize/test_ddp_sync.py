"""Under DDP (2 gloo processes on CPU) every rank holds the identical codebook, equal to the
single-process codebook trained on the union of the ranks' batches; the stateful remedies (k-means init,
decay warm-up, relative dead-code re-seeding, for the EMA and the affine rule) stay in sync, and re-seeding
really re-seeds codes, from rank 0's keys."""

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
    return build_attention("vq", d_k=4, d_v=3, heads=2, codebook_size=16, block_len=4, codebook=codebook)


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return (
        torch.randn(2, 2, 12, 4, generator=g),
        torch.randn(2, 2, 12, 4, generator=g),
        torch.randn(2, 2, 12, 3, generator=g),
    )


def _worker(rank: int, world: int, init_file: str, out_dir: str, codebooks: list[dict]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for i, codebook in enumerate(codebooks):
            attn = _make(**codebook).train()
            after_step = []
            for step in range(STEPS):
                attn(*_batch(step, rank))
                attn.quantizer.update()
                after_step.append(attn.quantizer.codebook.detach().clone())
            state = attn.quantizer.state_dict() | {"codebooks": torch.stack(after_step)}
            torch.save(state, Path(out_dir) / f"{i}.rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_ddp(tmp_path: Path, *codebooks: dict) -> list[list[dict]]:
    """Per codebook config, every rank's quantiser state (plus its codebook after each step)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path), list(codebooks)), nprocs=2, join=True)
    return [[torch.load(tmp_path / f"{i}.rank{r}.pt") for r in range(2)] for i in range(len(codebooks))]


def test_ddp_codebooks_identical_and_equal_to_global_batch(tmp_path: Path) -> None:
    (ranks,) = _run_ddp(tmp_path, {"decay": 0.9})
    for key in ranks[0]:
        assert torch.equal(ranks[0][key], ranks[1][key]), key
    single = _make(decay=0.9).train()
    for step in range(STEPS):
        parts = [_batch(step, r) for r in range(2)]
        single(*(torch.cat(xs, 0) for xs in zip(*parts, strict=True)))
        single.quantizer.update()
    assert torch.allclose(single.quantizer.embed, ranks[0]["embed"], atol=1e-5)
    assert torch.allclose(single.quantizer.embed, ranks[0]["codebooks"][-1], atol=1e-5)
    assert torch.allclose(single.quantizer.ema_count, ranks[0]["ema_count"], atol=1e-5)


def test_ddp_reseeding_kmeans_init_and_warmup_stay_in_sync(tmp_path: Path) -> None:
    remedies = {"decay": 0.5, "decay_warmup": 2, "reseed_fraction": 0.5, "init": "kmeans", "kmeans_iters": 3}
    for ranks in _run_ddp(tmp_path, remedies | {"update": "ema"}, remedies | {"update": "affine"}):
        for key in ranks[0]:
            assert torch.equal(ranks[0][key], ranks[1][key]), key
        assert bool(ranks[0]["initialized"]) and int(ranks[0]["steps"]) == STEPS
        reseeded = 0
        for step in range(1, STEPS):  # a code that moved onto one of rank 0's keys of the step was re-seeded
            before, after = ranks[0]["codebooks"][step - 1], ranks[0]["codebooks"][step]
            keys = _batch(step, 0)[1].transpose(0, 1).reshape(2, -1, 4)  # (H, N, d)
            distance = (after[:, :, None] - keys[:, None]).norm(dim=-1).amin(-1)  # (H, S)
            reseeded += int(((distance < 1e-5) & (after - before).norm(dim=-1).gt(1e-6)).sum())
        assert reseeded > 0
