"""The course's tensor parallelism (``parlab.lab.parallel.tensor``) against DTensor's ``parallelize_module``:
step time and bytes per step, same model, same ranks, one run (chapter 05; ``benchmarks/tensor_parallel.py``).

Two models: ``mlp``, a stack of residual MLP blocks (``parlab.lab.models.tiny_blocks``: up by columns, down by
rows), and ``llama``, the decoder blocks of a Llama built from a config (attention by heads, SwiGLU MLP,
vocabulary-parallel embedding). Both implementations split them the same way, so they must send the same
bytes; their step times are taken in alternating rounds (``time_alternating``), so that whatever else the
machine does falls on both alike. The Llama is compared without sequence parallelism and without its LM
head and loss (its base model's hidden states), so what is byte-for-byte equal is the decoder blocks and
the embedding.

Also here, for chapter 05's "Under the hood": one GPT-2 layer's all-reduces as training issues them, timed
beside chapter 02's α-β fit on the same ranks (:func:`layer_all_reduces`, :func:`per_layer_times`), with
the share of the time the ranks' threads waited for a core (:func:`run_delay`), and the bytes gloo writes
for one collective of each kind (:func:`bytes_per_op`).
"""

from __future__ import annotations

import functools

import torch

import parlab
from parlab.lab.measure import bytes_written, record_comm, time_alternating
from parlab.lab.parallel.comm import _all_gather, _reduce_scatter  # PyTorch 2.13's names where it has them

KINDS = ("scratch", "dtensor")
LABELS = {"scratch": "course (from scratch)", "dtensor": "DTensor parallelize_module"}
MODELS = ("mlp", "llama")
PRESETS = {  # a CPU box, and GPUs
    "cpu": dict(hidden=256, layers=4, heads=8, kv_heads=4, seq_len=128, batch=4, vocab=1024, mlp_batch=512),
    "gpu": dict(hidden=2048, layers=4, heads=16, kv_heads=8, seq_len=1024, batch=8, vocab=32000, mlp_batch=8192),
}


def build(model: str, how: str, cfg: dict, mesh):
    """(parallel model, step function) for one model and implementation, on this rank."""
    from torch.distributed.tensor.parallel import parallelize_module

    from parlab.lab.compose import blocks_tp_plan
    from parlab.lab.models import tiny_blocks, tiny_llama, token_batch
    from parlab.lab.parallel.tensor_models import parallelize_lm
    from parlab.lab.parallel.tensor_plan import parallelize

    dev = parlab.device()
    if model == "mlp":
        m = tiny_blocks(cfg["layers"], cfg["hidden"], seed=0).to(dev)
        if how == "scratch":
            parallelize(m, {"*.up": "colwise", "*.down": "rowwise"}, mesh.get_group())
        else:
            parallelize_module(m, mesh, blocks_tp_plan(m))
        x = torch.randn(cfg["mlp_batch"], cfg["hidden"], generator=torch.Generator().manual_seed(0)).to(dev)
        loss = lambda: m(x).pow(2).mean()
    else:
        m = tiny_llama(cfg["layers"], cfg["hidden"], cfg["heads"], cfg["kv_heads"], 4 * cfg["hidden"], cfg["vocab"],
                       cfg["seq_len"], seed=0).to(dev)
        parallelize_lm(m, how, mesh)
        ids = token_batch(cfg["batch"], cfg["seq_len"], cfg["vocab"], seed=0).to(dev)
        loss = lambda: m.model(input_ids=ids).last_hidden_state.pow(2).mean()
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)

    def step():
        loss().backward()
        opt.step()
        opt.zero_grad()

    return m, step


def measure(cfg: dict) -> dict:
    """Runs on every rank: per model, step times of both (one per round), and the collectives of a step."""
    from parlab.lab.topology import Topology

    mesh = Topology.build(tp=parlab.world_size()).submesh("tp")
    out = {}
    for model in cfg.get("models", MODELS):
        steps = {how: build(model, how, cfg, mesh)[1] for how in KINDS}
        times = time_alternating({k: functools.partial(steps[k]) for k in KINDS}, rounds=cfg["rounds"],
                                 steps=cfg["steps"], warmup=cfg["warmup"])
        collectives, sent = {}, {}
        for how in KINDS:
            before = bytes_written()
            with record_comm() as log:
                steps[how]()
            after = bytes_written()
            collectives[how] = [(r.op, r.bytes) for r in log.records]
            sent[how] = None if before is None or parlab.device().type != "cpu" else after - before
        out[model] = {"times": times, "collectives": collectives, "sent": sent}
    return out


