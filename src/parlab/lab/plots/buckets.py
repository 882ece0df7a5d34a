"""Gradient buckets: which parameters share one all-reduce, and when each bucket sets off during backward.

- :func:`bucket_list`    one row per bucket, in launch order: its parameters as segments as wide as their
                         gradients' bytes, in the order they were packed, and the cap each bucket closed
                         against (chapter 03's DDP v2, ``parlab.lab.parallel.ddp.DDPBuckets``);
- :func:`record_firing`  around one backward of a ``DDPOverlap`` (v3): the order in which gradients became
                         ready and, for each bucket launch, how many gradients were ready then, read from the
                         wrapper's own ``_ready`` set and ``_launch`` calls;
- :func:`firing_frame`   the buckets after the first k gradients of that backward: still computing, packed
                         and waiting, or on their way (the bucket's all-reduce launched); a plain ``Figure``
                         for :func:`parlab.lab.plots.step_through`;
- :func:`layer_steps`    the frames worth stepping through: after each layer's gradients, with their labels.
"""

from __future__ import annotations

import contextlib

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from parlab.lab.plots.colors import KIND_COLORS, lighter

#: A gradient's state in a frame of :func:`firing_frame`, and its colour.
STATES = {"computing": "#D9D9D9", "in its bucket": lighter(KIND_COLORS["compute"], 0.35),
          "all-reduce launched": KIND_COLORS["comm"]}


def _short(name: str) -> str:
    return name.replace("transformer.", "").replace(".weight", ".w").replace(".bias", ".b")


def _draw(ax, buckets, param_bytes, color_of, cap=None, right=None, unit=1024):
    """Each bucket a row (bucket 0 on top), its parameters left to right as segments of their bytes."""
    widest = max(sum(param_bytes[n] for n in names) for names, _ in buckets) / unit
    for row, (names, _) in enumerate(buckets):
        left = 0.0
        for name in names:
            width = param_bytes[name] / unit
            ax.barh(row, width, left=left, height=0.7, color=color_of(row, name), edgecolor="white", linewidth=0.8)
            if width > 0.09 * widest:
                ax.text(left + width / 2, row, _short(name), ha="center", va="center", fontsize=6.5, rotation=0)
            left += width
        if right:
            ax.text(left + 0.01 * widest, row, right(row), va="center", fontsize=7.5)
    if cap is not None:
        ax.axvline(cap / unit, color="black", ls="--", lw=1)
        ax.text(cap / unit, -0.65, f" cap {cap / unit:g} KiB", fontsize=7.5, va="bottom")
    ax.set_yticks(range(len(buckets)), [f"bucket {i}" for i in range(len(buckets))])
    ax.set_ylim(len(buckets) - 0.5, -1.0)
    ax.set_xlim(0, widest * 1.32)
    ax.set_xlabel("KiB of gradients, in the order they are packed")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def bucket_list(buckets, param_bytes: dict, cap: int | None = None, title: str = ""):
    """``buckets``: ``[(names, nbytes), ...]`` in launch order (``DDPBuckets.buckets``' names and bytes);
    ``param_bytes``: each parameter's gradient bytes. Draws one row per bucket. Returns the figure."""
    for names, nbytes in buckets:
        if sum(param_bytes[n] for n in names) != nbytes:
            raise ValueError(f"a bucket of {nbytes} bytes holds {names}, whose gradients add up to "
                             f"{sum(param_bytes[n] for n in names)}: param_bytes is not this model's")
    fig, ax = plt.subplots(figsize=(9, 0.36 * len(buckets) + 1.4))
    shades = [lighter(KIND_COLORS["compute"], a) for a in (0.0, 0.45)]
    counter = {}

    def color(row, name):
        counter[row] = counter.get(row, -1) + 1
        return shades[(row + counter[row]) % 2]

    _draw(ax, buckets, param_bytes, color, cap,
          right=lambda row: f"{buckets[row][1] / 1024:.1f} KiB, {len(buckets[row][0])} tensors")
    ax.set_title(title or f"{len(buckets)} buckets: parameters in reverse order, each bucket closed once it "
                          f"holds the cap or more", fontsize=9, loc="left")
    fig.tight_layout()
    return fig


@contextlib.contextmanager
def record_firing(ddp):
    """Around one backward of a ``DDPOverlap`` ``ddp``: yields a dict that fills with ``buckets`` ([(names,
    nbytes)]), ``param_bytes``, ``ready`` (parameter names in the order their gradients were packed) and
    ``launches`` ([(bucket index, gradients ready when it was launched)]). Nothing of the wrapper changes:
    its ``_launch`` is wrapped for the block only, and a hook registered after its own reads the order."""
    names = {id(p): n for n, p in ddp.module.named_parameters()}
    trace = {"buckets": [(b.names, b.nbytes) for b in ddp.buckets], "ready": [], "launches": [],
             "param_bytes": {names[id(p)]: v.numel() * v.element_size() for b in ddp.buckets
                             for p, v in zip(b.params, b.views)}}
    launch = ddp._launch

    def counted(bucket):
        trace["launches"].append((bucket.index, len(ddp._ready)))
        launch(bucket)

    ddp._launch = counted
    hooks = [p.register_post_accumulate_grad_hook(lambda p: trace["ready"].append(names[id(p)]))
             for p in ddp._params]
    try:
        yield trace
    finally:
        del ddp._launch  # the class's method again
        for h in hooks:
            h.remove()


def launched_after(trace, k: int) -> set[int]:
    """The buckets whose all-reduce ``trace`` shows launched once ``k`` gradients were ready."""
    return {b for b, ready in trace["launches"] if ready <= k}


def firing_frame(trace, k: int, label: str = "") -> Figure:
    """The buckets once ``k`` gradients of the recorded backward are ready (``trace``: :func:`record_firing`);
    ``label`` opens the title ("h.1 ready")."""
    ready, launched = set(trace["ready"][:k]), launched_after(trace, k)

    def state(row, name):
        return "all-reduce launched" if row in launched else "in its bucket" if name in ready else "computing"

    fig = Figure(figsize=(9, 0.36 * len(trace["buckets"]) + 1.7))
    ax = fig.subplots()
    _draw(ax, trace["buckets"], trace["param_bytes"], lambda row, name: STATES[state(row, name)],
          right=lambda row: "on its way" if row in launched else
          f"{sum(n in ready for n in trace['buckets'][row][0])}/{len(trace['buckets'][row][0])} packed")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in STATES.values()]
    ax.legend(handles, [f"gradient {s}" if s != "all-reduce launched" else s for s in STATES], fontsize=7,
              loc="lower right", frameon=False, ncol=3, bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"{label or 'backward'}: {k} of {len(trace['ready'])} gradients ready, {len(launched)} of "
                 f"{len(trace['buckets'])} buckets launched", fontsize=9, loc="left", pad=18)
    fig.tight_layout()
    return fig


def _layer(name: str) -> str:
    parts = name.replace("transformer.", "").split(".")
    return ".".join(parts[:2]) if parts[0] == "h" else parts[0]


def layer_steps(trace) -> tuple[list[int], list[str]]:
    """Frames at which one layer's gradients are all ready (``h.1``, ``ln_f``, ``wte``, ...): the number of
    gradients ready then, and a label for each; the first frame, nothing ready yet."""
    counts, labels = [0], ["backward starts"]
    for k, name in enumerate(trace["ready"], start=1):
        nxt = trace["ready"][k] if k < len(trace["ready"]) else None
        if nxt is None or _layer(nxt) != _layer(name):
            counts.append(k)
            labels.append(f"{_layer(name)} ready")
    return counts, labels
