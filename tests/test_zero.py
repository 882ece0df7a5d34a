"""Parity of the from-scratch ZeRO (``parlab.lab.parallel.zero``, chapter 04) with a single process trained on the
global batch, with ``DistributedDataParallel``, with ``torch.distributed.optim.ZeroRedundancyOptimizer``
(stage 1) and with FSDP2's ``fully_shard`` (stage 3, with and without ``reshard_after_forward``, and in
mixed precision).

One launch per world size (2, 3 and 4: parameter counts that do not divide, so padding is exercised)
trains every configuration on the tiny MLP and the tiny GPT-2 and sends back the losses, the final
parameters, the first step's reduced gradients (``parlab.course.bench.zero.FirstGradients``), the flat layout and
the last step's collectives; the assertions run here. The gradients are compared before the weights because
Adam all but ignores a uniform gradient scale: planted scale bugs (÷ N twice, sum instead of average) move
Adam's weights by a fraction to a few tens of times the tolerance, the reduced gradients by thousands.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.testing import assert_close

import parlab
from parlab.course.bench.zero import FirstGradients, margin
from parlab.lab.launch import preload
from parlab.lab.measure import CommLog, Timeline, record_comm, record_ddp
from parlab.lab.models import regression_batch, shard, tiny_gpt2, tiny_mlp, token_batch
from parlab.lab.parallel import ZeroStage1, ZeroStage2, ZeroStage3

STEPS = 3
GLOBAL_BATCH = 12  # splits evenly over 2, 3 and 4 ranks
# Adam's first step is lr·g/(|g| + eps): a rounding-level difference δ in a gradient moves it by at most
# lr·min(2, δ/eps). eps keeps that under the tolerance where g itself is rounding-sized; a small lr, elsewhere.
# Adam also all but ignores a uniform scale of g: the reduced gradients are compared too (FirstGradients).
LR = 1e-3
D_OUT = 7  # the MLP then has 3,175 parameters: divisible by none of 2, 3, 4
TASKS = ("mlp", "gpt2")
OPTIMIZERS = {"adam": (torch.optim.Adam, {}), "adamw": (torch.optim.AdamW, {"weight_decay": 0.1})}
BF16 = dict(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)

# (name, optimizer): what each configuration is compared with is decided in the tests below
CONFIGS = [("ddp", "adam"), ("ddp", "adamw"), ("zero1", "adam"), ("zero1_all_reduce", "adam"),
           ("zero_redundancy_optimizer", "adam"), ("zero2", "adamw"), ("zero3", "adamw"),
           ("zero3_prefetch", "adamw"), ("zero3_keep", "adamw"), ("fsdp2", "adamw"), ("fsdp2_keep", "adamw"),
           ("zero3_bf16", "adamw"), ("fsdp2_bf16", "adamw"), ("zero1_bf16", "adam")]
PLANTED = ("zero1_no_gather", "adam")
# Planted scale bugs, which Adam's weights let through by a hair: gradients divided by N twice, or summed
SCALE_BUGS = [("zero1_divided_twice", "adam"), ("zero1_summed", "adam"), ("zero2_summed", "adamw")]


def build(task: str, seed: int = 1):
    """(model, global batch of step s, loss(model, batch), the blocks stage 3 and FSDP2 shard one by one)."""
    if task == "mlp":
        model = tiny_mlp(seed=seed, d_out=D_OUT)
        return (model, lambda s: regression_batch(GLOBAL_BATCH, d_out=D_OUT, seed=100 + s),
                lambda m, xy: F.mse_loss(m(xy[0]).float(), xy[1]), list(model.children()))
    model = tiny_gpt2(seed=seed)
    return (model, lambda s: token_batch(GLOBAL_BATCH, seed=100 + s),
            lambda m, x: m(input_ids=x, labels=x).loss, list(model.transformer.h))


class NoGather(ZeroStage1):
    """A planted bug: every rank updates its shard, but nobody sends it to the others."""

    def _publish(self):
        pass


def _planted(stage, bug):
    """A planted scale bug in a stage's gradient reduction: ``"divided_twice"`` (÷ N before the collective
    as well) or ``"summed"`` (the sum over ranks, not the average)."""

    class Planted(stage):
        def _communicate(self, op, tensor, label, **kwargs):
            if op in ("reduce_scatter", "all_reduce") and label is not None:
                if bug == "divided_twice":
                    tensor.div_(self.world_size)
                elif kwargs.get("reduce_op") == dist.ReduceOp.AVG:  # stage 2: AVG in the collective
                    kwargs["reduce_op"] = dist.ReduceOp.SUM
                else:  # stage 1 divides before a SUM: undo it
                    tensor.mul_(self.world_size)
            return super()._communicate(op, tensor, label, **kwargs)

    return Planted


def _wrap(name, model, blocks, opt, log):
    """(what the loop calls, its optimizer or None, a function returning the final parameters). ``log``:
    where PyTorch's DDP records its buckets (a comm hook); the course's stages record into the attached log."""
    optimizer, kwargs = OPTIMIZERS[opt]
    kwargs = dict(kwargs, lr=LR)
    if name.startswith(("zero1", "zero2", "zero3")):
        stage = {"zero1": ZeroStage1, "zero2": ZeroStage2, "zero3": ZeroStage3}[name[:5]]
        extra = {"zero1_all_reduce": dict(reduce="all_reduce"), "zero2": dict(bucket_bytes=2048),
                 "zero3": dict(blocks=blocks), "zero3_prefetch": dict(blocks=blocks, prefetch=True),
                 "zero3_keep": dict(blocks=blocks, reshard_after_forward=False),
                 "zero3_bf16": dict(blocks=blocks, prefetch=True, **BF16), "zero1_bf16": BF16}.get(name, {})
        if name == "zero1_no_gather":
            stage = NoGather
        elif name.endswith(("_divided_twice", "_summed")):
            stage = _planted(stage, name.split("_", 1)[1])
        zero = stage(model, optimizer, **extra, **kwargs)
        return zero, None, zero.full_state_dict
    if name.startswith("fsdp2"):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        how = dict(reshard_after_forward=name != "fsdp2_keep")
        if name == "fsdp2_bf16":
            how["mp_policy"] = MixedPrecisionPolicy(**BF16)
        for block in blocks:
            fully_shard(block, **how)
        fully_shard(model, **how)
        return model, optimizer(model.parameters(), **kwargs), \
            lambda: {n: p.full_tensor() for n, p in model.named_parameters()}
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    record_ddp(ddp, log)
    if name == "zero_redundancy_optimizer":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        opt_ = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=optimizer, **kwargs)
    else:
        opt_ = optimizer(ddp.parameters(), **kwargs)
    return ddp, opt_, lambda: {n: p.detach().clone() for n, p in model.named_parameters()}


def train(name: str, opt: str, task: str) -> dict:
    """Runs on a rank: STEPS steps on this rank's shard of each global batch."""
    rank, n = parlab.rank(), parlab.world_size()
    # Every rank starts from a different model, and the wrapper's broadcast must make them agree; except
    # under FSDP2, which shards each rank's own values (it expects them equal) and broadcasts nothing.
    model, batch, loss_fn, blocks = build(task, seed=1 + (0 if name.startswith("fsdp2") else rank))
    dev = parlab.device()  # a GPU per rank in GPU mode (test_gpu_parity), else the CPU
    model.to(dev)
    log = CommLog()
    model_, optimizer, final = _wrap(name, model, blocks, opt, log)
    grads = FirstGradients(model_, model=model)
    losses, backward = [], None
    for s in range(STEPS):
        log.records.clear()
        mine = shard(batch(s), rank, n)
        mine = tuple(t.to(dev) for t in mine) if isinstance(mine, tuple) else mine.to(dev)
        with log, record_comm() as seen:  # and the broadcasts ZeroRedundancyOptimizer issues from Python
            loss = loss_fn(model_, mine)
            start = time.perf_counter()
            loss.backward()
            backward = (start, time.perf_counter())
            grads.after_backward()
            if optimizer is None:
                model_.step()
                model_.zero_grad()
            else:
                optimizer.step()
                optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / n)
    # losses in float32, so that they are compared to fp32's precision
    out = {"params": final(), "grads": grads.whole(), "losses": torch.tensor(losses), "records": log.records, "backward": backward,
           "broadcast": sum(r.bytes for r in seen.records if r.op == "broadcast")}
    if hasattr(model_, "groups"):
        out["groups"] = [(g.name, g.numel, g.padded_numel) for g in model_.groups]
        out["peak_gathered"] = getattr(model_, "peak_gathered_bytes", None)
    return out


