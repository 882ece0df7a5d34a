"""Each exercise check passes the reference and fails a planted wrong answer with a precise message."""

import pytest
import torch
import torch.distributed as dist

from parlab.exercises import (
    ExerciseFailed,
    check_crossover_bytes,
    check_ddp_buckets,
    check_gated_mlp_bytes,
    check_hang_prediction,
    check_max_params,
    check_my_slice,
    check_ranks,
    check_recursive_doubling,
    check_weighted_average,
    first_difference,
)
from parlab.exercises.ch01 import _max_params
from parlab.exercises.ch02 import _crossover_bytes
from parlab.exercises.ch03 import _reference_weighted_average
from parlab.ring import ring_all_reduce


def test_first_difference_names_element_expected_and_got():
    expected = torch.tensor([1.0, 2.0, 3.0, 4.0])
    got = torch.tensor([1.0, 2.0, 9.0, 4.0])
    assert first_difference(expected.clone(), expected) is None
    assert first_difference(got, expected) == "element 2: expected 3, got 9 (1 of 4 elements differ)"
    assert "shape (4,)" in first_difference(torch.zeros(3), expected)
    assert "got NoneType" in first_difference(None, expected)


def off_by_one_on_rank1(t):
    ring_all_reduce(t)
    if dist.get_rank() == 1:
        t[5] += 1


def test_wrong_element_names_rank_and_values():
    def inputs(rank, n):
        return torch.arange(6, dtype=torch.float32) + 100 * rank

    with pytest.raises(ExerciseFailed) as err:
        check_ranks(off_by_one_on_rank1, lambda t: dist.all_reduce(t), world_size=2, make_input=inputs)
    # element 5 summed over ranks: 5 + 105 = 110
    assert "on rank 1 of 2: element 5: expected 110, got 111 (1 of 6 elements differ)" in str(err.value)




# ---- chapter 00 -------------------------------------------------------------------------------------

def even_slice(n_items):
    rank, n = dist.get_rank(), dist.get_world_size()
    per, extra = divmod(n_items, n)
    start = rank * per + min(rank, extra)
    return start, start + per + (rank < extra)


def last_rank_takes_the_rest(n_items):
    rank, n = dist.get_rank(), dist.get_world_size()
    per = n_items // n
    return rank * per, n_items if rank == n - 1 else (rank + 1) * per


def test_my_slice_check_both_ways():
    assert "evenly" in repr(check_my_slice(even_slice, world_size=3))
    with pytest.raises(ExerciseFailed, match=r"last_rank_takes_the_rest\(8\) with 3 ranks: shares of \[2, 2, 4\]"):
        check_my_slice(last_rank_takes_the_rest, world_size=3)
    with pytest.raises(ExerciseFailed, match=r"returned None"):
        check_my_slice(lambda n_items: None, world_size=2)


def test_hang_prediction_check_both_ways():
    assert "ranks [0, 2] waited" in repr(check_hang_prediction([0, 2], world_size=4, timeout=1))
    with pytest.raises(ExerciseFailed, match=r"you predicted ranks \[1, 3\].*found 2 rank\(s\) waiting"):
        check_hang_prediction([1, 3], world_size=4, timeout=1)


def test_chapter_00_solutions_pass_their_checks():
    """The solutions chapter 00 shows (collapsed cells tagged ``solution``, never run by its checks) pass."""
    import pathlib

    import nbformat

    import parlab

    nb = nbformat.read(pathlib.Path(__file__).parent.parent / "notebooks" / "00_welcome.ipynb", as_version=4)
    scope = {"parlab": parlab}
    for cell in nb.cells:
        if "solution" in cell.metadata.get("tags", []):
            exec(cell.source, scope)  # noqa: S102 - the chapter's own solution cells
    assert "evenly" in repr(check_my_slice(scope["solution_my_slice"], world_size=3))
    assert "ranks [0, 2] waited" in repr(check_hang_prediction(scope["solution_waiting_ranks"](4), world_size=4,
                                                                timeout=1))


# ---- chapter 01 -------------------------------------------------------------------------------------

def gated_relu_bytes(s, b, h, i, bytes_per_value):
    return bytes_per_value * s * b * (h + 3 * i)  # x; relu's output, up's output, their product


