"""Chapter 09: the accelerate script's guard against the CPU trap, the records of a collective only rank 0
calls and where they diverge, the step's peak memory when ``measure_memory`` resets CUDA's statistic, and
the chapter's pictures (a launch tree, the ranks' records, memory over a step)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import nbformat
import pytest
import torch

import parlab
from parlab.lab.job import debug, train_fsdp

matplotlib.use("Agg")
NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "09_trainer_and_debugging.ipynb"


def _script(name: str) -> str:
    """The chapter's script ``name`` as its %%writefile cells write it (``-a`` appends)."""
    text = ""
    for cell in nbformat.read(NOTEBOOK, as_version=4).cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type == "code" and first.startswith("%%writefile") and first.endswith(f"/{name}"):
            text = (text if " -a " in first else "") + body + "\n"
    assert text, f"no %%writefile cell writes {name}"
    return text


@pytest.mark.slow
def test_the_accelerate_script_refuses_one_process_when_the_job_asks_for_two(tmp_path):
    """What `accelerate launch --num_processes 2` starts on a CPU machine: one plain process. The script says
    which distributed type it got and exits before training; at 1 process asked for, it trains."""
    cfg = dict(train_fsdp.CONFIG, steps=1)
    train_fsdp.build_model(cfg).save_pretrained(tmp_path / "model")
    torch.save(train_fsdp.dataset(cfg), tmp_path / "rows.pt")
    (tmp_path / "accel.py").write_text(_script("accel.py"))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    outcomes = {}
    for asked in (2, 1):
        job = dict(model=str(tmp_path / "model"), data=str(tmp_path / "rows.pt"), out=str(tmp_path / f"out{asked}"),
                   steps=1, save_every=1, global_batch=24, accumulation=2, lr=0.3, momentum=0.9, max_grad_norm=0.5,
                   processes=asked)
        os.makedirs(job["out"])
        (tmp_path / "job.json").write_text(json.dumps(job))
        done = subprocess.run([sys.executable, str(tmp_path / "accel.py"), str(tmp_path / "job.json")],
                              capture_output=True, text=True, env=env, timeout=300)
        outcomes[asked] = done
    refused, trained = outcomes[2], outcomes[1]
    assert refused.returncode != 0 and "rank 0: NO, 1 processes" in refused.stdout
    assert "refusing to train: the job asks for 2 processes, 1 is running (NO)" in refused.stderr
    assert not os.listdir(tmp_path / "out2")  # nothing trained, nothing saved
    assert trained.returncode == 0, trained.stderr[-2000:]
    assert '{"step": 1, "loss"' in trained.stdout and os.path.isdir(tmp_path / "out1" / "step_1")


def test_divergence_is_where_the_records_first_differ_not_where_one_stops():
    grads = {"op": "all_reduce", "numel": 72, "what": "gradients"}
    loss = {"op": "all_reduce", "numel": 1, "what": "loss for the log"}
    assert debug.divergence([[grads, loss], [grads, grads]]) == 1
    assert debug.divergence([[grads, grads], [grads]]) == 1  # one record ended
    assert debug.divergence([[grads], [grads]]) is None
    assert debug.divergence([[grads, dict(grads, numel=73)], [grads, grads]]) == 1  # another size


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_ranks")
def test_rank0_logging_in_a_loop_aborts_under_gloo_and_its_records_diverge_at_the_loss(tmp_path):
    with pytest.raises(parlab.RankCrashedError, match="Received data size doesn't match expected size"):
        parlab.launch(debug.log_on_rank0_loop, 2, args=(str(tmp_path),), timeout=60, output="none")
    records = debug.read_records(str(tmp_path), 2)
    assert [r["what"] for r in records[0]] == ["gradients", "loss for the log"]
    assert [r["what"] for r in records[1]][:2] == ["gradients", "gradients"]
    assert debug.divergence(records) == 1


class _FakeCuda:
    """CUDA's allocated/peak statistics, kept by hand: ``alloc``/``free`` move them, ``reset`` is CUDA's."""

    def __init__(self):
        self.allocated = self.peak = 0

    def alloc(self, n):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n):
        self.allocated -= n