def run_all(cfgs):
    return {cfg: train(*cfg) for cfg in cfgs}


def reference(task: str, opt: str, mixed: bool = False):
    """One process, the whole global batch per step: (final parameters, losses, the first step's gradients).
    ``mixed``: bf16 compute, fp32 master weights and optimizer, as the ZeRO paper trains."""
    model, batch, loss_fn, _ = build(task)
    optimizer, kwargs = OPTIMIZERS[opt]
    optimizer = optimizer(model.parameters(), lr=LR, **kwargs)
    losses, first = [], None
    for s in range(STEPS):
        x = batch(s)
        if mixed:
            compute = copy.deepcopy(model).to(torch.bfloat16)
            x = tuple(t.to(torch.bfloat16) for t in x) if isinstance(x, tuple) else x
            loss = loss_fn(compute, x)
            loss.backward()
            for p, q in zip(model.parameters(), compute.parameters()):
                p.grad = q.grad.float()
        else:
            loss = loss_fn(model, x)
            loss.backward()
        if first is None:
            first = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {n: p.detach().clone() for n, p in model.named_parameters()}, torch.tensor(losses), first


@pytest.fixture(scope="module")
def refs():
    out = {(t, o): reference(t, o) for t in TASKS for o in OPTIMIZERS}
    out.update({(t, "mixed"): reference(t, "adamw", mixed=True) for t in TASKS})
    return out