def summary(raw: dict) -> dict:
    """What the script and the chapter report: medians, paired throughput ratios, bytes per step (the
    records' nccl-tests sizes), whether both sent the same, and whether the targets are met."""
    from parlab.lab.measure import summarize

    out = {"median_step_s": {}, "throughput_vs_dtensor": {}, "bytes_per_step": {}, "same_collectives": {},
           "bytes_written": {}}
    for model, r in raw.items():
        out["median_step_s"][model], out["throughput_vs_dtensor"][model] = summarize(r["times"], reference="dtensor")
        out["bytes_per_step"][model] = {k: sum(b for _, b in r["collectives"][k]) for k in KINDS}
        out["same_collectives"][model] = sorted(r["collectives"]["scratch"]) == sorted(r["collectives"]["dtensor"])
        out["bytes_written"][model] = r["sent"]
    out["target_met"] = all(out["same_collectives"].values()) and all(
        v["scratch"] >= 0.8 for v in out["throughput_vs_dtensor"].values())
    return out


def plot(result: dict, title: str):
    import matplotlib.pyplot as plt

    models = list(result["median_step_s"])
    fig, ax = plt.subplots(figsize=(7.5, 1.1 + 0.9 * len(models)))
    y, labels = 0, []
    for model in models:
        for k, color in zip(KINDS, ("#3377bb", "#cc6633")):
            t = result["median_step_s"][model][k] * 1e3
            ax.barh(y, t, color=color)
            note = (f"  {result['throughput_vs_dtensor'][model]['scratch']:.2f}x DTensor, "
                    f"{result['bytes_per_step'][model][k] / 1024:.0f} KiB/step") if k == "scratch" else \
                f"  {result['bytes_per_step'][model][k] / 1024:.0f} KiB/step"
            ax.text(t, y, note, va="center", fontsize=8)
            labels.append(f"{model}: {LABELS[k]}")
            y += 1
    ax.set_yticks(range(y), labels)
    ax.invert_yaxis()
    ax.set_xlabel("median step time (ms), lower is better")
    ax.set_xlim(0, max(v for m in models for v in result["median_step_s"][m].values()) * 1e3 * 1.6)
    ax.set_title(title, fontsize=9)
    return fig


# -- chapter 05, under the hood: one layer's all-reduces on this machine, beside chapter 02's fit -----------

def own_time(starts, ends):
    """Per call, from every rank's start and end of it (arrays (ranks, calls)): the median over ranks of the
    time from the last rank's arrival to each rank's end (the call's own time), and of the time from each
    rank's start to that arrival (waiting). ``perf_counter`` is one clock for all processes of a machine."""
    import numpy as np

    starts, ends = np.asarray(starts), np.asarray(ends)
    arrive = starts.max(axis=0)
    return np.median(ends - arrive, axis=0), np.median(arrive - starts, axis=0)


