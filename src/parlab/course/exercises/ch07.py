"""Chapter 07's exercises: which ranks talk on a mesh, the memory a rank holds under a 3-D layout with ZeRO,
and choosing a layout for a described cluster and model, each checked over many cases against the package
(``Topology``, ``estimate_memory``, ``parlab.decide.planner``), naming the first difference. While the learner's
function runs, the package's own answer to the same question is refused (``core.refusing``: ``ch07.1`` to
``ch07.3`` in ``core.ANSWERS``)."""

from __future__ import annotations

from parlab.course.exercises.core import ExerciseFailed, Passed, _call, _grading, _name, refusing

MESHES = [{"pp": 1, "dp": 4, "tp": 2}, {"pp": 2, "dp": 2, "tp": 2}, {"pp": 2, "dp": 3, "tp": 2},
          {"pp": 3, "dp": 1, "tp": 4}, {"pp": 4, "dp": 2, "tp": 1}, {"pp": 2, "dp": 1, "tp": 1}]


def _args(case: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in case.items())


def check_group_ranks(fn) -> Passed:
    """``fn(rank, axis, sizes)`` → the sorted ranks of ``rank``'s group along ``axis`` (``"pp"``, ``"dp"`` or
    ``"tp"``) on a mesh of ``sizes`` (``{"pp": ..., "dp": ..., "tp": ...}``; pp outermost, tp innermost).
    Checked for every rank and axis of six meshes, uneven ones included."""
    from parlab.lab.parallel import Topology

    count = 0
    for sizes in MESHES:
        topo = Topology(**sizes)
        for rank in range(topo.world_size):
            for axis in ("pp", "dp", "tp"):
                expected = topo.group_ranks(axis, rank)
                with refusing("ch07.1", "the exercise asks for the groups worked out from the axis order, "
                              "without parlab.lab.parallel.Topology: what is the stride of each axis?"):
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
    from parlab.lab.measure import estimate_memory

    return estimate_memory(num_params=num_params, precision="bf16", optimizer="adam", world_size=dp * tp * pp,
                           tp_size=tp, pp_size=pp, zero_stage=zero_stage).model_states


def check_model_states(fn) -> Passed:
    """``fn(num_params, dp, tp, pp, zero_stage)`` → bytes of weights, gradients and optimizer state one rank
    holds in bf16 mixed-precision training with Adam (fp32 master weights and moments), model split evenly
    over tp × pp, ZeRO ``zero_stage`` (0–3) over the dp ranks. Within 1 % of ``estimate_memory``, which
    (and the planner, which calls it) the learner's function may not call."""
    for case in STATE_CASES:
        expected = _model_states(**case)
        with refusing("ch07.2", "the exercise asks for the bytes counted yourself, without estimate_memory or "
                      "the planner: bytes per parameter for weights, gradients, Adam; which are divided by what?"):
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


#: The clusters exercise 3 draws from: (kind of node, nodes, link between nodes or None for the node's own).
CLUSTERS = (("pcie", 1, None), ("nvlink", 1, None), ("nvlink", 2, None), ("nvlink", 4, None),
            ("nvlink", 4, "ethernet"), ("h100", 2, None), ("h100", 4, None))
MODELS = ("Llama 2 7B", "Llama 2 13B", "Llama 2 70B")


def scenarios(count: int = 4, seed: int | None = None) -> list:
    """``count`` (description, Workload, Cluster) drawn at random (``seed``: None draws afresh) from
    :data:`MODELS` × :data:`CLUSTERS` × sequences of 1024 or 4096 tokens × 1 or 2 sequences per GPU, with
    activation checkpointing: one node over PCIe and NVLink, two and four nodes over InfiniBand (A100s, HDR)
    and H100s (NDR), four nodes over Ethernet. Only scenarios where some layout fits with 5 % to spare are drawn."""
    import random

    from parlab.decide import planner
    draw = random.Random(seed)
    out = []
    while len(out) < count:
        kind, nodes, inter = draw.choice(CLUSTERS)
        model, seq, per_gpu = draw.choice(MODELS), draw.choice((1024, 4096)), draw.choice((1, 2))
        cluster = planner.cluster_of(kind, nodes, **({"inter": planner.LINKS[inter]} if inter else {}))
        workload = planner.Workload(model, global_batch=per_gpu * cluster.world_size, seq_len=seq, checkpointing=True)
        description = (f"{model}, {cluster.describe()}, {workload.global_batch} sequences of {seq} tokens per step, "
                       f"checkpointing")
        if any(d == description for d, _, _ in out):
            continue
        # some layout fits with room to spare (5 %): no scenario turns on a knife edge of the estimate
        if any(p.memory.total <= 0.95 * cluster.gpu.memory and p.layout.tp <= cluster.gpus_per_node
               for p in planner.candidates(workload, cluster)):
            out.append((description, workload, cluster))
    return out


