"""The course's tensor parallelism (``parlab.parallel.tensor``) against DTensor's ``parallelize_module``:
step time and bytes per step, same model, same ranks, one run (chapter 05; ``benchmarks/tensor_parallel.py``).

Two models: ``mlp``, a stack of residual MLP blocks (``parlab.models.tiny_blocks``: up by columns, down by
rows), and ``llama``, the decoder blocks of a Llama built from a config (attention by heads, SwiGLU MLP,
vocabulary-parallel embedding). Both implementations split them the same way, so they must send the same
bytes; their step times are taken in alternating rounds (``time_alternating``), so that whatever else the
machine does falls on both alike.
"""

from __future__ import annotations

import functools

import torch

import parlab
from parlab.measure import record_comm, time_alternating

KINDS = ("scratch", "dtensor")
LABELS = {"scratch": "course (from scratch)", "dtensor": "DTensor parallelize_module"}
MODELS = ("mlp", "llama")
PRESETS = {  # a CPU box, and GPUs
    "cpu": dict(hidden=256, layers=4, heads=8, kv_heads=4, seq_len=128, batch=4, vocab=1024, mlp_batch=512),
    "gpu": dict(hidden=2048, layers=4, heads=16, kv_heads=8, seq_len=1024, batch=8, vocab=32000, mlp_batch=8192),
}


def bytes_written():
    """Bytes this process has written so far (/proc/self/io; Linux): on CPU, gloo's traffic; else None."""
    try:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("wchar")).split()[1])
    except (OSError, StopIteration):
        return None


def build(model: str, how: str, cfg: dict, mesh):
    """(parallel model, step function) for one model and implementation, on this rank."""
    from torch.distributed.tensor.parallel import parallelize_module

    from parlab.compose import blocks_tp_plan
    from parlab.models import tiny_blocks, tiny_llama, token_batch
    from parlab.parallel.tensor_models import parallelize_lm
    from parlab.parallel.tensor_plan import parallelize

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
    from parlab.parallel.topology import Topology

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
    from parlab.measure import summarize

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
