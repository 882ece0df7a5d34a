"""The strategy chooser of chapter 01: controls in front of :func:`parlab.decide.advice.recommend`; and chapter
06's pipeline simulator (:func:`pipeline_simulator`, at the end of the file).

All decisions live in :func:`parlab.decide.advice.recommend`; this file only builds controls and shows its
answer: the recommendations as HTML, and :func:`parlab.lab.plots.memory_bars` of every layout as a PNG.
:func:`show_advice` gives the same text and chart without any widget (papermill, CI, a static view).

Threads. JupyterLab (4.4 and later, by default) sends widget messages over a kernel *subshell*, and
ipykernel 7 handles a subshell's messages on a thread of its own while cells run on the main thread. So
the tool's update may run on either thread, and during a cell. It therefore never touches pyplot: its
chart is a plain ``matplotlib.figure.Figure`` rendered to PNG bytes for an ``Image`` widget (pyplot's open
figures are global, and the inline backend shows and closes all of them after every cell, from the main
thread). And updates run one at a time, the latest controls winning (:class:`_Latest`).
"""

from __future__ import annotations

import html
import io
import json
import textwrap
import threading

import ipywidgets as w

from parlab.lab import plots
from parlab.decide.advice import PRESET_NAMES, Advice, recommend

GPU_SIZES_GB = (16, 24, 40, 48, 80, 141)  # V100/T4, RTX 4090/TITAN RTX, A100-40, L40S, A100/H100-80, H200
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)
SEQ_LENS = (512, 1024, 2048, 4096, 8192)
CUSTOM = "custom size"
#: PNG text key holding the :func:`recommend` arguments a chart shows, as JSON: the chart can be redrawn
#: from its file (the browser test does, to check each chart the tool sent is whole).
PNG_INPUTS_KEY = "parlab.recommend"
DPI = 96


def advice_figure(advice: Advice, what: str = ""):
    """The memory per GPU of each layout, on a plain ``Figure`` (no pyplot: any thread may draw it).
    ``what``: the model's name, for the title."""
    with_acts = any(e.activations for e in advice.memory.values())
    return plots.memory_bars(advice.memory, pyplot=False, limit=advice.gpu_memory,
                             title=(f"{what}: " if what else "") + "memory per GPU, by layout (model states"
                                   + (" + activations)" if with_acts else ")"),
                             limit_label=f"{advice.gpu_memory / 1e9:g} GB GPU", ymax=4 * advice.gpu_memory)


def advice_png(advice: Advice, inputs: dict) -> bytes:
    """:func:`advice_figure` as PNG bytes, with ``inputs`` (the arguments of :func:`recommend`) stored in
    the file under :data:`PNG_INPUTS_KEY`."""
    model, num_params = inputs.get("model"), inputs.get("num_params")
    what = model if isinstance(model, str) else f"{num_params / 1e9:.3g} B parameters" if num_params else ""
    buf = io.BytesIO()
    # a config or module given as model= is stored by its type's name
    meta = json.dumps(inputs, sort_keys=True, default=lambda o: type(o).__name__)
    advice_figure(advice, what).savefig(buf, format="png", dpi=DPI, bbox_inches="tight", facecolor="white",
                                        metadata={PNG_INPUTS_KEY: meta})
    return buf.getvalue()


def advice_html(advice: Advice) -> str:
    """The summary, the numbered recommendations and the notes, as HTML that wraps between words only."""
    esc = html.escape
    items = []
    for r in advice.recommendations:
        verdict = advice.verdict(r)
        if verdict:
            color = "#1a7f37" if advice.fits(r) else "#b3261e"
            verdict = f' <span style="white-space: nowrap; color: {color}">[{esc(verdict)}]</span>'
        items.append(f"<li><b style='white-space: nowrap'>{esc(r.strategy)}</b>: {esc(r.reason)}{verdict}</li>")
    notes = "".join(f"<li>{esc(n)}</li>" for n in advice.notes)
    # JupyterLab's output CSS breaks long words anywhere (word-break: break-all); this text must not
    return ("<div class='parlab-advice' style='white-space: normal; word-break: normal; overflow-wrap: normal; "
            "line-height: 1.45; max-width: 70em'>"
            f"<p style='margin: 0.3em 0'>{esc(advice.summary)}</p><ol style='margin: 0.3em 0'>{''.join(items)}</ol>"
            f"<ul style='margin: 0.3em 0; color: #555; font-size: 92%'>{notes}</ul></div>")


def show_advice(**kwargs) -> Advice:
    """Print :func:`recommend`'s advice and show the memory per GPU of each layout; returns the Advice."""
    from IPython.display import Image, display

    advice = recommend(**kwargs)
    # wrapped here: a notebook's output area breaks over-long lines in the middle of words
    print("\n".join(textwrap.fill(line, 110, subsequent_indent="   ") for line in str(advice).splitlines()))
    display(Image(advice_png(advice, kwargs)))
    return advice


