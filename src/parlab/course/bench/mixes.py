"""The guide's mixes run for real: a tiny GPT-2 trained under one layout on every rank, and what the layout
costs (chapter 07).

:func:`run` builds the layout with ``parlab.lab.compose.parallelize``, trains a few steps (the losses, to hold
against one process), then measures one more step three ways: the memory each rank holds
(``Parallelized.memory``), the collectives on each axis (``comm_by_axis``) and the bytes it sends in them, and, untimed instruments
off, the step time (the slowest rank's, median of ``timed`` steps) and the pipeline's operations on a
timeline (its bubble). :func:`layout_on` scales a layout the strategy tool (``parlab.decide.advice``) recommends
for a cluster down to this machine's ranks, keeping its axes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from parlab.lab.checks import positive_int
from parlab.lab.compose import COURSE, comm_by_axis, parallelize

#: The tiny decoder of chapter 07: 4 layers, so that 2 pipeline stages hold 2 each; 4 heads for 2 TP ranks.
SIZES = dict(n_layer=4, n_embd=64, n_head=4, vocab_size=128, seq_len=32)
ADAMW = {"lr": 1e-3}


@dataclass(frozen=True)
class Mix:
    """A layout to run: axis sizes, the ZeRO stage of its dp axis, and the implementation of each axis
    (``parallelize``'s ``data_parallel``, ``tensor_parallel``, ``pipeline``, ``schedule`` arguments)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero_stage: int = 0
    how: tuple = ()

    @property
    def label(self) -> str:
        axes = [f"{name} {size}" for name, size in (("DP", self.dp), ("PP", self.pp), ("TP", self.tp)) if size > 1]
        zero = {0: "", 1: " + ZeRO-1", 2: " + ZeRO-2", 3: " + ZeRO-3 (FSDP2)"}[self.zero_stage] if self.dp > 1 else ""
        return " × ".join(axes or ["1 rank"]) + zero

    def parallelize_kwargs(self) -> dict:
        """The course's strategy on every axis, FSDP2 for ZeRO-3 (the course's ZeRO-3 takes one backward
        per step, so it does not compose with a pipeline), the course's DDP for plain data parallelism."""
        if self.zero_stage == 2:
            raise ValueError("zero_stage=2: parallelize has no ZeRO-2 (it reduce-scatters once per backward, so not "
                             "with a pipeline's micro-batches); use 1, or 3 (FSDP2)")
        dp = {0: "course-ddp", 1: "course-zero1", 3: "fsdp"}[self.zero_stage]
        return {**COURSE, "data_parallel": dp, **dict(self.how)}


def make_model(cfg: dict):
    from parlab.lab.models import tiny_gpt2

    return tiny_gpt2(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"], vocab_size=cfg["vocab_size"],
                     n_positions=cfg["seq_len"], seed=0, tie_word_embeddings=False)


def batches(cfg: dict, steps: int, start: int = 0) -> list:
    """Global batches of token ids, ``(inputs, targets)`` alike (the loss shifts them)."""
    from parlab.lab.models import token_batch

    return [(t, t) for t in (token_batch(cfg["global_batch"], cfg["seq_len"], cfg["vocab_size"], seed=s)
                             for s in range(start, start + steps))]


def run(mix: Mix, cfg: dict) -> dict:
    """On every rank: train ``cfg["steps"]`` steps of :func:`make_model` under ``mix`` with
    ``cfg["micro_batches"]`` micro-batches per pipeline step; then measure. Returns this rank's
    ``losses``, ``coords``, ``memory`` (bytes by part), ``bytes`` ({axis: {op: bytes}} of one step: the
    collectives' buffers, nccl-tests' "size", summed), ``sent`` ({axis: bytes this rank sends in that step},
    :func:`bytes_sent` of each), ``step_s`` (the slowest rank's median), ``events`` (a timeline of one step's pipeline operations),
    and ``recorded``: the last timed step's start, end, and the collectives the course's strategies
    reported in it, each with its start and end on this machine's one clock (:func:`step_parts`)."""
    from parlab.lab import runtime
    from parlab.lab.measure import CommLog, Timeline
    from parlab.lab.models import shard
    from parlab.lab.parallel import Topology
    from parlab.lab.training import train_steps

    timed = positive_int('cfg["timed"]', cfg.get("timed", 3), "steps timed, the median kept")
    topo = Topology.build(dp=mix.dp, tp=mix.tp, pp=mix.pp)
    parts = parallelize(make_model(cfg), topo, num_micro_batches=cfg["micro_batches"], optimizer=torch.optim.AdamW,
                        optimizer_kwargs=ADAMW, **mix.parallelize_kwargs())
    losses = train_steps(parts, batches(cfg, cfg["steps"]))
    memory = parts.memory().as_dict()  # after a step: gradients and optimizer state exist
    x, y = (t.to(runtime.device()) for t in shard(batches(cfg, 1, start=cfg["steps"])[0], topo.coord("dp"), topo.dp))

    def step():
        parts.zero_grad()
        parts.forward_backward(x, y)
        parts.step()

    with comm_by_axis(topo) as axes:
        step()
    sizes = {axis: {} for axis in axes}
    sent = dict.fromkeys(axes, 0.0)
    for axis, records in axes.items():
        for r in records:
            if r.op != "barrier":
                sizes[axis][r.op] = sizes[axis].get(r.op, 0) + r.bytes
                sent[axis] += bytes_sent(r.op, r.bytes, r.group_size)
    seconds = []
    for _ in range(timed):
        dist.barrier()
        # The course's strategies report each collective through one door (parlab.lab.parallel.communicate): a
        # list append per op, cheap enough to leave on while the steps are timed (FSDP2's are not reported).
        with CommLog() as log:
            start = time.perf_counter()
            step()
            _sync()
            seconds.append(time.perf_counter() - start)
        recorded = (start, start + seconds[-1], list(log.records))  # the last timed step, op by op
    slowest = torch.tensor([statistics.median(seconds)], device=runtime.device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step ends when its slowest rank does
    with Timeline() as timeline:
        step()
    return {"losses": losses, "coords": {a: topo.coord(a) for a in ("pp", "dp", "tp")}, "memory": memory,
            "bytes": sizes, "sent": sent, "step_s": slowest.item(), "events": timeline.events, "recorded": recorded}


def bytes_sent(op: str, nbytes: int, group_size: int) -> float:
    """The bytes one rank sends in a collective of an ``nbytes`` buffer (nccl-tests' size) on ``group_size``
    ranks, run as a ring: each rank passes on its share of the buffer, 2(n−1)/n of it for an all-reduce
    (a reduce-scatter, then an all-gather), (n−1)/n for a reduce-scatter, an all-gather or an all-to-all
    (``parlab.lab.measure.bus_factor``, chapter 02); a message's whole size for a send, nothing for a receive."""
    from parlab.lab.measure import bus_factor

    return 0.0 if op == "recv" else nbytes * bus_factor(op, group_size)


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # GPU work is asynchronous: wait for it
        torch.cuda.synchronize()


def reference(cfg: dict) -> list[float]:
    """One process, the whole batch: the losses every layout must reproduce."""
    from parlab.lab.training import train_reference

    return train_reference(make_model(cfg), batches(cfg, cfg["steps"]), torch.optim.AdamW, ADAMW)


def num_params(cfg: dict) -> int:
    return sum(p.numel() for p in make_model(cfg).parameters())


def params_held(cfg: dict, stage: int, pp: int = 1, tp: int = 1) -> int:
    """Parameters one rank of pipeline stage ``stage`` (of ``pp``) holds under the course's tensor
    parallelism over ``tp`` ranks, from :func:`make_model`'s shapes alone: the count the bytes on ``dp``
    follow (chapter 07). With hidden width h, vocabulary V, S positions and L/p blocks per stage, a GPT-2
    block has 12h² + 13h parameters: Megatron splits c_attn and c_fc (weights and biases) and both
    c_proj weights, 12h² + 7h, over the tp ranks; the two layer norms and the c_proj biases, 6h, stay whole
    on each. The first stage adds the token embedding, split by vocabulary (V·h / t), and the positions,
    whole (S·h); the last adds the final norm, whole (2h), and the LM head, split by vocabulary (V·h / t)."""
    h, v, s, layers = cfg["n_embd"], cfg["vocab_size"], cfg["seq_len"], cfg["n_layer"]
    if layers % pp or (12 * h * h + 7 * h + 2 * v * h) % tp or not 0 <= stage < pp:
        raise ValueError(f"stage={stage}, pp={pp}, tp={tp}: pp must divide n_layer={layers}, tp the split "
                         f"layers (width {h}, vocabulary {v}), and 0 ≤ stage < pp")
    held = layers // pp * ((12 * h * h + 7 * h) // tp + 6 * h)  # (L/p) blocks
    if stage == 0:
        held += v * h // tp + s * h  # wte split by vocabulary, wpe whole
    if stage == pp - 1:
        held += 2 * h + v * h // tp  # ln_f whole, lm_head split by vocabulary
    return held


def layout_on(label: str, world_size: int) -> Mix | None:
    """The layout a recommendation names (``parlab.decide.planner.layout_of``), on ``world_size`` ranks: the same
    axes, each model-parallel axis of size 2 (the tiny model has 4 layers and 4 heads), data parallelism
    over the rest. ``None`` for a recommendation without a layout ("ZeRO ×N: measure")."""
    from parlab.decide.planner import layout_of

    layout = layout_of(label)
    if layout is None:
        return None
    tp, pp = (2 if layout.tp > 1 else 1), (2 if layout.pp > 1 else 1)
    if world_size % (tp * pp):
        raise ValueError(f"{label!r} needs tp × pp = {tp * pp} to divide world_size={world_size}")
    dp = world_size // (tp * pp)
    return Mix(dp=dp, tp=tp, pp=pp, zero_stage=layout.zero_stage if dp > 1 else 0)


def run_many(runs: list, cfg: dict) -> list[dict]:
    """On every rank: :func:`run` for each ``(mix, changes to cfg)`` in turn, in one launch."""
    return [run(mix, {**cfg, **changes}) for mix, changes in runs]


def summarize(mix: Mix, results: list[dict], cfg: dict) -> dict:
    """What the ranks of one :func:`run` measured, beside what predicts it: the most memory any rank holds
    and ``estimate_memory``'s figure (fp32 AdamW model states), per step and axis the collectives' buffers
    (``bytes``) and the bytes a rank sends (``sent``), each the most over ranks, the step time, and the bubble of the pipeline that holds rank 0 (measured on
    its timeline, and (p − 1)/(m + p − 1))."""
    from parlab.lab.measure import estimate_memory
    from parlab.lab.parallel import pipeline_schedule as ps

    estimate = estimate_memory(num_params=num_params(cfg), optimizer="adamw", world_size=len(results),
                               tp_size=mix.tp, pp_size=mix.pp, zero_stage=mix.zero_stage if mix.dp > 1 else 0)
    axes = ("dp", "tp", "pp")
    row = {"layout": mix.label, "memory": max(r["memory"]["total"] for r in results),
           "estimate": estimate.model_states, "step_s": results[0]["step_s"],
           "bytes": {a: max(sum(r["bytes"][a].values()) for r in results) for a in axes},
           "sent": {a: max(r["sent"][a] for r in results) for a in axes}, "bubble": None,
           "bubble_formula": None}
    if mix.pp > 1:
        first = [r for r in results if r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0]
        row["bubble"] = ps.bubble_fraction([e for r in first for e in r["events"]])
        row["bubble_formula"] = ps.bubble_formula(mix.pp, cfg["micro_batches"])
    return row


def calibrate(cfg: dict, sequences: int = 2, reps: int = 4) -> dict:
    """On every rank at once (the cores shared as in training): what ``parlab.decide.planner`` needs to know of this
    machine. ``flops``: the planner's FLOPs (``Workload.model_flops``) over the time of a forward and backward of :func:`make_model` on
    ``sequences`` sequences; ``memory_bandwidth``: 32 bytes per parameter over an AdamW step's time;
    ``alpha`` and ``bandwidth``: chapter 02's fit of one message between two ranks (a broadcast within
    pairs, every pair at once). The slowest rank's figures. And what the planner leaves out: the same
    forward and backward on 1, ``sequences`` and 2 × ``sequences`` sequences (``passes``: the fastest of
    ``reps`` each), fitted as ``pass_s`` + tokens × FLOPs per token / ``marginal_flops`` (chapter 02's fit once more;
    ``None`` when the passes do not grow with their size on a loaded machine):
    ``pass_s`` is what a pass costs whatever its size (Python and the dispatch of each op), which one FLOP
    rate cannot carry."""
    from parlab.decide import planner
    from parlab.lab.measure import fit_alpha_beta, sweep
    from parlab.lab.models import token_batch
    from parlab.lab.parallel import Topology

    from parlab.lab import runtime
    model = make_model(cfg).to(runtime.device())
    psi = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    counts = sorted({1, sequences, 2 * sequences})
    compute, update = {n: [] for n in counts}, []
    for n in counts:
        ids = token_batch(n, cfg["seq_len"], cfg["vocab_size"], seed=0).to(runtime.device())
        for _ in range(reps + 1):  # the first, untimed, creates the optimizer's state and warms the sizes
            dist.barrier()
            start = time.perf_counter()
            model(input_ids=ids, labels=ids).loss.backward()
            _sync()
            middle = time.perf_counter()
            opt.step()
            opt.zero_grad()
            _sync()
            compute[n].append(middle - start)
            update.append(time.perf_counter() - middle)
    pairs = Topology.build(tp=2).group("tp") if dist.get_world_size() % 2 == 0 else None
    points = sweep("broadcast", sizes=[1 << k for k in range(12, 21, 2)], iters=5, group=pairs)
    alpha, beta = fit_alpha_beta([p.bytes for p in points], [p.seconds for p in points])
    # the fit takes each size's fastest pass: the machine's other work only ever adds to a time
    passes = [min(compute[n][1:]) for n in counts]
    slowest = torch.tensor([statistics.median(compute[sequences][1:]), *passes, statistics.median(update[1:]),
                            alpha, beta], device=runtime.device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    f, *passes, u, alpha, beta = slowest.tolist()
    pass_s, per_token = fit_alpha_beta([n * cfg["seq_len"] for n in counts], passes)
    # the planner's own count of a step's FLOPs (its layers, attention and output layer: Narayanan's eq. 3)
    flops_per_token = planner.Workload(model.config, global_batch=1, seq_len=cfg["seq_len"]).model_flops() / cfg["seq_len"]
    return {"flops": flops_per_token * sequences * cfg["seq_len"] / f,
            "memory_bandwidth": planner.OPTIMIZER_BYTES_PER_PARAM * psi / u,
            "alpha": alpha, "bandwidth": 1 / beta if beta > 0 else float("inf"),
            "passes": dict(zip(counts, passes)), "pass_s": pass_s,
            "marginal_flops": flops_per_token / per_token if per_token > 0 else None}


def this_machine(calibration: dict, world_size: int):
    """``parlab.decide.planner.Cluster`` of this machine's ranks, from :func:`calibrate`: one node, one link, the
    figures reached (utilisation 1), and no overlap (ranks' computation and gloo share the same cores)."""
    from parlab.decide import planner
    rank = planner.GPU("a CPU rank of this machine", float("inf"), calibration["flops"],
                       calibration["memory_bandwidth"], "measured by parlab.course.bench.mixes.calibrate")
    link = planner.Link("gloo, this machine", calibration["alpha"], calibration["bandwidth"],
                        "fitted here (chapter 02's sweep and fit_alpha_beta)")
    return planner.Cluster(gpu=rank, gpus_per_node=world_size, intra=link, inter=link, utilization=1.0, overlap=False)


P2P = ("send", "recv")


def _union(intervals) -> float:
    """Seconds covered by at least one of the ``(start, end)`` intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def step_parts(mix: Mix, results: list[dict]) -> dict:
    """Where the last timed step of one :func:`run` went, on its slowest rank (seconds): ``step``, of which
    ``waiting`` (inside a collective before the last rank of its group had joined: waiting for the
    slowest), ``moving`` (inside collectives, every rank there) and ``computing`` (no collective in flight:
    forward, backward, optimizer, the Python around them, and a pipeline's messages and bubble, since its
    receives are posted ahead and their records cannot tell waiting from computing). A collective's partners are the ranks of one of
    its axis's groups that were in the same op, of the same size, at the same time; ``time.perf_counter``
    is one clock for every process of the machine. An asynchronous collective (the course's DDP during
    backward) runs beside the computation: its time counts as collective, not computing."""
    from parlab.lab.parallel import Topology

    topo = Topology(dp=mix.dp, tp=mix.tp, pp=mix.pp)
    sizes = {"dp": mix.dp, "tp": mix.tp, "pp": mix.pp}
    parts = []
    for rank, r in enumerate(results):  # launch returns the ranks' results in rank order
        start, end, records = r["recorded"]
        coll = [rec for rec in records if rec.op not in P2P]
        waits = []
        for rec in coll:
            joined = rec.start
            for axis in (a for a, n in sizes.items() if n == rec.group_size):
                partners = [next((o for o in results[g]["recorded"][2] if o.op == rec.op and o.bytes == rec.bytes
                                  and o.start <= rec.end and o.end >= rec.start), None)
                            for g in topo.group_ranks(axis, rank)]
                if all(partners):
                    joined = max(o.start for o in partners)
                    break
            waits.append((rec.start, min(max(joined, rec.start), rec.end)))
        in_coll, waiting = _union((rec.start, rec.end) for rec in coll), _union(waits)
        parts.append({"step": end - start, "waiting": waiting, "moving": in_coll - waiting,
                      "computing": end - start - in_coll})
    return max(parts, key=lambda part: part["step"])


def checked_run(mix: Mix, cfg: dict, world_size: int, reference: list, **changes) -> tuple[list, dict]:
    """Chapter 07's one run of a layout: :func:`run` on ``world_size`` ranks, every rank's losses held to
    one process's (``reference``, from :func:`reference`) with ``assert_close``, then :func:`summarize`d.
    Returns (the ranks' results, the row), the row with ``launch_s``."""
    import parlab
    from torch.testing import assert_close

    start = time.perf_counter()
    results = parlab.launch(run, world_size, args=(mix, {**cfg, **changes}), timeout=600, announce=False)
    for r in results:
        assert_close(torch.tensor(r["losses"]), torch.tensor(reference))
    row = summarize(mix, results, {**cfg, **changes})
    row["launch_s"] = time.perf_counter() - start
    return results, row


def report(row: dict) -> str:
    """One run's row in words: memory against ``estimate_memory``, bytes per axis, step time, bubble."""
    mib = 2**20
    bubble = (f"; bubble {row['bubble']:.0%} measured, (p−1)/(m+p−1) = {row['bubble_formula']:.0%}"
              if row["bubble"] is not None else "")
    return (f"{row['layout']}: the losses of one process on every rank ({row['launch_s']:.1f} s to run)\n"
            f"  model states per rank: at most {row['memory'] / mib:.3f} MiB measured; estimate_memory "
            f"{row['estimate'] / mib:.3f} MiB ({row['memory'] / row['estimate'] - 1:+.1%})\n"
            "  bytes a rank sends per step (a ring's share of each buffer): "
            + ", ".join(f"{a} {b / mib:.3f} MiB" for a, b in row["sent"].items() if b)
            + f"\n  step time {row['step_s'] * 1e3:.0f} ms (slowest rank, median of the timed steps){bubble}")


def table(rows: list) -> str:
    """Rows of :func:`summarize` side by side (the bytes each rank sends, not the buffers)."""
    lines = [f"{'':<30}{'':>22}{'MiB a rank sends':>24}",
             f"{'layout':<30}{'memory/rank':>12}{'estimate':>10}{'dp':>8}{'tp':>8}{'pp':>8}"
             f"{'step ms':>9}{'bubble':>8}{'(p−1)/(m+p−1)':>15}"]
    for row in rows:
        bubble = f"{row['bubble']:>8.0%}{row['bubble_formula']:>15.0%}" if row["bubble"] is not None else ""
        lines.append(f"{row['layout']:<30}{row['memory'] / 2**20:>10.3f}Mi{row['estimate'] / 2**20:>8.3f}Mi"
                     + "".join(f"{row['sent'][a] / 2**20:>8.3f}" for a in ("dp", "tp", "pp"))
                     + f"{row['step_s'] * 1e3:>9.0f}{bubble}")
    return "\n".join(lines)


def pipeline_timeline(results: list) -> list:
    """The operations of the pipeline that holds rank 0 (its dp = tp = 0 ranks), on one clock."""
    first = [r for r in results if r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0]
    return sorted((e for r in first for e in r["events"]), key=lambda e: (e.rank, e.start))
