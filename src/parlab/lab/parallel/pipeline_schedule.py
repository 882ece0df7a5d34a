"""Pipeline schedules as data: which rank computes what, in which order (chapter 06).

A pipeline cuts a model into ``num_stages`` consecutive *stages* and gives each rank one of them (or,
interleaved, several). A step's batch is cut into ``m`` *micro-batches*. A **schedule** is nothing more
than one list of operations per rank, each operation an :class:`Op`:

- ``F`` forward of one micro-batch through one stage;
- ``B`` its backward (gradients for the stage's input and its weights);
- ``I`` and ``W`` the two halves of ``B`` when they are split (input gradient now, weight gradient
  later), as zero-bubble schedules do.

Because a schedule is data, the same object is *run* (``parlab.lab.parallel.pipeline.Pipeline``), *simulated*
(:func:`simulate`, with chosen costs), *drawn* (``parlab.lab.plots.pipeline``), *checked* (:meth:`Schedule.check`,
and ``pipeline_p2p.check_p2p`` for its messages), and compared operation by operation with a recorded run
(:func:`recorded_ops`).

The schedules built here (each cites its paper):

- :func:`naive`: model parallelism without micro-batches; one rank works at a time.
- :func:`gpipe`: all forwards, then all backwards (Huang et al. 2019, "GPipe", arXiv:1811.06965).
- :func:`one_f_one_b`: after a short warm-up each rank alternates one forward and one backward, so at
  most ``p`` micro-batches are in flight. The order comes from PipeDream (Narayanan et al. 2019,
  "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP), which trained asynchronously;
  this synchronous form, flushed at the end of every step, is PipeDream-Flush (Narayanan et al. 2021,
  "Memory-Efficient Pipeline-Parallel DNN Training", arXiv:2006.09503) and the schedule of Megatron-LM.
- :func:`interleaved_1f1b`: each rank holds ``v`` smaller stages, which shrinks the bubble ``v``-fold
  (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", arXiv:2104.04473, section 2.2). Same operation order as PyTorch's
  ``ScheduleInterleaved1F1B``, including its rule for ``m`` not a multiple of ``p``.
- :func:`from_torch`: any schedule of ``torch.distributed.pipelining`` (zero-bubble, ZB-V, DualPipeV …)
  as a :class:`Schedule`, so it can be simulated, drawn and compared like ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from parlab.lab.checks import positive_int

KINDS = {"F": "forward", "B": "backward", "I": "backward, input gradient", "W": "backward, weight gradient"}
#: Relative cost of each kind for a whole stage (one rank's layers); a common rule of thumb is that a
#: backward costs two forwards, split evenly between input and weight gradients.
DEFAULT_COSTS = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
_NAME = re.compile(r"^([FBIW])(\d+)(?:s(\d+))?$")


@dataclass(frozen=True)
class Op:
    """One operation: ``kind`` (F, B, I or W) of ``micro_batch`` on pipeline stage ``stage``."""

    kind: str
    micro_batch: int
    stage: int

    def name(self, with_stage: bool = False) -> str:
        """``F3`` (or ``F3s5`` when a rank holds several stages): the label on timelines and tables."""
        return f"{self.kind}{self.micro_batch}" + (f"s{self.stage}" if with_stage else "")

    @staticmethod
    def parse(name: str, stage: int | None = None) -> Op:
        """The inverse of :meth:`name`; ``stage`` supplies the stage when the name carries none."""
        match = _NAME.match(name)
        if not match:
            raise ValueError(f"{name!r} is not an operation name such as 'F3' or 'B0s5'")
        kind, mb, s = match.groups()
        if s is None and stage is None:
            raise ValueError(f"{name!r} names no stage; pass stage=")
        return Op(kind, int(mb), int(s) if s is not None else stage)


@dataclass(frozen=True)
class Schedule:
    """``ops[r]``: rank ``r``'s operations in the order it runs them. Checked on construction."""

    name: str
    num_ranks: int
    num_micro_batches: int
    num_stages: int
    ops: tuple[tuple[Op, ...], ...]
    stage_rank: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "ops", tuple(tuple(r) for r in self.ops))
        object.__setattr__(self, "stage_rank", {op.stage: r for r, ops in enumerate(self.ops) for op in ops})
        self.check()

    @property
    def stages_per_rank(self) -> int:
        return self.num_stages // self.num_ranks

    def stages_of(self, rank: int) -> list[int]:
        """The stages rank ``rank`` holds, in increasing order (its model chunks)."""
        return sorted(s for s, r in self.stage_rank.items() if r == rank)

    def names(self, rank: int) -> list[str]:
        """Rank ``rank``'s operations as names (what a recorded timeline shows)."""
        many = self.stages_per_rank > 1
        return [op.name(many) for op in self.ops[rank]]

    def table(self) -> str:
        """One line per rank: its operations in order."""
        return "\n".join(f"rank {r}: " + " ".join(self.names(r)) for r in range(self.num_ranks))

    def check(self) -> None:
        """Every (stage, micro-batch) is computed exactly once, on one rank, and its backward follows its
        forward there. A schedule that breaks this could not train correctly, so it is refused."""
        p, m, n = self.num_ranks, self.num_micro_batches, self.num_stages
        if len(self.ops) != p:
            raise ValueError(f"a schedule for {p} ranks needs {p} lists of operations; got {len(self.ops)}")
        if sorted(self.stage_rank) != list(range(n)):
            raise ValueError(f"stages {sorted(self.stage_rank)} have operations; expected 0..{n - 1}")
        for r, ops in enumerate(self.ops):
            seen: set = set()
            for op in ops:
                if op.kind not in KINDS or not 0 <= op.micro_batch < m:
                    raise ValueError(f"rank {r}: {op} is not an operation of this schedule (kinds {', '.join(KINDS)}, "
                                     f"micro-batches 0..{m - 1})")
                if self.stage_rank[op.stage] != r:
                    raise ValueError(f"stage {op.stage} runs on rank {self.stage_rank[op.stage]} and on rank {r}")
                key = (op.kind, op.stage, op.micro_batch)
                other = {"B": "I", "I": "B"}.get(op.kind)
                if key in seen or (other, op.stage, op.micro_batch) in seen:
                    raise ValueError(f"rank {r} runs the backward of micro-batch {op.micro_batch} on stage {op.stage} "
                                     f"twice" if other else f"rank {r} runs {op.name(True)} twice")
                need = {"B": "F", "I": "F", "W": "I"}.get(op.kind)
                if need and (need, op.stage, op.micro_batch) not in seen:
                    raise ValueError(f"rank {r} runs {op.name(True)} before {need}{op.micro_batch}s{op.stage}")
                seen.add(key)
            for s in self.stages_of(r):
                for k in range(m):
                    backward = ("B", s, k) in seen or (("I", s, k) in seen and ("W", s, k) in seen)
                    if ("F", s, k) not in seen or not backward:
                        raise ValueError(f"rank {r} never completes micro-batch {k} on stage {s}")


