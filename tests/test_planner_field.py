"""The planner against published runs of today's layouts (``parlab.decide.planner.field``, ``docs/planner.md``):
FP8, context and expert parallelism, interleaved pipelines, on H100, B200 and GB200. Which rows fitted which
constant, the trivial model beside the planner on the same rows, and the runs that ran predicted to fit."""

from __future__ import annotations

import functools
import statistics

import numpy
import pytest

from parlab.decide import planner
from parlab.decide.planner import field


@functools.cache
def _errors():
    return tuple(field.errors())


def test_the_blackwell_constant_is_the_fit_of_its_named_rows():
    """The Blackwells' share, of bf16 and FP8 peak alike, fitted on the four rows FITTED names.
    The H100's FP8 share is its bf16 one, fitted on no row here."""
    runs = field.runs_named(field.FITTED["blackwell"])
    assert {run.generation for run in runs} == {"blackwell"} and list(field.FITTED) == ["blackwell"]
    assert field.fitted_share(runs) == pytest.approx(planner.BLACKWELL_UTILIZATION, abs=0.005)
    assert planner.UTILIZATIONS["h100", "fp8"] == planner.UTILIZATIONS["h100", "bf16"] == planner.H100_UTILIZATION
    assert planner.UTILIZATIONS["blackwell", "fp8"] == planner.UTILIZATIONS["blackwell", "bf16"]
    assert planner.cluster_of("h100").rate("fp8") == pytest.approx(2 * planner.cluster_of("h100").rate("bf16"), rel=1e-3)


def test_each_expert_constant_is_the_fit_of_its_named_rows():
    """A local expert's fixed cost, one per generation, fitted on its MoE rows on the fewest GPUs (EXPERT_FITTED);
    no dense row moves with it."""
    for generation, names in field.EXPERT_FITTED.items():
        runs = field.runs_named(names)
        assert {run.generation for run in runs} == {generation} and all(run.workload().experts for run in runs)
        fewest = min(e["run"].row["gpus"] for e in _errors() if e["moe"] and e["run"].generation == generation)
        assert {run.row["gpus"] for run in runs} == {fewest}
        assert field.fitted_expert_seconds(runs) == pytest.approx(planner.EXPERT_SECONDS[generation], rel=0.02)
    dense, = field.runs_named(["Llama 3 8B, 8 B200, MXFP8"])
    with pytest.raises(KeyError, match=r"no priced field run is named \['Llama 3 8B, 8 A100'\]"):
        field.runs_named(["Llama 3 8B, 8 A100"])
    assert dense.predict(cluster=dense.cluster(expert_seconds=1.0)).step_s == dense.predict().step_s


def test_tp_overlap_shares_are_the_fits_of_their_named_rows():
    """PyTorch's async TP hides a fifth of the TP time the products cover (TP_OVERLAP_FITTED's pair: 829 → 876
    tokens/s per GPU); Transformer Engine's overlap, as Megatron-Bridge ran it, 27 % (its four rows with TP 4). The
    pair's options differ in tp_overlap alone. Hiding all of it would price torchtitan's two 405B runs at 8k tokens
    30 % fast, and Megatron-Bridge's held-out 405B with TP 8 on 1,024 H100 22 % fast; the fitted shares bring them
    within ±20 %, the last within ±10 %."""
    assert field.fitted_tp_overlap() == pytest.approx(planner.TP_OVERLAP_HIDDEN["course"], abs=0.01)
    assert field.fitted_tp_overlap("megatron") == pytest.approx(planner.TP_OVERLAP_HIDDEN["megatron"], abs=0.01)
    with pytest.raises(ValueError, match=r"implementation='deepspeed': a TP overlap share is fitted for 'course', "
                                         r"'megatron'"):
        field.fitted_tp_overlap("deepspeed")
    fitted = field.runs_named(field.TP_OVERLAP_FITTED["megatron"])
    assert {run.row["tp"] for run in fitted} == {4} and all(run.options()["tp_overlap"] for run in fitted)
    assert all(field.role(run) == "fitted" for run in fitted)
    held, = field.runs_named(["Llama 3.1 405B, 1024 H100, FP8 current scaling, CP 2"])
    assert field.role(held) == "held out" and held.row["tp"] == 8 and held.options()["tp_overlap"]
    assert abs(held.predict().step_s / held.step_s - 1) < 0.1
    assert held.predict(tp_overlap=1.0).step_s / held.step_s - 1 < -0.2  # the share before the fit: all hidden
    plain, overlapped = field.runs_named(field.TP_OVERLAP_FITTED["course"])
    assert {**plain.options(), "tp_overlap": True} == overlapped.options() and not plain.options()["tp_overlap"]
    pp8 = [e for e in _errors() if "405B, 512 H100, FSDP 8 x TP 8 x PP 8" in e["run"].name]
    assert len(pp8) == 2 and all(abs(e["planner"]) < 0.2 for e in pp8)
    assert all(e["run"].predict(tp_overlap=1.0).step_s / e["run"].step_s - 1 < -0.29 for e in pp8)
    run = pp8[0]["run"]
    for bad in (-0.1, 1.5, "yes", None):
        with pytest.raises(ValueError, match=rf"tp_overlap={bad!r}: True, False, or the share"):
            run.predict(tp_overlap=bad)
    # numpy's bool_ is a flag (the implementation's share), not the share 1.0
    assert run.predict(tp_overlap=numpy.bool_(True)).step_s == run.predict(tp_overlap=True).step_s
    assert run.predict(tp_overlap=numpy.float64(0.2)).step_s == run.predict(tp_overlap=True).step_s