class _Latest:
    """Calls ``fn()`` when asked, never two at once, from whichever thread asks; a request that comes
    while a call is running is not lost but served by one more call when it ends (``fn`` reads the
    controls' values then, so the last state is always drawn, and a burst of slider moves costs one or
    two draws, not one each)."""

    def __init__(self, fn):
        self._fn = fn
        self._lock = threading.Lock()
        self._asked = 0
        self._running = False

    def __call__(self, *_):
        with self._lock:
            self._asked += 1
            if self._running:
                return  # the running thread sees the new count and calls again
            self._running = True
        try:
            while True:
                with self._lock:
                    seen = self._asked
                self._fn()
                with self._lock:
                    if self._asked == seen:
                        self._running = False
                        return
        except BaseException:
            with self._lock:
                self._running = False
            raise


def _described(cls, description: str, tooltip: str, **kwargs):
    # "initial": the label as wide as its text (the default width cuts long labels with "…"); a tooltip
    # always, or JupyterLab shows the label's hover title as "null"
    return cls(description=description, tooltip=tooltip, style={"description_width": "initial"}, **kwargs)


class StrategyTool(w.VBox):
    """The interactive chooser: model, GPU memory, GPUs per node, nodes, micro-batch and sequence length
    (activations), checkpointing, intra- and inter-node links. ``controls``: name → widget; ``text``: the
    recommendations (HTML); ``chart``: the memory per GPU of each layout (PNG)."""

    def __init__(self, model: str = "Llama 2 7B", gpu_memory_gb: int = 80, gpus_per_node: int = 8,
                 nodes: int = 1, micro_batch: int = 1, seq_len: int = 2048):
        super().__init__()
        c = self.controls = dict(
            model=_described(w.Dropdown, "model", "a published architecture, counted from its config on the "
                             "meta device; or 'custom size' for a bare parameter count",
                             options=list(PRESET_NAMES) + [CUSTOM], value=model),
            size=_described(w.FloatLogSlider, "custom size, B params", "billions of parameters; used only "
                            "when the model is 'custom size' (no architecture, so no activations)",
                            value=10, base=10, min=-1, max=3, step=0.05, readout_format=".3g"),
            gpu=_described(w.SelectionSlider, "GPU memory, GB", "memory of one GPU: 16 V100/T4, 24 RTX 4090, "
                           "40 or 80 A100, 48 L40S, 80 H100, 141 H200", options=list(GPU_SIZES_GB),
                           value=gpu_memory_gb),
            per_node=_described(w.SelectionSlider, "GPUs per node", "GPUs in one machine",
                                options=[1, 2, 4, 8, 16], value=gpus_per_node),
            nodes=_described(w.SelectionSlider, "nodes", "machines", options=[1, 2, 4, 8, 16, 32, 64],
                             value=nodes),
            micro_batch=_described(w.SelectionSlider, "micro-batch", "sequences per GPU per step: "
                                   "activations grow with it", options=list(MICRO_BATCHES), value=micro_batch),
            seq_len=_described(w.SelectionSlider, "tokens per sequence", "sequence length: activations grow "
                               "with it, the attention scores with its square", options=list(SEQ_LENS),
                               value=seq_len),
            checkpointing=_described(w.Checkbox, "activation checkpointing", "keep only each layer's input "
                                     "and recompute the rest during backward", value=False, indent=False),
            intra=_described(w.ToggleButtons, "inside a node", "how the GPUs of one node talk",
                             options=[("NVLink/NVSwitch", "nvlink"), ("PCIe", "pcie")]),
            inter=_described(w.ToggleButtons, "between nodes", "how nodes talk: fast (InfiniBand, 400 Gb/s "
                             "Ethernet) or slow (ordinary Ethernet)",
                             options=[("fast", "fast"), ("slow", "slow")]),
        )
        self.text = w.HTML()
        self.chart = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self._refresh = _Latest(self._draw)
        for control in c.values():
            control.observe(self._refresh, names="value")
        self._draw()  # the first answer, on the thread that builds the tool
        self.children = [w.HBox([c["model"], c["size"]]), w.HBox([c["gpu"], c["per_node"], c["nodes"]]),
                         w.HBox([c["micro_batch"], c["seq_len"], c["checkpointing"]]),
                         w.HBox([c["intra"], c["inter"]]), self.text, self.chart]

    def inputs(self) -> dict:
        """The controls' values as :func:`recommend`'s arguments."""
        v = {name: control.value for name, control in self.controls.items()}
        which = dict(model=v["model"]) if v["model"] != CUSTOM else dict(num_params=round(v["size"] * 1e9))
        return dict(which, gpu_memory_gb=v["gpu"], gpus_per_node=v["per_node"], nodes=v["nodes"],
                    intra_node=v["intra"], inter_node=v["inter"], micro_batch=v["micro_batch"],
                    seq_len=v["seq_len"], checkpointing=v["checkpointing"])

    def _draw(self):
        custom = self.controls["model"].value == CUSTOM
        # a control that would change nothing must not look live
        self.controls["size"].disabled = not custom
        for name in ("micro_batch", "seq_len", "checkpointing"):
            self.controls[name].disabled = custom
        inputs = self.inputs()
        try:
            advice = recommend(**inputs)
            text, png = advice_html(advice), advice_png(advice, inputs)
        except Exception as e:  # shown in the tool: raised from a widget callback it would reach only the log
            self.text.value = f"<p style='color: #b3261e'>{html.escape(f'{type(e).__name__}: {e}')}</p>"
            self.chart.layout.display = "none"  # not the last chart, which no longer matches the controls
            return
        self.text.value = text
        self.chart.value = png
        self.chart.layout.display = None