def counts_the_gate_output(s, b, h, i, bytes_per_value):
    return bytes_per_value * s * b * (h + 4 * i)


def test_gated_mlp_check_against_measurement():
    assert "all 3 cases" in repr(check_gated_mlp_bytes(gated_relu_bytes))
    with pytest.raises(ExerciseFailed, match=r"s=16, b=2, h=32, i=96, bytes_per_value=4\) = 53248; "
                                             r"measured 40,960 bytes. You counted one s·b·i tensor too many"):
        check_gated_mlp_bytes(counts_the_gate_output)


def max_params_forgets_sharding(gpu_gb, n_d, stage, k=12):
    return gpu_gb * 1e9 / (4 + k)


def test_max_params_check_both_ways():
    assert "agrees with the reference" in repr(check_max_params(_max_params))
    assert _max_params(80, 1, 0) == pytest.approx(5e9)  # 80 GB / 16 bytes per parameter
    with pytest.raises(ExerciseFailed, match=r"max_params_forgets_sharding\(gpu_gb=24, n_d=8, stage=1\): "
                                             r"expected 4\.364e\+09, got 1500000000\.0"):
        check_max_params(max_params_forgets_sharding)


# ---- chapter 02 -------------------------------------------------------------------------------------

def calls_all_reduce(t):
    dist.all_reduce(t)  # planted: right answer by the forbidden route


def recursive_doubling(t):
    rank, n = dist.get_rank(), dist.get_world_size()
    step = 1
    while step < n:
        incoming = torch.empty_like(t)
        request = dist.isend(t.clone(), rank ^ step)
        dist.recv(incoming, rank ^ step)
        request.wait()
        t += incoming
        step *= 2


@pytest.mark.parametrize("world_size", [2, 4])
def test_recursive_doubling_check_passes_the_reference(world_size):
    assert "log₂ n × buffer" in repr(check_recursive_doubling(recursive_doubling, world_size=world_size))


def test_recursive_doubling_check_refuses_a_ring_and_collectives():
    # the ring gives the right sums but sends 2(n-1)/n of the buffer, not log2(n) buffers
    with pytest.raises(ExerciseFailed, match=r"rank 0 sent 72 bytes; recursive doubling sends the whole 48-byte "
                                             r"buffer once per step, log₂ 4 = 2 steps: 96 bytes"):
        check_recursive_doubling(ring_all_reduce, world_size=4)
    with pytest.raises(ExerciseFailed, match="called all_reduce"):
        check_recursive_doubling(calls_all_reduce, world_size=2)
    with pytest.raises(ValueError, match="power of two"):
        check_recursive_doubling(recursive_doubling, world_size=3)


def crossover_forgets_the_ring_chunks(n, alpha, bandwidth):
    return alpha * bandwidth  # treats the ring's messages as whole buffers


def test_crossover_check_both_ways():
    assert "agrees" in repr(check_crossover_bytes(_crossover_bytes))
    # on 4 ranks: ring 6·(α + m/4B), doubling 2·(α + m/B): equal at m = 8αB
    assert _crossover_bytes(4, 1e-5, 1e9) == pytest.approx(8e4)
    with pytest.raises(ExerciseFailed, match=r"crossover_forgets_the_ring_chunks\(n=4"):
        check_crossover_bytes(crossover_forgets_the_ring_chunks)


# ---- chapter 03 -------------------------------------------------------------------------------------

def equal_weights(params, local_batch_size):
    for p in params:
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def test_weighted_average_check_both_ways():
    assert "[3, 5, 2] examples" in repr(check_weighted_average(_reference_weighted_average, world_size=3))
    with pytest.raises(ExerciseFailed, match=r"every rank weighs the same, but they hold \[3, 5\] examples"):
        check_weighted_average(equal_weights, world_size=2)
    with pytest.raises(ExerciseFailed, match=r".grad is unchanged"):
        check_weighted_average(lambda params, b: None, world_size=2)


def _close_buckets(ready_bytes, first_limit, cap):
    buckets, size, limit = [], 0, first_limit
    for nbytes in ready_bytes:
        size += nbytes
        if size >= limit:
            buckets.append(size)
            size, limit = 0, cap
    return buckets + ([size] if size else [])


