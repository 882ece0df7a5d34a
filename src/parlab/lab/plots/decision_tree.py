"""The guide's decision rules drawn as the tree :func:`parlab.decide.advice.recommend` walks
(:data:`parlab.decide.advice.RULES`): its questions, its leaves (what the guide offers), and the path one
:class:`~parlab.decide.advice.Advice` took, highlighted. The tree is read from the rules' own objects, so
the picture cannot drift from the advice. (A question is a node with ``yes`` and ``no``, a leaf one
without: this floor does not import :mod:`parlab.decide`, which sits above it.)
"""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

PATH_COLOR = "#DD8452"


def _is_question(node) -> bool:
    return hasattr(node, "yes") and hasattr(node, "no")


def tree_layout(tree) -> dict[int, tuple[float, int]]:
    """``{id(node): (x, depth)}``: leaves one slot apart, left to right in yes-before-no order; a question
    centred over its two answers."""
    at: dict[int, tuple[float, int]] = {}
    slot = [0]

    def place(node, depth: int) -> float:
        if not _is_question(node):
            at[id(node)] = (slot[0], depth)
            slot[0] += 1
            return at[id(node)][0]
        x = (place(node.yes, depth + 1) + place(node.no, depth + 1)) / 2
        at[id(node)] = (x, depth)
        return x

    place(tree, 0)
    return at


def _box(ax, x, y, text, width, on_path, leaf):
    ax.text(x, y, textwrap.fill(text, width), ha="center", va="center", fontsize=8.5,
            fontweight="bold" if leaf else "normal",
            bbox=dict(boxstyle="round,pad=0.4", facecolor=("#FBE3D0" if on_path else "#F2F2F2") if leaf else "white",
                      edgecolor=PATH_COLOR if on_path else "#555555", linewidth=2 if on_path else 1))


def advice_tree(tree, advice=None, title: str = "", pyplot: bool = True):
    """The tree of the guide's rules (``parlab.decide.advice.RULES``); with ``advice`` (an
    :class:`~parlab.decide.advice.Advice`), the path it took and the leaf it reached in colour, and the
    leaf's recommendations under it."""
    at = tree_layout(tree)
    on_path = {id(q) for q, _ in advice.path} | {id(advice.rule)} if advice is not None else set()
    leaves = sum(not _is_question(n) for n in _nodes(tree))
    fig = (plt.figure if pyplot else Figure)(figsize=(max(8, 1.9 * leaves), 5.2))
    ax = fig.subplots()
    for node in _nodes(tree):
        x, depth = at[id(node)]
        if _is_question(node):
            for answer, child in (("yes", node.yes), ("no", node.no)):
                cx, cd = at[id(child)]
                taken = id(node) in on_path and id(child) in on_path
                ax.plot([x, cx], [-depth, -cd], color=PATH_COLOR if taken else "#999999",
                        linewidth=3 if taken else 1, zorder=0)
                ax.text((x + cx) / 2, -(depth + cd) / 2, answer, ha="center", va="center", fontsize=8,
                        color=PATH_COLOR if taken else "#555555", backgroundcolor="white")
            _box(ax, x, -depth, node.text, 18, id(node) in on_path, leaf=False)
        else:
            _box(ax, x, -depth, node.offers, 16, id(node) in on_path, leaf=True)
    if advice is not None:
        x, depth = at[id(advice.rule)]
        ax.text(x, -depth - 0.45, "→ " + "\n→ ".join(r.strategy for r in advice.recommendations),
                ha="center", va="top", fontsize=8, color=PATH_COLOR)
    depth = max(d for _, d in at.values())
    ax.set_xlim(-0.7, leaves - 0.3)
    ax.set_ylim(-depth - 1.1, 0.5)
    ax.axis("off")
    ax.set_title(title or "The guide's decision rules (parlab.decide.advice.RULES)")
    fig.tight_layout()
    return fig


def _nodes(tree):
    """Every node of ``tree``, questions before their answers."""
    yield tree
    if _is_question(tree):
        yield from _nodes(tree.yes)
        yield from _nodes(tree.no)
