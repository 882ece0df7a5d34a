"""The strategy chooser of chapter 01: sliders in front of :func:`parlab.advice.recommend`; and chapter
06's pipeline simulator (:func:`pipeline_simulator`, at the end of the file).

All decisions live in :func:`parlab.advice.recommend`; this file only builds controls and draws its
answer (the recommendations as text, and :func:`parlab.plots.memory_bars` of every layout). Headless
(papermill, CI, a terminal) the widget still builds and renders its first answer into its output area,
and :func:`show_advice` gives the same text and chart without any widget.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from parlab import plots
from parlab.advice import PRESET_NAMES, recommend

GPU_SIZES_GB = (16, 24, 40, 48, 80, 141)  # V100/T4, RTX 4090/TITAN RTX, A100-40, L40S, A100/H100-80, H200


def show_advice(**kwargs):
    """Print :func:`recommend`'s advice and draw the memory per GPU of each layout; returns the Advice."""
    advice = recommend(**kwargs)
    print(advice)
    fig = plots.memory_bars(advice.memory, title="memory per GPU, by layout (model states"
                            + (" + activations)" if kwargs.get("micro_batch") else ")"),
                            limit=advice.gpu_memory, limit_label=f"{advice.gpu_memory / 1e9:g} GB GPU",
                            ymax=4 * advice.gpu_memory)
    # display, then close: inside a widget's output area the figure must not also linger in pyplot's
    # list of open figures, or the inline backend draws it a second time below the cell
    from IPython.display import display

    display(fig)
    plt.close(fig)
    return advice


def strategy_tool():
    """The interactive chooser: model, GPU memory, GPUs per node, nodes, intra- and inter-node links."""
    import ipywidgets as w

    model = w.Dropdown(options=list(PRESET_NAMES) + ["custom size"], value="Llama 2 7B", description="model")
    size = w.FloatLogSlider(value=7, base=10, min=-1, max=3, step=0.05, description="custom B params")
    gpu = w.SelectionSlider(options=list(GPU_SIZES_GB), value=80, description="GPU GB")
    per_node = w.SelectionSlider(options=[1, 2, 4, 8, 16], value=8, description="GPUs/node")
    nodes = w.SelectionSlider(options=[1, 2, 4, 8, 16, 32, 64], value=1, description="nodes")
    intra = w.ToggleButtons(options=[("NVLink/NVSwitch", "nvlink"), ("PCIe", "pcie")], description="in node")
    inter = w.ToggleButtons(options=[("fast", "fast"), ("slow", "slow")], description="between")
    out = w.Output()

    def update(model, size, gpu, per_node, nodes, intra, inter):
        which = dict(num_params=int(size * 1e9)) if model == "custom size" else dict(model=model)
        with out:
            out.clear_output(wait=True)
            show_advice(**which, gpu_memory_gb=gpu, gpus_per_node=per_node, nodes=nodes,
                        intra_node=intra, inter_node=inter)

    w.interactive_output(update, dict(model=model, size=size, gpu=gpu, per_node=per_node, nodes=nodes,
                                      intra=intra, inter=inter))
    return w.VBox([w.HBox([model, size]), w.HBox([gpu, per_node, nodes]), intra, inter, out])


# -- chapter 06: the pipeline simulator ---------------------------------------------------------------------

PIPELINE_SCHEDULES = {"naive model parallelism": "naive", "GPipe": "gpipe", "1F1B": "1f1b",
                      "interleaved 1F1B": "interleaved"}


def pipeline_view(schedule: str = "1f1b", p: int = 4, m: int = 8, v: int = 2, backward: float = 2.0):
    """What the pipeline simulator shows for one setting, without a widget: a ``types.SimpleNamespace``
    with the ``schedule`` (``parlab.parallel.pipeline_schedule.make(schedule, p, m, v)``), its simulated
    ``events`` (a forward costs 1, a backward ``backward``), the ``figure`` (timeline and activations held)
    and a ``summary`` line (bubble simulated and by formula, peak activations per rank). Chapter 06 checks
    that for every setting it ran, this schedule is the order each rank recorded."""
    from types import SimpleNamespace

    from parlab.parallel import pipeline_schedule as ps

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
    figure = plots.pipeline(events, title=summary.split(":")[0], unit=1.0, unit_name="forward times",
                            memory=memory, memory_label="activations held\n(stage micro-batches)")
    return SimpleNamespace(schedule=s, events=events, figure=figure, summary=summary, bubble=bubble,
                           formula=formula, peaks=peaks)


def pipeline_simulator(p: int = 4, m: int = 8, v: int = 2):
    """Sliders for the ranks ``p``, micro-batches ``m``, stages per rank ``v`` (interleaved only) and the
    schedule; draws :func:`pipeline_view` with its bubble and memory. The figure is a plain matplotlib
    ``Figure`` rendered to PNG into an ``Image`` widget: no pyplot state and no captured output, so it
    draws correctly even when JupyterLab runs the callback on another thread."""
    import io

    import ipywidgets as w

    which = w.Dropdown(options=list(PIPELINE_SCHEDULES), value="1F1B", description="schedule")
    ranks = w.IntSlider(value=p, min=2, max=8, description="p (ranks)")
    micro = w.IntSlider(value=m, min=1, max=32, description="m (micro)")
    chunks = w.IntSlider(value=v, min=2, max=4, description="v (interl.)")
    ratio = w.FloatSlider(value=2.0, min=0.5, max=4.0, step=0.5, description="B / F time")
    image = w.Image(format="png")
    text = w.HTML()

    def update(*_):
        try:
            view = pipeline_view(PIPELINE_SCHEDULES[which.value], ranks.value, micro.value, chunks.value, ratio.value)
        except ValueError as err:  # e.g. interleaving with m not a multiple of the rounds
            text.value = f"<b>cannot build this schedule:</b> {err}"
            return
        buffer = io.BytesIO()
        view.figure.savefig(buffer, format="png", dpi=80)
        image.value = buffer.getvalue()
        text.value = view.summary

    for control in (which, ranks, micro, chunks, ratio):
        control.observe(update, names="value")
    update()
    return w.VBox([w.HBox([which, ratio]), w.HBox([ranks, micro, chunks]), text, image])