def ddp_buckets(ready_bytes, bucket_cap_mb=None):
    cap = (25 if bucket_cap_mb is None else bucket_cap_mb) * 2**20
    return _close_buckets(ready_bytes, 2**20 if bucket_cap_mb is None else cap, cap)  # small first: default only


def ddp_buckets_always_1mib_first(ready_bytes, bucket_cap_mb=None):
    return _close_buckets(ready_bytes, 2**20, (25 if bucket_cap_mb is None else bucket_cap_mb) * 2**20)


def test_ddp_buckets_check_against_pytorch():
    assert "default cap and at 0.5 MiB" in repr(check_ddp_buckets(ddp_buckets))
    with pytest.raises(ExerciseFailed, match=r"bucket_cap_mb=0.5\)"):
        check_ddp_buckets(ddp_buckets_always_1mib_first)


# -- chapter 06 ----------------------------------------------------------------------------------------------

def test_one_f_one_b_order_check_both_ways():
    from parlab.exercises import check_one_f_one_b_order
    from parlab.parallel.pipeline_schedule import one_f_one_b

    def reference(stage, num_stages, num_micro_batches):
        return one_f_one_b(num_stages, num_micro_batches).names(stage)

    assert "every stage" in repr(check_one_f_one_b_order(reference))

    def warmup_one_too_many(stage, num_stages, num_micro_batches):  # planted: p − s warm-up forwards
        w = min(num_stages - stage, num_micro_batches)
        ops = [f"F{k}" for k in range(w)]
        for k in range(num_micro_batches - w):
            ops += [f"F{w + k}", f"B{k}"]
        return ops + [f"B{k}" for k in range(num_micro_batches - w, num_micro_batches)]

    with pytest.raises(ExerciseFailed, match=r"stage 0 of 1, 2 micro-batches: operation 1 should be 'B0', got 'F1'"):
        check_one_f_one_b_order(warmup_one_too_many)
    from parlab.parallel import pipeline_schedule as ps

    with pytest.raises(ExerciseFailed, match="without parlab.parallel.pipeline_schedule's schedules"):
        check_one_f_one_b_order(lambda stage, num_stages, num_micro_batches:
                                ps.one_f_one_b(num_stages, num_micro_batches).names(stage))
    assert ps.one_f_one_b(2, 2).names(0) == ["F0", "F1", "B0", "B1"]  # and the package's schedule is back


def test_smallest_micro_batches_check_both_ways():
    import math
    from itertools import count

    from parlab.exercises import check_smallest_micro_batches
    from parlab.parallel.pipeline_schedule import bubble_formula

    def search(p, target, v=1):
        return next(m for m in count(1) if bubble_formula(p, m, v) <= target)

    assert "all" in repr(check_smallest_micro_batches(search))

    def rounded(p, target, v=1):  # planted: the algebra is right, floating point is not (3 · 0.8 / 0.2 > 12)
        return max(1, math.ceil((p - 1) * (1 - target) / (target * v)))

    with pytest.raises(ExerciseFailed, match=r"\(p=4, target=0.2\): expected 12, got 13 \(with m=13"):
        check_smallest_micro_batches(rounded)


def test_peak_activations_check_both_ways():
    from parlab.exercises import check_peak_activations

    def peak(ops, frees=("B", "W")):
        held = most = 0
        for name in ops:
            held += name[0] == "F"
            held -= name[0] in frees
            most = max(most, held)
        return most

    assert "all 6" in repr(check_peak_activations(peak))
    with pytest.raises(ExerciseFailed, match=r"\(F0 I0 F1 W0 I1 F2 W1 I2 W2\): expected 2, got 1"):  # planted: I frees
        check_peak_activations(lambda ops: peak(ops, frees=("B", "I")))
    from parlab.parallel import pipeline_schedule as ps

    with pytest.raises(ExerciseFailed, match="without parlab.parallel.pipeline_schedule's in_flight"):
        check_peak_activations(lambda ops: max(ps.in_flight(ps.Schedule("x", 1, 1 + max(int(o[1:]) for o in ops), 1, [[ps.Op.parse(o, stage=0)
                                                                                         for o in ops]]), 0)))


