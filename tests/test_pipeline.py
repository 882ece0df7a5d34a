"""Pipeline parallelism from scratch (``parlab.lab.parallel.pipeline``, ``pipeline_schedule`` and ``pipeline_p2p``,
chapter 06).

Schedules are data, so most of their properties are checked here without any rank: what each rank runs,
the bubble the simulator finds against the formula, the activations held, and that the messages of every
schedule can neither deadlock nor be mismatched. Then one launch per world size (2 and 4) trains every
configuration — naive, GPipe, 1F1B and interleaved 1F1B, ours and ``torch.distributed.pipelining``'s, on
a residual MLP stack and on a tiny GPT-2 cut by layers, plus a planted bug — and the assertions compare
losses and gradients with one process and with PyTorch, recorded orders with the schedules, and the bytes
sent with the size of an activation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import parlab
from parlab.lab.launch import preload
from parlab.lab.measure import CommLog, Timeline
from parlab.lab.models import regression_batch, tiny_blocks, tiny_gpt2, token_batch
from parlab.lab.parallel import pipeline_p2p as p2p
from parlab.lab.parallel import pipeline_schedule as ps
from parlab.lab.parallel.pipeline import Pipeline, causal_lm_loss, record_stage, split_gpt2, split_sequential

BATCH, M = 8, 4  # examples per step, micro-batches
HIDDEN, SEQ, VOCAB, EMBD = 16, 8, 64, 16
TASKS = ("mlp", "gpt2")
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved")
TORCH = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}


# -- schedules as data -----------------------------------------------------------------------------------

def test_gpipe_and_1f1b_orders():
    assert ps.gpipe(2, 3).names(0) == ["F0", "F1", "F2", "B0", "B1", "B2"]
    assert ps.one_f_one_b(3, 4).names(0) == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    assert ps.one_f_one_b(3, 4).names(2) == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]
    assert ps.one_f_one_b(4, 2).names(0) == ["F0", "F1", "B0", "B1"]  # fewer micro-batches than ranks
    assert ps.naive(3).names(1) == ["F0", "B0"]


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 5, 8, 16])
def test_simulated_bubble_is_the_formula(p, m):
    """Equal stages, no communication time: the simulator's idle share is exactly (p−1)/(v·m+p−1)."""
    for costs in ({}, {"F": 1.0, "B": 3.0}):
        schedules = [ps.gpipe(p, m), ps.one_f_one_b(p, m)]
        if m % p == 0:  # the interleaved formula assumes whole rounds of p micro-batches
            schedules += [ps.interleaved_1f1b(p, m, v) for v in (2, 3)]
        for s in schedules:
            simulated = ps.bubble_fraction(ps.simulate(s, costs))
            assert simulated == pytest.approx(ps.bubble_formula(p, m, s.stages_per_rank), abs=1e-12), s.name


def test_activations_held():
    """GPipe holds all m micro-batches on every rank; 1F1B at most p − r on rank r (and never more than m)."""
    for p, m in ((4, 8), (4, 2), (2, 6)):
        assert ps.peak_in_flight(ps.gpipe(p, m)) == [m] * p
        assert ps.peak_in_flight(ps.one_f_one_b(p, m)) == [min(p - r, m) for r in range(p)]
    # interleaving holds more (stage, micro-batch) pairs, each 1/v of a stage: (v−1)·p + 2(p−r−1) + 1
    assert ps.peak_in_flight(ps.interleaved_1f1b(4, 8, 2)) == [11, 9, 7, 5]