def run_delay():
    """Seconds this process's threads (the rank's and gloo's) have so far spent runnable but waiting for a
    core: the second field of Linux's ``/proc/<pid>/task/<tid>/schedstat``; None where there is none."""
    import os

    total = 0
    try:
        for tid in os.listdir(f"/proc/{os.getpid()}/task"):
            with open(f"/proc/{os.getpid()}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return total / 1e9


def sweep_own(sizes, reps: int = 7):
    """Chapter 02's all-reduce sweep, timed as training's all-reduces are: each call after a barrier, from the
    last rank's arrival (``measure.sweep`` reports the slowest rank's time from the barrier, which on shared
    cores also counts the ranks' skew in leaving it). → (seconds per size, share of the calls' time the
    threads were runnable without a core, or None)."""
    import time

    import numpy as np

    out, delays, walls = [], [], []
    for size in sizes:
        x = torch.ones(size // 4, device=parlab.device())  # fp32
        sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
        torch.distributed.all_reduce(x)  # once untimed: connections and buffers set up
        starts, ends = [], []
        for _ in range(reps):
            torch.distributed.barrier()
            sync()
            delay = run_delay()
            starts.append(time.perf_counter())
            torch.distributed.all_reduce(x)
            sync()
            ends.append(time.perf_counter())
            delays.append(None if delay is None else run_delay() - delay)
            walls.append(ends[-1] - starts[-1])
        every = [None] * parlab.world_size()
        torch.distributed.all_gather_object(every, (starts, ends))
        out.append(float(np.median(own_time([s for s, _ in every], [e for _, e in every])[0])))
    return out, (None if None in delays else sum(delays) / sum(walls))


def layer_all_reduces(cfg: dict, n_steps: int = 5):
    """On every rank: chapter 02's α-β fit over all-reduces of m/4, m and 4m bytes (m = b·s·h·4, one
    activation), then ``n_steps`` recorded forward-backward steps of a tiny GPT-2 split by the course's
    plan. → (fit, per step this rank's records of the blocks' collectives, seconds per step, (share of the
    sweep's and of the steps' time without a core) or None)."""
    import time

    from parlab.lab.measure import CommLog, fit_alpha_beta
    from parlab.lab.models import tiny_gpt2, token_batch
    from parlab.lab.parallel import tensor_models as tm
    from parlab.lab.parallel.tensor import vocab_parallel_cross_entropy
    from parlab.lab.parallel.tensor_plan import parallelize

    m = cfg["batch"] * cfg["seq_len"] * cfg["hidden"] * 4
    sizes = [m // 4, m, 4 * m]
    swept, no_core_sweep = sweep_own(sizes)
    model = tiny_gpt2(n_layer=cfg["layers"], n_embd=cfg["hidden"], n_head=cfg["heads"], vocab_size=cfg["vocab"],
                      n_positions=cfg["seq_len"])
    n = parlab.world_size()
    parallelize(model, tm.scratch_plan(model, n))
    tm.localize_heads(model, n)
    ids, per_step, step_s, delays = token_batch(cfg["batch"], cfg["seq_len"], cfg["vocab"], seed=0), [], [], []
    for _ in range(n_steps):
        delay, start = run_delay(), time.perf_counter()
        with CommLog() as log:
            logits = model(input_ids=ids).logits
            vocab_parallel_cross_entropy(logits[:, :-1], ids[:, 1:]).backward()
        step_s.append(time.perf_counter() - start)
        delays.append(None if delay is None else run_delay() - delay)
        per_step.append([r for r in log.records if str(r.label).startswith("transformer.h.")])
    no_core = None if None in delays or no_core_sweep is None else (no_core_sweep, sum(delays) / sum(step_s))
    return fit_alpha_beta(sizes, swept), per_step, step_s, no_core


def per_layer_times(runs, n_layer: int):
    """From every rank's :func:`layer_all_reduces`: per layer, the median over steps of the all-reduces' own
    time, of the time waited for the last rank, and the share of the step spent in them. An all-reduce
    cannot finish before its last rank arrives; a shared CPU deschedules ranks now and then."""
    import numpy as np

    own, waited, share = [], [], []
    for s in range(len(runs[0][1])):
        ranks_recs = [run[1][s] for run in runs]  # every rank's per-layer all-reduces of step s, in order
        mine, wait = own_time([[r.start for r in recs] for recs in ranks_recs],
                              [[r.end for r in recs] for recs in ranks_recs])
        own.append(mine.sum() / n_layer)
        waited.append(wait.sum() / n_layer)
        share.append(np.mean([sum(r.end - r.start for r in run[1][s]) / run[2][s] for run in runs]))
    return float(np.median(own)), float(np.median(waited)), float(np.median(share))


def bytes_per_op(kinds):
    """On every rank: the bytes this rank writes (:func:`bytes_written`) for one collective of each
    ``(op, buffer bytes)``, after a first call that sets up its connections; None values off Linux."""
    n, out = parlab.world_size(), {}
    for op, nbytes in kinds:
        x = torch.ones(nbytes // 4)  # fp32
        run = {"all_reduce": lambda: torch.distributed.all_reduce(x),
               "all_gather": lambda: _all_gather(torch.empty_like(x), x[:x.numel() // n]),
               "reduce_scatter": lambda: _reduce_scatter(torch.empty(x.numel() // n), x)}[op]
        run()
        before = bytes_written()
        run()
        out[op, nbytes] = None if before is None else bytes_written() - before
    return out
