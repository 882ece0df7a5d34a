"""Each exercise check passes the reference and fails a planted wrong answer with a precise message."""

import pytest
import torch
import torch.distributed as dist

from parlab.exercises import (
    ExerciseFailed,
    check_mean_over_ranks,
    check_ranks,
    check_ring_all_reduce,
    check_zero_memory,
    first_difference,
)
from parlab.ring import ring_all_reduce, ring_reduce_scatter


def test_first_difference_names_element_expected_and_got():
    expected = torch.tensor([1.0, 2.0, 3.0, 4.0])
    got = torch.tensor([1.0, 2.0, 9.0, 4.0])
    assert first_difference(expected.clone(), expected) is None
    assert first_difference(got, expected) == "element 2: expected 3, got 9 (1 of 4 elements differ)"
    assert "shape (4,)" in first_difference(torch.zeros(3), expected)
    assert "got NoneType" in first_difference(None, expected)


@pytest.mark.parametrize("world_size, numel", [(4, None), (3, 7)])
def test_reference_ring_passes(world_size, numel):
    passed = check_ring_all_reduce(ring_all_reduce, world_size=world_size, numel=numel)
    assert "matches dist.all_reduce" in repr(passed)


def only_reduce_scatter(t):
    # planted mistake: forgets the all-gather phase
    ring_reduce_scatter(list(torch.tensor_split(t.view(-1), dist.get_world_size())))


def test_missing_all_gather_is_located():
    with pytest.raises(ExerciseFailed) as err:
        check_ring_all_reduce(only_reduce_scatter, world_size=2)
    # 2 ranks, 6 elements: rank 0 owns the sum of chunk 1, chunk 0 still holds its partial x + y
    # inputs: rank 0 arange(6), rank 1 arange(6) + 100 -> sums 100, 102, ...; rank 0's element 0 is 0+100
    msg = str(err.value)
    assert "only_reduce_scatter on rank" in msg and "element" in msg and "expected" in msg


def calls_all_reduce(t):
    dist.all_reduce(t)  # planted: right answer by the forbidden route


def test_using_all_reduce_is_refused():
    with pytest.raises(ExerciseFailed, match="called all_reduce"):
        check_ring_all_reduce(calls_all_reduce, world_size=2)


def send_everything(t):
    # planted: right sums, but every rank sends its whole buffer to every other rank: (n-1) x buffer
    n, r = dist.get_world_size(), dist.get_rank()
    total = t.clone()
    for step in range(1, n):
        incoming = torch.empty_like(t)
        req = dist.isend(t, (r + step) % n)
        dist.recv(incoming, (r - step) % n)
        req.wait()
        total += incoming
    t.copy_(total)


def test_too_many_bytes_is_refused():
    with pytest.raises(ExerciseFailed, match=r"ranks sent \[72, 72, 72, 72\] bytes.*= 36 bytes"):
        check_ring_all_reduce(send_everything, world_size=4, numel=6)


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


def zero_gb(num_params, n_d, stage, k=12):
    psi = num_params
    shards = {0: (1, 1, 1), 1: (1, 1, n_d), 2: (1, n_d, n_d), 3: (n_d, n_d, n_d)}[stage]
    return (2 * psi / shards[0] + 2 * psi / shards[1] + k * psi / shards[2]) / 1e9


def zero_gb_forgets_master_weights(num_params, n_d, stage, k=12):
    return zero_gb(num_params, n_d, stage, k - 4) if stage else zero_gb(num_params, n_d, stage, k)


def test_zero_memory_exercise():
    assert "all 32 cases" in repr(check_zero_memory(zero_gb))
    with pytest.raises(ExerciseFailed, match=r"zero_gb_forgets_master_weights\(num_params=7500000000.0, "
                                             r"n_d=1, stage=1\): expected 120, got 90.0"):
        check_zero_memory(zero_gb_forgets_master_weights)


def test_mean_over_ranks_check_both_ways():
    def right(t):
        dist.all_reduce(t)
        t /= dist.get_world_size()

    def sum_only(t):
        dist.all_reduce(t)

    def nothing(t):
        pass

    assert "mean over 2 ranks" in repr(check_mean_over_ranks(right, world_size=2))
    with pytest.raises(ExerciseFailed, match=r"sum_only on rank 0 of 2: element 0: expected 50, got 100"):
        check_mean_over_ranks(sum_only, world_size=2)
    with pytest.raises(ExerciseFailed, match=r"nothing on rank 0 of 2: element 0: expected 50, got 0"):
        check_mean_over_ranks(nothing, world_size=2)


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


def test_group_ranks_check_both_ways():
    from parlab.exercises import check_group_ranks

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


def test_model_states_check_both_ways():
    from parlab.exercises import check_model_states

    def states(num_params, dp, tp, pp, zero_stage, over=None):
        psi = num_params / (tp * pp)
        n = over or dp
        weights, grads, adam = 2 * psi, 2 * psi, 12 * psi
        return weights / (n if zero_stage >= 3 else 1) + grads / (n if zero_stage >= 2 else 1) + \
            adam / (n if zero_stage >= 1 else 1)

    assert "all 48 layouts" in repr(check_model_states(states))
    with pytest.raises(ExerciseFailed, match="ZeRO sharding over all the ranks"):  # planted: ZeRO over the world
        check_model_states(lambda num_params, dp, tp, pp, zero_stage:
                           states(num_params, dp, tp, pp, zero_stage, over=dp * tp * pp))


def test_layout_choice_check_both_ways():
    from parlab import planner
    from parlab.exercises import check_layout_choice

    def best(workload, cluster):
        return next(p for p in planner.candidates(workload, cluster) if p.fits).layout

    assert "all 4 scenarios" in repr(check_layout_choice(best))
    with pytest.raises(ExerciseFailed, match=r"Llama 2 7B.*DP 8 needs .* GB per GPU"):  # planted: DDP everywhere
        check_layout_choice(lambda workload, cluster: planner.Layout(dp=cluster.world_size))
    with pytest.raises(ExerciseFailed, match="TP 16 spans nodes"):  # planted: TP over every GPU
        check_layout_choice(lambda workload, cluster: planner.Layout(tp=cluster.world_size) if cluster.nodes > 1
                            else best(workload, cluster))
