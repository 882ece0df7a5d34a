"""The course's colours, one palette for every picture: a timeline's kinds of event, memory's parts, a
pipeline's operations; :func:`rank_color`, one colour per rank; and :func:`lighter`, for shades of one of
them."""

from __future__ import annotations

KIND_COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "idle": "#D9D9D9"}
MEMORY_COLORS = {"params": "#4C72B0", "grads": "#55A868", "buckets": "#8DCB9B", "optimizer": "#C44E52",
                 "activations": "#8172B3"}
PIPELINE_COLORS = {"F": "#4C72B0", "B": "#55A868", "I": "#8BC995", "W": "#2A9D8F"}


def rank_color(rank: int) -> tuple:
    """Rank ``rank``'s colour (RGB), the same in every picture of the course: matplotlib's tab10 cycle."""
    from matplotlib import colormaps

    return colormaps["tab10"](rank % 10)[:3]


def lighter(color: str, amount: float) -> tuple:
    """``color`` blended towards white by ``amount`` (0: unchanged, 1: white)."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(color))
