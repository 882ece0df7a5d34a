"""The planner against published runs of today's layouts (``parlab.decide.planner.field``, ``docs/planner.md``):
FP8, context and expert parallelism, interleaved pipelines, on H100, B200 and GB200. Which rows fitted which
constant, the trivial model beside the planner on the same rows, and the runs that ran predicted to fit."""

from __future__ import annotations

import functools
import statistics

import pytest

from parlab.decide import planner
from parlab.decide.planner import field


@functools.cache
def _errors():
    return tuple(field.errors())


def test_the_blackwell_constant_is_the_fit_of_its_named_rows():
    """One new constant: the Blackwells' share, of bf16 and FP8 peak alike, fitted on the four rows FITTED names.
    The H100's FP8 share is its bf16 one, fitted on no row here."""
    by_name = {run.name: run for run in field.field_runs()}
    runs = [by_name[n] for n in field.FITTED["blackwell"]]
    assert {run.generation for run in runs} == {"blackwell"} and list(field.FITTED) == ["blackwell"]
    assert field.fitted_share(runs) == pytest.approx(planner.BLACKWELL_UTILIZATION, abs=0.005)
    assert planner.UTILIZATIONS["h100", "fp8"] == planner.UTILIZATIONS["h100", "bf16"] == planner.H100_UTILIZATION
    assert planner.UTILIZATIONS["blackwell", "fp8"] == planner.UTILIZATIONS["blackwell", "bf16"]
    assert planner.cluster_of("h100").rate("fp8") == pytest.approx(2 * planner.cluster_of("h100").rate("bf16"), rel=1e-3)


def test_held_out_rows_against_the_trivial_model_on_each_generation():
    """On the 23 H100 rows (none fitted anything) the planner's median miss is a fifth of the trivial model's
    and it is closer on 22; on the 13 Blackwell rows that fitted nothing the two tie by median (20 % and 19 %),
    the planner closer on 7: there the trivial model is as good, as the issue's bar is not met (docs/planner.md)."""
    held = {g: [e for e in _errors() if e["role"] == "held out" and e["run"].generation == g] for g in ("h100", "blackwell")}
    miss = {g: (statistics.median(abs(e["planner"]) for e in rows), statistics.median(abs(e["trivial"]) for e in rows),
                sum(abs(e["planner"]) < abs(e["trivial"]) for e in rows)) for g, rows in held.items()}
    assert len(held["h100"]) == 23 and miss["h100"][0] < miss["h100"][1] / 4 and miss["h100"][2] == 22, miss
    assert len(held["blackwell"]) == 13 and abs(miss["blackwell"][0] - miss["blackwell"][1]) < 0.02, miss
    assert miss["blackwell"][2] == 7, miss


def test_held_out_dense_rows_within_the_band():
    """Dense rows that fitted nothing: 19 of 24 inside ±20 % (H100 15 of 20, Blackwell 4 of 4)."""
    dense = [e for e in _errors() if e["role"] == "held out" and not e["moe"]]
    inside = {g: sum(abs(e["planner"]) <= 0.2 for e in dense if e["run"].generation == g) for g in ("h100", "blackwell")}
    assert len(dense) == 24 and inside == {"h100": 15, "blackwell": 4}, inside


def test_mixtures_of_experts_are_priced_fast():
    """What the planner still lacks for a MoE: every published MoE row ran slower than it predicts (by 6 to 74 %),
    on every generation and precision; no term accounts for it (``docs/planner.md``). Fails once one does."""
    moe = [e["planner"] for e in _errors() if e["moe"]]
    assert len(moe) == 12 and all(-0.8 < e < 0 for e in moe)


def test_runs_that_ran_are_predicted_to_fit():
    misses = {e["run"].name for e in _errors() if not e["fits"]}
    assert misses == set(field.DOES_NOT_FIT), misses ^ set(field.DOES_NOT_FIT)
    assert len(misses) == 5 and len(_errors()) == 40
