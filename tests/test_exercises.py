"""Each exercise check passes the reference and fails a planted wrong answer with a precise message."""

import re
import types

import pytest
import torch
import torch.distributed as dist

import parlab.decide.planner
from parlab.course.exercises import (
    ExerciseFailed,
    check_crossover_bytes,
    check_ddp_buckets,
    check_activation_scaling,
    check_gated_mlp_bytes,
    check_hang_prediction,
    check_largest_models,
    check_max_params,
    check_my_slice,
    check_ranks,
    check_recursive_doubling,
    check_weighted_average,
    first_difference,
)
from parlab.course.exercises.ch01 import _max_params
from parlab.course.exercises.ch02 import _crossover_bytes
from parlab.course.exercises.ch03 import _reference_buckets
from parlab.lab.models import tiny_gpt2
from parlab.lab.parallel import expert
from parlab.lab.parallel.ring import ring_all_reduce


def solutions(chapter: str, count: int | None = None, **names) -> dict:
    """What a chapter's collapsed solution cells (tagged ``solution``) define, run as the learner would open
    them, with ``torch``, ``dist``, ``math`` and ``names`` standing for what the chapter imported before them.
    ``chapter`` is its number ("04") or file name; ``count``, when given, the number of solution cells."""
    import math
    from pathlib import Path

    import nbformat

    folder = Path(__file__).parents[1] / "notebooks"
    path = folder / chapter if chapter.endswith(".ipynb") else next(folder.glob(f"{chapter}_*.ipynb"))
    cells = [c for c in nbformat.read(path, as_version=4).cells if "solution" in c.metadata.get("tags", [])]
    assert cells and all(c.metadata.get("jupyter", {}).get("source_hidden") is True for c in cells), (
        f"{path.name}: its solution cells must exist and be collapsed")
    assert count is None or len(cells) == count, f"{path.name}: {len(cells)} solution cells, expected {count}"
    namespace = {"torch": torch, "dist": dist, "math": math, **names}
    for cell in cells:
        exec(cell.source, namespace)  # noqa: S102 - the chapter's own solution cells
    return namespace


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


