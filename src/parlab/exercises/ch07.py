"""Chapter 07's exercises: which ranks talk on a mesh, the memory a rank holds under a 3-D layout with ZeRO,
and choosing a layout for a described cluster and model, each checked over many cases against the package
(``Topology``, ``estimate_memory``, ``parlab.planner``), naming the first difference. While the learner's
function runs, the package's own answer to the same question is refused (``exercises.core.without``)."""

from __future__ import annotations

import contextlib

from parlab.exercises.core import ExerciseFailed, Passed, _call, _name, without

#: What exercise 1 asks for, which ``Topology`` already knows.
TOPOLOGY_ANSWERS = ("coords", "group_ranks", "groups", "rank_at", "describe")

MESHES = [{"pp": 1, "dp": 4, "tp": 2}, {"pp": 2, "dp": 2, "tp": 2}, {"pp": 2, "dp": 3, "tp": 2},
          {"pp": 3, "dp": 1, "tp": 4}, {"pp": 4, "dp": 2, "tp": 1}, {"pp": 2, "dp": 1, "tp": 1}]


def _args(case: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in case.items())


def check_group_ranks(fn) -> Passed:
    """``fn(rank, axis, sizes)`` → the sorted ranks of ``rank``'s group along ``axis`` (``"pp"``, ``"dp"`` or
    ``"tp"``) on a mesh of ``sizes`` (``{"pp": ..., "dp": ..., "tp": ...}``; pp outermost, tp innermost).
    Checked for every rank and axis of six meshes, uneven ones included."""
    from parlab.parallel import Topology

    count = 0
    for sizes in MESHES:
        topo = Topology(**sizes)
        for rank in range(topo.world_size):
            for axis in ("pp", "dp", "tp"):
                expected = topo.group_ranks(axis, rank)
                with without(Topology, TOPOLOGY_ANSWERS, "the exercise asks for the groups worked out from the "
                             "axis order, without parlab.parallel.Topology: what is the stride of each axis?"):
                    got = _call(fn, rank=rank, axis=axis, sizes=dict(sizes))
                count += 1
                if not isinstance(got, (list, tuple)) or sorted(got) != expected:
                    raise ExerciseFailed(f"{_name(fn)}({_args(dict(rank=rank, axis=axis, sizes=sizes))}): expected "
                                         f"{expected}, got {got!r:.80}")
    return Passed(f"{_name(fn)} finds all {count} groups of {len(MESHES)} meshes")


STATE_CASES = [dict(num_params=p, dp=dp, tp=tp, pp=pp, zero_stage=z)
               for p in (7_000_000_000, 70_000_000_000)
               for dp, tp, pp in ((8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 8, 1), (4, 8, 2), (16, 4, 4))
               for z in (0, 1, 2, 3)]


def _model_states(num_params, dp, tp, pp, zero_stage):
    from parlab.measure import estimate_memory

    return estimate_memory(num_params=num_params, precision="bf16", optimizer="adam", world_size=dp * tp * pp,
                           tp_size=tp, pp_size=pp, zero_stage=zero_stage).model_states


@contextlib.contextmanager
def _without_estimator(why: str):
    """``estimate_memory`` refused wherever the package keeps it, and the planner, which calls it."""
    import parlab.measure
    import parlab.measure.memory
    from parlab import planner

    with contextlib.ExitStack() as stack:
        for owner in (parlab.measure, parlab.measure.memory, planner):
            stack.enter_context(without(owner, ("estimate_memory",), why))
        stack.enter_context(without(planner, ("predict", "candidates"), why))
        yield