@pytest.fixture(scope="module")
def warm_ranks():
    # imported by every rank otherwise, after each fork (seconds each on a 2-core machine)
    preload("torch._dynamo", "transformers.models.gpt2.modeling_gpt2", "torch.distributed.fsdp")


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"world{n}")
def trained(request, warm_ranks):
    n = request.param
    cfgs = [(name, opt, task) for task in TASKS for name, opt in CONFIGS + SCALE_BUGS] + [(*PLANTED, "mlp")]
    per_rank = parlab.launch(run_all, world_size=n, args=(cfgs,), timeout=180, output="rank0", announce=False)
    return n, per_rank


def _label(cfg, n):
    return f"{cfg[0]}/{cfg[2]} ({cfg[1]}) at world size {n}"


def _fp32_zero(task):
    return [(name, opt, task) for name, opt in CONFIGS if name.startswith("zero") and "bf16" not in name]


def test_every_rank_ends_with_the_same_parameters(trained):
    n, per_rank = trained
    for cfg in per_rank[0]:
        if cfg[0] == PLANTED[0] or cfg[:2] in SCALE_BUGS:
            continue
        for r in range(1, n):
            assert_close(per_rank[r][cfg]["params"], per_rank[0][cfg]["params"], rtol=0, atol=0,
                         msg=lambda m, c=cfg, r=r: f"{_label(c, n)}: rank {r} differs from rank 0: {m}")


