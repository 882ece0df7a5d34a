"""What crosses a stage boundary, and in which batch each rank sends and receives it (chapter 06).

A pipeline schedule (``pipeline_schedule.Schedule``) says which rank computes what, in which order; this
file derives the point-to-point messages that order implies (:func:`messages`), groups them into the
batches each rank issues together so that neighbours can never wait for each other (:func:`p2p_plan`),
and proves, before any rank starts, that the batches line up (:func:`check_p2p`).
``parlab.lab.parallel.pipeline.Pipeline`` runs the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.lab.parallel.pipeline_schedule import Op, Schedule, simulate


@dataclass(frozen=True)
class Message:
    """A tensor crossing a stage boundary: the activation *into* ``stage`` (``"act"``), or the gradient
    of that activation going back (``"grad"``, received by ``stage − 1``). ``send``: this rank sends it
    to ``peer``; otherwise receives it from ``peer``."""

    what: str
    stage: int
    micro_batch: int
    peer: int
    send: bool


def messages(schedule: Schedule, rank: int) -> list[tuple[list[Message], Op, list[Message]]]:
    """For each operation of ``rank``: what it must receive before it runs, and what it sends after.

    A forward of stage s > 0 needs the activation from stage s − 1 and sends its output to stage s + 1; a
    backward (or its input half, I) needs the gradient from stage s + 1 and sends one to s − 1. Neighbouring
    stages on the same rank hand tensors over in memory: no message."""
    last = schedule.num_stages - 1
    where = schedule.stage_rank
    out = []
    for op in schedule.ops[rank]:
        recv, send = [], []
        s, k = op.stage, op.micro_batch
        if op.kind == "F":
            if s > 0 and where[s - 1] != rank:
                recv.append(Message("act", s, k, where[s - 1], False))
            if s < last and where[s + 1] != rank:
                send.append(Message("act", s + 1, k, where[s + 1], True))
        elif op.kind in ("B", "I"):
            if s < last and where[s + 1] != rank:
                recv.append(Message("grad", s + 1, k, where[s + 1], False))
            if s > 0 and where[s - 1] != rank:
                send.append(Message("grad", s, k, where[s - 1], True))
        out.append((recv, op, send))
    return out


def p2p_plan(schedule: Schedule) -> list[list[list[Message]]]:
    """``plan[r][i]``: the messages rank ``r`` issues together, as one batch, before its operation ``i``
    (``i = len(ops)``: after its last one).

    A receive sits right before the operation that needs it. A send could go right after the operation
    that produced it, but then two neighbours can each wait for the other: in 1F1B rank 0 sends a forward
    while rank 1 sends a backward, and on a GPU (NCCL) a send does not finish until its receive is posted.
    Megatron-LM pairs each send with the neighbour's matching receive in one batch
    (``send_forward_recv_backward``); here the same idea for any schedule: :func:`simulate` says when each
    receiver will need its input, and the sender puts the send into its batch at that moment (the last
    one before it), so partners' batches line up. :func:`check_p2p` verifies the result."""
    events = simulate(schedule)
    many = schedule.stages_per_rank > 1
    times = {(e.rank, e.name): (e.start, e.end) for e in events}
    steps = [messages(schedule, r) for r in range(schedule.num_ranks)]
    needed_at = {}  # (what, stage, micro-batch) -> when its receiver starts the operation that uses it
    for r, rank_steps in enumerate(steps):
        for recv, op, _ in rank_steps:
            for m in recv:
                needed_at[m.what, m.stage, m.micro_batch] = times[r, op.name(many)][0]
    plan = [[[] for _ in range(len(rank_steps) + 1)] for rank_steps in steps]
    for r, rank_steps in enumerate(steps):
        ends = [times[r, op.name(many)][1] for _, op, _ in rank_steps]
        for i, (recv, _, send) in enumerate(rank_steps):
            plan[r][i] += recv
            for m in send:
                due = needed_at[m.what, m.stage, m.micro_batch]
                # before the first later operation still running at `due` (after the last one if none is)
                j = next((j for j in range(i + 1, len(rank_steps)) if ends[j] > due), len(rank_steps))
                plan[r][j].append(m)
    for batches in plan:  # one order on both ends of a pair: messages are matched in the order issued
        for batch in batches:
            batch.sort(key=lambda m: (m.what, m.stage, m.micro_batch))
    return plan


def check_p2p(schedule: Schedule, plan: list | None = None) -> None:
    """Refuse a schedule whose messages (:func:`p2p_plan`) could deadlock or be mismatched when run.

    Two conditions. (1) Between two ranks, messages in one direction are matched in the order they were
    issued (NCCL and gloo both do so), so the sender's order must be the receiver's. (2) The strictest
    reading of a batch, that a rank is stuck at a batch until every message in it has met its partner,
    which in turn must sit in the partner's current batch, must let every rank finish. This is how NCCL's
    GPU stream behaves; gloo is more forgiving, so a schedule that passes runs on both. ``plan``: check
    this plan instead of :func:`p2p_plan`'s (a test plants a bad one).
    """
    p = schedule.num_ranks
    batches = plan if plan is not None else p2p_plan(schedule)
    # (1) the same order on both ends of every directed pair of ranks
    for a in range(p):
        for b in range(p):
            sent = [(m.what, m.stage, m.micro_batch) for batch in batches[a] for m in batch if m.send and m.peer == b]
            got = [(m.what, m.stage, m.micro_batch) for batch in batches[b] for m in batch if not m.send and m.peer == a]
            if sent != got:
                i = next((i for i, (x, y) in enumerate(zip(sent, got)) if x != y), min(len(sent), len(got)))
                raise ValueError(f"{schedule.name}: rank {a} sends {sent[i:i + 1] or 'nothing'} as its message "
                                 f"#{i} to rank {b}, which expects {got[i:i + 1] or 'nothing'}")
    # (2) every rank gets through its batches
    position = [0] * p
    matched = [set() for _ in range(p)]  # indices, within the current batch, of messages that met their partner
    while any(position[r] < len(batches[r]) for r in range(p)):
        progress = False
        for r in range(p):
            if position[r] >= len(batches[r]):
                continue
            for i, m in enumerate(batches[r][position[r]]):
                if i in matched[r] or position[m.peer] >= len(batches[m.peer]):
                    continue
                partner = Message(m.what, m.stage, m.micro_batch, r, not m.send)
                theirs = batches[m.peer][position[m.peer]]
                if partner in theirs:
                    matched[r].add(i)
                    matched[m.peer].add(theirs.index(partner))
        for r in range(p):
            if position[r] < len(batches[r]) and len(matched[r]) == len(batches[r][position[r]]):
                position[r] += 1
                matched[r] = set()
                progress = True
        if not progress:
            stuck = [f"rank {r} waits in batch {position[r]} for "
                     + ", ".join(f"{'send' if m.send else 'recv'} {m.what}{m.micro_batch}s{m.stage} "
                                 f"{'to' if m.send else 'from'} rank {m.peer}" for m in batches[r][position[r]])
                     for r in range(p) if position[r] < len(batches[r])]
            raise ValueError(f"{schedule.name} would deadlock:\n  " + "\n  ".join(stuck))
