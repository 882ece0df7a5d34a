"""Chapter 09: the Trainer and accelerate scripts as the page writes them (any causal LM, resumed equal to the
run that never stopped, an export ``from_pretrained`` loads, copied alone into an empty folder), the accelerate
script's guard against the CPU trap, the records of a collective only rank 0
calls and where they diverge, the step's peak memory when ``measure_memory`` resets CUDA's statistic, and
the chapter's pictures (a launch tree, the ranks' records, memory over a step)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import matplotlib
import nbformat
import pytest
import torch
from torch.testing import assert_close

import parlab
from parlab.lab.job import debug, hf

matplotlib.use("Agg")
NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "09_trainer_and_debugging.ipynb"


def _script(name: str) -> str:
    """The chapter's script ``name`` as the page writes it: ``hf.write_script_start``'s lines, then its
    %%writefile cells (``-a`` appends)."""
    text = hf.SCRIPT_START.get(name, "")
    for cell in nbformat.read(NOTEBOOK, as_version=4).cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type == "code" and first.startswith("%%writefile") and first.endswith(f"/{name}"):
            text = (text if " -a " in first else "") + body + "\n"
    assert text != hf.SCRIPT_START.get(name, ""), f"no %%writefile cell writes {name}"
    return text


_SMALL = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
              intermediate_size=64, max_position_embeddings=64)
#: Tiny causal LMs of six architectures, built from configs (nothing fetched). GPT-NeoX writes its output
#: layer ``lm_head`` into a checkpoint as ``embed_out``; OPT and Phi have biases and other norms.
ARCHITECTURES = {
    "gpt2": dict(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                 attn_pdrop=0.0),
    "llama": _SMALL,
    "gpt_neox": dict(_SMALL, hidden_dropout=0.0, attention_dropout=0.0),
    "opt": dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64,
                max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.0, attention_dropout=0.0),
    "qwen2": _SMALL,
    "phi": dict(_SMALL, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0),
}
JOB = dict(pretrained="model", data="rows.pt", out="out", steps=4, save_every=1, global_batch=24, accumulation=2,
           lr=0.3, momentum=0.9, max_grad_norm=0.5, processes=2)


def _folder(folder: Path, arch: str) -> Path:
    """A job's folder as a download and ``make_data.py`` would leave it: ``model/`` (a tiny ``arch`` from its
    config) and ``rows.pt`` (chapter 08's dict, rows padded at unequal lengths, labels -100 there)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **ARCHITECTURES[arch]))
    model.save_pretrained(folder / "model")
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(128, (96, 32), generator=g)
    labels = input_ids.clone()
    for row, end in enumerate(torch.randint(16, 33, (96,), generator=g).tolist()):
        labels[row, end:] = -100
    torch.save({"input_ids": input_ids, "labels": labels}, folder / "rows.pt")
    return folder


def _write_job(folder: Path, name: str, **changes) -> str:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(dict(JOB, **changes)))
    return str(path)


def _final(folder: Path) -> dict:
    """The exported folder, loaded as anyone would load it."""
    from transformers import AutoModelForCausalLM

    return dict(AutoModelForCausalLM.from_pretrained(folder).named_parameters())


def _same(a: dict, b: dict, label: str):
    assert a.keys() == b.keys(), label
    for name in a:
        assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{label}, {name}: {m}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_IN_ONE_PROCESS = """
import json, os, runpy, sys
def _exit(code=0):
    raise SystemExit(code)
os._exit = _exit  # the scripts end with os._exit: here, the next job runs in this process
results = {}
for script, job in json.loads(sys.argv[1]):
    sys.argv = [script, job]
    try:
        runpy.run_path(script, run_name="__main__")
        results[job] = "ok"
    except SystemExit as e:
        results[job] = "ok" if e.code in (0, None) else f"exit: {e.code}"
    except Exception as e:
        results[job] = f"{type(e).__name__}: {e}"
print("RESULTS " + json.dumps(results))
"""