def _check_sizes(p, m, v=1):
    positive_int("num_ranks", p, "pipeline ranks")
    positive_int("num_micro_batches", m, "micro-batches per step")
    positive_int("v", v, "stages per rank")


def naive(p: int) -> Schedule:
    """Model parallelism without micro-batches: the batch goes forward through the ranks, then back."""
    _check_sizes(p, 1)
    return Schedule("naive", p, 1, p, [[Op("F", 0, r), Op("B", 0, r)] for r in range(p)])


def gpipe(p: int, m: int) -> Schedule:
    """GPipe: every rank runs the forwards of all ``m`` micro-batches, then their backwards (Huang et al.
    2019). Each rank holds the activations of all ``m`` micro-batches at once."""
    _check_sizes(p, m)
    return Schedule("GPipe", p, m, p, [[Op("F", k, r) for k in range(m)] + [Op("B", k, r) for k in range(m)]
                                       for r in range(p)])


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B: rank r runs ``p − r − 1`` warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards. A backward frees a micro-batch's activations as soon as possible,
    so rank r never holds more than ``p − r`` of them (Narayanan et al. 2021, PipeDream-Flush)."""
    _check_sizes(p, m)
    ops = []
    for r in range(p):
        warmup = min(p - r - 1, m)
        mine = [Op("F", k, r) for k in range(warmup)]
        for k in range(m - warmup):  # steady state: the next forward, then the oldest backward
            mine += [Op("F", warmup + k, r), Op("B", k, r)]
        mine += [Op("B", k, r) for k in range(m - warmup, m)]
        ops.append(mine)
    return Schedule("1F1B", p, m, p, ops)


def interleaved_1f1b(p: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B: rank r holds the ``v`` stages r, r + p, r + 2p, … (each 1/v of a plain stage)
    and cycles through them in rounds of micro-batches, depth first (Narayanan et al. 2021, Megatron-LM,
    section 2.2). The warm-up is ``(v − 1)·round + 2(p − r − 1)`` forwards. A round holds ``p``
    micro-batches when ``m`` is a multiple of ``p``; otherwise PyTorch's rule is followed: ``m // p``
    rounds (at least one), which must divide ``m``."""
    _check_sizes(p, m, v)
    if v < 2:
        raise ValueError(f"interleaving needs v >= 2 stages per rank; got v={v} (v=1 is one_f_one_b)")
    rounds = max(1, m // p)
    if m % rounds:
        raise ValueError(f"num_micro_batches={m} must be a multiple of the number of rounds "
                         f"max(1, m // p) = {rounds}, e.g. a multiple of p={p}")
    per_round = m // rounds
    total = m * v  # forwards (and backwards) per rank
    ops = []
    for r in range(p):
        warmup = min((v - 1) * per_round + 2 * (p - r - 1), total)
        next_mb = {"F": [0] * v, "B": [0] * v}
        mine: list[Op] = []

        def add(kind, i, chunk):
            mine.append(Op(kind, next_mb[kind][chunk], chunk * p + r))
            next_mb[kind][chunk] += 1

        forward_chunk = lambda i: (i // per_round) % v  # noqa: E731  i-th forward on this rank
        backward_chunk = lambda j: v - 1 - (j // per_round) % v  # noqa: E731  backwards run the chunks in reverse
        for i in range(warmup):
            add("F", i, forward_chunk(i))
        for j in range(total - warmup):
            add("F", warmup + j, forward_chunk(warmup + j))
            add("B", j, backward_chunk(j))
        for j in range(total - warmup, total):
            add("B", j, backward_chunk(j))
        ops.append(mine)
    return Schedule(f"interleaved 1F1B (v={v})", p, m, p * v, ops)


SCHEDULES = {"naive": lambda p, m, v: naive(p), "gpipe": lambda p, m, v: gpipe(p, m),
             "1f1b": lambda p, m, v: one_f_one_b(p, m), "interleaved": interleaved_1f1b}


def make(name: str, p: int, m: int, v: int = 2) -> Schedule:
    """The schedule called ``name`` (one of :data:`SCHEDULES`) for ``p`` ranks and ``m`` micro-batches;
    ``v`` stages per rank is used by ``"interleaved"`` only. The simulator widget builds through this."""
    if name not in SCHEDULES:
        raise ValueError(f"name={name!r}; choose one of {', '.join(map(repr, SCHEDULES))}")
    return SCHEDULES[name](p, m, v)


def from_torch(pipeline_order: dict, num_micro_batches: int, name: str = "torch") -> Schedule:
    """A ``torch.distributed.pipelining`` schedule's ``pipeline_order`` (rank → actions, ``None`` for an
    idle slot) as a :class:`Schedule`. Idle slots and bookkeeping actions (e.g. ``REDUCE_GRAD``) are
    dropped; an overlapped forward+backward (DualPipeV) becomes its two parts, in the order PyTorch runs
    them."""
    ops = []
    for rank in sorted(pipeline_order):
        mine = []
        for action in pipeline_order[rank]:
            if action is None:
                continue
            for a in (action.sub_actions or (action,)):
                kind = a.computation_type.value
                if kind in KINDS:
                    mine.append(Op(kind, a.microbatch_index, a.stage_index))
        ops.append(mine)
    num_stages = 1 + max(op.stage for mine in ops for op in mine)
    return Schedule(name, len(ops), num_micro_batches, num_stages, ops)


# -- simulated time, bubble and memory ---------------------------------------------------------------------

def simulate(schedule: Schedule, costs: dict | None = None, comm: float = 0.0):
    """Run the schedule on paper: every rank takes its operations in order, each as soon as its rank is
    free and its input has arrived (``comm`` time units after the operation that produced it). ``costs``:
    kind → time for a rank's whole share of the model (:data:`DEFAULT_COSTS` for kinds not given), divided
    among a rank's stages; a list gives one time per rank (unbalanced stages, or measured times). Returns
    ``parlab.lab.measure.Event`` objects, like a recorded run, so the same plots and measures apply."""
    from parlab.lab.measure.timeline import Event

    costs = {**DEFAULT_COSTS, **(costs or {})}
    share = schedule.stages_per_rank
    last = schedule.num_stages - 1
    where = schedule.stage_rank
    # which kind of backward each (stage, micro-batch) gets: a whole B, or I then W
    backward = {(op.stage, op.micro_batch): op.kind for ops in schedule.ops for op in ops if op.kind in "BI"}
    done: dict = {}  # (kind, stage, micro-batch) -> end time
    free = [0.0] * schedule.num_ranks
    position = [0] * schedule.num_ranks
    events = []
    many = share > 1

    def needs(op):
        s, k = op.stage, op.micro_batch
        if op.kind == "F":
            return [("F", s - 1, k)] if s > 0 else []
        if op.kind == "W":
            return [("I", s, k)]
        return [("F", s, k)] + ([(backward[s + 1, k], s + 1, k)] if s < last else [])

    def ready(op):
        """When op's inputs are there, or None if one is not computed yet."""
        if any(n not in done for n in needs(op)):
            return None
        return max([done[n] + (comm if where[n[1]] != where[op.stage] else 0.0) for n in needs(op)], default=0.0)

    remaining = sum(len(o) for o in schedule.ops)
    while remaining:
        progress = False
        for r in range(schedule.num_ranks):
            while position[r] < len(schedule.ops[r]):
                op = schedule.ops[r][position[r]]
                t = ready(op)
                if t is None:
                    break
                cost = costs[op.kind][r] if isinstance(costs[op.kind], (list, tuple)) else costs[op.kind]
                start = max(free[r], t)
                end = start + cost / share
                done[(op.kind, op.stage, op.micro_batch)] = end
                events.append(Event(r, op.name(many), "compute", start, end))
                free[r] = end
                position[r] += 1
                remaining -= 1
                progress = True
        if not progress:
            waiting = [f"rank {r}: {schedule.ops[r][position[r]].name(True)}" for r in range(schedule.num_ranks)
                       if position[r] < len(schedule.ops[r])]
            raise ValueError(f"{schedule.name} cannot finish: each rank's next operation waits for an input that "
                             f"no rank can produce ({'; '.join(waiting)})")
    return sorted(events, key=lambda e: (e.rank, e.start))


def bubble_fraction(events, per_rank: bool = False):
    """The share of the step the ranks spent not computing: 1 − Σ busy / (ranks × step time), where the step
    runs from the first operation's start to the last one's end on any rank. ``events``: a recorded or
    simulated timeline (only ``compute`` events count as busy). ``per_rank``: a list, one per rank."""
    events = [e for e in events if e.kind == "compute"]
    if not events:
        raise ValueError("bubble_fraction needs a timeline with compute events")
    start, end = min(e.start for e in events), max(e.end for e in events)
    ranks = sorted({e.rank for e in events})
    busy = {r: sum(e.seconds for e in events if e.rank == r) for r in ranks}
    idle = {r: 1 - busy[r] / (end - start) for r in ranks}
    return [idle[r] for r in ranks] if per_rank else sum(idle.values()) / len(ranks)


def bubble_formula(p: int, m: int, v: int = 1) -> float:
    """The idle share of a step for GPipe and 1F1B (v = 1) and interleaved 1F1B: (p − 1) / (v·m + p − 1).

    The bubble lasts (p − 1) stage-times (forward plus backward), divided by v when each rank holds v
    stages of 1/v the work; useful work lasts m of them (Narayanan et al. 2021, section 2.2, where the
    bubble/ideal ratio is (p − 1) / (v·m))."""
    _check_sizes(p, m, v)
    return (p - 1) / (v * m + p - 1)


def in_flight(schedule: Schedule, rank: int) -> list[int]:
    """After each of ``rank``'s operations, the number of (stage, micro-batch) pairs whose activations it
    holds: a forward adds one; the backward that finishes with them (B, or W when backward is split)
    releases it."""
    count, out = 0, []
    split = {(op.stage, op.micro_batch) for op in schedule.ops[rank] if op.kind == "W"}
    for op in schedule.ops[rank]:
        if op.kind == "F":
            count += 1
        elif op.kind == "B" or (op.kind == "W" and (op.stage, op.micro_batch) in split):
            count -= 1
        out.append(count)
    return out


def peak_in_flight(schedule: Schedule) -> list[int]:
    """Per rank, the most (stage, micro-batch) activations held at once (see :func:`in_flight`)."""
    return [max(in_flight(schedule, r)) for r in range(schedule.num_ranks)]


def recorded_ops(events, rank: int) -> list[str]:
    """The names of ``rank``'s compute operations in a timeline, in the order they started."""
    return [e.name for e in sorted(events, key=lambda e: e.start) if e.rank == rank and e.kind == "compute"
            and _NAME.match(e.name)]


def measured_costs(events, schedule: Schedule) -> dict:
    """From a recorded timeline, each rank's median duration of each kind of operation, as :func:`simulate`
    takes them (kind → one time per rank, for the rank's whole share of the model). Simulating the schedule
    with them gives the step it would take if messages were instant and nothing else ran on the machine."""
    import statistics

    costs: dict = {}
    for kind in sorted({op.kind for ops in schedule.ops for op in ops}):
        per_rank = []
        for r in range(schedule.num_ranks):
            times = [e.seconds for e in events if e.rank == r and e.kind == "compute" and e.name.startswith(kind)]
            if not times:
                raise ValueError(f"the timeline has no {kind} operation on rank {r}")
            per_rank.append(statistics.median(times) * schedule.stages_per_rank)
        costs[kind] = per_rank
    return costs
