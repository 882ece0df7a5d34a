"""Activations drawn as what autograd keeps: one layer's saved tensors (:func:`layer_saves`), and activation
checkpointing as which of them are kept and which recomputed, layer by layer (:func:`checkpointing_steps`).

Both read :func:`parlab.lab.measure.activations.layer_terms`, the list :func:`parlab.lab.measure.estimate_memory`
adds up: each box is one term of it. A term is drawn as growing with s² when it quadruples as the sequence
doubles (the attention scores), as :func:`term_growth` finds by asking ``layer_terms`` at both lengths.
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from parlab.lab.measure.activations import Architecture, layer_terms
from parlab.lab.plots.colors import MEMORY_COLORS, lighter

GROWTH_COLORS = {"tokens": "#4C72B0", "scores": "#C44E52"}  # grows with s·b; grows with s²·b
GROWTH_LABELS = {"tokens": "grows with the tokens s·b", "scores": "grows with s²·b: attention scores"}


def term_growth(arch: Architecture, seq_len: int, micro_batch: int, bytes_per_value: int,
                device: str = "cpu") -> list[str]:
    """For each term of ``layer_terms``: ``"scores"`` if it grows 4× when the sequence doubles, else
    ``"tokens"`` (grows 2×)."""
    one = layer_terms(arch, seq_len, micro_batch, bytes_per_value, device)
    two = layer_terms(arch, 2 * seq_len, micro_batch, bytes_per_value, device)
    return ["scores" if b.numel >= 3 * a.numel else "tokens" for a, b in zip(one, two)]


def layer_saves(arch: Architecture, shapes: list[tuple[int, int]], bytes_per_value: int = 4, device: str = "cpu",
                unit: float = 1e6, unit_name: str = "MB", title: str = "", pyplot: bool = True):
    """One bar per ``(micro_batch, seq_len)``: the tensors one layer keeps for backward, each a box (its
    bytes), coloured by how it grows; the largest boxes are named; each bar's total and its ratio to the
    first bar at its end."""
    fig = (plt.figure if pyplot else Figure)(figsize=(11, 1.1 * len(shapes) + 1.6))
    ax = fig.subplots()
    totals = [sum(t.bytes for t in layer_terms(arch, s, b, bytes_per_value, device)) for b, s in shapes]
    for y, (b, s) in enumerate(shapes):
        terms = layer_terms(arch, s, b, bytes_per_value, device)
        left = 0.0
        for k, (term, growth) in enumerate(zip(terms, term_growth(arch, s, b, bytes_per_value, device))):
            width = term.bytes / unit
            ax.barh(y, width, left=left, color=lighter(GROWTH_COLORS[growth], 0.3 * (k % 2)),
                    edgecolor="white", linewidth=0.8)
            if width > 0.12 * max(totals) / unit:
                ax.text(left + width / 2, y, _short(term.name), ha="center", va="center", fontsize=7,
                        color="white")
            left += width
        ax.text(left + 0.01 * max(totals) / unit, y, f"{left:.2f} {unit_name}  (× {totals[y] / totals[0]:.2f})",
                va="center", fontsize=9)
    for growth, color in GROWTH_COLORS.items():
        ax.barh([0], [0], color=color, label=GROWTH_LABELS[growth])
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    ax.set_yticks(range(len(shapes)), [f"b = {b}, s = {s}" for b, s in shapes])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.25 * max(totals) / unit)
    ax.set_xlabel(f"{unit_name} one layer keeps for backward")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    family = {"gpt": "GPT", "gpt2": "GPT-2", "llama": "Llama", "bloom": "BLOOM"}.get(arch.family, arch.family)
    ax.set_title(title or f"What one {family} layer keeps for backward (h = {arch.hidden}, a = {arch.heads})")
    fig.tight_layout()
    return fig


def _short(name: str) -> str:
    """A term's name in at most two short lines."""
    return "\n".join(textwrap.wrap(name.replace("(", "").replace(")", ""), 16)[:2])


