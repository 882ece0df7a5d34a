"""From notebook to cluster: the same functions under torchrun (two agents standing in for two nodes)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid

import pytest
import torch

import parlab
from parlab.lab.builtin import STRATEGIES
from parlab.lab.launch.cluster import Job, current_job
from parlab.lab.training import train_single

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3


@pytest.fixture
def clean_env(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
                "PARLAB_IN_RANK"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_detects_torchrun_slurm_and_nothing(clean_env):
    assert current_job() is None
    clean_env.setenv("SLURM_PROCID", "5")
    clean_env.setenv("SLURM_NTASKS", "8")
    clean_env.setenv("SLURM_LOCALID", "1")
    clean_env.setenv("SLURM_NTASKS_PER_NODE", "4(x2)")
    assert current_job() is None  # SLURM without a rendezvous address is not a job parlab can join
    clean_env.setenv("MASTER_ADDR", "node0")
    clean_env.setenv("MASTER_PORT", "29400")
    assert current_job() == Job(5, 8, 1, 4, "slurm")
    for key, value in dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                           TORCHELASTIC_RUN_ID="x").items():
        clean_env.setenv(key, value)
    assert current_job() == Job(3, 4, 1, 2, "torchrun")
    clean_env.setenv("PARLAB_IN_RANK", "1")  # a rank that parlab itself started is not a job
    assert current_job() is None


def test_world_size_must_match_the_job(clean_env):
    for key, value in dict(RANK="0", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT="1").items():
        clean_env.setenv(key, value)
    with pytest.raises(ValueError, match=r"launch\(world_size=2\) was called in a job of 4 ranks"):
        parlab.launch(lambda: None, 2)


def test_single_rank_job_runs_in_process(clean_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        clean_env.setenv(key, value)
    assert parlab.launch(lambda: (os.getpid(), parlab.world_size()), 1, announce=False) == (os.getpid(), 1)
    assert not torch.distributed.is_initialized()  # the group it made is torn down


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: processes per node: one, so two nodes are two ranks, but mix_2d's dp=2 × tp=2 mesh keeps its TP pairs inside
#: a node (and a local rank that is not the rank). Each rank imports torch: 2 per node cost about 10 s a test.
PER_NODE = {"mix_2d": 2}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_example_on_two_torchrun_agents_matches_launch(name, tmp_path, clean_env):
    port, run_id = _free_port(), uuid.uuid4().hex[:8]
    per_node = PER_NODE.get(name, 1)
    agents = []
    for node in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(per_node),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
               "--max-restarts", "0", os.path.join(ROOT, "examples", f"{name}.py"), "--steps", str(STEPS),
               "--out", str(tmp_path / f"node{node}.json")]
        agents.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    for agent in agents:
        try:
            outputs.append(agent.communicate(timeout=300)[0])
        except subprocess.TimeoutExpired:
            for a in agents:
                a.kill()
            raise
    assert [a.returncode for a in agents] == [0, 0], "\n".join(outputs)[-4000:]
    written = [p for p in tmp_path.iterdir()]
    assert len(written) == 1  # rank 0 alone writes, on whichever agent holds it
    cluster_losses = json.loads(written[0].read_text())
    launched = parlab.launch(STRATEGIES[name], 2 * per_node, kwargs={"steps": STEPS}, announce=False)
    assert all(losses == launched[0] for losses in launched)
    torch.testing.assert_close(torch.tensor(cluster_losses), torch.tensor(launched[0]))
    torch.testing.assert_close(torch.tensor(cluster_losses), torch.tensor(train_single(STEPS)))
