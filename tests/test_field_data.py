"""The published runs of today's layouts (``parlab.decide.planner.field_data``): every row complete, its layout
multiplying out to its GPUs and its batch, its model buildable, its source named; and the Megatron-Bridge rows'
tokens per second and TFLOP/s agreeing through Megatron-Bridge's own FLOPs count (a check on the transcription
and on the model shapes)."""

from __future__ import annotations

import pytest
import transformers

from parlab.decide.planner.field_data import FIELD_RUNS
from parlab.decide.planner.field_hardware import HARDWARE_FACTS
from parlab.decide.planner.field_models import KEYS
from parlab.decide.planner.workload import RECOMPUTES

GPUS = {"a100", "h100", "h800", "b200", "gb200"}
RECIPES = {None, "delayed", "tensorwise", "rowwise", "blockwise", "mxfp8"}
IDS = [row["name"] for row in FIELD_RUNS]


def test_names_are_unique():
    assert len(set(IDS)) == len(IDS)


@pytest.mark.parametrize("row", FIELD_RUNS, ids=IDS)
def test_row_is_complete_and_multiplies_out(row):
    assert tuple(row) == KEYS, f"{row['name']}: keys {sorted(set(row) ^ set(KEYS))} differ"
    assert row["source"].strip() and row["flops_counting"].strip(), row["name"]
    assert row["gpu"] in GPUS and row["precision"] in {"bf16", "fp8"} and row["fp8_recipe"] in RECIPES
    assert (row["fp8_recipe"] is None) == (row["precision"] == "bf16"), row["name"]
    assert row["gpus"] == row["tp"] * row["pp"] * row["cp"] * row["dp"], row["name"]
    assert row["dp"] % row["ep"] == 0 or row["ep"] % row["dp"] == 0 or row["ep"] == 1, row["name"]
    assert row["tokens_per_s_per_gpu"] or row["tflops_per_gpu"], f"{row['name']}: no outcome"
    assert {type(row[k]) for k in ("fused", "tp_overlap", "ep_overlap")} == {bool}, row["name"]
    assert row["recompute"] in RECOMPUTES or (row["recompute"] is None and not row["tokens_per_s_per_gpu"]), row["name"]
    assert row["recompute_layers"] is None or (row["recompute"] == "full" and type(row["recompute_layers"]) is int)
    assert type(row["offload_layers"]) is int and 0 <= row["offload_layers"] < row["model"]["num_hidden_layers"]
    assert not row["ep_overlap"] or row["ep"] > 1, f"{row['name']}: ep_overlap without EP"
    assert not row["tp_overlap"] or row["tp"] > 1, f"{row['name']}: tp_overlap without TP"
    per_dp, rest = divmod(row["global_batch"], row["dp"])
    assert rest == 0, f"{row['name']}: global batch {row['global_batch']} over dp {row['dp']}"
    if row["micro_batch"] is not None:  # None: the source does not give it
        assert per_dp % row["micro_batch"] == 0, f"{row['name']}: {per_dp} per DP rank, micro-batch {row['micro_batch']}"


@pytest.mark.parametrize("row", FIELD_RUNS, ids=IDS)
def test_model_builds(row):
    kwargs = dict(row["model"])
    config = getattr(transformers, kwargs.pop("class"))(**kwargs)
    for key, value in kwargs.items():
        assert getattr(config, key) == value, f"{row['name']}: {key}"


def megatron_bridge_flops_per_token(row) -> float:
    """Megatron-Bridge's flop_utils.py count for a GQA model (Llama 3, Qwen3 MoE, GPT-OSS), per token: SwiGLU's
    3/2 only for F.silu, so GPT-OSS's clamped GLU counts 1, and its sliding-window layers count full attention."""
    m = row["model"]
    h, layers, s = m["hidden_size"], m["num_hidden_layers"], row["seq_len"]
    heads, groups = m["num_attention_heads"], m["num_key_value_heads"]
    kv_channels = m.get("head_dim", h // heads)
    if "num_experts" in m:
        ffn = m["moe_intermediate_size"] * m["num_experts_per_tok"]
    elif "num_local_experts" in m:
        ffn = m["intermediate_size"] * m["num_experts_per_tok"]
    else:
        ffn = m["intermediate_size"]
    multiple = 128 * row["tp"]
    vocab = -(-m["vocab_size"] // multiple) * multiple
    attention = 12 * layers * h * h * (1 + groups / heads + s / h / 2) * (heads * kv_channels / h)
    glu = 1 if m["class"] == "GptOssConfig" else 1.5
    return 12 * layers * h * ffn * glu + attention + 6 * h * vocab


@pytest.mark.parametrize("row", [r for r in FIELD_RUNS if r["framework"] == "megatron"
                                 and r["model"]["class"] in ("LlamaConfig", "Qwen3MoeConfig", "GptOssConfig")],
                         ids=lambda r: r["name"])
def test_megatron_bridge_tflops_are_their_tokens_through_their_count(row):
    tflops = row["tokens_per_s_per_gpu"] * megatron_bridge_flops_per_token(row) / 1e12
    assert tflops == pytest.approx(row["tflops_per_gpu"], rel=0.01), row["name"]


def test_hardware_facts_are_sourced():
    assert HARDWARE_FACTS
    for fact in HARDWARE_FACTS:
        assert set(fact) == {"what", "value", "unit", "source"}, fact
        assert fact["source"].strip() and fact["value"] is not None, fact


def test_how_runs_ran_is_read_from_the_source_as_a_key():
    """The keys that say how a run's kernels and collectives ran, against the words of the rows that state them:
    a row that names async TP overlaps TP, an eager row is not fused, a preset with moe_a2a_overlap overlaps the
    all-to-alls, cpu_offloading_num_layers=40 offloads 40 layers."""
    for row in FIELD_RUNS:
        words = (row["name"] + " " + row["source"] + " " + row["notes"]).lower()
        if row["framework"] == "torchtitan":
            assert row["tp_overlap"] == ("async tp" in words or "asynctp" in row["source"].lower()), row["name"]
            assert row["fused"] == ("eager" not in row["name"]), row["name"]
        if row["framework"] == "megatron":
            assert row["ep_overlap"] == ("moe_a2a_overlap" in words), row["name"]
            assert row["offload_layers"] == (40 if "cpu_offloading_num_layers=40" in words else 0), row["name"]
