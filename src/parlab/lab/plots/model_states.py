"""Model states drawn as what they are made of: the bytes one parameter costs (:func:`bytes_per_parameter`),
and which rank holds which shard of them under each ZeRO stage (:func:`zero_holdings`, :func:`zero_stages`).

Both read :func:`parlab.lab.measure.estimate_memory`: a bar's segments are the estimator's weights, gradients
and optimizer state per parameter (the optimizer's split into the fp32 master copy and the optimizer's own
state uses :data:`~parlab.lab.measure.memory.OPTIMIZER_STATE_BYTES`); a ZeRO part is drawn sharded exactly
when the estimator gives a rank less of it than stage 0 does. So the pictures cannot drift from the numbers.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from parlab.lab.measure.memory import OPTIMIZER_STATE_BYTES, estimate_memory
from parlab.lab.plots.colors import MEMORY_COLORS, lighter

#: The tensors an optimizer keeps per parameter (PyTorch's names), each an equal share of its state bytes.
STATE_TENSORS = {"sgd": (), "momentum": ("momentum\nbuffer",), "adam": ("Adam m\nexp_avg", "Adam v\nexp_avg_sq"),
                 "adamw": ("AdamW m\nexp_avg", "AdamW v\nexp_avg_sq")}
_DTYPE = {2: "bf16", 4: "fp32"}
_PSI = 10**6  # any Ψ: the estimator's bytes divided by it are bytes per parameter


def parameter_bytes(optimizer: str = "adam", **setup) -> list[tuple[str, str, float]]:
    """``[(part, label, bytes per parameter)]`` for one parameter: weights, gradients, then the optimizer's
    state split into the fp32 master weights (mixed precision) and the optimizer's own tensors. ``setup``:
    :func:`estimate_memory`'s keywords (``precision``, ``fp32_grads``)."""
    est = estimate_memory(num_params=_PSI, optimizer=optimizer, **setup)
    weight, grad, state = est.params / _PSI, est.grads / _PSI, est.optimizer / _PSI
    parts = [("params", f"weight\n{_DTYPE[int(weight)]}", weight),
             ("grads", f"gradient\n{_DTYPE[int(grad)]}", grad)]
    own = OPTIMIZER_STATE_BYTES[optimizer]
    if state > own:
        parts.append(("master", "master copy\nfp32", state - own))
    parts += [("optimizer", name, own / len(STATE_TENSORS[optimizer])) for name in STATE_TENSORS[optimizer]]
    return parts


def _part_color(part: str, k: int) -> tuple:
    base = MEMORY_COLORS["optimizer" if part == "master" else part]
    return lighter(base, 0.45 if part == "master" else 0.25 * k)


def bytes_per_parameter(setups: dict, optimizer: str = "adam", title: str = "", pyplot: bool = True):
    """One horizontal bar per setup (``{label: estimate_memory keywords}``), its segments the bytes one
    parameter costs (:func:`parameter_bytes`), each named, with the total at the bar's end."""
    fig = (plt.figure if pyplot else Figure)(figsize=(10, 1.0 * len(setups) + 1.3))
    ax = fig.subplots()
    for y, (label, setup) in enumerate(setups.items()):
        left = 0.0
        states = 0  # the optimizer's own tensors, each a shade lighter
        for part, name, nbytes in parameter_bytes(optimizer, **setup):
            ax.barh(y, nbytes, left=left, color=_part_color(part, states), edgecolor="white", linewidth=2)
            states += part == "optimizer"
            ax.text(left + nbytes / 2, y, f"{name}\n{nbytes:g} bytes", ha="center", va="center", fontsize=8,
                    color="white" if part != "master" else "black")
            left += nbytes
        ax.text(left + 0.2, y, f"{left:g} bytes", va="center", fontsize=10, fontweight="bold")
    ax.set_yticks(range(len(setups)), list(setups))
    ax.invert_yaxis()
    ax.set_xlim(0, 20.5)
    ax.set_xlabel("bytes per parameter")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"What one parameter costs in training ({optimizer})")
    fig.tight_layout()
    return fig


ZERO_PARTS = ("params", "grads", "optimizer")
STAGE_NAMES = ("no ZeRO (plain data parallel)", "ZeRO-1: optimizer state sharded",
               "ZeRO-2: + gradients sharded", "ZeRO-3: + weights sharded")


def zero_shares(world_size: int, stage: int, precision: str = "bf16") -> dict[str, tuple[float, bool]]:
    """``{part: (bytes per parameter one rank holds, sharded)}`` from the estimator at this stage."""
    psi = _PSI * world_size
    est = estimate_memory(num_params=psi, precision=precision, world_size=world_size, zero_stage=stage).as_dict()
    whole = estimate_memory(num_params=psi, precision=precision, world_size=world_size).as_dict()
    return {part: (est[part] / psi, est[part] < whole[part]) for part in ZERO_PARTS}


def zero_holdings(world_size: int, stage: int, precision: str = "bf16") -> Figure:
    """Rank × {weights, gradients, optimizer state}: each part a strip of ``world_size`` shards, as wide as
    its bytes per parameter; a rank's shard is filled where it holds it. A plain ``Figure`` (a frame for
    :func:`parlab.lab.plots.step_through`)."""
    shares = zero_shares(world_size, stage, precision)
    whole = zero_shares(world_size, 0, precision)
    fig = Figure(figsize=(10, 0.55 * world_size + 1.6))
    ax = fig.subplots()
    x = 0.0
    for part in ZERO_PARTS:
        width, (held, sharded) = whole[part][0], shares[part]
        shard = width / world_size
        for rank in range(world_size):
            for j in range(world_size):
                holds = j == rank or not sharded
                ax.add_patch(Rectangle((x + j * shard, rank + 0.1), shard, 0.8, edgecolor="white", linewidth=1.5,
                                       facecolor=MEMORY_COLORS[part] if holds else lighter(MEMORY_COLORS[part], 0.85)))
        state = "optimizer state" + ("" if precision == "fp32" else " (fp32 master, m, v)")
        name = {"params": "weights", "grads": "gradients", "optimizer": state}[part]
        ax.text(x + width / 2, -0.1, f"{name}\n{held:g} bytes", ha="center", va="bottom", fontsize=9)
        x += width + 0.4
    total = sum(held for held, _ in shares.values())
    for rank in range(world_size):
        ax.text(x, rank + 0.5, f"{total:g} bytes\nper param.", va="center", fontsize=10, fontweight="bold")
    ax.set_yticks([r + 0.5 for r in range(world_size)], [f"rank {r}" for r in range(world_size)])
    ax.set_xlim(0, x + 1.2)
    ax.set_ylim(world_size, -1.1)
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"{STAGE_NAMES[stage]}\nbytes per parameter on each of {world_size} ranks "
                 "(dark: the shards a rank holds)")
    fig.tight_layout()
    return fig


def zero_stages(world_size: int, precision: str = "bf16", start: int = 0) -> None:
    """:func:`zero_holdings` for stages 0 to 3, every stage in one picture (stage ``start`` outlined) and a slider."""
    from parlab.lab.plots.steps import step_through

    step_through(lambda i: zero_holdings(world_size, i, precision), ["none", "ZeRO-1", "ZeRO-2", "ZeRO-3"],
                 label="stage", start=start)