@pytest.mark.parametrize("task", TASKS)
def test_each_stage_matches_a_single_process(trained, refs, task):
    n, per_rank = trained
    for cfg in _fp32_zero(task) + [("ddp", o, task) for o in OPTIMIZERS]:
        params, losses, grads = refs[task, cfg[1]]
        got = per_rank[0][cfg]
        assert_close(got["grads"], grads, msg=lambda m, c=cfg: f"{_label(c, n)}, first gradients vs single process: {m}")
        assert_close(got["losses"], losses, msg=lambda m, c=cfg: f"{_label(c, n)}, losses vs single process: {m}")
        assert_close(got["params"], params, msg=lambda m, c=cfg: f"{_label(c, n)} vs single process: {m}")


@pytest.mark.parametrize("task", TASKS)
def test_each_stage_matches_ddp(trained, task):
    n, per_rank = trained
    for cfg in _fp32_zero(task):
        ddp = per_rank[0][("ddp", cfg[1], task)]
        assert_close(per_rank[0][cfg]["grads"], ddp["grads"], msg=lambda m, c=cfg: f"{_label(c, n)} grads vs DDP: {m}")
        assert_close(per_rank[0][cfg]["params"], ddp["params"], msg=lambda m, c=cfg: f"{_label(c, n)} vs DDP: {m}")
        assert_close(per_rank[0][cfg]["losses"], ddp["losses"])


@pytest.mark.parametrize("task", TASKS)
def test_stage1_matches_zero_redundancy_optimizer(trained, task):
    n, per_rank = trained
    theirs = per_rank[0][("zero_redundancy_optimizer", "adam", task)]
    for name in ("zero1", "zero1_all_reduce"):
        cfg = (name, "adam", task)
        assert_close(per_rank[0][cfg]["grads"], theirs["grads"])
        assert_close(per_rank[0][cfg]["params"], theirs["params"],
                     msg=lambda m, c=cfg: f"{_label(c, n)} vs ZeroRedundancyOptimizer: {m}")
        assert_close(per_rank[0][cfg]["losses"], theirs["losses"])


@pytest.mark.parametrize("task", TASKS)
def test_stage3_matches_fsdp2(trained, task):
    """fp32 with and without resharding after forward; bf16 compute with fp32 master weights and fp32
    gradient reduction, as ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``."""
    n, per_rank = trained
    pairs = [("zero3", "fsdp2"), ("zero3_prefetch", "fsdp2"), ("zero3_keep", "fsdp2_keep"),
             ("zero3_bf16", "fsdp2_bf16")]
    for ours, theirs in pairs:
        a, b = per_rank[0][(ours, "adamw", task)], per_rank[0][(theirs, "adamw", task)]
        assert_close(a["grads"], b["grads"], msg=lambda m, o=ours: f"{o}/{task} at world size {n}, grads vs FSDP2: {m}")
        assert_close(a["params"], b["params"], msg=lambda m, o=ours: f"{o}/{task} at world size {n} vs FSDP2: {m}")
        assert_close(a["losses"], b["losses"])


@pytest.mark.parametrize("task", TASKS)
def test_mixed_precision_losses_follow_a_single_process(trained, refs, task):
    """In bf16 the ranks' gradients and a single process's differ in rounding, which Adam (dividing by the
    gradient's size) can turn into whole steps on weights whose gradient is nearly zero: so the losses are
    compared with the single process, to bf16's precision, and the weights with FSDP2 (above), exactly."""
    n, per_rank = trained
    _, losses, _ = refs[task, "mixed"]
    for name in ("zero3_bf16", "zero1_bf16"):
        opt = "adamw" if name == "zero3_bf16" else "adam"
        assert_close(per_rank[0][(name, opt, task)]["losses"], losses, rtol=1e-2, atol=0,
                     msg=lambda m, c=name: f"{c}/{task} at world size {n}, losses vs single process (bf16): {m}")


def test_the_checks_catch_a_missing_all_gather(trained, refs):
    _, per_rank = trained
    with pytest.raises(AssertionError):
        assert_close(per_rank[0][(*PLANTED, "mlp")]["params"], refs["mlp", "adam"][0])