def ceil_slice(n_items):
    rank, n = dist.get_rank(), dist.get_world_size()
    per = -(-n_items // n)  # planted: every share rounded up, the last rank gets what is left
    return min(rank * per, n_items), min((rank + 1) * per, n_items)


def test_my_slice_check_both_ways():
    assert "evenly" in repr(check_my_slice(even_slice, world_size=3))
    with pytest.raises(ExerciseFailed, match=r"last_rank_takes_the_rest\(8\) with 3 ranks: shares of \[2, 2, 4\]"):
        check_my_slice(last_rank_takes_the_rest, world_size=3)
    with pytest.raises(ExerciseFailed, match=r"\(the last rank took all the remainder"):
        check_my_slice(last_rank_takes_the_rest, world_size=3)
    with pytest.raises(ExerciseFailed, match=r"ceil_slice\(10\) with 4 ranks: shares of \[3, 3, 3, 1\] items; .*"
                                             r"\(the last rank is left short"):
        check_my_slice(ceil_slice, world_size=4)
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

def counts_the_gate_output(s, b, h, i, bytes_per_value):
    return bytes_per_value * s * b * (h + 4 * i)


def test_gated_mlp_check_against_measurement():
    assert "all 4 cases" in repr(check_gated_mlp_bytes(solutions("01")["solution_gated_relu_mlp_bytes"]))
    with pytest.raises(ExerciseFailed, match=r"s=16, b=2, h=32, i=96, bytes_per_value=4\) = 53248; "
                                             r"measured 40,960 bytes. You counted one s·b·i tensor too many"):
        check_gated_mlp_bytes(counts_the_gate_output)


def test_chapter_01_checks_refuse_the_package_answers():
    import parlab.lab.measure
    from parlab.course.exercises import ch01
    from parlab.lab.measure import measure_activations  # bound before the check, as a notebook cell would

    def measures(s, b, h, i, bytes_per_value):
        return measure_activations(ch01.GatedReLUMLP(h, i), torch.randn(s, b, h, requires_grad=True))

    def measures_by_attribute(s, b, h, i, bytes_per_value):
        return parlab.lab.measure.measure_activations(ch01.GatedReLUMLP(h, i), torch.randn(s, b, h, requires_grad=True))

    with pytest.raises(ExerciseFailed, match="measure_activations is the package's answer to this exercise: the "
                                             "exercise asks you to count"):
        check_gated_mlp_bytes(measures)
    with pytest.raises(ExerciseFailed, match="measure_activations is the package's answer"):
        check_gated_mlp_bytes(measures_by_attribute)
    assert parlab.lab.measure.measure_activations is measure_activations  # nothing was patched
    with pytest.raises(ExerciseFailed, match="ch01._max_params is the package's answer"):
        check_max_params(lambda gpu_gb, n_d, stage, k=12: ch01_max_params(gpu_gb, n_d, stage, k))
    estimate = parlab.lab.measure.estimate_memory

    def by_the_estimator(gpu_gb, n_d, stage, k=12):
        return gpu_gb * 1e9 / estimate(num_params=1, precision="bf16", world_size=n_d, zero_stage=stage).total

    with pytest.raises(ExerciseFailed, match="estimate_memory is the package's answer"):  # through a closure
        check_max_params(by_the_estimator)


ch01_max_params = _max_params


def halves_both(h, a, s, b):
    return 2.0, 2.0  # planted: forgets that the scores are s × s


def test_activation_scaling_check_both_ways():
    solution = solutions("01")["solution_activation_scaling"]
    assert "all 6 layers" in repr(check_activation_scaling(solution))
    assert solution(h=1600, a=25, s=1024, b=8) == pytest.approx((2, 114 / 37))  # 34 + 80 against (34 + 40) / 2
    with pytest.raises(ExerciseFailed, match=r"expected \(2, 3\.081\), got \(2\.0, 2\.0\)\. Halving s halves"):
        check_activation_scaling(halves_both)


def halves_with_floor_division(h, a, s, b):  # planted: b // 2, which is 0 at b = 1
    def per_layer(s, b):
        return s * b * h * (34 + 5 * a * s / h)
    return per_layer(s, b) / per_layer(s, b // 2), per_layer(s, b) / per_layer(s // 2, b)


def test_chapter_01_a_function_that_raises_fails_its_check_naming_the_call_and_the_line():
    from parlab.course.exercises import check_crossover_bytes

    with pytest.raises(ExerciseFailed) as err:
        check_activation_scaling(halves_with_floor_division)
    message = str(err.value)
    assert message.startswith("halves_with_floor_division(4096, 32, 4096, 1) raised ZeroDivisionError")  # by position
    assert "at line " in message and "of halves_with_floor_division: return per_layer(s, b) / per_layer(s, b // 2)" \
        in message
    assert "At b=1, b // 2 is 0: a micro-batch of 1 halved is b / 2 = 0.5" in message
    assert "Traceback" not in message and message.count("\n") <= 3  # the line that raised, not a traceback

    def crossover_of_nothing(n, alpha, bandwidth):
        return {}[n]  # raised inside the learner's own code, through check_function

    with pytest.raises(ExerciseFailed, match=r"crossover_of_nothing\(\d+, .*\) raised KeyError"):
        check_crossover_bytes(crossover_of_nothing)


def max_params_forgets_sharding(gpu_gb, n_d, stage, k=12):
    return gpu_gb * 1e9 / (4 + k)


def _shards(n_d, stage, k=12, weight_bytes=2):  # the learner's bytes per parameter on one GPU
    return weight_bytes / (n_d if stage >= 3 else 1) + weight_bytes / (n_d if stage >= 2 else 1) \
        + k / (n_d if stage >= 1 else 1)


MAX_PARAMS_MISTAKES = {  # planted: each a unit or a count a learner gets wrong, and the hint that names it
    "10⁹ times too few: gpu_gb is in GB": lambda gpu_gb, n_d, stage, k=12: gpu_gb / _shards(n_d, stage, k),
    "You took a GB as 2³⁰ bytes \\(a GiB\\)": (
        lambda gpu_gb, n_d, stage, k=12: gpu_gb * 2**30 / _shards(n_d, stage, k)),
    "That is for K = 12: this case has k=4": lambda gpu_gb, n_d, stage, k=12: gpu_gb * 1e9 / _shards(n_d, stage),
    "You counted 4 bytes each for the weights and gradients": (
        lambda gpu_gb, n_d, stage, k=12: gpu_gb * 1e9 / _shards(n_d, stage, k, weight_bytes=4)),
    "got 12000000000. That is what fits at stage 3: stage 0 shards nothing, so n_d does not matter": (
        lambda gpu_gb, n_d, stage, k=12: gpu_gb * 1e9 * n_d / (4 + k)),  # every byte divided by n_d
}


def test_max_params_check_both_ways():
    shown = solutions("01")
    assert "agrees with the reference" in repr(check_max_params(shown["solution_max_params"]))
    assert _max_params(80, 1, 0) == pytest.approx(5e9)  # 80 GB / 16 bytes per parameter
    with pytest.raises(ExerciseFailed, match=r"max_params_forgets_sharding\(gpu_gb=24, n_d=8, stage=1\): "
                                             r"expected 4\.364e\+09, got 1500000000\.0. That is what fits at "
                                             r"stage 0: stage 1 shards the optimizer state over the n_d=8 GPUs"):
        check_max_params(max_params_forgets_sharding)
    for hint, wrong in MAX_PARAMS_MISTAKES.items():
        with pytest.raises(ExerciseFailed, match=hint):
            check_max_params(wrong)
    assert "5 B parameters; 64 with ZeRO-3, 320 B" in repr(
        check_largest_models(shown["solution_one_gpu_b"], shown["solution_zero3_64_b"]))
    with pytest.raises(ExerciseFailed, match="zero3_64 = 80"):  # planted: the GPU size for the model size
        check_largest_models(5, 80)
    with pytest.raises(ExerciseFailed, match="in billions of parameters"):
        check_largest_models(5e9, 320e9)


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


def _all_reduce_in_a_thread(t):  # planted: the all-reduce done where a dispatch mode cannot see it
    import threading

    worker = threading.Thread(target=dist.all_reduce, args=(t,))
    worker.start()
    worker.join()


def _all_reduce_outside_the_modes(t):  # planted: under _disable_current_modes
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        dist.all_reduce(t)


def _padded_with_sends(t):  # planted: the right sums by all-reduce hidden in a thread, plus sends for show
    rank, n = dist.get_rank(), dist.get_world_size()
    _all_reduce_in_a_thread(t)
    for step in (1, 1):
        request = dist.isend(t.clone(), rank ^ step)
        dist.recv(torch.empty_like(t), rank ^ step)
        request.wait()


def _ring_partners(t):  # planted: right sums, but every message goes to the next rank around a ring
    rank, n = dist.get_rank(), dist.get_world_size()
    held = t.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(t)
        request = dist.isend(held.clone(), (rank + 1) % n)
        dist.recv(incoming, (rank - 1) % n)
        request.wait()
        t += incoming
        held = incoming
    return None


def _sends_t_itself(t, wait_first=False):  # sends t, not a copy; adds into it before the send is waited on
    rank, n = dist.get_rank(), dist.get_world_size()
    step = 1
    while step < n:
        incoming = torch.empty_like(t)
        request = dist.isend(t, rank ^ step)
        dist.recv(incoming, rank ^ step)
        if wait_first:  # right: the send has read t before it changes
            request.wait()
        t += incoming
        if not wait_first:
            request.wait()
        step *= 2


def _peers_on_rank():
    from parlab.lab.measure import CommLog
    from parlab.lab.parallel.comm import communicate, communicate_batch

    rank = dist.get_rank()
    with core.record_group() as seen:
        with CommLog() as log:
            communicate("send" if rank == 0 else "recv", torch.zeros(3), peer=1 - rank)
            batch = [("send", torch.zeros(2), 1 - rank, "a"), ("recv", torch.zeros(2), 1 - rank, "b")]
            for work in communicate_batch(batch):
                work.wait()
        dist.reduce(torch.zeros(1), dst=1)
    return [(r.op, r.peer) for r in log.records], [(r.op, r.peer) for r in seen.records]


def test_records_know_their_peer_in_communicate_and_on_the_group():
    import parlab

    (strategy0, group0), (strategy1, _) = parlab.launch(_peers_on_rank, world_size=2, announce=False, output="all")
    assert strategy0 == [("send", 1), ("send", 1), ("recv", 1)] and strategy1[0] == ("recv", 0)
    assert group0 == [("send", 1), ("send", 1), ("recv", 1), ("reduce", 1)]  # a reduce's peer is its root


def test_recursive_doubling_check_sees_the_group_and_each_partner():
    for hidden in (_all_reduce_in_a_thread, _all_reduce_outside_the_modes):
        with pytest.raises(ExerciseFailed, match="on rank 0 called all_reduce: build the all-reduce"):
            check_recursive_doubling(hidden, world_size=4)
    with pytest.raises(ExerciseFailed, match="called all_reduce"):
        check_recursive_doubling(_padded_with_sends, world_size=4)
    with pytest.raises(ExerciseFailed, match=r"rank 0 sent to ranks \[1, 1, 1\]; .* once to each of \[1, 2\]"):
        check_recursive_doubling(_ring_partners, world_size=4)
    # the race: gloo may have copied the buffer before the add (right sums: the early write is named) or not
    with pytest.raises(ExerciseFailed, match="wrote into the buffer it was sending to rank 1 before that isend|"
                                             "expected .* elements differ"):
        check_recursive_doubling(_sends_t_itself, world_size=4)
    assert "rank XOR 2^k" in repr(check_recursive_doubling(lambda t: _sends_t_itself(t, wait_first=True), world_size=4))


@pytest.mark.parametrize("world_size", [2, 4])
def test_recursive_doubling_check_passes_the_reference(world_size):
    assert "log₂ n × buffer" in repr(check_recursive_doubling(recursive_doubling, world_size=world_size))


def test_chapter_02_solutions_pass_and_think_questions_are_checked():
    from parlab.course.exercises import check_below_crossover, check_send_buffer

    shown = solutions("02_collectives.ipynb")
    assert "log₂ n × buffer" in repr(check_recursive_doubling(shown["solution_my_all_reduce"], world_size=4))
    assert "agrees" in repr(check_crossover_bytes(shown["solution_crossover_bytes"]))
    assert "isend may still" in repr(check_send_buffer(shown["solution_why_copy"]))
    assert "recursive doubling" in repr(check_below_crossover(shown["solution_below_wins"]))
    # planted wrong answers: each is told why
    with pytest.raises(ExerciseFailed, match="separate processes"):
        check_send_buffer("c")
    with pytest.raises(ExerciseFailed, match=r"None is not one of \['a', 'b', 'c'\]"):
        check_send_buffer(None)
    with pytest.raises(ExerciseFailed, match="latency dominates"):
        check_below_crossover("ring")


def test_chapter_02_checks_draw_fresh_inputs():
    # the sums a failed check prints belong to that call only: copied into an answer, they fail the next one
    printed = []
    for _ in range(2):
        with pytest.raises(ExerciseFailed) as err:
            check_recursive_doubling(lambda t: t.zero_(), world_size=2)
        printed.append(str(err.value).split("expected")[1].splitlines()[0])
    assert printed[0] != printed[1]


def crossover_forgets_the_ring_chunks(n, alpha, bandwidth):
    return alpha * bandwidth  # treats the ring's messages as whole buffers


def test_crossover_check_both_ways():
    assert "agrees" in repr(check_crossover_bytes(solutions("02")["solution_crossover_bytes"]))
    with pytest.raises(ExerciseFailed, match="_crossover_bytes is the package's answer"):
        check_crossover_bytes(_crossover_bytes)
    # on 4 ranks: ring 6·(α + m/4B), doubling 2·(α + m/B): equal at m = 8αB
    assert _crossover_bytes(4, 1e-5, 1e9) == pytest.approx(8e4)
    with pytest.raises(ExerciseFailed, match=r"crossover_forgets_the_ring_chunks\(4, "):
        check_crossover_bytes(crossover_forgets_the_ring_chunks)


def test_in_order_lays_a_case_out_by_the_reference_parameters():
    from parlab.course.exercises.core import in_order

    def reference(p, target, v=1, *, strict=False):
        return p, target, v, strict

    assert in_order(reference, {"target": 0.1, "p": 4}) == ((4, 0.1), {})
    assert in_order(reference, {"v": 2, "target": 0.1, "p": 4, "strict": True}) == ((4, 0.1, 2), {"strict": True})
    assert in_order(("h", "a", "s", "b"), {"s": 8, "b": 1, "a": 2, "h": 4}) == ((4, 2, 8, 1), {})
    assert in_order(("a", "b", "c"), {"a": 1, "c": 3}) == ((1,), {"c": 3})  # after a default left out: by name
    with pytest.raises(ValueError, match=r"names \['x'\], not parameters of \['a', 'b'\]"):
        in_order(("a", "b"), {"x": 1})


def test_a_learner_may_rename_parameters_the_checks_call_by_position():
    """A learner's function is called by position, in the order of the exercise's parameters: renamed parameters
    pass, a wrong answer under new names still fails, and the message shows the call as it was made."""
    crossover = solutions("02")["solution_crossover_bytes"]

    def ring_vs_doubling(ranks, latency_s, bytes_per_s):  # check_function's path
        return crossover(ranks, latency_s, bytes_per_s)

    def chunks_forgotten(ranks, latency_s, bytes_per_s):
        return crossover_forgets_the_ring_chunks(ranks, latency_s, bytes_per_s)

    assert "agrees" in repr(check_crossover_bytes(ring_vs_doubling))
    with pytest.raises(ExerciseFailed, match=r"^chunks_forgotten\(4, [\d.e-]+, [\d.e+]+\): expected"):
        check_crossover_bytes(chunks_forgotten)

    max_params = solutions("01")["solution_max_params"]

    def most_params(memory_gb, gpus, zero, k_bytes=12, gradient_bytes=2):  # a chapter's own loop over its cases
        return max_params(memory_gb, gpus, zero, k_bytes, gradient_bytes)

    def sharding_forgotten(memory_gb, gpus, zero, k_bytes=12, gradient_bytes=2):
        return max_params_forgets_sharding(memory_gb, gpus, zero, k_bytes)

    assert "agrees" in repr(check_max_params(most_params))
    with pytest.raises(ExerciseFailed, match=r"^sharding_forgotten\(gpu_gb=.*expected"):
        check_max_params(sharding_forgotten)  # (its message names the case; the call was positional)
    scaling = solutions("01")["solution_activation_scaling"]  # the exercise's order (h, a, s, b), not s, b, h, a
    assert "both factors" in repr(check_activation_scaling(lambda hidden, heads, seq, batch: scaling(hidden, heads, seq, batch)))
    with pytest.raises(ExerciseFailed, match=r"<lambda>\(hidden, heads, seq\) cannot be called as "
                                             r"<lambda>\(\d+, \d+, \d+, \d+\), as the check calls it"):
        check_activation_scaling(lambda hidden, heads, seq: scaling(hidden, heads, seq, 1))


# ---- chapter 03 -------------------------------------------------------------------------------------

def equal_weights(params, local_batch_size):
    for p in params:
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def weighted_average(params, local_batch_size):
    # each rank's mean gradient weighted by its share of the examples, then summed
    total = torch.tensor([float(local_batch_size)])
    dist.all_reduce(total)
    for p in params:
        p.grad.mul_(local_batch_size / total)
        dist.all_reduce(p.grad)


def assumes_equal_batches(params, local_batch_size, batch_per_rank=4):
    for p in params:  # planted: the total taken as the chapter's batch_per_rank × n
        p.grad *= local_batch_size / (batch_per_rank * dist.get_world_size())
        dist.all_reduce(p.grad)


def unnormalised(params, local_batch_size):
    for p in params:  # planted: weighted, never divided by the total
        p.grad *= local_batch_size
        dist.all_reduce(p.grad)


def test_weighted_average_check_both_ways():
    assert "ranks holding [" in repr(check_weighted_average(weighted_average, world_size=3))
    with pytest.raises(ExerciseFailed, match=r"every rank weighs the same, but they hold \[\d, \d\] examples"):
        check_weighted_average(equal_weights, world_size=2)
    for world_size in (2, 4):  # the chapter's batch_per_rank × n taken for the total, and no total at all
        for wrong in (assumes_equal_batches, unnormalised):
            with pytest.raises(ExerciseFailed, match="points the right way but is .* times the global mean's"):
                check_weighted_average(wrong, world_size=world_size)
    with pytest.raises(ExerciseFailed, match=r".grad is unchanged"):
        check_weighted_average(lambda params, b: None, world_size=2)


def ddp_buckets_always_1mib_first(ready_bytes, bucket_cap_mb=None):
    # planted: a 1 MiB first bucket whatever the cap (DDP does that only at its default cap)
    first, i = 0, 0
    while i < len(ready_bytes) and first < 2**20:
        first, i = first + ready_bytes[i], i + 1
    return [first] + ddp_rule(ready_bytes[i:], 25 if bucket_cap_mb is None else bucket_cap_mb)


#: DDP's rule, the check's own answer's code under another name (what a check in the learner's process cannot
#: stop, see docs/course_design.md), so that it can stand for a learner's right answer
ddp_rule = types.FunctionType(_reference_buckets.__code__.replace(co_name="ddp_rule", co_qualname="ddp_rule"),
                              _reference_buckets.__globals__, "ddp_rule", _reference_buckets.__defaults__)
ddp_rule.__kwdefaults__ = dict(_reference_buckets.__kwdefaults__)  # DDP's rule, not one of its near misses


def learners_buckets(ready_bytes, bucket_cap_mb=None, mib=2**20, closes_at_the_limit=True):
    # a learner's DDP rule, written out; the planted mistakes below change its unit or its comparison
    cap = (25 if bucket_cap_mb is None else bucket_cap_mb) * mib
    limit = mib if bucket_cap_mb is None else cap
    buckets, size = [], 0
    for nbytes in ready_bytes:
        size += nbytes
        if size > limit or (closes_at_the_limit and size == limit):
            buckets.append(size)
            size, limit = 0, cap
    return buckets + ([size] if size else [])


def buckets_of_a_million_bytes(ready_bytes, bucket_cap_mb=None):  # planted: a MB read as 10⁶ bytes
    return learners_buckets(ready_bytes, bucket_cap_mb, mib=10**6)


def buckets_close_above_the_cap(ready_bytes, bucket_cap_mb=None):  # planted: > for >=
    return learners_buckets(ready_bytes, bucket_cap_mb, closes_at_the_limit=False)


def buckets_of_a_million_close_above(ready_bytes, bucket_cap_mb=None):  # planted: both
    return learners_buckets(ready_bytes, bucket_cap_mb, mib=10**6, closes_at_the_limit=False)


def test_chapter_03_ddp_buckets_names_a_mb_of_a_million_bytes_and_greater_than():
    from parlab.course.exercises.ch03 import EDGE_CASES

    for ready, cap in EDGE_CASES:  # the learner's rule is DDP's; each mistake differs from it on a fixed case
        assert learners_buckets(ready, cap) == _reference_buckets(ready, cap)
        assert buckets_close_above_the_cap(ready, cap) != _reference_buckets(ready, cap) or cap == 1
    assert buckets_of_a_million_bytes(*EDGE_CASES[1]) != _reference_buckets(*EDGE_CASES[1])  # not by a draw's luck
    with pytest.raises(ExerciseFailed, match=r"bucket_cap_mb=1\) = \[1000000, 1122112, 4096\]; DDP's rule gives "
                                             r"\[1073536, 1048576, 4096\].*You read bucket_cap_mb's MB as 10⁶ "
                                             r"bytes: DDP counts bucket_cap_mb in MiB, 2²⁰ = 1,048,576 bytes"):
        check_ddp_buckets(buckets_of_a_million_bytes)
    with pytest.raises(ExerciseFailed, match=r"bucket_cap_mb=None\) = \[1052672, 1052672\].*You close a bucket "
                                             r"only above the limit \(>\): a bucket closes once it holds the "
                                             r"limit or more \(>=\)"):
        check_ddp_buckets(buckets_close_above_the_cap)
    with pytest.raises(ExerciseFailed, match=r"bucket_cap_mb=1\) = .*You read bucket_cap_mb's MB as 10⁶ bytes \(DDP "
                                             r"counts bucket_cap_mb in MiB.*\), and you close a bucket only above"):
        check_ddp_buckets(buckets_of_a_million_close_above)


def test_ddp_buckets_check_against_pytorch():
    assert "and on fresh gradient sizes" in repr(check_ddp_buckets(ddp_rule))
    with pytest.raises(ExerciseFailed, match="ch03._reference_buckets is the package's answer"):
        check_ddp_buckets(_reference_buckets)
    with pytest.raises(ExerciseFailed, match=r"bucket_cap_mb=0.5\).*Only at DDP's default cap \(bucket_cap_mb=None\) "
                                             r"is the first bucket's limit 1 MiB"):
        check_ddp_buckets(ddp_buckets_always_1mib_first)


def test_ddp_buckets_check_refuses_a_layout_copied_from_its_message():
    with pytest.raises(ExerciseFailed) as err:
        check_ddp_buckets(lambda ready_bytes, bucket_cap_mb=None: [sum(ready_bytes)])
    assert "DDP built" in str(err.value)  # the message shows DDP's real layout for the model's gradients
    seen = {}

    def transcribed(ready_bytes, bucket_cap_mb=None):
        # the layouts of that message, typed in: right for the model, the same whatever the gradients
        return seen.setdefault(bucket_cap_mb, ddp_rule(ready_bytes, bucket_cap_mb))

    with pytest.raises(ExerciseFailed, match="DDP's rule gives"):
        check_ddp_buckets(transcribed)


def test_chapter_03_solutions_pass_their_checks():
    from parlab.course.exercises import check_early_buckets

    shown = solutions("03_dp_vs_ddp.ipynb")
    assert "global mean" in repr(check_weighted_average(shown["solution_weighted_average"], world_size=3))
    assert "fresh gradient sizes" in repr(check_ddp_buckets(shown["solution_ddp_buckets"]))
    sizes = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)  # the chapter's defaults
    assert "nothing overlaps" in repr(check_early_buckets(shown["solution_early_buckets"](sizes), sizes=sizes))


def test_early_buckets_check_both_ways():
    from parlab.course.exercises import check_early_buckets

    sizes = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    with pytest.raises(ExerciseFailed, match="keys"):
        check_early_buckets({1024: (1, 0)}, sizes=sizes)
    right_at_1kib = _real(sizes, 1024)
    with pytest.raises(ExerciseFailed, match=r"bucket_bytes=16777216: 1 of 1 buckets starting early"):
        # planted: "every bucket leaves early", as if the last gradient could be sent before it exists
        check_early_buckets({1024: right_at_1kib, 16 * 2**20: (1, 1)}, sizes=sizes)
    with pytest.raises(ExerciseFailed, match=r"bucket_bytes=1024: you said 3 buckets"):
        check_early_buckets({1024: (3, 2), 16 * 2**20: (1, 0)}, sizes=sizes)


def _real(sizes, bucket_bytes):
    import parlab
    from parlab.course.exercises.ch03 import _early_launches

    return tuple(parlab.launch(_early_launches, world_size=2, args=(sizes, bucket_bytes, 8), announce=False,
                               output="none")[0])


# -- chapters 05 and 06: the collapsed solutions pass, planted wrong answers and copies fail --------------

def test_chapter_05_solutions_pass_and_copies_fail():
    import torch.nn.functional as F

    from parlab.course.exercises import check_row_parallel_forward, check_sp_costs, check_tp_collectives
    from parlab.course.exercises.ch05 import CASES, _reference_tp_collectives
    from parlab.lab.parallel import tensor as tp

    sol = solutions("05", F=F, tp=tp)
    assert "one all-reduce" in repr(check_row_parallel_forward(sol["solution_row_parallel_forward"], world_size=2))
    assert "11 chains, 3 of them drawn anew" in repr(check_tp_collectives(sol["solution_tp_collectives"]))
    fixed = {tuple(c): sol["solution_tp_collectives"](list(c)) for c in CASES}  # computed over the fixed cases
    with pytest.raises(ExerciseFailed, match=r"tp_collectives\(\[.*\]\) returned None"):
        check_tp_collectives(lambda splits: fixed.get(tuple(splits)))
    assert "both reasons" in repr(check_sp_costs(sol["solution_sp_recompute"], sol["solution_norms"],
                                                 sol["solution_literal"]))
    # the package's answer, however it is reached, is refused while the learner's code runs
    for copy in (lambda layer, x: type(layer).forward(layer, x), lambda layer, x: layer(x),
                 lambda layer, x, f=tp.RowParallelLinear.forward: f(layer, x)):
        with pytest.raises(ExerciseFailed, match="RowParallelLinear.forward is the package's answer .* own forward"):
            check_row_parallel_forward(copy, world_size=2)
    with pytest.raises(ExerciseFailed, match="never added up"):  # planted: no g
        check_row_parallel_forward(lambda layer, x: F.linear(x, layer.weight) + layer.bias, world_size=2)
    with pytest.raises(ExerciseFailed, match="_reference_tp_collectives is the package's answer"):
        check_tp_collectives(_reference_tp_collectives)
    with pytest.raises(ExerciseFailed, match="_reference_tp_collectives is the package's answer"):
        check_tp_collectives(lambda splits: _reference_tp_collectives(splits))
    with pytest.raises(ExerciseFailed, match="half of it: the values are fp32, 4 bytes each, and GPT-2's layer "
                                             "has two"):  # planted: only c_attn's input (or bf16's 2 bytes)
        check_sp_costs(lambda batch, seq_len, hidden, tp_size: (batch * seq_len * hidden * 4 * (tp_size - 1) // tp_size, 2),
                       "b", "a")
    assert "costs" in repr(check_sp_costs(lambda b, s, h, t: sol["solution_sp_recompute"](b, s, h, t), "b", "a"))  # renamed
    with pytest.raises(ExerciseFailed, match=r"<lambda>\(batch, seq_len, hidden\) cannot be called as "
                                             r"<lambda>\(4, 32, 64, 4\), as the check calls it"):  # a parameter forgotten
        check_sp_costs(lambda batch, seq_len, hidden: sol["solution_sp_recompute"](batch, seq_len, hidden, 4), "b", "a")
    with pytest.raises(ExerciseFailed, match=r"\(b\) norms: 'a'"):
        check_sp_costs(sol["solution_sp_recompute"], "a", "a")
    with pytest.raises(ExerciseFailed, match=r"\(c\) literal: 'b'"):
        check_sp_costs(sol["solution_sp_recompute"], "b", "b")


def test_chapter_05_hints_name_dividing_and_multiplying_by_t():
    """05.1 dividing by t (an average where a sum is needed; the bias split t ways) and 05.3 multiplying by t
    (seq_len taken for each rank's chunk) fail with a hint that names the mistake, not only the numbers."""
    import torch.nn.functional as F

    from parlab.course.exercises import check_row_parallel_forward, check_sp_costs
    from parlab.lab.parallel import tensor as tp

    def averaged(layer, x):  # the partial sums averaged, as DDP averages gradients
        return tp.reduce_from_tp(F.linear(x, layer.weight), layer.comm) / layer.comm.size + layer.bias

    def bias_split(layer, x):  # bias/t on every rank before the sum: the output is right, its gradient is not
        return tp.reduce_from_tp(F.linear(x, layer.weight) + layer.bias / layer.comm.size, layer.comm)

    with pytest.raises(ExerciseFailed, match=r"partial sums divided by t = 2: an average.*do not divide by t"):
        check_row_parallel_forward(averaged, world_size=2)
    with pytest.raises(ExerciseFailed, match=r"bias's gradient is 1/2 of the dense layer's: the bias was divided by t"):
        check_row_parallel_forward(bias_split, world_size=2)

    def times_t(batch, seq_len, hidden, tp_size):  # seq_len taken as each rank's chunk: t times too much
        return 2 * batch * seq_len * hidden * 4 * (tp_size - 1), 2

    with pytest.raises(ExerciseFailed, match=r"that is 4 times too much, multiplied by t = tp_size: seq_len is the whole "
                                             r"sequence"):
        check_sp_costs(times_t, "b", "a")


def test_chapter_06_solutions_pass_and_wrong_answers_fail():
    from parlab.course.exercises import (
        check_interleave_tradeoff,
        check_message_cost,
        check_one_f_one_b_order,
        check_peak_activations,
        check_smallest_micro_batches,
    )
    from parlab.lab.parallel import pipeline_schedule as ps

    sol = solutions("06", ps=ps)
    check_one_f_one_b_order(sol["solution_one_f_one_b_order"])
    check_smallest_micro_batches(sol["solution_smallest_micro_batches"])
    check_peak_activations(sol["solution_peak_activations"])
    check_message_cost(sol["solution_bubble_comm_1"], sol["solution_why"])
    bubbles, peaks = sol["solution_bubbles"], sol["solution_peaks"]
    check_interleave_tradeoff(bubbles[2], bubbles[4], peaks[2], peaks[4], sol["solution_stop"])
    # planted: free messages; the wrong reason; v = 2 and v = 4 swapped; peaks in a rank's micro-batches
    with pytest.raises(ExerciseFailed, match="with comm=1"):
        check_message_cost(ps.bubble_fraction(ps.simulate(ps.one_f_one_b(4, 8))), "a")
    with pytest.raises(ExerciseFailed, match="why: 'c'"):
        check_message_cost(sol["solution_bubble_comm_1"], "c")
    with pytest.raises(ExerciseFailed, match="the bubble at v=2"):
        check_interleave_tradeoff(bubbles[4], bubbles[2], peaks[2], peaks[4], "a")
    with pytest.raises(ExerciseFailed, match="rank 0's peak at v=2"):
        check_interleave_tradeoff(bubbles[2], bubbles[4], peaks[2] / 2, peaks[4] / 4, "a")
    with pytest.raises(ExerciseFailed, match="where to stop: 'b'"):
        check_interleave_tradeoff(bubbles[2], bubbles[4], peaks[2], peaks[4], "b")


# -- chapter 06 ----------------------------------------------------------------------------------------------

def test_one_f_one_b_order_check_both_ways():
    from parlab.course.exercises import check_one_f_one_b_order

    assert "every stage" in repr(check_one_f_one_b_order(_chapter_06()["solution_one_f_one_b_order"]))

    def warmup_one_too_many(stage, num_stages, num_micro_batches):  # planted: p − s warm-up forwards
        w = min(num_stages - stage, num_micro_batches)
        ops = [f"F{k}" for k in range(w)]
        for k in range(num_micro_batches - w):
            ops += [f"F{w + k}", f"B{k}"]
        return ops + [f"B{k}" for k in range(num_micro_batches - w, num_micro_batches)]

    with pytest.raises(ExerciseFailed, match=r"stage 0 of 1, 2 micro-batches: operation 1 should be 'B0', got 'F1'"):
        check_one_f_one_b_order(warmup_one_too_many)
    from parlab.lab.parallel import pipeline_schedule as ps

    with pytest.raises(ExerciseFailed, match="without parlab.lab.parallel.pipeline_schedule's schedules"):
        check_one_f_one_b_order(lambda stage, num_stages, num_micro_batches:
                                ps.one_f_one_b(num_stages, num_micro_batches).names(stage))
    assert ps.one_f_one_b(2, 2).names(0) == ["F0", "F1", "B0", "B1"]  # and the package's schedule is back


def test_one_f_one_b_order_check_draws_settings_a_table_of_the_grid_lacks():
    from parlab.course.exercises import check_one_f_one_b_order
    from parlab.lab.parallel import pipeline_schedule as ps

    table = {(s, p, m): ps.one_f_one_b(p, m).names(s) for p in range(1, 7) for m in range(1, 10) for s in range(p)}
    with pytest.raises(ExerciseFailed, match=r"for stage \d+ of (7|8|9|10|11|12), \d+ micro-batch.*operation 0 "
                                             r"should be 'F0', got nothing") as err:
        check_one_f_one_b_order(lambda stage, num_stages, num_micro_batches:
                                table.get((stage, num_stages, num_micro_batches), []))
    assert "expected:" not in str(err.value)  # the failing case's op, not its whole answer


def test_smallest_micro_batches_check_both_ways():
    import math
    from itertools import count

    from parlab.course.exercises import check_smallest_micro_batches
    from parlab.lab.parallel.pipeline_schedule import bubble_formula

    def search(p, target, v=1):
        return next(m for m in count(1) if bubble_formula(p, m, v) <= target)

    assert "all" in repr(check_smallest_micro_batches(search))

    def rounded(p, target, v=1):  # planted: the algebra is right, floating point is not (3 · 0.8 / 0.2 > 12)
        return max(1, math.ceil((p - 1) * (1 - target) / (target * v)))

    with pytest.raises(ExerciseFailed, match=r"\(p=4, target=0.2\): expected 12, got 13 \(with m=13"):
        check_smallest_micro_batches(rounded)


def _pipeline_peak(ops, frees=("B", "W")):
    """A right answer to exercise 06 I: a forward holds one micro-batch; each op whose kind is in frees frees one."""
    held = most = 0
    for name in ops:
        held += name[0] == "F"
        held -= name[0] in frees
        most = max(most, held)
    return most


def test_peak_activations_check_both_ways():
    from parlab.course.exercises import check_peak_activations

    peak = _pipeline_peak
    assert "all 6" in repr(check_peak_activations(peak))
    with pytest.raises(ExerciseFailed, match=r"\(F0 I0 F1 W0 I1 F2 W1 I2 W2\): expected 2, got 1"):  # planted: I frees
        check_peak_activations(lambda ops: peak(ops, frees=("B", "I")))
    from parlab.lab.parallel import pipeline_schedule as ps

    with pytest.raises(ExerciseFailed, match="without parlab.lab.parallel.pipeline_schedule's in_flight"):
        check_peak_activations(lambda ops: max(ps.in_flight(ps.Schedule("x", 1, 1 + max(int(o[1:]) for o in ops), 1, [[ps.Op.parse(o, stage=0)
                                                                                         for o in ops]]), 0)))


def test_smallest_micro_batches_check_names_each_mistake():
    import math
    from fractions import Fraction
    from itertools import count

    from parlab.course.exercises import check_smallest_micro_batches

    def smallest(bubble):  # the smallest m >= 1 whose bubble(m) is at most target, exactly
        return lambda p, target, v=1: next(m for m in count(1) if bubble(p, m, v) <= Fraction(target))

    planted = {  # each mistake -> the words of the hint that names it
        "m ≥ 1": lambda p, target, v=1: math.ceil((p - 1) * (1 - target) / (target * v)),  # m = 0 at p = 1
        "the Playbook's and Megatron's bubble": smallest(lambda p, m, v: Fraction(p - 1, v * m)),
        "the m for v=1": smallest(lambda p, m, v: Fraction(p - 1, m + p - 1)),
        "'at most' includes it": lambda p, target, v=1: next(
            m for m in count(1) if Fraction(p - 1, v * m + p - 1) < Fraction(target)),
        "still above the target": lambda p, target, v=1: max(1, next(
            m for m in count(1) if Fraction(p - 1, v * m + p - 1) <= Fraction(target)) - 1),
    }
    for words, fn in planted.items():
        with pytest.raises(ExerciseFailed, match=re.escape(words)):
            check_smallest_micro_batches(fn)
    with pytest.raises(ExerciseFailed, match=r"\(p=1, target=0.5\): expected 1, got 0 \(m=0 is no step at all"):
        check_smallest_micro_batches(planted["m ≥ 1"])


def test_peak_activations_check_names_each_mistake():
    from parlab.course.exercises import check_peak_activations

    peak = _pipeline_peak
    planted = {
        "I frees nothing": lambda ops: peak(ops, "BI"),
        "a split backward frees too": lambda ops: peak(ops, "B"),
        "counts every forward": lambda ops: sum(name[0] == "F" for name in ops),
    }
    for words, fn in planted.items():
        with pytest.raises(ExerciseFailed, match=re.escape(words)):
            check_peak_activations(fn)
    assert "all 6" in repr(check_peak_activations(lambda ops: peak(ops, "BW")))  # the right rule passes


def test_group_ranks_check_both_ways():
    from parlab.course.exercises import check_group_ranks
    from parlab.lab.parallel import Topology

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
        with pytest.raises(ExerciseFailed, match="without parlab.lab.parallel.Topology: what is the stride"):
            check_group_ranks(shortcut)
    assert Topology(pp=2, dp=2, tp=2).group_ranks("dp", 1) == [1, 3]  # and the package's answer is back



@pytest.mark.parametrize("mistake, hint", [
    ("blocks", "blocks of consecutive ranks: only tp, the innermost axis, is contiguous"),
    ("reversed", "The axes in reverse order: pp is the outermost axis"),
    ("coordinates", "the coordinates along the axis"),
    ("without_self", "The group includes the rank itself"),
    ("wrong_stride", "an axis's stride is the product of the sizes of the axes inside it"),
])
def test_group_ranks_check_names_the_mistake(mistake, hint):
    """Exercise 07.1's planted mistakes, each failing with a hint that names it (issue 45)."""
    from parlab.course.exercises import check_group_ranks

    def planted(rank, axis, sizes):
        n = sizes[axis]
        if mistake == "blocks":  # every axis taken as contiguous blocks of ranks, like tp
            return list(range(rank // n * n, rank // n * n + n))
        order = ("tp", "dp", "pp") if mistake == "reversed" else ("pp", "dp", "tp")
        stride = 1
        for a in order[order.index(axis) + 1:]:
            stride *= sizes[a]
        if mistake == "wrong_stride" and axis == "pp":
            stride = sizes["dp"]  # the size of the next axis, not the product of those inside
        coord = rank // stride % n
        group = [rank + (i - coord) * stride for i in range(n)]
        if mistake == "coordinates":
            return list(range(n))
        if mistake == "without_self":
            return [r for r in group if r != rank]
        return group

    with pytest.raises(ExerciseFailed, match=re.escape(hint)):
        check_group_ranks(planted)


@pytest.mark.parametrize("change, hint", [
    (dict(split=1), "the whole model on every rank"),
    (dict(adam=8), "Adam as 8 bytes"),
    (dict(grads=4), "gradients as fp32"),
    (dict(stages=(9, 9, 9)), "ignores zero_stage"),
    (dict(stages=(0, 1, 2)), "one stage too early"),
    (dict(stages=(1, 1, 1)), "everything from ZeRO-1 on"),
])
def test_model_states_check_names_the_mistake(change, hint):
    """Exercise 07.2's planted mistakes, each failing with a hint that names it (issue 45)."""
    from parlab.course.exercises import check_model_states
    from parlab.course.exercises.ch07 import _counted

    with pytest.raises(ExerciseFailed, match=re.escape(hint)):
        check_model_states(lambda num_params, dp, tp, pp, zero_stage:
                           _counted(num_params, dp, tp, pp, zero_stage, **change))


def test_layout_choice_rejects_a_constant_answer_on_every_seed():
    """Exercise 07.3: "always ZeRO-3, pure data parallelism" passed about one draw in ten (issue 45); every
    draw now holds a scenario that rejects it, and one that rejects ZeRO-1 over every GPU."""
    from parlab.decide import planner
    from parlab.course.exercises import check_layout_choice
    from parlab.course.exercises.ch07 import CONSTANT_ANSWERS

    for label, answer in CONSTANT_ANSWERS.items():
        for seed in range(6):
            with pytest.raises(ExerciseFailed):
                check_layout_choice(lambda workload, cluster, price: planner.Layout(**answer(cluster)), seed=seed)


def _states(num_params, dp, tp, pp, zero_stage, over=None):
    psi = num_params / (tp * pp)
    n = over or dp
    weights, grads, adam = 2 * psi, 2 * psi, 12 * psi
    return {"params": weights / (n if zero_stage >= 3 else 1), "grads": grads / (n if zero_stage >= 2 else 1),
            "optimizer": adam / (n if zero_stage >= 1 else 1)}


def test_model_states_check_both_ways():
    import parlab.lab.measure
    from parlab.decide import planner
    from parlab.course.exercises import check_model_states

    assert "all 48 layouts" in repr(check_model_states(_states))
    with pytest.raises(ExerciseFailed, match="ZeRO sharding over all the ranks"):  # planted: ZeRO over the world
        check_model_states(lambda num_params, dp, tp, pp, zero_stage:
                           _states(num_params, dp, tp, pp, zero_stage, over=dp * tp * pp))

    def estimated(num_params, dp, tp, pp, zero_stage):  # the package's answer, refused
        return parlab.lab.measure.estimate_memory(num_params=num_params, precision="bf16", world_size=dp * tp * pp,
                                              tp_size=tp, pp_size=pp, zero_stage=zero_stage).model_states

    def priced(num_params, dp, tp, pp, zero_stage):  # the same through the planner, refused too
        workload = planner.Workload("Llama 2 7B", global_batch=dp, seq_len=1)
        layout = planner.Layout(dp=dp, tp=tp, pp=pp, zero_stage=zero_stage)
        return planner.predict(workload, layout, planner.Cluster(gpus_per_node=dp * tp * pp)).memory.model_states

    for shortcut in (estimated, priced):
        with pytest.raises(ExerciseFailed, match="without estimate_memory or the planner"):
            check_model_states(shortcut)
    assert parlab.lab.measure.estimate_memory(num_params=10).model_states == 160  # and the package's answer is back


def test_chapter_07_solutions_pass_their_checks():
    from parlab.course.exercises import check_group_ranks, check_layout_choice, check_model_states

    shown = solutions("07", 3, measure=parlab.lab.measure, planner=parlab.decide.planner)
    check_group_ranks(shown["solution_group_ranks"])
    check_model_states(shown["solution_model_states"])
    for seed in (0, 1):  # fresh scenarios each time; two draws here
        assert "drawn afresh" in repr(check_layout_choice(shown["solution_choose_layout"], seed=seed))


def test_layout_choice_check_both_ways():
    from parlab.decide import planner
    from parlab.course.exercises import check_layout_choice
    from parlab.course.exercises.ch07 import scenarios
    from parlab.decide.planner import candidates as bound_candidates
    from parlab.decide.planner import predict as bound_predict

    solution = solutions("07", 3, measure=parlab.lab.measure, planner=parlab.decide.planner)["solution_choose_layout"]
    # draws differ from call to call: nothing to write down in advance
    assert [d for d, _, _ in scenarios(4, seed=0)] != [d for d, _, _ in scenarios(4, seed=1)]
    with pytest.raises(ExerciseFailed, match="TP 32 spans nodes of 8 GPUs|TP 16 spans nodes of 8 GPUs"):
        check_layout_choice(lambda workload, cluster, price: planner.Layout(tp=cluster.world_size) if cluster.nodes > 1
                            else solution(workload, cluster, price), count=8, seed=3)
    old_answers = {"Llama 2 7B, one node of 8 A100s joined by PCIe, 16 sequences of 4096 tokens per step":
                   planner.Layout(dp=8, zero_stage=2)}  # planted: answers written down for fixed scenarios
    with pytest.raises(ExerciseFailed, match="needs .* GB per GPU|fits but takes"):
        check_layout_choice(lambda workload, cluster, price: old_answers.get(
            cluster.describe(), planner.Layout(dp=cluster.world_size, zero_stage=1)), count=8, seed=2)
    with pytest.raises(ExerciseFailed, match="priced 4 layouts .* the budget is 3"):  # planted: price everything
        check_layout_choice(lambda workload, cluster, price: min(
            (planner.Layout(dp=cluster.world_size // t, tp=t) for t in (1, 2, 4, 8)),
            key=lambda l: (not price(l).fits, price(l).step_s)), seed=0)
    for shortcut in (  # planted: the planner's own answer, through the module or bound before the check
            lambda workload, cluster, price: next(p for p in planner.candidates(workload, cluster) if p.fits).layout,
            lambda workload, cluster, price: next(p for p in bound_candidates(workload, cluster) if p.fits).layout,
            lambda workload, cluster, price: bound_predict(workload, planner.Layout(dp=8), cluster).layout):
        with pytest.raises(ExerciseFailed, match="without the planner's predict or candidates"):
            check_layout_choice(shortcut, seed=0)
    assert bound_candidates(planner.Workload("Llama 2 7B", 8, 512), planner.cluster_of("nvlink"))  # back



def test_layout_choice_failure_names_its_scenario_and_a_seed_that_repeats_it():
    import re

    from parlab.decide import planner
    from parlab.course.exercises import check_layout_choice

    def pure_dp(workload, cluster, price):  # planted: a heuristic that fails some draws
        return planner.Layout(dp=cluster.world_size, zero_stage=3)

    for _ in range(10):
        try:
            check_layout_choice(pure_dp)
        except ExerciseFailed as failure:
            first = str(failure)
            break
    else:
        pytest.fail("pure data parallelism with ZeRO-3 passed ten fresh draws")
    assert re.search(r"for scenario \d of 4 \(Llama 2 \d+B, ", first)
    seed = int(re.search(r"check_layout_choice\(pure_dp, seed=(\d+)\) draws these 4 scenarios again", first)[1])
    with pytest.raises(ExerciseFailed) as again:
        check_layout_choice(pure_dp, seed=seed)
    assert str(again.value) == first

# ---- chapter 04 -------------------------------------------------------------------------------------

def _summed_to_owners(flat):  # planted: the sum, not the average
    n = dist.get_world_size()
    per = -(-flat.numel() // n)
    padded = torch.zeros(per * n)
    padded[:flat.numel()] = flat
    for owner, chunk in enumerate(padded.chunk(n)):
        dist.reduce(chunk, dst=owner)
    return padded.chunk(n)[dist.get_rank()].clone()


def _unpadded_to_owners(flat):  # planted: floor-sized shards, no padding
    n = dist.get_world_size()
    per = flat.numel() // n
    out = flat[:per * n].clone()
    for owner, chunk in enumerate(out.chunk(n)):
        dist.reduce(chunk, dst=owner)
    return out.chunk(n)[dist.get_rank()] / n


def _reduce_scattered(flat):  # right values, through the collective the exercise asks to build
    n = dist.get_world_size()
    per = -(-flat.numel() // n)
    padded = torch.zeros(per * n)
    padded[:flat.numel()] = flat
    out = torch.empty(per)
    dist.reduce_scatter_tensor(out, padded)
    return out / n


def _nothing_sent_to_owners(flat):  # planted: each rank's own shard of its own gradient, no communication
    n = dist.get_world_size()
    per = -(-flat.numel() // n)
    padded = torch.zeros(per * n)
    padded[:flat.numel()] = flat
    return padded.chunk(n)[dist.get_rank()].clone()


def _reduced_to_rank_0(flat):  # planted: every chunk reduced to rank 0, then the owner's shard broadcast... not
    n = dist.get_world_size()
    per = -(-flat.numel() // n)
    padded = torch.zeros(per * n)
    padded[:flat.numel()] = flat
    for chunk in padded.chunk(n):
        dist.reduce(chunk, dst=0)
    return padded.chunk(n)[dist.get_rank()] / n


def _whole_buffer_to_every_owner(flat):  # planted: right values and roots, but N× the traffic
    rank, n = dist.get_rank(), dist.get_world_size()
    per = -(-flat.numel() // n)
    padded = torch.zeros(per * n)
    padded[:flat.numel()] = flat
    for owner in range(n):
        whole = padded.clone()
        dist.reduce(whole, dst=owner)  # every element to every owner, though it keeps one chunk
        if owner == rank:
            mine = whole.chunk(n)[rank] / n
    return mine


def test_chapter_04_reduce_to_owners_both_ways():
    from parlab.course.exercises import ch04, check_reduce_to_owners

    shown = solutions("04", 4, tiny_gpt2=tiny_gpt2)
    assert "from reduces alone" in repr(check_reduce_to_owners(shown["solution_reduce_to_owners"]))
    with pytest.raises(ExerciseFailed, match="that is the sum over ranks"):
        check_reduce_to_owners(_summed_to_owners)
    with pytest.raises(ExerciseFailed, match=r"⌈10/3⌉ = 4 elements"):
        check_reduce_to_owners(_unpadded_to_owners)
    with pytest.raises(ExerciseFailed, match="through reduce_scatter: build it from dist.reduce alone"):
        check_reduce_to_owners(_reduce_scattered)
    with pytest.raises(ExerciseFailed, match="no communication was recorded on the process group"):
        check_reduce_to_owners(_nothing_sent_to_owners)
    with pytest.raises(ExerciseFailed, match=r"the reduces had roots \[0, 0, 0\]; each of the 3 ranks owns"):
        check_reduce_to_owners(_reduced_to_rank_0)
    with pytest.raises(ExerciseFailed, match=r"10-element gradient: the reduces sent 48, 48, 48 bytes, 144 in all, "
                                             r"but an owner needs only its shard, 4 elements \(16 bytes\)\. Reducing "
                                             r"the whole buffer to every owner moves 3× the traffic"):
        check_reduce_to_owners(_whole_buffer_to_every_owner)
    with pytest.raises(ExerciseFailed, match="_reference_owner_shards is the package's answer .*with dist.reduce"):
        check_reduce_to_owners(lambda flat: ch04._reference_owner_shards(flat))


def _peak(block_numels, root_numel, prefetch, world_size, pad_root=True, with_root=True, pad_sums=False):
    # a learner's peak; the planted mistakes below leave the root unpadded or out, or pad a sum once
    def pad(k):
        return -(-k // world_size) * world_size

    blocks = block_numels if pad_sums else [pad(b) for b in block_numels]
    held = [a + b for a, b in zip(blocks, blocks[1:])] if prefetch and len(blocks) > 1 else blocks
    held = [pad(h) for h in held] if pad_sums else held
    return (pad(root_numel) if pad_root else root_numel) * with_root + max(held)


PEAK_MISTAKES = {  # planted: the hint each must hear
    "the root is unpadded: the root's weights are gathered into a padded buffer too": (
        lambda blocks, root, prefetch, n: _peak(blocks, root, prefetch, n, pad_root=False)),
    "the root is forgotten: the root's weights \\(the embeddings and final norm\\) stay gathered": (
        lambda blocks, root, prefetch, n: _peak(blocks, root, prefetch, n, with_root=False)),
    "padding applied once, to the two blocks together: each group is gathered into its own padded buffer": (
        lambda blocks, root, prefetch, n: _peak(blocks, root, prefetch, n, pad_sums=True)),
}


def test_chapter_04_peak_gathered_both_ways():
    from parlab.course.exercises import ch04, check_peak_gathered

    shown = solutions("04", 4, tiny_gpt2=tiny_gpt2)
    assert "12 cases, 4 of them drawn anew" in repr(check_peak_gathered(shown["solution_peak_gathered"]))
    with pytest.raises(ExerciseFailed, match="need padding"):
        check_peak_gathered(lambda blocks, root, prefetch, n: shown["solution_peak_gathered"](blocks, root, prefetch, 1))
    with pytest.raises(ExerciseFailed, match="without prefetch"):
        check_peak_gathered(lambda blocks, root, prefetch, n: shown["solution_peak_gathered"](blocks, root, False, n))
    for hint, wrong in PEAK_MISTAKES.items():
        with pytest.raises(ExerciseFailed, match=hint):
            check_peak_gathered(wrong)
    with pytest.raises(ExerciseFailed, match="reference_peak_gathered is the package's answer"):
        check_peak_gathered(lambda *args: ch04.reference_peak_gathered(*args))
    assert ch04.reference_peak_gathered([1, 2], 0, True, 1) == 3  # and the package's answer is back


def test_chapter_04_peak_gathered_cannot_be_harvested_from_its_messages():
    import ast
    import re

    from parlab.course.exercises import check_peak_gathered

    table = {}  # the learner's try/except loop: each failure's case and expected value, typed into a table

    def harvested(blocks, root, prefetch, n):
        return table.get((tuple(blocks), root, prefetch, n), 0)

    for _ in range(12):
        with pytest.raises(ExerciseFailed) as err:
            check_peak_gathered(harvested)
        case = re.search(r"block_numels=(\[.*?\]), root_numel=(\d+), prefetch=(\w+), world_size=(\d+)\): "
                         r"expected (\d+)", str(err.value))
        blocks, root, prefetch, n, expected = (ast.literal_eval(g) for g in case.groups())
        table[tuple(blocks), root, prefetch, n] = expected
    assert len(table) == 12  # the 8 fixed cases harvested, and then a new drawn one at every call


def test_chapter_04_accumulation_volume_both_ways():
    from parlab.decide import planner
    from parlab.course.exercises import check_accumulation_volume

    shown = solutions("04", 4, tiny_gpt2=tiny_gpt2)
    assert "all 5 strategies" in repr(check_accumulation_volume(shown["solution_accumulation_volume"]))
    with pytest.raises(ExerciseFailed, match="where does the next micro-batch's gradient go"):  # planted: as stage 1
        check_accumulation_volume(lambda s, m: 2 if s in ("ddp", "zero1", "zero2") else
                                  shown["solution_accumulation_volume"](s, m))
    with pytest.raises(ExerciseFailed, match="does every micro-batch's forward find the weights gathered"):
        check_accumulation_volume(lambda s, m: shown["solution_accumulation_volume"](s, 1 if s.startswith("zero3") else m))

    right = shown["solution_accumulation_volume"]
    for strategy, wrong, hint in (  # planted: one count wrong at a time
            ("ddp", lambda m: 2 * m, "with no_sync, DDP all-reduces only after the last micro-batch"),
            ("ddp", lambda m: 1, r"an all-reduce moves 2Ψ per rank \(a reduce-scatter, then an all-gather"),
            ("zero1", lambda m: m + 1, "stage 1 keeps whole gradients .*, so they accumulate locally"),
            ("zero2", lambda m: 2 * m, "the updated weights are all-gathered once, after the step"),
            ("zero3", lambda m: 2 * m + 1, "stage 3 keeps only its shard of the gradients, as stage 2: every "
                                           "micro-batch's backward reduce-scatters"),
            ("zero3", lambda m: 2 * m, "stage 3 frees the weights after each block's forward, so backward gathers "
                                       "them again"),
            ("zero3_keep", lambda m: 3 * m, "reshard_after_forward=False keeps the weights gathered from forward "
                                            "into backward: one gather per micro-batch, not two")):
        with pytest.raises(ExerciseFailed, match=rf"fn\('{strategy}', micro_batches=\d\): .*: {hint}"):
            check_accumulation_volume(lambda s, m, strategy=strategy, wrong=wrong: wrong(m) if s == strategy
                                      else right(s, m))

    def priced(strategy, micro_batches):  # the planner's answer, refused
        costs = {op: (0.0, 1.0) for op in ("all_reduce", "all_gather", "reduce_scatter")}
        return planner.predict_dp_step(strategy, costs, 1.0, 2, 0, 0, 0, micro_batches=micro_batches)

    with pytest.raises(ExerciseFailed, match="not with the planner"):
        check_accumulation_volume(priced)


def test_chapter_04_keep_gathered_both_ways():
    from parlab.course.exercises import check_keep_gathered

    sizes = dict(n_layer=2, n_embd=64, n_head=2, vocab_size=128, n_positions=32)
    shown = solutions("04", 4, tiny_gpt2=tiny_gpt2)
    for world_size in (3, 4):
        block, saved = shown["solution_keep_gathered"](sizes, world_size)
        assert "keep block 1" in repr(check_keep_gathered(block, saved, sizes, world_size))
        with pytest.raises(ExerciseFailed, match="which one's backward comes first"):  # planted: the first block
            check_keep_gathered(0, saved, sizes, world_size)
        with pytest.raises(ExerciseFailed, match="only one gather is skipped"):
            check_keep_gathered(block, 2 * saved, sizes, world_size)
    with pytest.raises(ExerciseFailed, match="padded to a multiple of world_size"):  # 3 does not divide the block
        check_keep_gathered(1, 4 * sum(p.numel() for p in _gpt_block(sizes)), sizes, 3)
    block, saved = shown["solution_keep_gathered"](sizes, 3)
    assert "keep block 1" in repr(check_keep_gathered(-1, saved, sizes, 3))  # Python's last block is the last block
    with pytest.raises(ExerciseFailed, match=r"block=None: give an index into model.transformer.h, 0 to 1 \(or -1"):
        check_keep_gathered(None, saved, sizes, 3)
    with pytest.raises(ExerciseFailed, match=r"block=2: give an index"):
        check_keep_gathered(2, saved, sizes, 3)
    with pytest.raises(ExerciseFailed, match=r"block -2 \(block 0\): every block's backward"):
        check_keep_gathered(-2, saved, sizes, 3)
    gathered = {n: shown["solution_keep_gathered"](sizes, n)[1] for n in (3, 4)}  # bytes in the gathered buffer
    for world_size, got, hint in (  # planted: the bytes in the wrong unit or of the wrong part
            (3, gathered[3] // 4, r"\(that is the gathered buffer's elements; bytes_saved is in bytes, and the "
                                  r"weights are fp32 \(4 bytes each\)\)$"),
            (3, gathered[3] // 3, r"\(that is one rank's shard in bytes; the all-gather fills the whole gathered "
                                  r"buffer, all 3 shards \(this rank's own included\)\)$"),
            (3, gathered[3] * 2 // 3, r"\(that is what the other ranks send"),
            (3, gathered[3] // 2, r"\(that is the buffer in 2-byte values; ZeroStage3 here is fp32"),
            (4, gathered[4] // 4, r"\(that is the gathered buffer's elements; .*; or one rank's shard in bytes; ")):
        with pytest.raises(ExerciseFailed, match=r"block -1 is right; bytes_saved=\d+ is not " + hint):
            check_keep_gathered(-1, got, sizes, world_size)


def _gpt_block(sizes):
    from parlab.lab.models import tiny_gpt2

    return list(tiny_gpt2(**sizes).transformer.h[-1].parameters())


# ---- chapter 10 -------------------------------------------------------------------------------------

def test_chapter_10_solutions_pass_and_wrong_answers_fail():
    from parlab.course.exercises import check_online_softmax_combine, check_received
    from parlab.lab.parallel import context, expert

    shown = solutions("10", __name__="chapter_10_solutions", epx=expert)
    assert "✅" in repr(check_online_softmax_combine(shown["solution_combine"], world_size=3))
    assert "✅" in repr(check_received(shown["solution_received"], world_size=3))

    def plain_sum(m1, l1, acc1, m2, l2, acc2):  # no rescaling to the larger maximum
        return torch.maximum(m1, m2), l1 + l2, acc1 + acc2

    with pytest.raises(ExerciseFailed, match="plain sum"):
        check_online_softmax_combine(plain_sum)
    with pytest.raises(ExerciseFailed, match="combine is the package's answer .*write the online-softmax rule"):
        check_online_softmax_combine(lambda *state: context.combine(*state))

    def no_capacity(expert_index, num_experts, ep, capacity):  # counts the dropped assignments too
        counts = torch.bincount(expert_index.flatten(), minlength=num_experts)
        return [int(counts[p.start:p.stop].sum()) for p in expert.placement(num_experts, ep)]

    with pytest.raises(ExerciseFailed, match="counts dropped tokens too"):
        check_received(no_capacity)

    def capped_counts(expert_index, num_experts, ep, capacity):  # no priority order at all, token-major or other:
        kept = torch.bincount(expert_index.flatten(), minlength=num_experts).clamp(max=capacity)  # right, as the
        return [int(kept[p.start:p.stop].sum()) for p in expert.placement(num_experts, ep)]  # statement says

    assert "✅" in repr(check_received(capped_counts))  # the order decides which assignments drop, not how many
    with pytest.raises(ExerciseFailed, match="route is the package's answer to this exercise"):
        check_received(lambda e, n, ep, c: expert.route(torch.zeros(len(e), n), 2, c))


def test_chapter_10_hints_name_pythons_max_and_a_capacity_per_rank():
    """10.1 with Python's max(m1, m2) on tensors (it crashes in the learner's own code) and 10.2 with the
    capacity applied to a rank's total instead of each expert fail with a hint that names the mistake."""
    from parlab.course.exercises import check_online_softmax_combine, check_received
    from parlab.lab.parallel import expert

    def python_max(m1, l1, acc1, m2, l2, acc2):
        m = max(m1, m2)  # compares whole tensors: 'Boolean value of Tensor ... is ambiguous'
        a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
        return m, l1 * a1 + l2 * a2, acc1 * a1 + acc2 * a2

    with pytest.raises(ExerciseFailed, match=r"Python's max\(m1, m2\).*torch.maximum\(m1, m2\)"):
        check_online_softmax_combine(python_max)

    def capacity_per_rank(expert_index, num_experts, ep, capacity):  # a rank's total capped, not each expert
        counts = torch.bincount(expert_index.flatten(), minlength=num_experts)
        return [min(int(counts[p.start:p.stop].sum()), capacity) for p in expert.placement(num_experts, ep)]

    def capacity_times_experts(expert_index, num_experts, ep, capacity):  # capacity × experts per rank
        counts = torch.bincount(expert_index.flatten(), minlength=num_experts)
        return [min(int(counts[p.start:p.stop].sum()), capacity * len(p)) for p in expert.placement(num_experts, ep)]

    for wrong in (capacity_per_rank, capacity_times_experts):
        with pytest.raises(ExerciseFailed, match=r"expected \[.*got \[.*the capacity is per expert"):
            check_received(wrong)


# ---- the one refusal: every way of reaching a package answer is refused, the solutions still pass --------

from parlab.course.exercises import core  # noqa: E402


def test_every_declared_answer_resolves_to_code():
    for exercise, names in core.ANSWERS.items():
        assert names and core.refused_answers(exercise) == list(names)
        for name in names:
            assert core._code_of(core._resolve(name)).co_filename.endswith(".py"), name


def test_the_refusals_off_switch_is_not_shown_to_a_learner():
    import parlab.course.exercises as exercises
    from parlab.lab.parallel import pipeline_schedule as ps

    assert "grading" not in exercises.__all__ and "grading" not in exercises._WHERE
    assert not hasattr(exercises, "grading") and not hasattr(core, "grading")
    assert len(exercises._WHERE) == len(set(exercises.__all__)) == len(exercises.__all__)  # each name once
    assert set(exercises._WHERE) == set(exercises.__all__)
    with core.refusing("ch06.1", "write it yourself"), core._grading():  # the check's own code, called inside
        assert ps.gpipe(2, 2)


def test_answers_are_refused_as_code_and_unchanged_outside_a_check():
    import inspect
    import sys
    import threading

    from parlab.lab.parallel import pipeline_schedule as ps
    from parlab.course.reading import source

    assert ps.one_f_one_b(2, 2).names(0) == ["F0", "F1", "B0", "B1"]
    assert source(ps.one_f_one_b) == inspect.getsource(ps.one_f_one_b)  # no marker in the product's code
    assert "answer" not in inspect.getsource(ps)  # nor in its module
    kept = sys.getprofile()
    with pytest.raises(ExerciseFailed, match="one_f_one_b is the package's answer to this exercise: write it"):
        with core.refusing("ch06.1", "write it yourself"):
            ps.one_f_one_b(2, 2)
    with pytest.raises(ExerciseFailed, match="outer"), core.refusing("ch06.1", "outer"):
        with core.refusing("ch06.1", "inner"):
            pass
        ps.gpipe(2, 2)  # a nested scope gives back the outer one
    assert not core._REFUSED and not core._CODES and ps.gpipe(2, 2)  # nothing is left refused after a check
    assert sys.getprofile() is kept and threading.getprofile() is None  # and the hooks are given back
    with pytest.raises(KeyError, match="no answers are declared for exercise 'ch99.1'"):
        core.refusing("ch99.1", "why")


def test_a_refusal_the_learner_catches_still_fails_the_check():
    from parlab.lab.parallel import pipeline_schedule as ps

    def swallows():
        try:
            ps.one_f_one_b(2, 2)
        except ExerciseFailed:
            pass
        return ps.one_f_one_b(2, 2)  # the hook is unset on this thread now: the log still knows

    with pytest.raises(ExerciseFailed, match="one_f_one_b is the package's answer"):
        with core.refusing("ch06.1", "write it yourself"):
            swallows()
    assert ps.one_f_one_b(2, 2)


def test_a_refusal_propagates_through_c_code_and_an_outer_scope_gets_its_hook_back():
    import sys

    from parlab.lab.parallel import pipeline_schedule as ps

    for through_c in (lambda: list(map(ps.gpipe, [2], [2])), lambda: sorted([2, 1], key=lambda m: ps.gpipe(2, m))):
        with pytest.raises(ExerciseFailed, match="gpipe is the package's answer"), core.refusing("ch06.1", "w"):
            through_c()
    with pytest.raises(ExerciseFailed, match="gpipe is the package's answer to this exercise: outer"):
        with core.refusing("ch06.1", "outer"):
            with pytest.raises(ExerciseFailed, match="in_flight is the package's answer"):
                with core.refusing("ch06.3", "inner"):
                    ps.in_flight(None, 0)  # refused on entry, before it reads its arguments
            assert sys.getprofile() is core._hook  # CPython unset it when it raised; the inner scope put it back
            ps.gpipe(2, 2)
    assert sys.getprofile() is None


def test_the_refusal_costs_a_small_factor_on_one_check(capsys):
    import contextlib
    import time

    from parlab.course.exercises import ch06

    solution = _chapter_06()["solution_one_f_one_b_order"]

    def best_of_3():
        times = []
        for _ in range(3):
            start = time.perf_counter()
            ch06.check_one_f_one_b_order(solution)
            times.append(time.perf_counter() - start)
        return min(times)

    refused = best_of_3()
    kept, ch06.refusing = ch06.refusing, lambda exercise, why: contextlib.nullcontext()
    try:
        bare = best_of_3()
    finally:
        ch06.refusing = kept
    with capsys.disabled():
        print(f"\nchapter 06 exercise 1's check: {refused * 1e3:.0f} ms refusing, {bare * 1e3:.0f} ms without "
              f"(× {refused / bare:.1f})")
    assert refused < 10 * bare


def test_unsetting_the_hook_fails_the_check_but_a_thread_started_before_it_is_not_seen():
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from parlab.course.exercises import check_smallest_micro_batches
    from parlab.course.exercises.ch06 import _smallest_m

    def unsets(p, target, v=1):
        sys.setprofile(None)
        return _smallest_m(p, target, v)

    with pytest.raises(ExerciseFailed, match=r"profile hook was replaced while your code ran \(sys.setprofile\)"):
        check_smallest_micro_batches(unsets)
    pool = ThreadPoolExecutor(1)
    pool.submit(int).result()  # its worker thread runs before the check: threading.setprofile cannot reach it
    passed = check_smallest_micro_batches(lambda p, target, v=1: pool.submit(_smallest_m, p, target, v).result())
    assert "finds the smallest m" in repr(passed)  # the limit docs/course_design.md states (Python 3.11)
    pool.shutdown()


def test_without_refuses_the_named_functions_as_code_and_replaces_nothing():
    import parlab.lab.measure.memory as memory

    estimate = memory.estimate_memory
    with pytest.raises(ExerciseFailed, match="estimate_memory is the package's answer .*: count it yourself"):
        with core.without(memory, ["estimate_memory"], "count it yourself"):
            assert memory.estimate_memory is estimate  # nothing patched
            from parlab.lab.measure.memory import estimate_memory as imported_meanwhile  # as a late import would

            imported_meanwhile(num_params=10)
    assert imported_meanwhile(num_params=10).model_states == 160  # not a refusal kept for good


def _chapter_06():
    from parlab.lab.parallel import pipeline_schedule as ps

    return solutions("06", ps=ps)


def test_a_reference_bound_before_the_check_and_an_alias_are_refused():
    from parlab.course.exercises import check_one_f_one_b_order
    from parlab.lab.parallel.pipeline_schedule import one_f_one_b as ofob  # an alias, bound before the check

    with pytest.raises(ExerciseFailed, match="one_f_one_b is the package's answer .*count the warm-up forwards"):
        check_one_f_one_b_order(lambda stage, num_stages, num_micro_batches:
                                ofob(num_stages, num_micro_batches).names(stage))
    assert "every stage" in repr(check_one_f_one_b_order(_chapter_06()["solution_one_f_one_b_order"]))


def test_a_default_argument_a_container_and_a_thread_are_refused():
    from concurrent.futures import ThreadPoolExecutor

    from parlab.course.exercises import ch01, check_gated_mlp_bytes, check_smallest_micro_batches
    from parlab.course.exercises.ch06 import _smallest_m
    from parlab.lab.measure import measure_activations

    def by_default(s, b, h, i, bytes_per_value, _m=measure_activations):
        return _m(ch01.GatedReLUMLP(h, i), torch.randn(s, b, h, requires_grad=True))

    with pytest.raises(ExerciseFailed, match="measure_activations is the package's answer"):
        check_gated_mlp_bytes(by_default)
    held = {"answer": _smallest_m, "all": [_smallest_m]}
    for reach in (lambda p, target, v=1: held["answer"](p, target, v),
                  lambda p, target, v=1: held["all"][0](p, target, v),
                  lambda p, target, v=1: ThreadPoolExecutor(1).submit(_smallest_m, p, target, v).result()):
        with pytest.raises(ExerciseFailed, match="_smallest_m is the package's answer"):
            check_smallest_micro_batches(reach)
    assert "finds the smallest m" in repr(check_smallest_micro_batches(_chapter_06()["solution_smallest_micro_batches"]))


def test_re_exports_are_refused():
    import parlab
    import parlab.decide.advice

    for estimate in (parlab.estimate_memory, parlab.decide.advice.estimate_memory, getattr(parlab, "estimate_" + "memory")):
        def by_the_estimator(gpu_gb, n_d, stage, k=12, estimate=estimate):
            return gpu_gb * 1e9 / estimate(num_params=1, precision="bf16", world_size=n_d, zero_stage=stage).total

        with pytest.raises(ExerciseFailed, match="estimate_memory is the package's answer to this exercise"):
            check_max_params(by_the_estimator)


def test_importlib_reload_is_refused():
    import importlib

    from parlab.course.exercises import ch02

    reloaded = importlib.reload(ch02)  # a fresh module: its functions are marked again
    with pytest.raises(ExerciseFailed, match="_crossover_bytes is the package's answer"):
        check_crossover_bytes(lambda n, alpha, bandwidth: reloaded._crossover_bytes(n, alpha, bandwidth))
    with pytest.raises(ExerciseFailed, match="_crossover_bytes is the package's answer"):
        reloaded.check_crossover_bytes(_crossover_bytes)  # the reloaded check refuses the old function too
    assert "agrees" in repr(reloaded.check_crossover_bytes(solutions("02")["solution_crossover_bytes"]))


def test_partial_and_a_copied_class_dict_are_refused_on_every_rank():
    import functools

    from parlab.course.exercises import check_received, check_row_parallel_forward
    from parlab.lab.parallel import expert as epx
    from parlab.lab.parallel.tensor import RowParallelLinear

    copied = type("Mine", (), dict(vars(RowParallelLinear)))  # the class's dict, copied before the check
    for copy in (functools.partial(RowParallelLinear.forward), lambda layer, x: copied.forward(layer, x)):
        with pytest.raises(ExerciseFailed, match=r"on rank 0 of 2: .*RowParallelLinear.forward is the package's"):
            check_row_parallel_forward(copy, world_size=2)
    route = epx.route  # bound before the check, called on the ranks

    def reroutes(expert_index, num_experts, ep, capacity):
        kept = route(torch.zeros(len(expert_index), num_experts), 2, capacity).kept
        return [int(kept.sum())] * ep

    with pytest.raises(ExerciseFailed, match=r"on rank 0 of 2: .*route is the package's answer"):
        check_received(reroutes)


def test_every_wrong_choice_hears_why():
    from parlab.course.exercises import ch02, ch05, ch06, check_choice

    tables = {"SEND_BUFFER": (ch02.SEND_BUFFER, "a"), "BELOW_CROSSOVER": (ch02.BELOW_CROSSOVER, "recursive doubling"),
              "NORM_CHOICES": (ch05.NORM_CHOICES, "b"), "LITERAL_CHOICES": (ch05.LITERAL_CHOICES, "a"),
              "MESSAGE_CHOICES": (ch06.MESSAGE_CHOICES, "a"), "INTERLEAVE_CHOICES": (ch06.INTERLEAVE_CHOICES, "a")}
    for name, (choices, right) in tables.items():
        for letter, value in choices.items():
            if letter != right:
                with pytest.raises(ExerciseFailed) as err:
                    check_choice(name, letter, choices, right)
                assert value[1] and str(err.value).endswith(value[1]), f"{name}[{letter!r}] has no feedback"
    with pytest.raises(ValueError, match=r"wrong choices \['b'\] need \(text, feedback\)"):
        check_choice("q", "a", {"a": "right", "b": "wrong, and silent"}, "a")


# ---- chapter 09 (trainer and debugging) ---------------------------------------------------------------

def test_chapter_09_solution_passes_and_each_usual_mistake_hears_its_name():
    """09: the collapsed solution names where the records diverge and who took another path; the rank whose
    record stops earliest, the op compared without its size, and the last difference each fail, named."""
    import collections

    from parlab.course.exercises.ch09 import check_culprit

    shown = solutions("09", count=2, __name__="chapter_09_solutions")
    for seed in (None, 0, 1, 2):
        assert "✅" in repr(check_culprit(shown["solution_culprit"], seed=seed))

    def stops_earliest(records):
        return min(len(r) for r in records) - 1, min(range(len(records)), key=lambda r: len(records[r]))

    def by_op(records, size=False, last=False):
        found = None
        for seq in range(max(len(r) for r in records)):
            keys = [None if seq >= len(r) else (r[seq]["op"], r[seq]["what"]) + ((r[seq]["numel"],) if size else ())
                    for r in records]
            if len(set(keys)) > 1:
                common = collections.Counter(keys).most_common(1)[0][0]
                found = seq, next(rank for rank, k in enumerate(keys) if k != common)
                if not last:
                    return found
        return found

    with pytest.raises(ExerciseFailed, match="stops earliest.*stuck, not wrong"):
        check_culprit(stops_earliest, seed=0)
    with pytest.raises(ExerciseFailed, match="compare the size too"):
        check_culprit(by_op)
    with pytest.raises(ExerciseFailed, match="the first difference is the evidence"):
        check_culprit(lambda records: by_op(records, size=True, last=True))
    assert "✅" in repr(check_culprit(lambda records: by_op(records, size=True)))

    from parlab.course.exercises import ch09
    from parlab.lab.job import debug

    def borrowed(records):
        seq = debug.divergence(records)
        return seq, 0

    for copy in (borrowed, lambda records: ch09.reference_culprit(records)):
        with pytest.raises(ExerciseFailed, match="refused"):
            check_culprit(copy)


# ---- issue 50: 01.3 sees which part a stage shards; 02.1's function is checked whatever why_copy says ------


def max_params_shards_weights_at_stage_2(gpu_gb, n_d, stage, k=12, grad_bytes=2):
    # planted: stage 2 divides the weights and keeps the gradients whole (the totals agree when both are 2 bytes)
    per_param = (2 / (n_d if stage >= 2 else 1) + grad_bytes / (n_d if stage >= 3 else 1)
                 + k / (n_d if stage >= 1 else 1))
    return gpu_gb * 1e9 / per_param


def test_max_params_tells_the_weights_from_the_gradients():
    with pytest.raises(ExerciseFailed, match=r"stage=2, k=12, grad_bytes=4\): .* You sharded the weights instead of "
                                             r"the gradients: stage 2 divides the gradients"):
        check_max_params(max_params_shards_weights_at_stage_2)
    with pytest.raises(ExerciseFailed, match=r"grad_bytes=4\): .* That is for 2-byte gradients"):  # planted
        check_max_params(lambda gpu_gb, n_d, stage, k=12, grad_bytes=2: gpu_gb * 1e9 / _shards(n_d, stage, k))


def test_recursive_doubling_stub_reaches_the_check():
    def my_all_reduce(t):
        raise NotImplementedError

    with pytest.raises(ExerciseFailed, match=r"my_all_reduce is not written yet \(it raises NotImplementedError\)"):
        check_recursive_doubling(my_all_reduce, world_size=2)

    def halves(t):
        raise ValueError("buffer of the wrong size")

    with pytest.raises(ExerciseFailed, match=r"halves raised ValueError on rank \d of 2: buffer of the wrong size"):
        check_recursive_doubling(halves, world_size=2)

def test_model_states_check_sees_each_part():
    """Exercise 07.2 (issue 50): ZeRO-2 sharding the weights instead of the gradients holds the right total
    (2 bytes each) and passed a check of the total; each part is compared now, and the hint names the swap.
    A total alone is refused too: two wrong parts can sum to it."""
    from parlab.course.exercises import check_model_states
    from parlab.course.exercises.ch07 import _counted

    def swapped(num_params, dp, tp, pp, zero_stage):  # planted: weights sharded from stage 2, gradients from 3
        return _counted(num_params, dp, tp, pp, zero_stage, stages=(1, 3, 2))

    assert all(abs(sum(swapped(**case).values()) - sum(_counted(**case).values())) < 1e-3
               for case in (dict(num_params=7e9, dp=4, tp=2, pp=1, zero_stage=z) for z in range(4)))  # same totals
    with pytest.raises(ExerciseFailed, match=r"zero_stage=2\): params expected .* grads expected .*"
                                             r"shards the weights at ZeRO-2 instead of the gradients"):
        check_model_states(swapped)
    with pytest.raises(ExerciseFailed, match="that is one number: the check compares each part"):
        check_model_states(lambda num_params, dp, tp, pp, zero_stage:
                           sum(_counted(num_params, dp, tp, pp, zero_stage).values()))

def test_chapter_09_culprit_counts_a_record_that_ended_at_the_divergence():
    """09.1: a rank that left the loop early (its record ends at the divergence) is the culprit. An answer
    that loops over the shortest record, or compares only the ranks that still have a record, never sees that
    difference: it fails, named, on every seed."""
    import collections

    from parlab.course.exercises.ch09 import check_culprit

    def key(r):
        return r["op"], r["numel"], r["what"]

    def over_shortest(records):
        for seq in range(min(len(r) for r in records)):
            keys = [key(r[seq]) for r in records]
            if len(set(keys)) > 1:
                common = collections.Counter(keys).most_common(1)[0][0]
                return seq, next(rank for rank, k in enumerate(keys) if k != common)

    def present_only(records):
        for seq in range(max(len(r) for r in records)):
            keys = {rank: key(r[seq]) for rank, r in enumerate(records) if seq < len(r)}
            if len(set(keys.values())) > 1:
                common = collections.Counter(keys.values()).most_common(1)[0][0]
                return seq, next(rank for rank, k in keys.items() if k != common)

    for wrong in (over_shortest, present_only):
        for seed in (None, 0, 1):
            with pytest.raises(ExerciseFailed, match="record has ended while the others' go on.*counts as a "
                                                     "different record"):
                check_culprit(wrong, seed=seed)


def test_chapter_09_mfu_solution_passes_and_each_usual_mistake_hears_its_name():
    """09: the collapsed solution reproduces PaLM 540B's reported 46.2 % MFU and fresh runs', called
    positionally; forward FLOPs only, one chip's peak, the chips twice, attention left out and a percentage
    each fail with a hint that names them; the package's own arithmetic is refused."""
    from parlab.course.exercises.ch09 import check_mfu

    shown = solutions("09", __name__="chapter_09_solutions")
    for seed in (None, 0, 1, 2):
        assert "46.2%" in repr(check_mfu(shown["solution_mfu"], seed=seed))

    def flops(n, layers, width, seq_len, backward=True, attention=True):
        return (6 if backward else 2) * n + (12 if backward else 4) * layers * width * seq_len * attention

    def forward_only(t, n, layers, width, seq_len, chips, peak):
        return flops(n, layers, width, seq_len, backward=False) * t / (chips * peak)

    def one_chip(t, n, layers, width, seq_len, chips, peak):
        return flops(n, layers, width, seq_len) * t / peak

    def chips_twice(t, n, layers, width, seq_len, chips, peak):
        return flops(n, layers, width, seq_len) * (t / chips) / (chips * peak)

    def no_attention(t, n, layers, width, seq_len, chips, peak):
        return flops(n, layers, width, seq_len, attention=False) * t / (chips * peak)

    def percent(t, n, layers, width, seq_len, chips, peak):
        return 100 * flops(n, layers, width, seq_len) * t / (chips * peak)

    for wrong, named in ((forward_only, "forward's FLOPs only"), (one_chip, "one chip's peak"),
                         (chips_twice, "chips twice"), (no_attention, "left out attention"),
                         (percent, "a fraction")):
        with pytest.raises(ExerciseFailed, match=named):
            check_mfu(wrong)
    with pytest.raises(ExerciseFailed, match="return a number"):
        check_mfu(lambda *args: None)

    from parlab.course.exercises import ch09
    from parlab.lab.job import mfu

    def borrowed(t, n, layers, width, seq_len, chips, peak):
        return mfu.utilization(flops(n, layers, width, seq_len) * t, 1.0, peak, chips)

    for copy in (borrowed, lambda *args: ch09.reference_mfu(*args)):
        with pytest.raises(ExerciseFailed, match="refused"):
            check_mfu(copy)

def test_chapter_10_received_names_each_plausible_mistake():
    """10.2: first choices only, tokens instead of assignments, round-robin placement and one count per
    expert each fail with a hint that names the mistake, at 2 and 3 ranks."""
    from parlab.course.exercises import check_received
    from parlab.lab.parallel import expert

    def counts(e, n, cap=None):
        c = torch.bincount(e.flatten(), minlength=n)
        return c if cap is None else c.clamp(max=cap)

    def first_choices(e, n, ep, cap):  # column 0 only
        return [int(counts(e[:, 0], n, cap)[b.start:b.stop].sum()) for b in expert.placement(n, ep)]

    def tokens_not_assignments(e, n, ep, cap):  # a token with both choices on one rank counted once
        return [sum(bool(((e >= b.start) & (e < b.stop))[t].any()) for t in range(len(e))) for b in expert.placement(n, ep)]

    def round_robin(e, n, ep, cap):  # expert j on rank j mod ep
        return [int(counts(e, n, cap)[r::ep].sum()) for r in range(ep)]

    def per_expert(e, n, ep, cap):  # E numbers, not ep
        return counts(e, n, cap).tolist()

    for wrong, named in ((first_choices, "first choices only"), (tokens_not_assignments, "that counts tokens"),
                         (round_robin, "rank e mod ep"), (per_expert, "one count per expert")):
        for world_size in (2, 3):
            with pytest.raises(ExerciseFailed, match=named):
                check_received(wrong, world_size=world_size)


def test_chapter_10_dispatch_plan_solution_passes_and_wrong_plans_fail():
    """10.3: the solution passes at 2 and 3 ranks (called positionally); each plausible wrong plan fails with
    a hint that names it; the package's dropless layer is refused."""
    from parlab.course.exercises import check_dispatch_plan
    from parlab.lab.parallel import expert

    shown = solutions("10", count=3, __name__="chapter_10_solutions", epx=expert)
    for world_size in (2, 3):
        assert "✅" in repr(check_dispatch_plan(shown["solution_dispatch_plan"], world_size=world_size))

    def per_rank(e, n, ep):
        return [sum(int((e == j).sum()) for j in block) for block in expert.placement(n, ep)]

    wrong = {
        "as they come, token by token": lambda e, n, ep: (torch.arange(e.numel()), per_rank(e, n, ep)),
        r"expert.t\(\).flatten\(\), choice by choice": lambda e, n, ep: (e.t().flatten().argsort(stable=True),
                                                                      per_rank(e, n, ep)),
        "token indices": lambda e, n, ep: (e.flatten().argsort(stable=True) // e.shape[1], per_rank(e, n, ep)),
        "from last to first": lambda e, n, ep: (e.flatten().argsort(descending=True), per_rank(e, n, ep)),
        "one per expert": lambda e, n, ep: (e.flatten().argsort(), torch.bincount(e.flatten(), minlength=n).tolist()),
        "e mod ep": lambda e, n, ep: (e.flatten().argsort(),
                                      [int(torch.bincount(e.flatten(), minlength=n)[r::ep].sum()) for r in range(ep)]),
        "counts tokens": lambda e, n, ep: (e.flatten().argsort(), [sum(bool(((e >= b.start) & (e < b.stop))[t].any())
                                                                       for t in range(len(e)))
                                                                   for b in expert.placement(n, ep)]),
        "adds up to the .* tokens": lambda e, n, ep: (e[:, 0].argsort(), per_rank(e[:, :1], n, ep)),
        "not written yet": lambda e, n, ep: (_ for _ in ()).throw(NotImplementedError),
    }
    for named, plan in wrong.items():
        with pytest.raises(ExerciseFailed, match=named):
            check_dispatch_plan(plan)

    def within_rank_unsorted(e, n, ep):  # each rank's rows together, its experts' rows interleaved
        flat, order = e.flatten(), e.flatten().argsort(stable=True)
        rank_of = torch.tensor([r for r, b in enumerate(expert.placement(n, ep)) for _ in b])
        return order[(rank_of[flat[order]] * 1000 - torch.arange(len(order))).argsort()], per_rank(e, n, ep)

    with pytest.raises(ExerciseFailed, match="not sorted by expert within it"):
        check_dispatch_plan(within_rank_unsorted)

    from parlab.lab.parallel.expert_practice import DroplessExpertParallelMoE

    def borrowed(e, n, ep):
        DroplessExpertParallelMoE.forward(None, None)
        return None

    with pytest.raises(ExerciseFailed, match="forward is the package's answer"):
        check_dispatch_plan(borrowed)

def _peak_like_a_learner(rounding=None, with_root=True, prefetching="neighbours", shards=False):
    """A learner's peak_gathered, with one plausible mistake: ``rounding(numel, world_size)`` pads (right:
    up to a multiple of world_size), ``prefetching`` says what prefetch holds at once, ``shards`` divides the
    answer by world_size (one rank's shards instead of whole gathered blocks)."""
    def peak(block_numels, root_numel, prefetch, world_size):
        pad = rounding or (lambda k, n: -(-k // n) * n)
        blocks = [pad(b, world_size) for b in block_numels]
        held = blocks
        if prefetch and len(blocks) > 1:
            held = {"neighbours": [a + b for a, b in zip(blocks, blocks[1:])], "none": blocks,
                    "largest twice": [2 * max(blocks)], "two largest": [sum(sorted(blocks)[-2:])],
                    "three": [sum(blocks[max(0, i - 1):i + 2]) for i in range(len(blocks))],
                    "all": [sum(blocks)]}[prefetching]
        total = (pad(root_numel, world_size) if with_root else 0) + max(held)
        return total // world_size if shards else total
    return peak


@pytest.mark.parametrize("wrong, hint", [  # planted: each plausible mistake hears its name
    (_peak_like_a_learner(with_root=False), "the root is forgotten"),
    (_peak_like_a_learner(prefetching="none"), "that is the peak without prefetch: prefetch gathers the next block"),
    (_peak_like_a_learner(shards=True), "that counts one rank's shards: a gathered buffer holds the whole block"),
    (_peak_like_a_learner(rounding=lambda k, n: -(-k // (n + 1)) * (n + 1)), "padded to a multiple of world_size \\+ 1"),
    (_peak_like_a_learner(rounding=lambda k, n: -(-k // max(1, n - 1)) * max(1, n - 1)),
     "padded to a multiple of world_size − 1"),
    (_peak_like_a_learner(rounding=lambda k, n: k // n * n), "rounded down: padding rounds each size \\*up\\*"),
    (_peak_like_a_learner(prefetching="largest twice"), "the largest block counted twice"),
    (_peak_like_a_learner(prefetching="two largest"), "the two largest blocks: prefetch holds a block and the next"),
    (_peak_like_a_learner(prefetching="three"), "three blocks at once: the previous block is freed"),
    (_peak_like_a_learner(prefetching="all"), "every block at once: stage 3 frees each block after it computes"),
])
def test_chapter_04_peak_gathered_names_each_plausible_mistake(wrong, hint):
    from parlab.course.exercises import check_peak_gathered

    assert _peak_like_a_learner()([7, 20, 5, 30], 11, True, 4) == 52  # the helper's right answer is right
    with pytest.raises(ExerciseFailed, match=hint):
        check_peak_gathered(wrong)


@pytest.mark.parametrize("strategy, wrong, hint", [  # planted: one strategy counted wrong, as a learner would
    ("zero2", lambda m: 2, "that counts stage 2 as stage 1, whose whole gradients accumulate locally"),
    ("zero2", lambda m: m, "the all-gather is missing: after the step every rank all-gathers the updated weights"),
    ("zero1", lambda m: 1, "the all-gather is missing"),
    ("zero3", lambda m: 3, "that counts one micro-batch: .* Stage 3 frees them after each block"),
    ("zero3", lambda m: 3 * m + 1, "stage 3 has no all-gather after the step"),
    ("zero3_keep", lambda m: 2, "that counts one micro-batch: .* freed after each backward"),
    ("zero3_keep", lambda m: m + 1, "keeps a block from its forward to its backward, not from one micro-batch to "
                                    "the next"),
    ("zero3_keep", lambda m: 2 * m + 1, "stage 3 has no all-gather after the step"),
    ("zero3_keep", lambda m: 3 * m, "one gather per micro-batch, not two$"),  # named alone, not with another
])
def test_chapter_04_accumulation_volume_names_each_plausible_mistake(strategy, wrong, hint):
    from parlab.course.exercises import check_accumulation_volume

    right = solutions("04", 4, tiny_gpt2=tiny_gpt2)["solution_accumulation_volume"]
    with pytest.raises(ExerciseFailed, match=rf"fn\('{strategy}', micro_batches=\d\): .*{hint}"):
        check_accumulation_volume(lambda s, m: wrong(m) if s == strategy else right(s, m))