def test_held_out_rows_against_the_trivial_model_on_each_generation():
    """On the 19 H100 rows that fitted nothing the planner's median miss is under a third of the trivial model's
    and it is closer on 17; on the 8 Blackwell rows under a fifth of it (3.9 % against 29 %), closer on 6
    (docs/planner.md). The trivial model's one constant per generation is fitted on every row any of the
    planner's constants was."""
    held = {g: [e for e in _errors() if e["role"] == "held out" and e["run"].generation == g] for g in ("h100", "blackwell")}
    miss = {g: (statistics.median(abs(e["planner"]) for e in rows), statistics.median(abs(e["trivial"]) for e in rows),
                sum(abs(e["planner"]) < abs(e["trivial"]) for e in rows)) for g, rows in held.items()}
    assert len(held["h100"]) == 19 and miss["h100"][0] < miss["h100"][1] / 3 and miss["h100"][2] == 17, miss
    assert len(held["blackwell"]) == 8 and miss["blackwell"][0] < miss["blackwell"][1] / 5, miss
    assert miss["blackwell"][2] == 6, miss


def test_eager_kernels_price_the_gap_torch_compile_closes():
    """torchtitan's Llama 3.1 8B on 8 H100 ran eager and under torch.compile, nothing else changed: 5,762 and
    6,667 tokens/s per GPU, 0.386 s a step apart. The eager row's elementwise ops are counted (each its own
    kernel), the compiled row's priced fused; nothing was fitted on either. The gap comes out within 10 % of the
    published one; priced fused, the eager row would match the compiled one."""
    from dataclasses import replace

    eager, compiled = field.runs_named(["Llama 3.1 8B, 8 H100, FSDP, eager", "Llama 3.1 8B, 8 H100, FSDP, compiled"])
    published = eager.step_s - compiled.step_s
    assert published == pytest.approx(0.386, abs=1e-3)
    gap = eager.predict().step_s - compiled.predict().step_s
    assert gap == pytest.approx(published, rel=0.1), gap
    fused = planner.predict(replace(eager.workload(), elementwise="fused"), eager.layout, eager.cluster(),
                            **eager.options())
    assert fused.step_s == pytest.approx(compiled.predict().step_s, rel=1e-9)


def test_held_out_rows_against_the_trivial_model_by_precision():
    """Split by the precision of the products as well: the planner is closer at the median on three of the four
    (generation, precision) sets; on the Blackwells' four bf16 rows (all MoE, two of them GPT-OSS) the two tie
    (14.8 % against 14.9 %, closer on 2 of 4; docs/planner.md)."""
    sets = {}
    for e in _errors():
        if e["role"] == "held out":
            sets.setdefault((e["run"].generation, e["run"].precision), []).append(e)
    miss = {k: (len(rows), round(statistics.median(abs(e["planner"]) for e in rows), 3),
                round(statistics.median(abs(e["trivial"]) for e in rows), 3),
                sum(abs(e["planner"]) < abs(e["trivial"]) for e in rows)) for k, rows in sets.items()}
    assert miss == {("h100", "bf16"): (4, 0.115, 0.265, 3), ("h100", "fp8"): (15, 0.076, 0.419, 14),
                    ("blackwell", "bf16"): (4, 0.148, 0.149, 2), ("blackwell", "fp8"): (4, 0.034, 0.508, 4)}, miss
    assert all(e["moe"] for e in sets[("blackwell", "bf16")])


def test_held_out_dense_rows_within_the_band():
    """Dense rows that fitted nothing: 17 of 18 inside ±20 % (H100 16 of 17, Blackwell 1 of 1)."""
    dense = [e for e in _errors() if e["role"] == "held out" and not e["moe"]]
    inside = {g: sum(abs(e["planner"]) <= 0.2 for e in dense if e["run"].generation == g) for g in ("h100", "blackwell")}
    assert len(dense) == 18 and inside == {"h100": 16, "blackwell": 1}, inside


def test_held_out_mixtures_of_experts_within_the_band():
    """MoE rows that fitted nothing: 7 of 9 inside ±20 % (GPT-OSS on 64 B200 and 64 GB200 are 27 % and 25 % fast).
    Without the experts' fixed cost every MoE row ran slower than predicted, 10 of 12 by more than 20 %
    (``docs/planner.md``)."""
    moe = [e for e in _errors() if e["moe"]]
    held = {e["run"].name: e["planner"] for e in moe if e["role"] == "held out"}
    assert len(held) == 9 and sorted(n for n, x in held.items() if abs(x) > 0.2) == ["GPT-OSS 120B, 64 B200, BF16", "GPT-OSS 120B, 64 GB200, BF16"]
    without = [e["run"].predict(without=("expert_fixed",)).step_s / e["run"].step_s - 1 for e in moe]
    assert len(without) == 12 and all(x < 0 for x in without) and sum(x < -0.2 for x in without) == 10, without


def test_runs_that_ran_are_predicted_to_fit():
    misses = {e["run"].name for e in _errors() if not e["fits"]}
    assert misses == set(field.DOES_NOT_FIT), misses ^ set(field.DOES_NOT_FIT)
    assert len(misses) == 1 and len(_errors()) == 40