def test_group_ranks_check_both_ways():
    from parlab.exercises import check_group_ranks
    from parlab.parallel import Topology

    def group_ranks(rank, axis, sizes):
        strides = {"tp": 1, "dp": sizes["tp"], "pp": sizes["tp"] * sizes["dp"]}
        coord = rank // strides[axis] % sizes[axis]
        return [rank + (i - coord) * strides[axis] for i in range(sizes[axis])]

    assert "all 150 groups" in repr(check_group_ranks(group_ranks))

    def blocks(rank, axis, sizes):  # planted: every axis taken as contiguous blocks of ranks, like tp
        n = sizes[axis]
        return list(range(rank // n * n, rank // n * n + n))

    with pytest.raises(ExerciseFailed, match=r"rank=0, axis='dp', sizes=\{'pp': 1, 'dp': 4, 'tp': 2\}\): expected \[0, 2, 4, 6\]"):
        check_group_ranks(blocks)
    for shortcut in (lambda rank, axis, sizes: Topology(**sizes).group_ranks(axis, rank),
                     lambda rank, axis, sizes: next(g for g in Topology(**sizes).groups(axis) if rank in g)):
        with pytest.raises(ExerciseFailed, match="without parlab.parallel.Topology: what is the stride"):
            check_group_ranks(shortcut)
    assert Topology(pp=2, dp=2, tp=2).group_ranks("dp", 1) == [1, 3]  # and the package's answer is back


def _states(num_params, dp, tp, pp, zero_stage, over=None):
    psi = num_params / (tp * pp)
    n = over or dp
    weights, grads, adam = 2 * psi, 2 * psi, 12 * psi
    return weights / (n if zero_stage >= 3 else 1) + grads / (n if zero_stage >= 2 else 1) + \
        adam / (n if zero_stage >= 1 else 1)


def test_model_states_check_both_ways():
    import parlab.measure
    from parlab import planner
    from parlab.exercises import check_model_states

    assert "all 48 layouts" in repr(check_model_states(_states))
    with pytest.raises(ExerciseFailed, match="ZeRO sharding over all the ranks"):  # planted: ZeRO over the world
        check_model_states(lambda num_params, dp, tp, pp, zero_stage:
                           _states(num_params, dp, tp, pp, zero_stage, over=dp * tp * pp))

    def estimated(num_params, dp, tp, pp, zero_stage):  # the package's answer, refused
        return parlab.measure.estimate_memory(num_params=num_params, precision="bf16", world_size=dp * tp * pp,
                                              tp_size=tp, pp_size=pp, zero_stage=zero_stage).model_states

    def priced(num_params, dp, tp, pp, zero_stage):  # the same through the planner, refused too
        workload = planner.Workload("Llama 2 7B", global_batch=dp, seq_len=1)
        layout = planner.Layout(dp=dp, tp=tp, pp=pp, zero_stage=zero_stage)
        return planner.predict(workload, layout, planner.Cluster(gpus_per_node=dp * tp * pp)).memory.model_states

    for shortcut in (estimated, priced):
        with pytest.raises(ExerciseFailed, match="without estimate_memory or the planner"):
            check_model_states(shortcut)
    assert parlab.measure.estimate_memory(num_params=10).model_states == 160  # and the package's answer is back


def _layouts(workload, cluster):
    """Every layout the batch and model allow, TP inside a node."""
    from parlab import planner

    heads, n = workload.config.num_attention_heads, cluster.world_size
    for tp in (t for t in (1, 2, 4, 8) if t <= cluster.gpus_per_node and heads % t == 0):
        for pp in (p for p in range(1, workload.layers + 1) if workload.layers % p == 0 and n % (tp * p) == 0):
            dp = n // (tp * pp)
            if workload.global_batch % (dp * workload.micro_batch) == 0:
                yield from (planner.Layout(dp=dp, tp=tp, pp=pp, zero_stage=z) for z in ((0, 1, 2, 3) if dp > 1 else (0,)))


def _fits(workload, cluster, layout):
    from parlab.measure import estimate_memory

    return estimate_memory(workload.config, precision=workload.precision, optimizer=workload.optimizer,
                           world_size=cluster.world_size, zero_stage=layout.zero_stage, tp_size=layout.tp,
                           pp_size=layout.pp, micro_batch=workload.micro_batch, seq_len=workload.seq_len,
                           checkpointing=workload.checkpointing).total <= cluster.gpu.memory


def _by_the_rules(workload, cluster, price):
    """The notebook's solution: memory first, the guide's rules shortlist, three priced."""
    fitting = [layout for layout in _layouts(workload, cluster) if _fits(workload, cluster, layout)]
    if cluster.nodes > 1 and cluster.inter.bandwidth < cluster.intra.bandwidth / 20:  # slow: only PP crosses
        shortlist = sorted((l for l in fitting if l.tp * l.dp <= cluster.gpus_per_node), key=lambda l: (l.pp, -l.zero_stage))
    elif cluster.intra.bandwidth < 50e9 and workload.seq_len * workload.micro_batch <= 1024:  # PCIe, short
        shortlist = sorted((l for l in fitting if l.pp > 1), key=lambda l: (-l.pp, l.tp))
    else:  # the least model parallelism, the most ZeRO
        shortlist = sorted(fitting, key=lambda l: (l.tp * l.pp, -l.zero_stage))
    return min(shortlist[:3], key=lambda layout: price(layout).step_s)


def test_layout_choice_check_both_ways():
    from parlab import planner
    from parlab.exercises import check_layout_choice

    assert "all 6 scenarios, pricing at most 3" in repr(check_layout_choice(_by_the_rules))
    with pytest.raises(ExerciseFailed, match=r"Llama 2 7B.*DP 8 needs .* GB per GPU"):  # planted: DDP everywhere
        check_layout_choice(lambda workload, cluster, price: planner.Layout(dp=cluster.world_size))
    with pytest.raises(ExerciseFailed, match="TP 32 spans nodes of 8 GPUs"):  # planted: TP over every GPU
        check_layout_choice(lambda workload, cluster, price: planner.Layout(tp=cluster.world_size) if cluster.nodes > 1
                            else _by_the_rules(workload, cluster, price))

    def least_model_parallel(workload, cluster, price):  # planted: the one-node rule everywhere
        fitting = [l for l in _layouts(workload, cluster) if _fits(workload, cluster, l)]
        return min(sorted(fitting, key=lambda l: (l.tp * l.pp, -l.zero_stage))[:3], key=lambda l: price(l).step_s)

    with pytest.raises(ExerciseFailed, match=r"16 sequences of 512 .* fits but takes .* Where does yours lose time"):
        check_layout_choice(least_model_parallel)
    with pytest.raises(ExerciseFailed, match="priced 4 layouts .* the budget is 3"):  # planted: price everything
        check_layout_choice(lambda workload, cluster, price: min(_layouts(workload, cluster),
                                                                 key=lambda l: (not price(l).fits, price(l).step_s)))
    for shortcut in (lambda workload, cluster, price: next(p for p in planner.candidates(workload, cluster) if p.fits).layout,
                     lambda workload, cluster, price: planner.predict(workload, planner.Layout(dp=8), cluster).layout):
        with pytest.raises(ExerciseFailed, match="without the planner's predict or candidates"):
            check_layout_choice(shortcut)
    assert planner.candidates(planner.Workload("Llama 2 7B", 8, 512), planner.cluster_of("nvlink"))  # back


def test_chapter_07_solutions_shown_pass_their_checks():
    """The solutions chapter 07 shows (collapsed, never run there) pass the checks, refusals and budget
    included: what a learner copies works."""
    import re
    from pathlib import Path

    import nbformat

    from parlab import measure, planner
    from parlab.exercises import check_group_ranks, check_layout_choice, check_model_states

    notebook = nbformat.read(Path(__file__).parents[1] / "notebooks" / "07_putting_it_together.ipynb", 4)
    (details,) = [c.source for c in notebook.cells if c.source.startswith("<details><summary>Solutions")]
    namespace = {"measure": measure, "planner": planner}  # what the chapter imported
    exec(re.search(r"```python\n(.*?)```", details, re.S).group(1), namespace)
    check_group_ranks(namespace["group_ranks"])
    check_model_states(namespace["model_states"])
    check_layout_choice(namespace["choose_layout"])