@pytest.mark.parametrize("task", TASKS)
def test_a_wrong_gradient_scale_fails_by_orders_of_magnitude(trained, refs, task, capsys):
    """Gradients divided by N twice, or summed instead of averaged: Adam's weights move by what eps lets
    through (near the tolerance), the reduced gradients by (N − 1)/N or N − 1 of themselves: thousands of
    times the tolerance. The margins (in units of assert_close's tolerance) are printed."""
    n, per_rank = trained
    for cfg in SCALE_BUGS:
        got, (params, _, grads) = per_rank[0][(*cfg, task)], refs[task, cfg[1]]
        on_grads, on_weights = margin(got["grads"], grads), margin(got["params"], params)
        with capsys.disabled():
            print(f"\n{cfg[0]}/{task} at world size {n}: {on_grads:,.0f}x the tolerance on the first gradients, "
                  f"{on_weights:,.2f}x on Adam's weights after {STEPS} steps")
        assert on_grads > 1e3, (cfg, on_grads)
        with pytest.raises(AssertionError):
            assert_close(got["grads"], grads)


def test_padding_makes_any_count_shard_evenly(trained):
    n, per_rank = trained
    padded_somewhere = False
    for cfg, out in per_rank[0].items():
        for name, numel, padded in out.get("groups", ()):
            assert padded % n == 0 and 0 <= padded - numel < n, f"{_label(cfg, n)}: {name} {numel} -> {padded}"
            padded_somewhere |= padded > numel
    assert padded_somewhere, "the test models should need padding at every world size"


def _bytes(out, op):
    return sum(r.bytes for r in out["records"] if r.op == op)


@pytest.mark.parametrize("task", TASKS)
def test_bytes_per_step(trained, task):
    """Stage 1/2: reduce-scatter Ψ + all-gather Ψ (the all-reduce variant: 2Ψ + Ψ); stage 3: two all-gathers
    and one reduce-scatter, 3Ψ (2Ψ keeping the weights from forward to backward); the padded Ψ, in bytes."""
    _, per_rank = trained
    runs = {name: per_rank[0][(name, opt, task)] for name, opt in CONFIGS if (name, opt, task) in per_rank[0]}
    padded = {name: sum(p for _, _, p in out["groups"]) for name, out in runs.items() if "groups" in out}
    expect = {"zero1": {"reduce_scatter": 4, "all_gather": 4}, "zero1_all_reduce": {"all_reduce": 4, "all_gather": 4},
              "zero2": {"reduce_scatter": 4, "all_gather": 4}, "zero3": {"all_gather": 8, "reduce_scatter": 4},
              "zero3_prefetch": {"all_gather": 8, "reduce_scatter": 4},
              "zero3_keep": {"all_gather": 4, "reduce_scatter": 4},
              "zero3_bf16": {"all_gather": 4, "reduce_scatter": 4},  # two bf16 gathers, one fp32 reduction
              "zero1_bf16": {"reduce_scatter": 4, "all_gather": 2}}
    for name, per_op in expect.items():
        for op, bytes_per_param in per_op.items():
            assert _bytes(runs[name], op) == bytes_per_param * padded[name], f"{name}/{task} {op}"
        assert {r.op for r in runs[name]["records"]} == set(per_op), f"{name}/{task}: unexpected collectives"
    # ZeroRedundancyOptimizer with DDP: DDP's all-reduce, then each rank broadcasts its updated parameters
    psi = sum(p.numel() for p in build(task)[0].parameters())
    zro = runs["zero_redundancy_optimizer"]
    assert _bytes(zro, "all_reduce") == 4 * psi and zro["broadcast"] == 4 * psi


def test_stage2_reduces_during_backward(trained):
    _, per_rank = trained
    for task in TASKS:
        out = per_rank[0][("zero2", "adamw", task)]
        scatters = [r for r in out["records"] if r.op == "reduce_scatter"]
        assert len(scatters) > 1 and min(r.start for r in scatters) < out["backward"][1], task


