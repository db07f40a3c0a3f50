"""``RngState``: the random states a checkpoint keeps, so a resumed run draws what an uninterrupted one would. The GPU
branch runs on CPU with torch.cuda's generator functions stood in for (a device's state is a byte tensor)."""

from __future__ import annotations

import pytest
import torch

from tvq_exp.callbacks.rng_state import RngState


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """A machine whose process trains on one GPU: its generator's state, and what is restored to it (appended)."""
    restored: list[torch.Tensor] = []

    def every_device(*args: object) -> None:
        raise AssertionError("every visible device's generator is not this process's")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_rng_state", lambda device="cuda": torch.tensor([7, 1], dtype=torch.uint8)
    )
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append(state))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", every_device)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", every_device)
    return restored


def test_a_checkpoint_keeps_the_generator_of_the_device_the_process_trains_on(
    one_gpu: list[torch.Tensor],
) -> None:
    state = RngState().state_dict()
    assert torch.equal(state["cuda_device"], torch.tensor([7, 1], dtype=torch.uint8)) and "cuda" not in state
    RngState().load_state_dict(state)
    assert [s.tolist() for s in one_gpu] == [[7, 1]]


def test_a_checkpoint_of_every_visible_device_resumes_on_fewer(one_gpu: list[torch.Tensor]) -> None:
    """Before 2026-11-29 a checkpoint kept all eight visible devices' generators: on a machine with one GPU, restoring
    them all failed. The first, rank 0's own device's, is restored."""
    state = RngState().state_dict()
    del state["cuda_device"]
    state["cuda"] = [torch.full((2,), i, dtype=torch.uint8) for i in range(8)]
    RngState().load_state_dict(state)
    assert [s.tolist() for s in one_gpu] == [[0, 0]]


def test_the_host_generators_resume_where_they_were() -> None:
    torch.manual_seed(3)
    state = RngState().state_dict()
    assert "cuda_device" not in state and "cuda" not in state  # no GPU here
    expected = torch.rand(4)
    torch.manual_seed(9)
    RngState().load_state_dict(state)
    assert torch.equal(torch.rand(4), expected)
