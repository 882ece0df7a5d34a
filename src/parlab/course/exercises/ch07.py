"""Chapter 07's exercises: which ranks talk on a mesh, the memory a rank holds under a 3-D layout with ZeRO,
and choosing a layout for a described cluster and model, each checked over many cases against the package
(``Topology``, ``estimate_memory``, ``parlab.decide.planner``), naming the first difference. While the learner's
function runs, the package's own answer to the same question is refused (``core.refusing``: ``ch07.1`` to
``ch07.3`` in ``core.ANSWERS``)."""

from __future__ import annotations

from parlab.course.exercises.core import ExerciseFailed, Passed, _call, _grading, _name, refusing
from parlab.lab.language import say

MESHES = [{"pp": 1, "dp": 4, "tp": 2}, {"pp": 2, "dp": 2, "tp": 2}, {"pp": 2, "dp": 3, "tp": 2},
          {"pp": 3, "dp": 1, "tp": 4}, {"pp": 4, "dp": 2, "tp": 1}, {"pp": 2, "dp": 1, "tp": 1}]


def _args(case: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in case.items())


def check_group_ranks(fn) -> Passed:
    """``fn(rank, axis, sizes)`` → the sorted ranks of ``rank``'s group along ``axis`` (``"pp"``, ``"dp"`` or
    ``"tp"``) on a mesh of ``sizes`` (``{"pp": ..., "dp": ..., "tp": ...}``; pp outermost, tp innermost).
    Checked for every rank and axis of six meshes, uneven ones included."""
    from parlab.lab.parallel import Topology

    answers = []  # ((rank, axis, sizes), expected, got) for every case: a mistake is named from all of them
    for sizes in MESHES:
        topo = Topology(**sizes)
        for rank in range(topo.world_size):
            for axis in ("pp", "dp", "tp"):
                expected = topo.group_ranks(axis, rank)
                with refusing("ch07.1", say("the exercise asks for the groups worked out from the axis order, "
                                            "without parlab.lab.parallel.Topology: what is the stride of each "
                                            "axis?")):
                    got = _call(fn, rank=rank, axis=axis, sizes=dict(sizes))
                answers.append(((rank, axis, sizes), expected, got))
    count = len(answers)
    for (rank, axis, sizes), expected, got in answers:
        if _sorted(got) != expected:
            raise ExerciseFailed(say("{fn}({args}): expected {expected}, got {got!r:.80}. {hint}", fn=_name(fn),
                                     args=_args(dict(rank=rank, axis=axis, sizes=sizes)), expected=expected,
                                     got=got, hint=_group_hint(answers)))
    return Passed(say("{fn} finds all {count} groups of {meshes} meshes", fn=_name(fn), count=count,
                      meshes=len(MESHES)))


def _strided(rank: int, axis: str, sizes: dict, order=("pp", "dp", "tp")) -> list[int]:
    """The group of ``rank`` along ``axis`` when the axes are laid out in ``order``, outermost first."""
    inner = order[order.index(axis) + 1:]
    stride = 1
    for a in inner:
        stride *= sizes[a]
    coord = rank // stride % sizes[axis]
    return [rank + (i - coord) * stride for i in range(sizes[axis])]


def _sorted(got):
    try:
        return sorted(int(r) for r in got)
    except (TypeError, ValueError):
        return None


