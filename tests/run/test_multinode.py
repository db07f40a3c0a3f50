"""Several nodes, simulated: two ``torchrun`` agents on loopback (``--nnodes 2``, one gloo process each, the
c10d rendezvous on 127.0.0.1) train the smoke preset into one run directory, and both ranks end with identical
weights, equal to the checkpoint's: the multi-node path docs/distributed.md gives, on one machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

from tests.helpers.paths import REPO
from tvq_exp.run.checkpoints import gather_checkpoint

STEPS = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_nodes(run_dir: Path, cwd: Path, *extra: str) -> list[subprocess.CompletedProcess[str]]:
    """Start both "nodes" at once (the same command line, as docs/distributed.md says, ``extra`` at its end) and
    wait for them."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", "multinode_test",
        str(REPO / "train.py"), "experiment=smoke", "trainer=ddp_cpu", "trainer.num_nodes=2", "trainer.devices=1",
        f"hydra.run.dir={run_dir}", f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={STEPS}",
        "trainer.limit_val_batches=1", "trainer.enable_progress_bar=false", "print_config=false", "torch_threads=1",
        "++callbacks.rank_weights._target_=tests.helpers.rank_weights.RankWeights",
        f"++callbacks.rank_weights.output_dir={run_dir}", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore", "GLOO_SOCKET_IFNAME": "lo",
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    nodes = [
        subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = []
    for node in nodes:
        out, err = node.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(command, node.returncode, out, err))
    return results


def test_two_torchrun_nodes_train_one_run_with_identical_weights(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    nodes = torchrun_nodes(run_dir, tmp_path)
    for node in nodes:
        assert node.returncode == 0, node.stderr[-4000:]
    output = "".join(node.stdout for node in nodes)
    assert "global batch 16 sequences = 8 per device x 2 processes x 1 accumulation" in output
    assert [p.name for p in tmp_path.iterdir()] == [
        "run"
    ]  # one run dir, no other (no logs/ of a second node)
    ranks = [torch.load(run_dir / f"weights-rank{r}.pt", weights_only=True) for r in (0, 1)]
    inputs = [rank.pop("first batch:input") for rank in ranks]
    assert not torch.equal(
        inputs[0], inputs[1]
    )  # each rank trained on its own data: the sameness is DDP's doing
    stored = gather_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert stored["global_step"] == STEPS
    assert ranks[0].keys() == ranks[1].keys() == stored["state_dict"].keys()
    for name, weight in ranks[0].items():
        assert torch.equal(weight, ranks[1][name]), f"{name} differs between the nodes"
        assert torch.equal(weight, stored["state_dict"][name]), f"{name} differs from the checkpoint"