#: Layouts the learner may price per scenario: "measure the best two or three" (§6).
PRICE_BUDGET = 3


def check_layout_choice(fn, tolerance: float = 0.1, budget: int = PRICE_BUDGET, count: int = 4,
                        seed: int | None = None) -> Passed:
    """``fn(workload, cluster, price)`` → a ``parlab.decide.planner.Layout`` for the cluster's ranks that fits in GPU
    memory, keeps TP inside a node, and whose predicted step time is within ``tolerance`` of the fastest
    such layout the planner finds, in each of ``count`` scenarios drawn afresh (:func:`scenarios`, from
    ``seed``; None: a new one, which a failure names, with the scenario, so the draw can be repeated): no
    answer can be written down in advance. ``price(layout)`` is the planner's prediction (``.step_s``,
    ``.fits``, ``.parts``, ``.memory``), for at most ``budget`` layouts per scenario: the learner shortlists by
    memory arithmetic (``estimate_memory`` is allowed) and the guide's rules, and prices only the shortlist.
    ``planner.predict`` and ``planner.candidates`` refuse while the learner's function runs, however they
    were imported (``core.ANSWERS["ch07.3"]``: the one function every prediction goes through)."""
    import random

    from parlab.decide import planner
    seed = random.randrange(10**6) if seed is None else seed  # printed on failure: the same draw again
    drawn = scenarios(count, seed)
    again = f"check_layout_choice({_name(fn)}, seed={seed}) draws these {count} scenarios again"
    for index, (description, workload, cluster) in enumerate(drawn):
        where = f"{_name(fn)} for scenario {index + 1} of {count} ({description}; {again})"
        priced = []

        def price(layout):
            if not isinstance(layout, planner.Layout):
                raise ExerciseFailed(f"{where}: price takes a parlab.decide.planner.Layout, got {layout!r:.80}")
            if layout not in priced:  # pricing one layout twice costs once
                priced.append(layout)
            if len(priced) > budget:
                raise ExerciseFailed(f"{where}: priced {len(priced)} layouts ({', '.join(map(str, priced))}); the "
                                     f"budget is {budget}. Rule out first: what fits in "
                                     f"{cluster.gpu.memory / 1e9:.0f} GB, which axes may cross the links between "
                                     f"GPUs and between nodes; then price the few that are left.")
            try:
                with _grading():  # the check's own pricing, called from the learner's function
                    return planner.predict(workload, layout, cluster)
            except ValueError as error:
                raise ExerciseFailed(f"{where}: price({layout}): {error}") from None

        with refusing("ch07.3", "the exercise asks you to choose by the guide's rules and memory arithmetic, "
                              f"pricing at most {budget} layouts with the price argument, without the "
                              "planner's predict or candidates"):
            got = _call(fn, workload=workload, cluster=cluster, price=price)
        _judge(got, workload, cluster, where, tolerance)
    return Passed(f"{_name(fn)} picks a fitting layout within {tolerance:.0%} of the fastest in {len(drawn)} "
                  f"scenarios drawn afresh (seed={seed}), pricing at most {budget} layouts in each")


def _judge(got, workload, cluster, where: str, tolerance: float) -> None:
    """Fail unless ``got`` is a layout of the cluster's ranks that keeps TP in a node, fits, and is predicted
    within ``tolerance`` of the fastest such layout."""
    from parlab.decide import planner
    if not isinstance(got, planner.Layout):
        raise ExerciseFailed(f"{where}: expected a parlab.decide.planner.Layout, got {got!r:.80}")
    if got.dp * got.tp * got.pp != cluster.world_size:
        raise ExerciseFailed(f"{where}: {got} uses {got.dp * got.tp * got.pp} GPUs; the cluster has "
                             f"{cluster.world_size}")
    if got.tp > cluster.gpus_per_node:
        raise ExerciseFailed(f"{where}: TP {got.tp} spans nodes of {cluster.gpus_per_node} GPUs")
    try:
        mine = planner.predict(workload, got, cluster)
    except ValueError as error:
        raise ExerciseFailed(f"{where}: {got} is not a layout of this batch: {error}") from None
    best = next(p for p in planner.candidates(workload, cluster) if p.fits and p.layout.tp <= cluster.gpus_per_node)
    if not mine.fits:
        raise ExerciseFailed(f"{where}: {got} needs {mine.memory.total / 1e9:.1f} GB per GPU; it has "
                             f"{cluster.gpu.memory / 1e9:.0f} GB")
    if mine.step_s > (1 + tolerance) * best.step_s:
        raise ExerciseFailed(f"{where}: {got} fits but takes {mine.step_s:.2f} s per step (predicted); "
                             f"a layout that fits takes {best.step_s:.2f} s. Where does yours lose time? "
                             + ", ".join(f"{k} {v:.2f} s" for k, v in mine.parts.items() if v > 0))
