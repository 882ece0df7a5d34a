"""The ring all-reduce drawn step by step, from the schedule the ring runs (chapter 02).

:func:`ring_states` plays :func:`parlab.lab.parallel.ring.ring_schedule` on sets of rank numbers instead of
tensors: cell ``[rank][chunk]`` is the set of ranks whose values that rank's chunk holds summed so far.
:func:`ring_frame` draws one step of it (every rank's chunks, the chunk each rank sends to its right
neighbour, the partial sums), and :func:`ring_steps` hands every frame to
:func:`parlab.lab.plots.step_through`. The chunk indices come from the ring's own code, so the picture
cannot drift from what ``ring_all_reduce`` does.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from parlab.lab.parallel.ring import ring_schedule
from parlab.lab.plots.colors import lighter

PHASE_COLORS = {"reduce-scatter": "#8172B3", "all-gather": "#55A868"}  # as the chapter's timelines


def ring_states(n: int) -> list[list[list[frozenset]]]:
    """The state before each step and after the last: ``2(n−1) + 1`` states, each ``[rank][chunk]`` → the
    ranks whose values are summed in that chunk. The reduce-scatter adds what arrives; the all-gather
    overwrites with it."""
    state = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    states = [state]
    for phase, _, chunks in ring_schedule(n):
        new = [list(row) for row in state]
        for rank, (send, _) in enumerate(chunks):
            right = (rank + 1) % n
            receive = chunks[right][1]
            assert receive == send, "the ring's schedule: the right neighbour receives the chunk sent to it"
            new[right][receive] = state[rank][send] | (state[right][receive] if phase == "reduce-scatter"
                                                        else frozenset())
        state = new
        states.append(state)
    return states


def ring_labels(n: int) -> list[str]:
    """The frames' names: "reduce-scatter 1" … "all-gather n−1", then "done"."""
    return [f"{phase} {step + 1}" for phase, step, _ in ring_schedule(n)] + ["done"]


def _cell_text(ranks: frozenset, n: int) -> str:
    return "Σ all" if len(ranks) == n else "+".join(str(r) for r in sorted(ranks))


def ring_frame(n: int, i: int) -> Figure:
    """Frame ``i`` of a ring all-reduce on ``n`` ranks: rows are ranks, columns chunks; a cell's shade is
    how many ranks it sums (its text says which); the outlined cell is what that rank sends at step ``i``,
    and the arrow goes to its right neighbour's same chunk (rank n−1's goes round to rank 0)."""
    schedule, states = ring_schedule(n), ring_states(n)
    state = states[i]
    fig = Figure(figsize=(1.25 * n + 2.6, 0.95 * n + 1.6))
    ax = fig.add_subplot()
    phase = schedule[i][0] if i < len(schedule) else None
    color = PHASE_COLORS.get(phase, "#4C72B0")
    for r in range(n):
        for c in range(n):
            k = len(state[r][c])
            ax.add_patch(Rectangle((c, r), 0.9, 0.6, facecolor=lighter(color, 0.85 * (1 - k / n)),
                                   edgecolor="#444444", linewidth=0.8))
            ax.text(c + 0.45, r + 0.3, _cell_text(state[r][c], n), ha="center", va="center", fontsize=9,
                    color="white" if k == n else "black", fontweight="bold" if k == n else "normal")
    if phase is not None:
        for r, (send, _) in enumerate(schedule[i][2]):
            ax.add_patch(Rectangle((send, r), 0.9, 0.6, fill=False, edgecolor="black", linewidth=2.5))
            right = (r + 1) % n
            end = (send + 0.45, right + 0.02) if right else (send + 0.45, n - 0.05)
            if not right:   # round the ring: leaves below the last row, comes in above the first
                ax.add_patch(FancyArrowPatch((send + 0.45, -0.35), (send + 0.45, 0.0), arrowstyle="-|>",
                                             mutation_scale=12, color="black"))
                ax.text(send + 0.5, -0.3, f"from rank {r}", fontsize=7, va="center")
                ax.text(send + 0.5, n - 0.1, "to rank 0", fontsize=7, va="center")
            ax.add_patch(FancyArrowPatch((send + 0.45, r + 0.62), end, arrowstyle="-|>", mutation_scale=12,
                                         color="black"))
    sent = min(i, len(schedule))
    step_name = ring_labels(n)[i]
    what = {"reduce-scatter": "each rank sends the outlined chunk right; the neighbour adds it to its own",
            "all-gather": "each rank sends a complete chunk right; the neighbour overwrites its copy"}
    ax.set_title(f"ring all-reduce, {n} ranks: {step_name}\n{what.get(phase, 'every rank holds every sum')}",
                 fontsize=10)
    ax.text(n / 2 - 0.05, n + 0.15, f"sent so far by each rank: {sent} chunks = {sent}/{n} of the buffer "
            f"(all told 2(n−1) = {2 * (n - 1)})", ha="center", fontsize=8)
    ax.set_xlim(-0.1, n + 0.4)
    ax.set_ylim(n + 0.4, -0.6)
    ax.set_xticks([c + 0.45 for c in range(n)], [f"chunk {c}" for c in range(n)], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks([r + 0.3 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=9)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    return fig


def ring_steps(n: int, start: int = 0) -> None:
    """Show :func:`ring_frame` for every step of a ring all-reduce on ``n`` ranks: the first frame as the
    cell's picture, a slider for the rest."""
    from parlab.lab.plots.steps import step_through

    step_through(lambda i: ring_frame(n, i), ring_labels(n), label="ring step", start=start)
