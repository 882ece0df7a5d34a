"""The pictures of chapter 01's mechanisms draw what the estimator counts: the bytes of one parameter, who
holds which ZeRO shard, what one layer keeps, and what activation checkpointing keeps step by step."""

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.colors import to_rgba
from transformers import GPT2Config

from parlab.lab.measure import estimate_memory
from parlab.lab.measure.activations import layer_terms
from parlab.lab.measure.memory import architecture
from parlab.lab.plots.activations import (GROWTH_COLORS, checkpointing_frame, checkpointing_schedule, held_bytes,
                                          layer_saves, term_growth)
from parlab.lab.plots.colors import MEMORY_COLORS
from parlab.lab.plots.model_states import bytes_per_parameter, parameter_bytes, zero_holdings, zero_shares

SETUPS = {"fp32": dict(precision="fp32"), "bf16": dict(precision="bf16"),
          "bf16, fp32 grads": dict(precision="bf16", fp32_grads=True)}


@pytest.mark.parametrize("setup", SETUPS.values(), ids=SETUPS)
def test_one_parameter_is_the_estimators_bytes(setup):
    parts = parameter_bytes("adam", **setup)
    est = estimate_memory(num_params=1000, **setup)
    by_part = {}
    for part, _, nbytes in parts:
        by_part[part] = by_part.get(part, 0) + nbytes
    assert by_part["params"] * 1000 == est.params and by_part["grads"] * 1000 == est.grads
    assert (by_part["optimizer"] + by_part.get("master", 0)) * 1000 == est.optimizer
    assert ("master" in by_part) == (setup["precision"] != "fp32")  # the fp32 copy exists in mixed precision only


def test_bytes_per_parameter_bars_are_16_16_18():
    fig = bytes_per_parameter(SETUPS, pyplot=False)
    ax = fig.axes[0]
    ends = {}
    for bar in ax.patches:
        y = round(bar.get_y() + bar.get_height() / 2)
        ends[y] = max(ends.get(y, 0), bar.get_x() + bar.get_width())
    assert [ends[y] for y in sorted(ends)] == [16, 16, 18]
    assert sum("master copy" in t.get_text() for t in ax.texts) == 2


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_holdings_fill_the_shards_each_rank_holds(stage):
    world = 4
    fig = zero_holdings(world, stage)
    dark = [p for p in fig.axes[0].patches if p.get_facecolor() in {to_rgba(c) for c in MEMORY_COLORS.values()}]
    shares = zero_shares(world, stage)
    expected = sum(1 if sharded else world for _, sharded in shares.values()) * world
    assert len(dark) == expected
    assert [sharded for _, sharded in shares.values()] == [stage >= 3, stage >= 2, stage >= 1]


ARCH = architecture(GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=256), attention="eager")


def test_layer_saves_draws_every_term_and_colours_the_scores():
    shapes = [(2, 64), (4, 64), (2, 128)]
    fig = layer_saves(ARCH, shapes, pyplot=False)
    bars = [p for p in fig.axes[0].patches if p.get_width() > 0]
    terms = [t for b, s in shapes for t in layer_terms(ARCH, s, b, 4, "cpu")]
    assert len(bars) == len(terms)
    assert sum(p.get_width() for p in bars) == pytest.approx(sum(t.bytes for t in terms) / 1e6)
    growth = term_growth(ARCH, 64, 2, 4)
    scores = [t for t, g in zip(layer_terms(ARCH, 64, 2, 4, "cpu"), growth) if g == "scores"]
    assert scores and all(t.numel == ARCH.heads * 64 * 64 * 2 for t in scores)  # a·s²·b: the score matrices
    assert growth.count("scores") < len(growth)
    red = [p for p in bars if p.get_facecolor()[:3] == to_rgba(GROWTH_COLORS["scores"])[:3]]
    assert red  # the scores are drawn in their colour


def test_checkpointing_peaks_are_the_estimators():
    config = GPT2Config(n_layer=4, n_embd=64, n_head=4, n_positions=128, vocab_size=256)
    s, b, d = 128, 2, 4
    arch = architecture(config, attention="eager")
    per_layer = sum(t.bytes for t in layer_terms(arch, s, b, d, "cpu"))
    held = held_bytes(4, per_layer, s * b * 64 * d)
    run = dict(precision="fp32", micro_batch=b, seq_len=s, attention="eager", device="cpu")
    full = estimate_memory(config, **run).activations
    ckpt = estimate_memory(config, checkpointing=True, **run).activations
    # the model's ends are the same either way: the peaks differ by what the estimates differ by
    assert abs((max(held["all kept"]) - max(held["checkpointed"])) - (full - ckpt)) <= 1
    assert held["checkpointed"].index(max(held["checkpointed"])) == 4  # the peak: the last layer's backward


def test_checkpointing_frame_hatches_only_the_layer_recomputed():
    steps = checkpointing_schedule(3)
    assert [label for label, _, _ in steps] == ["forward 1", "forward 2", "forward 3",
                                                "backward 3", "backward 2", "backward 1"]
    for i, (_, _, again) in enumerate(steps):
        hatched = [p for p in checkpointing_frame(3, 10.0, 1.0, i, unit=1).axes[0].patches
                   if p.get_hatch() and p.get_height() > 0]
        assert len(hatched) == (again is not None)
        if again:
            assert hatched[0].get_x() + hatched[0].get_width() / 2 == pytest.approx(again + 0.2)


def test_bytes_per_parameter_labels_say_bytes():  # "0.5 B" read as half a billion: the unit is spelt out
    texts = [t.get_text() for t in bytes_per_parameter(SETUPS, pyplot=False).axes[0].texts]
    texts += [t.get_text() for stage in range(4) for t in zero_holdings(4, stage).axes[0].texts]
    numbers = [t for t in texts if any(ch.isdigit() for ch in t.split("\n")[-1])]
    assert numbers and not [t for t in numbers if t.rstrip().endswith(" B")]
    assert "weights\n0.5 bytes" in texts and "4 bytes\nper param." in texts  # ZeRO-3 over 4 ranks: 2/4, 16/4