def test_prefetch_holds_two_blocks_at_once(trained):
    """Without prefetch the root and one block are gathered at a time; with it, the next block too."""
    from parlab.course.exercises.ch04 import reference_peak_gathered

    n, per_rank = trained
    for task in TASKS:
        for name, prefetch in (("zero3", False), ("zero3_prefetch", True)):
            out = per_rank[0][(name, "adamw", task)]
            root = [p for g, _, p in out["groups"] if g == "root"]
            blocks = [p for g, _, p in out["groups"] if g != "root"]
            want = 4 * reference_peak_gathered(blocks, root[0] if root else 0, prefetch)
            assert out["peak_gathered"] == want, f"{name}/{task} at world size {n}"


def _stage3_spans():
    model = tiny_mlp()
    zero = ZeroStage3(model, torch.optim.SGD, lr=0.1)
    x, y = regression_batch(4)
    F.mse_loss(zero(x), y).backward()  # nothing attached: nothing recorded, nothing fails
    zero.step()
    zero.zero_grad()
    with Timeline() as tl:
        F.mse_loss(zero(x), y).backward()
        zero.step()
    return [(e.name, e.kind) for e in tl.events], [g.name for g in zero._units]


def test_stage3_draws_its_blocks_on_an_attached_timeline():
    """Stage 3's hooks begin a block's span in one hook and end it in another; they land on the timeline
    attached around the step: each block's forward (``f``) and backward (``b``), and each wait for a gather."""
    events, blocks = parlab.launch(_stage3_spans, world_size=2, timeout=30, output="none", announce=False)[0]
    for kind, block in ((k, b) for k in "fb" for b in blocks):
        assert (f"{kind} {block}", "compute") in events, (kind, block, events)
    assert {name for name, kind in events if kind == "idle"} == {f"wait {g}" for g in blocks}


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_gpu_parity(warm_ranks):
    """On NCCL, one GPU per rank: each stage against PyTorch's own on the same GPUs."""
    cfgs = [(name, opt, task) for task in TASKS for name, opt in CONFIGS if name != "zero_redundancy_optimizer"]
    per_rank = parlab.launch(run_all, world_size=2, args=(cfgs,), timeout=300, output="rank0", announce=False)
    pairs = [("zero1", "ddp", "adam"), ("zero1_all_reduce", "ddp", "adam"), ("zero2", "ddp", "adamw"),
             ("zero3", "fsdp2", "adamw"), ("zero3_prefetch", "fsdp2", "adamw"), ("zero3_keep", "fsdp2_keep", "adamw"),
             ("zero3_bf16", "fsdp2_bf16", "adamw")]
    for task in TASKS:
        for ours, theirs, opt in pairs:
            a, b = per_rank[0][(ours, opt, task)], per_rank[0][(theirs, opt, task)]
            assert_close(a["params"], b["params"], msg=lambda m, o=ours, t=theirs: f"{o} vs {t} on GPUs: {m}")


# -- bad use ---------------------------------------------------------------------------------------------


def test_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="process group"):
        ZeroStage1(tiny_mlp())


def _misuse():
    errors = []

    def expect(exc, fn):
        try:
            fn()
        except exc as e:
            errors.append(str(e))
        else:
            errors.append(f"no {exc.__name__}")

    model = tiny_mlp()
    expect(TypeError, lambda: ZeroStage1(model, torch.optim.Adam(model.parameters())))
    expect(ValueError, lambda: ZeroStage1(tiny_mlp(), reduce="allreduce"))
    expect(ValueError, lambda: ZeroStage2(tiny_mlp(), bucket_bytes=0))
    expect(ValueError, lambda: ZeroStage3(tiny_mlp(), param_dtype=torch.int8))
    other = tiny_mlp()
    expect(ValueError, lambda: ZeroStage3(tiny_mlp(), blocks=[other.inp]))
    gpt = tiny_gpt2()
    expect(ValueError, lambda: ZeroStage3(gpt, blocks=[gpt.transformer, gpt.lm_head]))  # the tied weight
    x, y = regression_batch(4)
    zero = ZeroStage1(tiny_mlp())
    F.mse_loss(zero(x), y).backward()
    zero.module.zero_grad()
    F.mse_loss(zero(x), y).backward()
    expect(RuntimeError, zero.step)
    zero = ZeroStage2(tiny_mlp())
    F.mse_loss(zero(x), y).backward()
    expect(RuntimeError, lambda: zero(x))
    expect(RuntimeError, lambda: F.mse_loss(zero.module(x), y).backward())
    return errors