def strategy_tool(**defaults) -> StrategyTool:
    """The chooser of chapter 01 (see :class:`StrategyTool` for ``defaults``)."""
    return StrategyTool(**defaults)


# -- chapter 06: the pipeline simulator ---------------------------------------------------------------------

PIPELINE_SCHEDULES = {"naive model parallelism": "naive", "GPipe": "gpipe", "1F1B": "1f1b",
                      "interleaved 1F1B": "interleaved"}


def pipeline_view(schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2, backward: float = 2.0):
    """What the pipeline simulator shows for one setting, without a widget: a ``types.SimpleNamespace``
    with the ``schedule`` (``parlab.lab.parallel.pipeline_schedule.make(schedule, p, m, v)``), its simulated
    ``events`` (a forward costs 1, a backward ``backward``), the ``figure`` (timeline and activations held)
    and a ``summary`` line (bubble simulated and by formula, peak activations per rank). Chapter 06 checks
    that for every setting it ran, this schedule is the order each rank recorded."""
    from types import SimpleNamespace

    from parlab.lab.parallel import pipeline_schedule as ps

    s = ps.make(schedule, p, m, v)
    events = ps.simulate(s, {"F": 1.0, "B": backward})
    v = s.stages_per_rank
    memory = {}
    for r in range(p):
        ends = [e.end for e in events if e.rank == r]
        memory[r] = [(0.0, 0.0)] + [(t, held / v) for t, held in zip(ends, ps.in_flight(s, r))]
    bubble, formula = ps.bubble_fraction(events), ps.bubble_formula(p, s.num_micro_batches, v)
    peaks = [round(max(h for _, h in memory[r]), 2) for r in range(p)]
    summary = (f"{s.name}, p={p}, m={s.num_micro_batches}: bubble {bubble:.1%} simulated, (p−1)/(v·m+p−1) = {formula:.1%}; most activations held, "
               f"in micro-batches of a whole stage, per rank: {peaks}")
    figure = plots.pipeline(events, title="simulated " + summary.split(":")[0], unit=1.0, unit_name="forward times",
                            memory=memory, memory_label="activations held\n(stage micro-batches)")
    return SimpleNamespace(schedule=s, events=events, figure=figure, summary=summary, bubble=bubble,
                           formula=formula, peaks=peaks)


def pipeline_simulator(p: int = 4, m: int = 8, v: int = 2):
    """Sliders for the ranks ``p``, micro-batches ``m``, stages per rank ``v`` (interleaved only) and the
    schedule; draws :func:`pipeline_view` with its bubble and memory. The figure is a plain matplotlib
    ``Figure`` rendered to PNG into an ``Image`` widget: no pyplot state and no captured output, so it
    draws correctly even when JupyterLab runs the callback on another thread."""
    which = _described(w.Dropdown, "schedule", "the order in which each rank runs forwards and backwards",
                       options=list(PIPELINE_SCHEDULES), value="1F1B")
    ranks = _described(w.IntSlider, "p (ranks)", "pipeline ranks: one stage each, v when interleaved", value=p, min=2, max=8)
    micro = _described(w.IntSlider, "m (micro-batches)", "micro-batches per step", value=m, min=1, max=32)
    chunks = _described(w.IntSlider, "v (stages per rank)", "virtual stages per rank (interleaved 1F1B only)",
                        value=v, min=2, max=4)
    ratio = _described(w.FloatSlider, "backward / forward time", "how much longer a backward takes than a "
                       "forward", value=2.0, min=0.5, max=4.0, step=0.5)
    image = w.Image(format="png")
    text = w.HTML()

    def draw():
        try:
            view = pipeline_view(PIPELINE_SCHEDULES[which.value], ranks.value, micro.value, chunks.value, ratio.value)
        except ValueError as err:  # e.g. interleaving with m not a multiple of the rounds
            text.value = f"<b>cannot build this schedule:</b> {html.escape(str(err))}"
            return
        buffer = io.BytesIO()
        view.figure.savefig(buffer, format="png", dpi=80)  # a plain Figure: no pyplot state
        image.value = buffer.getvalue()
        text.value = view.summary

    update = _Latest(draw)  # one draw at a time, from whichever thread JupyterLab calls it on
    for control in (which, ranks, micro, chunks, ratio):
        control.observe(update, names="value")
    update()
    return w.VBox([w.HBox([which, ratio]), w.HBox([ranks, micro, chunks]), text, image])
