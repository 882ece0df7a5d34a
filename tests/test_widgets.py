"""Chapter 01's strategy tool, without a browser: its controls, its text, and whole charts from any thread
(JupyterLab's kernel subshells run widget callbacks on another thread than the cells; see
tests/test_browser.py for the same in a real browser)."""

import io
import json
import threading

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from parlab.decide.advice import recommend
from parlab.decide.widgets import CUSTOM, PNG_INPUTS_KEY, _Latest, advice_figure, advice_png, strategy_tool


def pixels(png: bytes):
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def inputs_of(png: bytes) -> dict:
    return json.loads(Image.open(io.BytesIO(png)).text[PNG_INPUTS_KEY])


def test_latest_never_overlaps_and_serves_requests_made_meanwhile():
    entered, release = threading.Event(), threading.Event()
    calls, running, overlaps = [], [0], []

    def fn():
        running[0] += 1
        overlaps.append(running[0] > 1)
        calls.append(len(calls))
        if len(calls) == 1:
            entered.set()
            release.wait(timeout=30)
        running[0] -= 1

    latest = _Latest(fn)
    first = threading.Thread(target=latest)
    first.start()
    assert entered.wait(timeout=30)
    others = [threading.Thread(target=latest) for _ in range(5)]
    for t in others:
        t.start()
    for t in others:
        t.join(timeout=30)  # they return at once: a call is running, which will serve them
        assert not t.is_alive()
    assert len(calls) == 1
    release.set()
    first.join(timeout=30)
    assert calls == [0, 1] and not any(overlaps)  # five requests, one more call
    latest()
    assert calls == [0, 1, 2]


def test_latest_recovers_after_an_exception():
    def boom():
        raise RuntimeError("boom")

    latest = _Latest(boom)
    for _ in range(2):  # a second call runs again instead of thinking one is still running
        with pytest.raises(RuntimeError, match="boom"):
            latest()


def test_chart_is_whole_and_reproducible_from_its_file():
    inputs = dict(model="Llama 2 7B", gpu_memory_gb=80, micro_batch=1, seq_len=2048)
    advice = recommend(**inputs)
    fig = advice_figure(advice, "Llama 2 7B")
    ax = fig.axes[0]
    assert ax.get_title().startswith("Llama 2 7B: memory per GPU") and "activations" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == list(advice.memory)
    assert ax.get_ylabel() and ax.get_legend() is not None
    assert fig.canvas.manager is None  # pyplot never saw it
    png = advice_png(advice, inputs)
    assert inputs_of(png) == inputs
    assert (pixels(png) == pixels(advice_png(recommend(**inputs_of(png)), inputs_of(png)))).all()


def test_tool_controls_text_and_custom_size():
    tool = strategy_tool()
    assert all(c.tooltip for c in tool.controls.values())  # else JupyterLab's hover title reads "null"
    assert tool.controls["size"].disabled and not tool.controls["micro_batch"].disabled
    assert inputs_of(tool.chart.value) == tool.inputs()
    assert "alike" in tool.text.value and "bubble" in tool.text.value
    assert "word-break: normal" in tool.text.value
    before = tool.text.value
    tool.controls["model"].value = CUSTOM
    assert not tool.controls["size"].disabled and tool.controls["micro_batch"].disabled
    assert tool.text.value != before and "activations not counted" in tool.text.value
    tool.controls["size"].value = 100.0
    assert inputs_of(tool.chart.value)["num_params"] == 100_000_000_000


def test_tool_shows_an_error_instead_of_raising():
    tool = strategy_tool()
    tool.controls["model"].options = ["GPT-5"]  # not a preset: recommend raises, the tool must say it
    assert "GPT-5" in tool.text.value and "is not a preset" in tool.text.value
    assert tool.chart.layout.display == "none"


def test_every_chart_is_whole_when_controls_move_on_many_threads():
    # Several threads move controls while the main thread draws and closes pyplot figures, as the
    # inline backend does after every cell; every chart the tool sends must equal the same chart drawn
    # alone from the arguments stored in it.
    tool = strategy_tool()
    sent, lock = [], threading.Lock()

    def record(change):
        with lock:
            sent.append(change["new"])

    tool.chart.observe(record, names="value")
    moves = [("gpu", (40, 80, 24, 141)), ("nodes", (1, 2, 4)), ("micro_batch", (1, 4, 2)),
             ("intra", ("pcie", "nvlink")), ("model", ("Llama 2 13B", "GPT-2 XL (1.5B)", "Llama 2 7B"))]

    def mover(name, values):
        for _ in range(3):
            for v in values:
                tool.controls[name].value = v

    threads = [threading.Thread(target=mover, args=m) for m in moves]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        fig, ax = plt.subplots()
        ax.plot([0, 1], [1, 0])
        for number in plt.get_fignums():  # what the inline backend does after a cell: draw, then close
            plt.figure(number).savefig(io.BytesIO(), format="png")
        plt.close("all")
    for t in threads:
        t.join()
    assert len(sent) >= len(moves)
    for png in sent:
        inputs = inputs_of(png)
        assert (pixels(png) == pixels(advice_png(recommend(**inputs), inputs))).all(), inputs
    assert inputs_of(sent[-1]) == tool.inputs()  # the last chart shows the controls as they are


def test_pipeline_simulator_draws_whole_timelines_when_controls_move_on_many_threads():
    # Chapter 06's simulator, as the strategy tool above: every timeline it sends, while three threads
    # move its controls, must be exactly one of the timelines drawn alone for a setting they could reach.
    from itertools import product

    from parlab.decide.widgets import PIPELINE_SCHEDULES, pipeline_simulator, pipeline_view

    box = pipeline_simulator(p=2, m=4)
    (which, ratio), (ranks, micro, _), _, image = box.children[0].children, box.children[1].children, *box.children[2:]
    sent, lock = [], threading.Lock()

    def record(change):
        with lock:
            sent.append(change["new"])

    image.observe(record, names="value")
    moves = [(which, ("GPipe", "1F1B")), (ranks, (4, 2)), (micro, (8, 4))]

    def mover(control, values):
        for _ in range(3):
            for v in values:
                control.value = v

    threads = [threading.Thread(target=mover, args=m) for m in moves]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def alone(name, p, m):
        buffer = io.BytesIO()
        pipeline_view(PIPELINE_SCHEDULES[name], p, m, 2, ratio.value).figure.savefig(buffer, format="png", dpi=80)
        return pixels(buffer.getvalue())

    references = [alone(*setting) for setting in product(("GPipe", "1F1B"), (2, 4), (4, 8))]
    assert len(sent) >= len(moves)
    for png in sent:
        drawn = pixels(png)
        assert any(drawn.shape == r.shape and (drawn == r).all() for r in references), "a timeline came out damaged"
    final = pixels(image.value)
    assert (final == alone(which.value, ranks.value, micro.value)).all()  # the last move is the one shown