def test_interleaved_places_stages_in_a_loop():
    s = ps.interleaved_1f1b(4, 8, 2)
    assert [s.stages_of(r) for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert s.names(3)[:4] == ["F0s3", "F1s3", "F2s3", "F3s3"]


def test_every_schedule_exchanges_messages_safely():
    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 3, 4, 6, 8, 16):
            schedules = [ps.naive(p), ps.gpipe(p, m), ps.one_f_one_b(p, m)]
            schedules += [ps.interleaved_1f1b(p, m, v) for v in (2, 3) if m % max(1, m // p) == 0]
            for s in schedules:
                p2p.check_p2p(s)


def _eager_plan(schedule):
    """Send right after producing, receive right before needing: the plan that can deadlock on NCCL."""
    plan = []
    for r in range(schedule.num_ranks):
        batches, pending = [], []
        for recv, _, send in p2p.messages(schedule, r):
            batches.append(pending + recv)
            pending = send
        plan.append(batches + [pending])
    return plan


def test_check_p2p_catches_a_deadlock_and_a_mismatch():
    s = ps.interleaved_1f1b(2, 4, 2)
    with pytest.raises(ValueError, match="would deadlock"):
        p2p.check_p2p(s, _eager_plan(s))
    plan = p2p.p2p_plan(ps.gpipe(2, 2))
    sends = [b for b in plan[0] if b]
    sends[0][0], sends[1][0] = sends[1][0], sends[0][0]  # rank 0 sends micro-batch 1 before 0
    with pytest.raises(ValueError, match="expects"):
        p2p.check_p2p(ps.gpipe(2, 2), plan)


def test_bad_schedules_and_arguments_are_refused():
    with pytest.raises(ValueError, match="before F0s0"):
        ps.Schedule("x", 1, 1, 1, [[ps.Op("B", 0, 0), ps.Op("F", 0, 0)]])
    with pytest.raises(ValueError, match="twice"):
        ps.Schedule("x", 1, 1, 1, [[ps.Op("F", 0, 0), ps.Op("F", 0, 0), ps.Op("B", 0, 0)]])
    with pytest.raises(ValueError, match="never completes micro-batch 1"):
        ps.Schedule("x", 1, 2, 1, [[ps.Op("F", 0, 0), ps.Op("B", 0, 0)]])
    with pytest.raises(ValueError, match="v >= 2"):
        ps.interleaved_1f1b(2, 4, 1)
    with pytest.raises(ValueError, match="multiple of the number of rounds"):
        ps.interleaved_1f1b(2, 5, 2)
    with pytest.raises(ValueError, match="num_micro_batches must be a positive int"):
        ps.gpipe(2, 0)
    with pytest.raises(ValueError, match="choose one of"):
        ps.make("pipedream", 2, 4)
    with pytest.raises(ValueError, match="num_stages must be an int in 1..4"):
        split_sequential(tiny_blocks(4), 5)
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        split_gpt2(tiny_gpt2(), 2)


def test_op_names_round_trip():
    assert ps.Op.parse("B12s3") == ps.Op("B", 12, 3)
    assert ps.Op.parse("F0", stage=2) == ps.Op("F", 0, 2)
    with pytest.raises(ValueError, match="not an operation name"):
        ps.Op.parse("X1")


def test_gpt2_stages_compute_the_whole_model():
    model = tiny_gpt2(n_layer=4, n_embd=EMBD, vocab_size=VOCAB, n_positions=SEQ, tie_word_embeddings=False)
    x = token_batch(4, SEQ, VOCAB)
    h = x
    for stage in split_gpt2(model, 3):
        h = stage(h)  # (4, SEQ) ids -> (4, SEQ, EMBD) … -> (4, SEQ, VOCAB)
    assert_close(causal_lm_loss(h, x), model(input_ids=x, labels=x).loss)


# -- on ranks ---------------------------------------------------------------------------------------------

def build(task: str, num_stages: int):
    """(model, its stages, batch inputs, targets, loss_fn, activation shape per micro-batch)."""
    if task == "mlp":
        model = tiny_blocks(num_stages, HIDDEN, seed=0)
        x, y = regression_batch(BATCH, HIDDEN, HIDDEN, seed=3)
        return model, split_sequential(model, num_stages), x, y, F.mse_loss, (BATCH // M, HIDDEN)
    model = tiny_gpt2(n_layer=num_stages, n_embd=EMBD, vocab_size=VOCAB, n_positions=SEQ, seed=0,
                      tie_word_embeddings=False)
    x = token_batch(BATCH, SEQ, VOCAB, seed=3)
    return model, split_gpt2(model, num_stages), x, x, causal_lm_loss, (BATCH // M, SEQ, EMBD)


class ForgetsTheMean(Pipeline):
    """A planted bug: each micro-batch's loss is back-propagated whole, not divided by their number."""

    def step(self, inputs=None, targets=None):
        fn = self.loss_fn
        self.loss_fn = lambda out, y: fn(out, y) * self.schedule.num_micro_batches
        try:
            return super().step(inputs, targets)
        finally:
            self.loss_fn = fn


def ours(task, name, bug=False):
    """Runs on a rank: one step of our executor; returns losses, gradients by stage, order, messages."""
    rank, p = parlab.rank(), parlab.world_size()
    schedule = ps.make(name, p, 1 if name == "naive" else M)
    model, stages, x, y, loss_fn, shape = build(task, schedule.num_stages)
    if name == "naive":
        shape = (BATCH, *shape[1:])
    kind = ForgetsTheMean if bug else Pipeline
    pipe = kind([stages[s] for s in schedule.stages_of(rank)], schedule, activation_shape=shape, loss_fn=loss_fn)
    with CommLog() as log, Timeline() as timeline:
        losses = pipe.step(x, y)
    grads = {s: [q.grad.clone() for q in stages[s].parameters()] for s in schedule.stages_of(rank)}
    return {"losses": losses, "grads": grads, "order": ps.recorded_ops(timeline.events, rank),
            "messages": [(r.op, r.bytes, r.label) for r in log.records]}


def theirs(task, name):
    """The same step with torch.distributed.pipelining's schedule of that name."""
    import torch.distributed.pipelining as pipelining

    rank, p = parlab.rank(), parlab.world_size()
    schedule = ps.make(name, p, M)
    model, stages, x, y, loss_fn, _ = build(task, schedule.num_stages)
    mine = schedule.stages_of(rank)
    torch_stages = [record_stage(pipelining.PipelineStage(stages[s], s, schedule.num_stages, parlab.device()),
                                 with_stage=len(mine) > 1) for s in mine]
    kind = getattr(pipelining, TORCH[name])
    run = kind(torch_stages if len(mine) > 1 else torch_stages[0], M, loss_fn=loss_fn)
    first, last = 0 in mine, schedule.num_stages - 1 in mine
    losses: list = []
    with Timeline() as timeline:
        run.step(*((x,) if first else ()), **({"target": y, "losses": losses} if last else {}))
    order = getattr(run, "pipeline_order", None)
    return {"losses": [v.detach() for v in losses], "grads": {s: [q.grad.clone() for q in stages[s].parameters()]
                                                             for s in mine},
            "order": ps.recorded_ops(timeline.events, rank),
            "pipeline_order": ps.from_torch(order, M).ops if name == "interleaved" else None}


def configs():
    out = [("ours", task, name) for task in TASKS for name in SCHEDULES]
    out += [("torch", task, name) for task in TASKS for name in TORCH]
    return out + [("bug", "mlp", "1f1b")]


def run_all(cfgs):
    return {c: (theirs(c[1], c[2]) if c[0] == "torch" else ours(c[1], c[2], bug=c[0] == "bug")) for c in cfgs}


def reference(task, name, p):
    """One process, the whole batch: loss per micro-batch and each stage's gradients."""
    schedule = ps.make(name, p, 1 if name == "naive" else M)
    model, stages, x, y, loss_fn, _ = build(task, schedule.num_stages)
    forward = model if task == "mlp" else (lambda ids: model(input_ids=ids).logits)
    m = schedule.num_micro_batches
    with torch.no_grad():
        losses = [loss_fn(forward(xk), yk) for xk, yk in zip(x.tensor_split(m), y.tensor_split(m))]
    loss_fn(forward(x), y).backward()
    return losses, {s: [q.grad for q in st.parameters()] for s, st in enumerate(stages)}


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"world{n}")
def trained(request):
    # torch.distributed.pipelining imports torch._dynamo (~7 s on 2 cores), GPT-2 loads lazily (~5 s)
    preload("torch._dynamo", "torch.distributed.pipelining", "transformers.models.gpt2.modeling_gpt2")
    n = request.param
    cfgs = configs()
    per_rank = parlab.launch(run_all, world_size=n, args=(cfgs,), timeout=300, announce=False)
    return n, cfgs, per_rank


def _merged(per_rank, cfg, key):
    out = {}
    for r in per_rank:
        out.update(r[cfg][key])
    return out


def _last_rank_losses(per_rank, cfg):
    return next(r[cfg]["losses"] for r in per_rank if r[cfg]["losses"])


def test_matches_one_process(trained):
    n, cfgs, per_rank = trained
    for cfg in cfgs:
        who, task, name = cfg
        if who == "bug":
            continue
        losses, grads = reference(task, name, n)
        assert_close(_last_rank_losses(per_rank, cfg), losses, msg=lambda m, c=cfg: f"{c} losses, world {n}: {m}")
        assert_close(_merged(per_rank, cfg, "grads"), grads, msg=lambda m, c=cfg: f"{c} gradients, world {n}: {m}")


def test_matches_torch_pipelining(trained):
    n, _, per_rank = trained
    for task in TASKS:
        for name in TORCH:
            a, b = ("ours", task, name), ("torch", task, name)
            assert_close(_last_rank_losses(per_rank, a), _last_rank_losses(per_rank, b))
            assert_close(_merged(per_rank, a, "grads"), _merged(per_rank, b, "grads"),
                         msg=lambda m, t=task, s=name: f"{s} on {t} vs {TORCH[s]}, world {n}: {m}")


def test_the_checks_catch_a_planted_bug(trained):
    n, _, per_rank = trained
    losses, grads = reference("mlp", "1f1b", n)
    with pytest.raises(AssertionError):
        assert_close(_merged(per_rank, ("bug", "mlp", "1f1b"), "grads"), grads)


def test_recorded_order_is_the_schedule(trained):
    """Each rank ran exactly its schedule's operations in order; PyTorch's runs follow the same orders."""
    n, cfgs, per_rank = trained
    for who, task, name in cfgs:
        schedule = ps.make(name, n, 1 if name == "naive" else M)
        for r in range(n):
            assert per_rank[r][who, task, name]["order"] == schedule.names(r), (who, task, name, r)
    interleaved = ps.interleaved_1f1b(n, M, 2).ops
    assert per_rank[0]["torch", "mlp", "interleaved"]["pipeline_order"] == interleaved


def test_only_boundary_activations_travel(trained):
    """Each message is one micro-batch's activation (or its gradient): b·s·h numbers, 4 bytes each. A rank
    sends one per forward whose output goes to another rank, and one per backward likewise."""
    n, cfgs, per_rank = trained
    for who, task, name in cfgs:
        if who != "ours":
            continue
        schedule = ps.make(name, n, 1 if name == "naive" else M)
        b = BATCH // schedule.num_micro_batches
        size = 4 * b * (HIDDEN if task == "mlp" else SEQ * EMBD)
        for r in range(n):
            msgs = per_rank[r][who, task, name]["messages"]
            expected = [m for _, _, send in p2p.messages(schedule, r) for m in send]
            assert sum(op == "send" for op, _, _ in msgs) == len(expected)
            assert {nbytes for _, nbytes, _ in msgs} <= {size}, (who, task, name, r)


def test_zero_bubble_and_dualpipe_schedules_run_on_gloo():
    """PyTorch's schedules that split the backward: same gradients as one process, and each rank's recorded
    order is its pipeline_order (what chapter 06 draws)."""

    def run(kind, style):
        import torch.distributed.pipelining as pipelining

        rank, p = parlab.rank(), parlab.world_size()
        model, stages, x, y, loss_fn, _ = build("mlp", 2 * p)
        mine = [rank, 2 * p - 1 - rank] if style == "v" else [rank, rank + p]
        st = [record_stage(pipelining.PipelineStage(stages[s], s, 2 * p, parlab.device()), with_stage=True)
              for s in mine]
        schedule = getattr(pipelining, kind)(st, M, loss_fn=loss_fn)
        losses: list = []
        with Timeline() as timeline:
            if rank == 0:
                schedule.step(x, target=y, losses=losses) if style == "v" else schedule.step(x)
            elif style != "v" and rank == p - 1:
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
        return ({s: [q.grad.clone() for q in stages[s].parameters()] for s in mine},
                ps.recorded_ops(timeline.events, rank), ps.from_torch(schedule.pipeline_order, M).names(rank))

    preload("torch._dynamo", "torch.distributed.pipelining")
    _, grads = reference("mlp", "interleaved", 2)  # 4 stages of the same MLP
    for kind, style in (("ScheduleInterleavedZeroBubble", "loop"), ("ScheduleZBVZeroBubble", "v"),
                        ("ScheduleDualPipeV", "v")):
        out = parlab.launch(run, world_size=2, args=(kind, style), timeout=120, announce=False)
        got = {s: g for r in out for s, g in r[0].items()}
        assert_close(got, grads, msg=lambda m, k=kind: f"{k}: {m}")
        for r in out:
            assert r[1] == r[2], kind
        assert any(name.startswith("W") for name in out[0][1])


def test_measured_activations_are_the_count_from_the_order():
    """What chapter 06 asserts of PyTorch's schedules and ours: each rank's peak of activations, measured by
    the ActivationTracker around the whole step, is the count from the schedule's order (a forward adds a
    micro-batch, the B or W that finishes it releases it), for 1F1B and the schedules that split the
    backward. A tracker that kept the split backward's graph alive, that charged the first stage the whole
    batch, or that counted what the loss keeps on the last stage, fails it."""
    from parlab.course.bench.pipeline import TORCH_SCHEDULES, record

    preload("torch._dynamo", "torch.distributed.pipelining")
    p, m = 2, 4
    runs = [("torch", n, m, 2) for n in ("1f1b", "zero-bubble", "zbv", "dualpipev")]
    runs += [("ours", "gpipe", m, 1), ("ours", "1f1b", m, 1), ("ours", "interleaved", m, 2)]
    cfg = dict(hidden=HIDDEN, batch=BATCH, blocks_per_rank=2)
    out = parlab.launch(record, world_size=p, args=(runs, cfg, 1), timeout=120, announce=False)
    for i, (who, name, _, v) in enumerate(runs):
        order = out[0][i]["pipeline_order"]
        if who == "ours":
            schedule = ps.make(name, p, m, v)
        else:
            schedule = ps.one_f_one_b(p, m) if order is None else ps.from_torch(order, m, TORCH_SCHEDULES[name])
        counted = [peak / schedule.stages_per_rank for peak in ps.peak_in_flight(schedule)]
        got = [out[r][i]["peak"] / out[r][i]["per_micro_batch"] for r in range(p)]
        assert got == pytest.approx(counted), (who, name)


def test_zero_bubble_gain_at_equal_stages_per_rank():
    """Chapter 06 compares the split backward at equal v: PyTorch's orders, simulated with F = I = W = 1 at
    p = 4, m = 8 (the issue's setting): 1F1B 3/11, interleaved 1F1B (v = 2) 3/19, ZB-1p below both; more than
    a third of ZB-1p's drop from 1F1B is interleaving's, the rest the split's."""
    from parlab.course.bench.pipeline import TORCH_SCHEDULES, record

    preload("torch._dynamo", "torch.distributed.pipelining")
    p, m, names = 4, 8, ("interleaved", "zero-bubble", "zbv")
    cfg = dict(hidden=16, batch=16, blocks_per_rank=2)
    out = parlab.launch(record, world_size=p, args=([("torch", n, m, 2) for n in names], cfg, 1), timeout=300,
                        announce=False)
    costs = {"F": 1, "I": 1, "W": 1, "B": 2}
    bubble = {name: ps.bubble_fraction(ps.simulate(ps.from_torch(out[0][i]["pipeline_order"], m, TORCH_SCHEDULES[name]),
                                                   costs)) for i, name in enumerate(names)}
    bubble["1f1b"] = ps.bubble_fraction(ps.simulate(ps.one_f_one_b(p, m), costs))
    assert bubble["1f1b"] == pytest.approx(3 / 11) and bubble["interleaved"] == pytest.approx(3 / 19)
    assert bubble["interleaved"] > bubble["zero-bubble"] and bubble["interleaved"] > bubble["zbv"]
    share = (bubble["1f1b"] - bubble["interleaved"]) / (bubble["1f1b"] - bubble["zero-bubble"])
    assert 0.3 < share < 0.7, share


def test_the_simulator_shows_what_ran(trained):
    """Chapter 06's simulator widget draws, for every setting that ran, the order each rank recorded."""
    from parlab.decide import widgets
    n, cfgs, per_rank = trained
    for who, task, name in cfgs:
        if who == "ours" and task == "mlp":
            view = widgets.pipeline_view(name, n, 1 if name == "naive" else M, 2)
            for r in range(n):
                assert per_rank[r][who, task, name]["order"] == view.schedule.names(r), (name, r)


def test_simulator_and_plot_draw_without_pyplot():
    """The widget's figure is a plain Figure rendered to PNG: nothing lands in pyplot's global state, so a
    callback on another thread cannot disturb (or be disturbed by) the notebook's figures."""
    import matplotlib.pyplot as plt

    from parlab.decide import widgets
    from parlab.lab import plots
    before = plt.get_fignums()
    view = widgets.pipeline_view("interleaved", 4, 8, 2)
    assert view.schedule == ps.interleaved_1f1b(4, 8, 2)
    assert view.bubble == pytest.approx(ps.bubble_formula(4, 8, 2))
    assert view.peaks == [5.5, 4.5, 3.5, 2.5]
    box = widgets.pipeline_simulator(p=2, m=4)
    controls, sizes, text, image = box.children
    assert image.value[:8] == b"\x89PNG\r\n\x1a\n" and "1F1B, p=2, m=4" in text.value
    controls.children[0].value, sizes.children[1].value = "interleaved 1F1B", 5  # m=5: no whole rounds
    assert "cannot build this schedule" in text.value and "multiple of the number of rounds" in text.value
    fig = plots.pipeline(ps.simulate(ps.gpipe(2, 2)))
    assert len(fig.axes) == 1 and plt.get_fignums() == before


def test_bad_pipeline_input_is_named():
    def run(case):
        rank = parlab.rank()
        schedule = ps.one_f_one_b(2, 4)
        stages = split_sequential(tiny_blocks(2, HIDDEN), 2)
        if case == "modules":
            Pipeline(stages, schedule, activation_shape=(2, HIDDEN))
        pipe = Pipeline([stages[rank]], schedule, activation_shape=(2, HIDDEN))
        x, y = regression_batch(6 if case == "split" else 8, HIDDEN, HIDDEN)
        pipe.step(None if case == "inputs" else x, y)

    for case, message in (("modules", r"rank \d holds stages \[\d\].*pass 1 module\(s\), got 2"),
                          ("inputs", "rank 0 holds stage 0: pass inputs= to step"),
                          ("split", "6 examples, which do not split into num_micro_batches=4")):
        with pytest.raises(parlab.RankError, match=message):
            parlab.launch(run, world_size=2, args=(case,), timeout=30, output="none", announce=False)
    zb = ps.Schedule("zb", 1, 1, 1, [[ps.Op("F", 0, 0), ps.Op("I", 0, 0), ps.Op("W", 0, 0)]])
    with pytest.raises(parlab.RankError, match="has I, W operations: this executor runs F and B"):
        parlab.launch(lambda: Pipeline([tiny_blocks(1)], zb, activation_shape=(1,)), world_size=1, timeout=30,
                      output="none", announce=False)


def test_benchmark_pairs_each_schedule_with_pytorchs():
    from parlab.course.bench.pipeline import summary

    times = {f"{who} {name}": [1.0, 4.0, 1.0] if who == "torch" else [1.25, 5.0, 1.25]
             for who in ("ours", "torch") for name in ("gpipe", "1f1b", "interleaved")}
    out = summary(times)
    assert out["1f1b"]["throughput_vs_torch"] == pytest.approx(0.8) and out["gpipe"]["torch_s"] == 1.0


def test_runs_on_the_pp_group_of_a_mesh():
    """Chapter 07 gives the pipeline ``Topology.group("pp")``: here 4 ranks as 2 pipelines of 2 stages
    (pp=2, dp=2), each pipeline on its own group, whose in-group ranks are not the global ones."""

    def run():
        from parlab.lab.topology import Topology

        topo = Topology.build(pp=2)
        group, stage = topo.group("pp"), topo.coord("pp")
        schedule = ps.one_f_one_b(2, M)
        model, stages, x, y, loss_fn, shape = build("mlp", 2)
        pipe = Pipeline([stages[stage]], schedule, activation_shape=shape, loss_fn=loss_fn, group=group)
        pipe.step(x if stage == 0 else None, y if stage == 1 else None)
        return stage, [q.grad for q in stages[stage].parameters()]

    _, grads = reference("mlp", "1f1b", 2)
    out = parlab.launch(run, world_size=4, timeout=60, output="none", announce=False)
    assert sorted(stage for stage, _ in out) == [0, 0, 1, 1]
    for stage, got in out:
        assert_close(got, grads[stage])


def test_neighbouring_stages_on_one_rank_hand_over_in_memory():
    """p = 1 with v = 2: both stages on one rank; activations and gradients pass between them without a
    message, and the result is still one process's."""

    def run():
        schedule = ps.interleaved_1f1b(1, M, 2)
        model, stages, x, y, loss_fn, shape = build("mlp", 2)
        with CommLog() as log:
            Pipeline(stages, schedule, activation_shape=shape).step(x, y)
        return [[q.grad for q in st.parameters()] for st in stages], len(log.records)

    _, grads = reference("mlp", "1f1b", 2)
    got, messages = parlab.launch(run, world_size=1, timeout=60, output="none", announce=False)[0]
    assert messages == 0
    assert_close(got, [grads[0], grads[1]])


def test_traffic_model_prices_only_a_tp_that_splits_the_heads():
    """Chapter 06 prices TP 8 only for a model whose heads split 8 ways (GPT-2 XL's 25 do not)."""
    from parlab.decide.advice import preset
    from parlab.course.bench.pipeline import traffic

    with pytest.raises(ValueError, match="25 attention heads do not split over 8"):
        traffic(preset("GPT-2 XL (1.5B)"), 8, 16, 1024, 16)
    sent = traffic(preset("Llama 2 7B"), 8, 16, 1024, 16)
    assert sent["PP"] == (32, 2 * 16 * 1 * 1024 * 4096 * 2)  # m activations and m gradients of (B/m, s, h) in bf16
    assert sent["TP"][0] == 4 * 32 * 2 * 7 and sent["DDP"][1] > 30 * sent["PP"][1]