def _in_one_process(runs: list[tuple[Path, str]]) -> dict:
    """Run each (script, job file) as ``torchrun --nproc-per-node 1`` would, one after another in one process (a
    rank's environment, gloo): the imports once, not once per run. What each run ended with."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    done = subprocess.run([sys.executable, "-c", _IN_ONE_PROCESS, json.dumps([[str(s), j] for s, j in runs])],
                          capture_output=True, text=True, env=env, timeout=900)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULTS ")), None)
    assert line, done.stderr[-3000:]
    return json.loads(line[len("RESULTS "):])


@pytest.mark.slow
def test_trainer_py_resumes_equal_to_the_run_that_never_stopped_for_six_architectures(tmp_path):
    """The Trainer's own resume loads a checkpoint's file without renaming its keys: GPT-NeoX's ``embed_out``
    never reaches ``lm_head``. The script loads the weights with from_pretrained and checks them after the
    Trainer's resume. Planted: weights from the job's model folder (the check refuses), and that without the
    check (the resumed run drifts from the one that never stopped: what the check is there for)."""
    script = tmp_path / "trainer.py"
    script.write_text(_script("trainer.py"))
    text = script.read_text()
    fix = 'from_pretrained(latest or path["pretrained"],'  # the weights from the checkpoint, renamed
    assert fix in text and "callbacks=[SameAsCheckpoint()]" in text
    (tmp_path / "load_planted.py").write_text(text.replace(fix, 'from_pretrained(path["pretrained"],'))
    (tmp_path / "both_planted.py").write_text(text.replace(fix, 'from_pretrained(path["pretrained"],')
                                              .replace("callbacks=[SameAsCheckpoint()]", "callbacks=[]"))
    runs, folders = [], {}
    for arch in ARCHITECTURES:
        f = folders[arch] = _folder(tmp_path / arch, arch)
        runs += [(script, _write_job(f, "half", out="resumed", steps=2)),
                 (script, _write_job(f, "rest", out="resumed")), (script, _write_job(f, "whole", out="whole"))]
    f = folders["gpt_neox"]
    for plant in ("load_planted", "both_planted"):
        runs += [(tmp_path / f"{plant}.py", _write_job(f, f"{plant}-half", out=plant, steps=2)),
                 (tmp_path / f"{plant}.py", _write_job(f, f"{plant}-rest", out=plant))]
    (tmp_path / "accel.py").write_text(_script("accel.py"))
    for name, lacking in (("trainer", "lr"), ("accel", "processes")):
        (f / f"lacking-{name}.json").write_text(json.dumps({k: v for k, v in JOB.items() if k != lacking}))
        runs.append((tmp_path / f"{name}.py", str(f / f"lacking-{name}.json")))
    results = _in_one_process(runs)
    for arch, f in folders.items():
        for name in ("half", "rest", "whole"):
            assert results[str(f / f"{name}.json")] == "ok", (arch, name, results[str(f / f"{name}.json")])
        resumed, whole = (json.loads((f / out / "run.json").read_text()) for out in ("resumed", "whole"))
        assert resumed["resumed_from"] == "checkpoint-2" and whole["resumed_from"] is None
        assert_close(torch.tensor(resumed["losses"]), torch.tensor(whole["losses"]), rtol=1e-5, atol=1e-6)
        _same(_final(f / "resumed" / "final"), _final(f / "whole" / "final"), arch)
    f = folders["gpt_neox"]
    assert results[str(f / "load_planted-half.json")] == "ok"
    assert results[str(f / "load_planted-rest.json")].startswith("RuntimeError: refusing to resume: lm_head.weight")
    assert results[str(f / "both_planted-rest.json")] == "ok"
    with pytest.raises(AssertionError, match="lm_head.weight|embed_in"):
        _same(_final(f / "both_planted" / "final"), _final(f / "whole" / "final"), "planted")
    for name, lacking in (("trainer", "lr"), ("accel", "processes")):  # a missing key stops a script by name
        assert results[str(f / f"lacking-{name}.json")] == f"exit: {f / f'lacking-{name}.json'} lacks ['{lacking}']"


@pytest.mark.slow
@pytest.mark.usefixtures("no_leftover_ranks")
def test_the_chapters_scripts_copied_alone_train_resume_and_export(tmp_path):
    """trainer.py and accel.py as the chapter writes them, alone in an empty folder, with the chapter's job files,
    launched from another folder: 2 ranks each, GPT-NeoX (whose output layer the Trainer's resume misnames)
    stopped halfway and resumed; every run equals one process, and every export loads with from_pretrained.
    Other architectures: trainer.py's resume for six, one rank each, above; on CPU ranks both scripts wrap the
    model in DDP whatever its architecture (a second one at 2 ranks was dropped for the suite's time, docs/ci.md)."""
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("trainer.py", "accel.py"):
        (scripts / name).write_text(_script(name))
    page_jobs = {name: json.loads(_script(name)) for name in ("trainer.json", "accel.json")}
    assert set(page_jobs["accel.json"]) == set(page_jobs["trainer.json"]) | {"processes"}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)

    def launch(script, job_file):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               str(scripts / script), job_file], cwd=elsewhere, capture_output=True, text=True,
                              env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    arch, stop = "gpt_neox", 2
    f = _folder(tmp_path / arch, arch)
    for script, page in (("trainer.py", "trainer.json"), ("accel.py", "accel.json")):
        out = script[:-3]
        job = dict(page_jobs[page], out=out)
        (f / f"{out}-half.json").write_text(json.dumps(dict(job, steps=stop)))
        launch(script, str(f / f"{out}-half.json"))
        (f / f"{out}.json").write_text(json.dumps(job))
        printed = launch(script, str(f / f"{out}.json"))
    reference = hf.reference_job(str(f / "trainer.json"))
    trainer = json.loads((f / "trainer" / "run.json").read_text())
    accel = [json.loads(line)["loss"] for line in printed.splitlines() if line.startswith('{"step"')]
    assert trainer["wrapped"] == "DistributedDataParallel"  # fsdp=True, on CPU ranks
    assert trainer["resumed_from"] == f"checkpoint-{stop}"
    assert_close(torch.tensor(trainer["losses"]), torch.tensor(reference["losses"]), rtol=1e-5, atol=1e-6)
    assert_close(torch.tensor(accel), torch.tensor(reference["losses"][stop:]), rtol=1e-5, atol=1e-6)
    for out in ("trainer", "accel"):
        _same(_final(f / out / "final"), reference["params"], f"{arch}, {out}.py")
    assert sorted(os.listdir(scripts)) == ["accel.py", "trainer.py"] and not os.listdir(elsewhere)


@pytest.mark.slow
def test_the_accelerate_script_refuses_one_process_when_the_job_asks_for_two(tmp_path):
    """What `accelerate launch --num_processes 2` starts on a CPU machine: one plain process. The script says
    which distributed type it got and exits before training; at 1 process asked for, it trains."""
    _folder(tmp_path, "gpt2")
    (tmp_path / "accel.py").write_text(_script("accel.py"))
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    outcomes = {}
    for asked in (2, 1):
        job = _write_job(tmp_path, "job", out=f"out{asked}", steps=1, processes=asked)
        done = subprocess.run([sys.executable, str(tmp_path / "accel.py"), job],
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