#: Exercise 07.1's known mistakes: (the groups it gives, what to say: said when shown, in the learner's language).
GROUP_MISTAKES = (
    (lambda rank, axis, sizes: [rank // sizes[axis] * sizes[axis] + i for i in range(sizes[axis])],
     lambda: say("Every axis taken as blocks of consecutive ranks: only tp, the innermost axis, is contiguous. "
                 "Ranks one step apart on an axis are its stride apart: dp's stride is the tp size, pp's tp × dp.")),
    (lambda rank, axis, sizes: _strided(rank, axis, sizes, order=("tp", "dp", "pp")),
     lambda: say("The axes in reverse order: pp is the outermost axis (largest stride), tp the innermost "
                 "(stride 1).")),
    (lambda rank, axis, sizes: list(range(sizes[axis])),
     lambda: say("Those are the coordinates along the axis (0 to size − 1), not the ranks that hold them.")),
    (lambda rank, axis, sizes: [r for r in _strided(rank, axis, sizes) if r != rank],
     lambda: say("The group includes the rank itself.")),
)


def _group_hint(answers) -> str:
    """Name the mistake the learner's answers make on every case, where it is a known one; else say how a
    group is found."""
    got = [_sorted(g) for _, _, g in answers]
    if any(g is None for g in got):
        return say("Return a list of ranks (ints).")
    for mistake, hint in GROUP_MISTAKES:
        if all(g == sorted(mistake(*case)) for g, (case, _, _) in zip(got, answers)):
            return hint()
    return say("A group is the ranks whose coordinates differ from rank's on this axis alone; an axis's stride is "
               "the product of the sizes of the axes inside it (tp innermost).")


STATE_CASES = [dict(num_params=p, dp=dp, tp=tp, pp=pp, zero_stage=z)
               for p in (7_000_000_000, 70_000_000_000)
               for dp, tp, pp in ((8, 1, 1), (4, 2, 1), (2, 2, 2), (1, 8, 1), (4, 8, 2), (16, 4, 4))
               for z in (0, 1, 2, 3)]


#: The parts of a rank's model states, as ``estimate_memory`` names them: weights, gradients, optimizer state.
PARTS = ("params", "grads", "optimizer")


def _model_states(num_params, dp, tp, pp, zero_stage) -> dict:
    from parlab.lab.measure import estimate_memory

    m = estimate_memory(num_params=num_params, precision="bf16", optimizer="adam", world_size=dp * tp * pp,
                        tp_size=tp, pp_size=pp, zero_stage=zero_stage)
    return {part: getattr(m, part) for part in PARTS}


def _parts(got) -> dict | None:
    """``got`` as ``{part: bytes}`` when it is a mapping of the three parts to numbers, else None."""
    try:
        return {part: float(got[part]) for part in PARTS} if len(got) == len(PARTS) else None
    except (TypeError, KeyError, ValueError):
        return None


def check_model_states(fn) -> Passed:
    """``fn(num_params, dp, tp, pp, zero_stage)`` → ``{"params": ..., "grads": ..., "optimizer": ...}``: the
    bytes of weights, gradients and optimizer state one rank holds in bf16 mixed-precision training with
    Adam (fp32 master weights and moments), model split evenly over tp × pp, ZeRO ``zero_stage`` (0–3) over
    the dp ranks. Each part within 1 % of ``estimate_memory``'s, which (and the planner, which calls it) the
    learner's function may not call: a total alone would let ZeRO-2 shard the weights instead of the
    gradients (2 bytes each) pass."""
    for case in STATE_CASES:
        expected = _model_states(**case)
        with refusing("ch07.2", say("the exercise asks for the bytes counted yourself, without estimate_memory "
                                    "or the planner: bytes per parameter for weights, gradients, Adam; which are "
                                    "divided by what?")):
            got = _call(fn, **case)
        parts = _parts(got)
        if parts is None:
            shape = say(" (that is one number: the check compares each part, since two wrong parts can sum to "
                        "the right total)") if isinstance(got, (int, float)) else ""
            raise ExerciseFailed(say("{fn}({args}): expected a dict of bytes {{'params': ..., 'grads': ..., "
                                     "'optimizer': ...}}, got {got!r:.80}{shape}", fn=_name(fn), args=_args(case),
                                     got=got, shape=shape))
        wrong = [part for part in PARTS if abs(parts[part] - expected[part]) > 0.01 * expected[part]]
        if wrong:
            raise ExerciseFailed(say("{fn}({args}): ", fn=_name(fn), args=_args(case))
                                 + say("; ").join(say("{part} expected {expected:.3f} GB, got {got:.3f} GB",
                                                      part=part, expected=expected[part] / 1e9,
                                                      got=parts[part] / 1e9) for part in wrong)
                                 + _states_hint(parts, **case))
    return Passed(say("{fn} agrees with estimate_memory, part by part, on all {count} layouts", fn=_name(fn),
                      count=len(STATE_CASES)))


def _counted(num_params, dp, tp, pp, zero_stage, weights=2, grads=2, adam=12, over=None, split=None,
             stages=(1, 2, 3)) -> dict:
    """Bytes of each part of the model states counted one way, right (the defaults) or with one known
    mistake. ``stages``: the ZeRO stage from which the optimizer state, the gradients and the weights are
    sharded."""
    psi = num_params / (tp * pp if split is None else split)
    n = over or dp
    shard = [n if zero_stage >= s else 1 for s in stages]  # optimizer state, gradients, weights
    return {"params": weights * psi / shard[2], "grads": grads * psi / shard[1], "optimizer": adam * psi / shard[0]}


def _states_hint(got: dict, **case) -> str:
    """`` (what the mistake is)`` where ``got`` (``{part: bytes}``) is a known wrong count of ``case``, else
    ``""``."""
    world = case["dp"] * case["tp"] * case["pp"]
    known = [
        (dict(over=world), say("that is ZeRO sharding over all the ranks: it shards only over the dp axis")),
        (dict(split=1), say("that is the whole model on every rank: tp × pp ranks each hold 1/(tp·pp) of it")),
        (dict(split=world), say("that divides the model by every rank: the dp ranks are replicas, only tp × pp "
                                "split it")),
        (dict(adam=8), say("that counts Adam as 8 bytes: with bf16 weights it keeps an fp32 master copy too, 12 in "
                           "all")),
        (dict(grads=4), say("that counts gradients as fp32: here they are bf16, 2 bytes each")),
        (dict(stages=(9, 9, 9)), say("that ignores zero_stage: ZeRO-1 shards the optimizer state, 2 the "
                                     "gradients, 3 the weights")),
        (dict(stages=(1, 3, 2)), say("that shards the weights at ZeRO-2 instead of the gradients: ZeRO-2 shards "
                                     "the gradients (and the optimizer state); the weights stay whole until "
                                     "ZeRO-3")),
        (dict(stages=(0, 1, 2)), say("that shards one stage too early: ZeRO-1 shards only the optimizer state, "
                                     "ZeRO-2 adds the gradients, ZeRO-3 the weights")),
        (dict(stages=(1, 1, 1)), say("that shards everything from ZeRO-1 on: stage 1 shards only the optimizer "
                                     "state")),
    ]
    right = _counted(**case)
    for change, hint in known:
        wrong = _counted(**case, **change)
        if (all(abs(got[p] - wrong[p]) <= 0.01 * wrong[p] for p in PARTS)
                and any(abs(wrong[p] - right[p]) > 0.01 * right[p] for p in PARTS)):
            return say(" ({hints})", hints=hint)
    return ""


#: The clusters exercise 3 draws from: (kind of node, nodes, link between nodes or None for the node's own).
CLUSTERS = (("pcie", 1, None), ("nvlink", 1, None), ("nvlink", 2, None), ("nvlink", 4, None),
            ("nvlink", 4, "ethernet"), ("h100", 2, None), ("h100", 4, None))
MODELS = ("Llama 2 7B", "Llama 2 13B", "Llama 2 70B")


#: Answers that ignore the scenario: each draw holds at least one scenario that rejects every one of them
#: (ZeRO-3 over every GPU passed about one draw in ten before). Each maps a cluster to a Layout.
CONSTANT_ANSWERS = {"ZeRO-3, pure data parallelism": lambda cluster: dict(dp=cluster.world_size, zero_stage=3),
                    "ZeRO-1, pure data parallelism": lambda cluster: dict(dp=cluster.world_size, zero_stage=1)}
TOLERANCE = 0.1


def _fastest(workload, cluster):
    """The fastest layout that fits with TP inside a node: what :func:`check_layout_choice` compares with."""
    from parlab.decide import planner
    return next(p for p in planner.candidates(workload, cluster) if p.fits and p.layout.tp <= cluster.gpus_per_node)


def _loses(layout, workload, cluster, best, tolerance: float = TOLERANCE) -> bool:
    """Whether ``layout`` fails :func:`check_layout_choice` on this scenario, whose fastest is ``best``: it
    does not fit, or is predicted slower than (1 + tolerance) × ``best``."""
    from parlab.decide import planner
    mine = planner.predict(workload, layout, cluster)
    return not mine.fits or mine.step_s > (1 + tolerance) * best.step_s


def scenarios(count: int = 4, seed: int | None = None) -> list:
    """``count`` (description, Workload, Cluster) drawn at random (``seed``: None draws afresh) from
    :data:`MODELS` × :data:`CLUSTERS` × sequences of 1024 or 4096 tokens × 1 or 2 sequences per GPU, with
    activation checkpointing: one node over PCIe and NVLink, two and four nodes over InfiniBand (A100s, HDR)
    and H100s (NDR), four nodes over Ethernet. Only scenarios where some layout fits with 5 % to spare are drawn.
    The last is drawn again until every answer of :data:`CONSTANT_ANSWERS` is rejected by some scenario."""
    from parlab.decide import planner
    out = _draw(count, seed)
    extra, fastest = 0, {}
    for d, w, c in out:
        fastest[d] = _fastest(w, c)  # by description: one scenario, one search
    while count and not all(any(_loses(planner.Layout(**answer(c)), w, c, fastest[d]) for d, w, c in out)
                            for answer in CONSTANT_ANSWERS.values()):
        extra += 1  # the same seed redraws the same way
        kept = [d for d, _, _ in out[:-1]]
        out = out[:-1] + [s for s in _draw(count + extra, seed)[count - 1:] if s[0] not in kept][-1:]
        fastest[out[-1][0]] = _fastest(out[-1][1], out[-1][2])
    return out


def _draw(count: int, seed: int | None) -> list:
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
    again = say("check_layout_choice({fn}, seed={seed}) draws these {count} scenarios again", fn=_name(fn),
                seed=seed, count=count)
    for index, (description, workload, cluster) in enumerate(drawn):
        where = say("{fn} for scenario {index} of {count} ({description}; {again})", fn=_name(fn), index=index + 1,
                    count=count, description=description, again=again)
        priced = []

        def price(layout):
            if not isinstance(layout, planner.Layout):
                raise ExerciseFailed(say("{where}: price takes a parlab.decide.planner.Layout, got {layout!r:.80}",
                                         where=where, layout=layout))
            if layout not in priced:  # pricing one layout twice costs once
                priced.append(layout)
            if len(priced) > budget:
                raise ExerciseFailed(say("{where}: priced {count} layouts ({layouts}); the budget is {budget}. "
                                         "Rule out first: what fits in {memory:.0f} GB, which axes may cross the "
                                         "links between GPUs and between nodes; then price the few that are left.",
                                         where=where, count=len(priced), layouts=', '.join(map(str, priced)),
                                         budget=budget, memory=cluster.gpu.memory / 1e9))
            try:
                with _grading():  # the check's own pricing, called from the learner's function
                    return planner.predict(workload, layout, cluster)
            except ValueError as error:
                raise ExerciseFailed(f"{where}: price({layout}): {error}") from None

        with refusing("ch07.3", say("the exercise asks you to choose by the guide's rules and memory arithmetic, "
                                    "pricing at most {budget} layouts with the price argument, without the "
                                    "planner's predict or candidates", budget=budget)):
            got = _call(fn, workload=workload, cluster=cluster, price=price)
        _judge(got, workload, cluster, where, tolerance)
    return Passed(say("{fn} picks a fitting layout within {tolerance:.0%} of the fastest in {count} scenarios drawn "
                      "afresh (seed={seed}), pricing at most {budget} layouts in each", fn=_name(fn),
                      tolerance=tolerance, count=len(drawn), seed=seed, budget=budget))


def _judge(got, workload, cluster, where: str, tolerance: float) -> None:
    """Fail unless ``got`` is a layout of the cluster's ranks that keeps TP in a node, fits, and is predicted
    within ``tolerance`` of the fastest such layout."""
    from parlab.decide import planner
    if not isinstance(got, planner.Layout):
        raise ExerciseFailed(say("{where}: expected a parlab.decide.planner.Layout, got {got!r:.80}", where=where,
                                 got=got))
    if got.dp * got.tp * got.pp != cluster.world_size:
        raise ExerciseFailed(say("{where}: {got} uses {used} GPUs; the cluster has {world_size}", where=where,
                                 got=got, used=got.dp * got.tp * got.pp, world_size=cluster.world_size))
    if got.tp > cluster.gpus_per_node:
        raise ExerciseFailed(say("{where}: TP {tp} spans nodes of {per_node} GPUs", where=where, tp=got.tp,
                                 per_node=cluster.gpus_per_node))
    try:
        mine = planner.predict(workload, got, cluster)
    except ValueError as error:
        raise ExerciseFailed(say("{where}: {got} is not a layout of this batch: {error}", where=where, got=got,
                                 error=error)) from None
    best = next(p for p in planner.candidates(workload, cluster) if p.fits and p.layout.tp <= cluster.gpus_per_node)
    if not mine.fits:
        raise ExerciseFailed(say("{where}: {got} needs {needs:.1f} GB per GPU; it has {has:.0f} GB", where=where,
                                 got=got, needs=mine.memory.total / 1e9, has=cluster.gpu.memory / 1e9))
    if mine.step_s > (1 + tolerance) * best.step_s:
        raise ExerciseFailed(say("{where}: {got} fits but takes {mine:.2f} s per step (predicted); a layout that "
                                 "fits takes {best:.2f} s. Where does yours lose time? ", where=where, got=got,
                                 mine=mine.step_s, best=best.step_s)
                             + ", ".join(f"{k} {v:.2f} s" for k, v in mine.parts.items() if v > 0))