def checkpointing_schedule(layers: int) -> list[tuple[str, list[int], int | None]]:
    """The steps of one forward and backward over ``layers`` layers: ``(label, layers whose input or
    activations are held, the layer being recomputed or None)``. Layers count from 1."""
    steps = [(f"forward {f}", list(range(1, f + 1)), None) for f in range(1, layers + 1)]
    steps += [(f"backward {k}", list(range(1, k + 1)), k) for k in range(layers, 0, -1)]
    return steps


def held_bytes(layers: int, per_layer: float, kept: float) -> dict[str, list[float]]:
    """Bytes held at each step of :func:`checkpointing_schedule`: ``"all kept"`` (every layer's activations
    until its backward) and ``"checkpointed"`` (each layer's input, plus the layer being recomputed)."""
    steps = checkpointing_schedule(layers)
    return {"all kept": [len(held) * per_layer for _, held, _ in steps],
            "checkpointed": [len(held) * kept + (per_layer if again else 0) for _, held, again in steps]}


def checkpointing_frame(layers: int, per_layer: float, kept: float, i: int, unit: float = 1e6,
                        unit_name: str = "MB") -> Figure:
    """Step ``i``: left, what each layer holds (all kept against checkpointed: input kept, recomputed
    activations hatched); right, the bytes held so far at each step, and the peaks."""
    label, held, again = checkpointing_schedule(layers)[i]
    fig = Figure(figsize=(11, 3.8))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    color = MEMORY_COLORS["activations"]
    for layer in range(1, layers + 1):
        if layer in held:
            left.bar(layer - 0.2, per_layer / unit, 0.38, color=color)
            left.bar(layer + 0.2, kept / unit, 0.38, color="#2F2F2F")
        if layer == again:
            left.bar(layer + 0.2, per_layer / unit, 0.38, bottom=kept / unit, color=lighter(color, 0.55),
                     hatch="///", edgecolor=color)
    left.bar([0], [0], color=color, label="all kept: the layer's activations")
    left.bar([0], [0], color="#2F2F2F", label="checkpointed: the layer's input")
    left.bar([0], [0], color=lighter(color, 0.55), hatch="///", edgecolor=color, label="checkpointed: recomputed")
    left.set_xticks(range(1, layers + 1), [f"layer {k}" for k in range(1, layers + 1)])
    left.set_xlim(0.4, layers + 0.6)
    left.set_ylim(0, 1.35 * (per_layer + kept) / unit)
    left.set_ylabel(unit_name)
    left.legend(loc="upper left", fontsize=8, frameon=False)
    left.set_title(f"step: {label}")
    held_now = held_bytes(layers, per_layer, kept)
    steps = range(len(checkpointing_schedule(layers)))
    for name, style in (("all kept", "-"), ("checkpointed", "--")):
        values = [v / unit for v in held_now[name]]
        right.plot(steps, values, style, color="#BBBBBB")
        right.plot(steps[:i + 1], values[:i + 1], style, color=color, marker="o", markersize=3,
                   label=f"{name}: peak {max(values):.2f} {unit_name}")
    right.axvline(i, color="black", linewidth=0.8)
    right.set_xticks(list(steps), [s for s, _, _ in checkpointing_schedule(layers)], rotation=60, fontsize=7)
    right.set_ylim(0, 1.1 * max(held_now["all kept"]) / unit)
    right.set_ylabel(f"{unit_name} held")
    right.legend(loc="upper left", fontsize=8, frameon=False)
    right.set_title("activations held, step by step")
    fig.tight_layout()
    return fig


def checkpointing_steps(layers: int, per_layer: float, kept: float, unit: float = 1e6,
                        unit_name: str = "MB") -> None:
    """:func:`checkpointing_frame` for every step of one forward and backward, in one picture and behind a
    slider; the last forward step (every layer's activations are held) is outlined."""
    from parlab.lab.plots.steps import step_through

    labels = [s for s, _, _ in checkpointing_schedule(layers)]
    step_through(lambda i: checkpointing_frame(layers, per_layer, kept, i, unit, unit_name), labels,
                 label="step", start=layers)