def check_model_states(fn) -> Passed:
    """``fn(num_params, dp, tp, pp, zero_stage)`` → bytes of weights, gradients and optimizer state one rank
    holds in bf16 mixed-precision training with Adam (fp32 master weights and moments), model split evenly
    over tp × pp, ZeRO ``zero_stage`` (0–3) over the dp ranks. Within 1 % of ``estimate_memory``, which
    (and the planner, which calls it) the learner's function may not call."""
    for case in STATE_CASES:
        expected = _model_states(**case)
        with _without_estimator("the exercise asks for the bytes counted yourself, without estimate_memory or "
                                "the planner: bytes per parameter for weights, gradients, Adam; which are "
                                "divided by what?"):
            got = _call(fn, **case)
        if not isinstance(got, (int, float)) or abs(got - expected) > 0.01 * expected:
            hint = ""
            if isinstance(got, (int, float)) and case["zero_stage"] and case["tp"] * case["pp"] > 1:
                split = case["tp"] * case["pp"]
                wrong = _model_states(case["num_params"] // split, case["dp"] * split, 1, 1, case["zero_stage"])
                if abs(got - wrong) <= 0.01 * wrong:
                    hint = " (that is ZeRO sharding over all the ranks: it shards only over the dp axis)"
            raise ExerciseFailed(f"{_name(fn)}({_args(case)}): expected {expected / 1e9:.3f} GB, got "
                                 f"{got / 1e9 if isinstance(got, (int, float)) else got!r:.6} GB{hint}")
    return Passed(f"{_name(fn)} agrees with estimate_memory on all {len(STATE_CASES)} layouts")


def scenarios():
    """(description, Workload, Cluster) of the layout exercise: one node over PCIe and over NVLink, long
    sequences and short; two and four nodes over InfiniBand; four nodes over Ethernet."""
    from parlab import planner

    return [
        ("Llama 2 7B, one node of 8 A100s joined by PCIe, 16 sequences of 4096 tokens per step",
         planner.Workload("Llama 2 7B", global_batch=16, seq_len=4096), planner.cluster_of("pcie")),
        ("Llama 2 13B, one node of 8 A100s with NVLink, 8 sequences of 4096 tokens per step, checkpointing",
         planner.Workload("Llama 2 13B", global_batch=8, seq_len=4096, checkpointing=True), planner.cluster_of("nvlink")),
        ("Llama 2 13B, one node of 8 A100s joined by PCIe, 16 sequences of 512 tokens per step, checkpointing",
         planner.Workload("Llama 2 13B", global_batch=16, seq_len=512, checkpointing=True), planner.cluster_of("pcie")),
        ("Llama 2 7B, 4 nodes of 8 A100s, NVLink inside and InfiniBand between, 64 sequences of 4096, "
         "checkpointing", planner.Workload("Llama 2 7B", global_batch=64, seq_len=4096, checkpointing=True),
         planner.cluster_of("nvlink", nodes=4)),
        ("Llama 2 70B, 2 nodes of 8 A100s, NVLink inside and InfiniBand between, 32 sequences of 4096, "
         "checkpointing", planner.Workload("Llama 2 70B", global_batch=32, seq_len=4096, checkpointing=True),
         planner.cluster_of("nvlink", nodes=2)),
        ("Llama 2 70B, 4 nodes of 8 A100s with NVLink, joined by 100 Gb/s Ethernet, 64 sequences of 4096, "
         "checkpointing", planner.Workload("Llama 2 70B", global_batch=64, seq_len=4096, checkpointing=True),
         planner.cluster_of("nvlink", nodes=4, inter=planner.LINKS["ethernet"])),
    ]


#: Layouts the learner may price per scenario: "measure the best two or three" (§9).
PRICE_BUDGET = 3


def check_layout_choice(fn, tolerance: float = 0.1, budget: int = PRICE_BUDGET) -> Passed:
    """``fn(workload, cluster, price)`` → a ``parlab.planner.Layout`` for the cluster's ranks that fits in GPU
    memory, keeps TP inside a node, and whose predicted step time is within ``tolerance`` of the fastest
    layout the planner finds that fits, in each of :func:`scenarios`. ``price(layout)`` is the planner's
    prediction (``.step_s``, ``.fits``, ``.parts``, ``.memory``), for at most ``budget`` layouts per scenario:
    the learner shortlists by memory arithmetic (``estimate_memory`` is allowed) and the guide's rules,
    as §9 ends, and prices only the shortlist. ``planner.predict`` and ``planner.candidates`` are refused."""
    from parlab import planner

    predict = planner.predict  # the check's own pricing, kept before the learner's function runs
    for description, workload, cluster in scenarios():
        where = f"{_name(fn)} for {description}"
        priced = []

        def price(layout):
            if not isinstance(layout, planner.Layout):
                raise ExerciseFailed(f"{where}: price takes a parlab.planner.Layout, got {layout!r:.80}")
            if layout not in priced:  # pricing one layout twice costs once
                priced.append(layout)
            if len(priced) > budget:
                raise ExerciseFailed(f"{where}: priced {len(priced)} layouts ({', '.join(map(str, priced))}); the "
                                     f"budget is {budget}. Rule out first: what fits in "
                                     f"{cluster.gpu.memory / 1e9:.0f} GB, which axes may cross the links between "
                                     f"GPUs and between nodes; then price the few that are left.")
            try:
                return predict(workload, layout, cluster)
            except ValueError as error:
                raise ExerciseFailed(f"{where}: price({layout}): {error}") from None

        with without(planner, ("predict", "candidates"), "the exercise asks you to choose by the guide's rules "
                     f"and memory arithmetic, pricing at most {budget} layouts with the price argument, "
                     "without the planner's predict or candidates"):
            got = _call(fn, workload=workload, cluster=cluster, price=price)
        if not isinstance(got, planner.Layout):
            raise ExerciseFailed(f"{where}: expected a parlab.planner.Layout, got {got!r:.80}")
        if got.dp * got.tp * got.pp != cluster.world_size:
            raise ExerciseFailed(f"{where}: {got} uses {got.dp * got.tp * got.pp} GPUs; the cluster has "
                                 f"{cluster.world_size}")
        if got.tp > cluster.gpus_per_node:
            raise ExerciseFailed(f"{where}: TP {got.tp} spans nodes of {cluster.gpus_per_node} GPUs")
        try:
            mine = predict(workload, got, cluster)
        except ValueError as error:
            raise ExerciseFailed(f"{where}: {got} is not a layout of this batch: {error}") from None
        best = next(p for p in planner.candidates(workload, cluster) if p.fits)
        if not mine.fits:
            raise ExerciseFailed(f"{where}: {got} needs {mine.memory.total / 1e9:.1f} GB per GPU; it has "
                                 f"{cluster.gpu.memory / 1e9:.0f} GB")
        if mine.step_s > (1 + tolerance) * best.step_s:
            raise ExerciseFailed(f"{where}: {got} fits but takes {mine.step_s:.2f} s per step (predicted); "
                                 f"a layout that fits takes {best.step_s:.2f} s. Where does yours lose time? "
                                 + ", ".join(f"{k} {v:.2f} s" for k, v in mine.parts.items() if v > 0))
    return Passed(f"{_name(fn)} picks a fitting layout within {tolerance:.0%} of the fastest in all "
                  f"{len(scenarios())} scenarios, pricing at most {budget} layouts in each")