def test_the_step_peak_keeps_forward_and_backward_when_measure_memory_resets_cudas_peak(monkeypatch):
    """measure_memory resets CUDA's peak statistic. step_memory measures the held states in a step of their
    own, so the step under peak_memory still sees the forward's and the backward's allocations."""
    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: fake.allocated)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: fake.peak)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: setattr(fake, "peak", fake.allocated))

    def step(measure=None):
        fake.alloc(1000)  # forward's activations
        fake.alloc(200)  # backward: gradients
        fake.free(1000)  # ... for the activations
        held = measure("model", "opt") if measure else None  # measure_memory resets the peak here
        fake.free(200)
        return held

    def measure(model, opt):
        torch.cuda.reset_peak_memory_stats()
        return "held"

    held, peak = debug.held_then_peak(step, measure, torch.device("cuda", 0))
    assert held == "held" and peak == 1200

    def measured_inside(measure=None):  # the old way: the measurement inside peak_memory's window
        return step(measure_memory_stub)

    def measure_memory_stub(model, opt):
        torch.cuda.reset_peak_memory_stats()

    from parlab.lab.measure import peak_memory

    _, lost = peak_memory(measured_inside, device=torch.device("cuda", 0))
    assert lost == 200  # what the chapter's out-of-memory band was fed before: forward and backward lost


def test_launch_tree_draws_the_ranks_asked_for_and_never_started():
    from parlab.lab.plots.launch_tree import launch_trees

    alone = [dict(rank=0, type="NO", wrapped="the bare model", blocks=["GPT2Block", "GPT2Block"])]
    fig = launch_trees([dict(command="accelerate launch --num_processes 3 accel.py", asked=3, processes=alone)])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("rank 0 · NO") == 1 and "GPT2Block 1" in texts
    assert sum("never started" in t for t in texts) == 2  # ranks 1 and 2


def test_records_picture_frames_the_divergence_column():
    from matplotlib.patches import Rectangle

    from parlab.lab.plots.collective_records import records

    g = {"op": "all_reduce", "numel": 72, "what": "gradients"}
    per_rank = [[dict(g, seq=0), {"seq": 1, "op": "all_reduce", "numel": 1, "what": "loss"}],
                [dict(g, seq=0), dict(g, seq=1)]]
    fig = records(per_rank, debug.divergence(per_rank), {0: "aborted"})
    frames = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_edgecolor()[0] > 0.6
              and not p.get_fill()]
    assert len(frames) == 1 and frames[0].get_x() == 1
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "#1 all_reduce\n1 el. · loss" in texts and "aborted" in texts


def test_memory_over_a_step_starts_at_what_is_held_and_draws_the_device():
    from parlab.lab.plots.step_memory import over_a_step

    measured = {"ddp": {"between_steps": 3e6, "curve": [(0.0, 0), (1.0, 2_000_000), (2.0, 500_000)]},
                "fsdp2": {"between_steps": 1e6, "curve": [(0.0, 0), (7.0, 1_500_000), (8.0, 0)]}}
    fig = over_a_step(measured, 4e6)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    assert list(lines["ddp: peak 5.0 MB"].get_ydata()) == [3.0, 5.0, 3.5]
    assert list(lines["fsdp2: peak 2.5 MB"].get_xdata()) == [0.0, 0.5, 1.0]  # a share of the step's events
    assert any(list(line.get_ydata()) == [4.0, 4.0] for line in ax.lines)  # the device's line


def test_step_flops_draws_the_counters_parts_and_the_time_at_peak():
    """Section 5's picture: forward and backward bars split into the weights' products and attention's
    (bmm), from the counters themselves; the step's time split at FLOPs / peak; MFU in the title."""
    from torch.utils.flop_counter import FlopCounterMode

    from parlab.lab.plots.step_flops import flops_and_time

    w, q = torch.randn(8, 8, requires_grad=True), torch.randn(2, 4, 8, requires_grad=True)
    with FlopCounterMode(display=False) as forward:
        loss = (torch.randn(16, 8) @ w).sum() + (q @ q.transpose(1, 2)).sum()  # a mm and a bmm
    with FlopCounterMode(display=False) as backward:
        loss.backward()
    total = forward.get_total_flops() + backward.get_total_flops()
    fig = flops_and_time(forward, backward, 2 * total / 1e9, 1e9)  # the FLOPs take half the step at peak
    left, right = fig.axes
    widths = {(round(b.get_y() + b.get_height() / 2), b.get_facecolor()): b.get_width() for b in left.patches}
    assert sum(widths.values()) * 1e6 == pytest.approx(total)
    assert sum(v for (y, _), v in widths.items() if y == 1) * 1e6 == pytest.approx(forward.get_total_flops())  # forward on top
    assert forward.get_flop_counts()["Global"][torch.ops.aten.bmm] == 2 * 2 * 4 * 4 * 8
    assert "MFU" in right.get_title() and "50.0%" in right.get_title()
    with pytest.raises(ValueError, match="step_seconds and peak_flops must be positive; got 0"):
        flops_and_time(forward, backward, 0, 1e9)