def test_misuse_is_explained():
    errors = parlab.launch(_misuse, world_size=2, output="none", announce=False)[0]
    assert "optimizer_class" in errors[0] and "AdamW" in errors[0]
    assert "reduce='allreduce'" in errors[1] and "'reduce_scatter'" in errors[1]
    assert "bucket_bytes" in errors[2] and "0" in errors[2]
    assert "param_dtype" in errors[3] and "torch.int8" in errors[3]
    assert "not a submodule" in errors[4]
    assert "share a parameter" in errors[5] and "tied" in errors[5]
    assert "zero_grad" in errors[6]
    assert "step()" in errors[7]
    assert "second backward" in errors[8]


def _offload_cell_on_cpu():
    """On a rank: chapter 04's offload cell with the CUDA calls it makes stubbed out (they only time and
    measure) and ``CPUOffloadPolicy`` unpinned (pinning needs a GPU)."""
    for name in ("reset_peak_memory_stats", "synchronize"):
        setattr(torch.cuda, name, lambda *args, **kwargs: None)
    torch.cuda.max_memory_allocated = lambda *args, **kwargs: 0
    return [offload_run(offload) for offload in (False, True)]  # noqa: F821 - the notebook's, in its namespace


def test_chapter_04s_offload_cell_runs_the_fsdp2_cells_factory():
    """The offload cell (GPU only) builds its model with the FSDP2 cell's factory, as that cell defines it:
    it called ``make(model, None)`` on the one-argument factory, a TypeError on every rank of every GPU run.
    Here both cells' definitions run on 2 CPU ranks (about 5 s)."""
    import ast
    import functools
    import inspect
    import pathlib

    import nbformat

    nb = nbformat.read(pathlib.Path(__file__).parent.parent / "notebooks" / "04_zero.ipynb", as_version=4)
    cells = {c.get("id"): c.source for c in nb.cells}
    ns: dict = {}
    exec(cells["c02"], ns)  # the parameters
    exec("import torch, parlab\nfrom parlab.course.bench import zero as zero_bench\n"
         "from parlab.lab.models import tiny_gpt2\nVOCAB = 128\n"
         "SIZES = dict(n_layer=n_layer, n_embd=n_embd, n_head=2, vocab_size=VOCAB, n_positions=seq_len)\n"
         "ADAMW = dict(lr=lr, weight_decay=0.01)", ns)  # what the two cells use from the set-up cell
    for cell in ("43e6412a", "h09"):  # the FSDP2 cell's fsdp2, the offload cell's offload_run: definitions only
        body = [n for n in ast.parse(cells[cell]).body if isinstance(n, (ast.FunctionDef, ast.Import, ast.ImportFrom))]
        exec(ast.unparse(body), ns)
    assert "fsdp2" in ns and "offload_run" in ns, "chapter 04's cells no longer define fsdp2 and offload_run"
    ns["CPUOffloadPolicy"] = functools.partial(ns["CPUOffloadPolicy"], pin_memory=False)
    exec(inspect.getsource(_offload_cell_on_cpu), ns)
    results = parlab.launch(ns["_offload_cell_on_cpu"], 2, announce=False)
    assert all(set(r) == {"peak", "step_s"} for rank in results for r in rank), results
