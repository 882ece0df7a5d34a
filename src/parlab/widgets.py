"""The strategy chooser of chapter 01: sliders in front of :func:`parlab.advice.recommend`.

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
