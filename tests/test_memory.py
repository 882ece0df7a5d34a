"""The memory estimator against the ZeRO paper, and against what ranks really hold (chapter 01)."""

import pytest
import torch
from transformers import AutoModelForCausalLM, BloomConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig, Qwen2Config

import parlab
from parlab.lab.measure import (
    ZERO_PAPER_TABLE1,
    activation_bytes_per_layer,
    count_params,
    estimate_memory,
    measure_activations,
    measure_memory,
    peak_memory,
)
from parlab.lab.measure.activations import Architecture, activation_saves, layer_terms


def tiny_config(dropout=0.0):
    # The course's tiny GPT-2: native GeLU and eager attention, so what autograd saves is what
    # Korthikanti et al. count (the default tanh-GeLU saves several intermediates more).
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128, vocab_size=256,
                     activation_function="gelu", resid_pdrop=dropout, embd_pdrop=dropout,
                     attn_pdrop=dropout, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "eager"
    return cfg


# ---- the ZeRO paper (Rajbhandari et al. 2020), mixed precision Adam: K = 12 -------------------------

@pytest.mark.parametrize("stage, expected_gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_figure1(stage, expected_gb):
    est = estimate_memory(num_params=7_500_000_000, precision="bf16", optimizer="adam", world_size=64,
                          zero_stage=stage)
    assert est.total / 1e9 == pytest.approx(expected_gb, abs=0.05)


@pytest.mark.parametrize("key", sorted(ZERO_PAPER_TABLE1))
def test_zero_table1(key):
    psi, nd = key
    got = [estimate_memory(num_params=int(psi), precision="fp16", world_size=nd, zero_stage=s).total / 1e9
           for s in range(4)]
    for g, paper in zip(got, ZERO_PAPER_TABLE1[key]):
        # the paper prints 3 significant figures (and truncates some, e.g. 4187.5 -> 4187)
        assert g == pytest.approx(paper, rel=6e-3, abs=0.01)


def test_bytes_per_parameter():
    psi = 1000
    assert estimate_memory(num_params=psi, optimizer="adam").total == 16 * psi
    assert estimate_memory(num_params=psi, optimizer="sgd").total == 8 * psi
    assert estimate_memory(num_params=psi, optimizer="momentum").total == 12 * psi
    assert estimate_memory(num_params=psi, precision="bf16", optimizer="adamw").total == 16 * psi
    assert estimate_memory(num_params=psi, precision="bf16", optimizer="sgd").total == 8 * psi


def test_model_parallel_splits_weights_and_dp_shards():
    est = estimate_memory(num_params=8000, world_size=8, tp_size=2, pp_size=2, zero_stage=3)
    # 8000 / (2·2) = 2000 weights per model-parallel rank, sharded over dp_size = 2
    assert (est.params, est.grads, est.optimizer) == (4000, 4000, 8000)


# ---- activations (Korthikanti et al. 2022) ---------------------------------------------------------

def test_korthikanti_equations():
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert activation_bytes_per_layer(s, b, h, a) == sbh * (34 + 5 * a * s / h)
    assert activation_bytes_per_layer(s, b, h, a, tp_size=t) == sbh * (10 + 24 / t + 5 * a * s / (h * t))
    assert activation_bytes_per_layer(s, b, h, a, tp_size=t, sequence_parallel=True) == \
        pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert activation_bytes_per_layer(s, b, h, a, checkpointing=True) == 2 * sbh


def test_activations_measured_match_estimate():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(tiny_config()).train()
    x = torch.randint(0, 256, (2, 128))  # (micro_batch, seq)
    measured = measure_activations(model, x, labels=x)
    est = estimate_memory(model, micro_batch=2, seq_len=128, dropout=False).activations
    assert measured == pytest.approx(est, rel=0.05)
    layer = measure_activations(model.transformer.h[0], torch.randn(2, 128, 64, requires_grad=True))
    # the formula leaves out LayerNorm's per-token mean and 1/std (2·s·b values): 0.3% here
    assert layer == pytest.approx(activation_bytes_per_layer(128, 2, 64, 4, bytes_per_value=4,
                                                             dropout=False), rel=0.01)


# ---- model states: estimated vs measured -----------------------------------------------------------

@pytest.mark.parametrize("name, make", [
    ("adam", lambda p: torch.optim.Adam(p, lr=1e-3)),
    ("sgd", lambda p: torch.optim.SGD(p, lr=1e-3)),
    ("momentum", lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9)),
])
def test_measured_model_states_match_estimate(name, make):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(tiny_config())
    opt = make(model.parameters())
    x = torch.randint(0, 256, (2, 16))
    model(x, labels=x).loss.backward()
    opt.step()
    got = measure_memory(model, opt)
    est = estimate_memory(model, optimizer=name)
    assert got.params == est.params  # every weight counted once, tied embedding included once
    assert got.grads == est.grads
    assert got.optimizer == pytest.approx(est.optimizer, rel=0.05, abs=1)


def _zero1_rank():
    # ZeroRedundancyOptimizer (ZeRO-1): each rank keeps Adam state for its share of the parameters
    from torch.distributed.optim import ZeroRedundancyOptimizer
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    got = measure_memory(model, opt)
    est = estimate_memory(model, optimizer="adam", world_size=parlab.world_size(), zero_stage=1)
    return got.as_dict(), est.as_dict()


def test_zero1_measured_per_rank():
    for got, est in parlab.launch(_zero1_rank, world_size=2, timeout=60, output="none", announce=False):
        assert got["params"] == est["params"] and got["grads"] == est["grads"]
        assert got["optimizer"] == pytest.approx(est["optimizer"], rel=0.05)


def test_real_size_configs_on_meta_device():
    gpt2_xl = GPT2Config(n_embd=1600, n_layer=48, n_head=25)
    assert count_params(gpt2_xl) == pytest.approx(1.558e9, rel=0.01)  # "1.5B", Radford et al. 2019
    llama7b = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                          num_attention_heads=32, vocab_size=32000)
    assert count_params(llama7b) == pytest.approx(6.74e9, rel=0.01)  # Touvron et al. 2023
    assert estimate_memory(llama7b).total == 16 * count_params(llama7b)


def test_a_config_changed_after_a_count_is_counted_again():
    """The count is cached by the config's JSON, itself made once per config: a change to the config, a nested
    one too, must give a new JSON, not the first one's count."""
    from parlab.lab.measure.activations import config_json

    config = GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=100, n_positions=32)
    first = count_params(config)
    assert config_json(config) == config.to_json_string()
    config.n_layer = 4
    assert config_json(config) == config.to_json_string()
    assert count_params(config) == count_params(GPT2Config(n_embd=64, n_layer=4, n_head=2, vocab_size=100,
                                                           n_positions=32)) > first
    config.task_specific_params = {"a": {"b": 1}}
    config_json(config)
    config.task_specific_params["a"]["b"] = 2  # nested, in place
    assert config_json(config) == config.to_json_string()


@pytest.mark.parametrize("kwargs, word", [
    (dict(num_params=10, optimizer="lamb"), "optimizer='lamb'"),
    (dict(num_params=10, zero_stage=4), "zero_stage=4"),
    (dict(num_params=10, precision="int8"), "precision='int8'"),
    (dict(num_params=10, world_size=6, tp_size=4), "world_size=6"),
    (dict(num_params=-3), "num_params=-3"),
    (dict(num_params=7.5e9 + 0.5), "num_params=7500000000.5"),
    (dict(num_params=True), "num_params=True"),
    (dict(num_params=10, fp32_grads=True), "fp32_grads=True"),
    (dict(num_params=10, world_size=2, zero_stage=2, gradient_buckets=True), "gradient_buckets=True"),
    (dict(num_params=10, attention="flash"), "attention='flash'"),
    (dict(num_params=10, micro_batch=2), "hidden"),
    (dict(), "num_params="),
])
def test_bad_input_names_the_argument(kwargs, word):
    with pytest.raises(ValueError, match=word.replace("(", r"\(")):
        estimate_memory(**kwargs)


def _zero3_rank():
    # FSDP2 (ZeRO-3): weights, gradients and Adam state are all DTensor shards on each rank
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
    est = estimate_memory(model, optimizer="adam", world_size=parlab.world_size(), zero_stage=3)
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return measure_memory(model, opt).as_dict(), est.as_dict()


@pytest.mark.parametrize("world_size", [2, 3])  # 3: shards are uneven, FSDP2 pads them
def test_zero3_fsdp2_measured_per_rank(world_size):
    results = parlab.launch(_zero3_rank, world_size=world_size, timeout=60, output="none", announce=False)
    for got, est in results:
        # weights and gradients live in padded storage: every rank holds ceil(numel / n) per parameter
        assert got["params"] == pytest.approx(est["params"], rel=0.05)
        assert got["grads"] == pytest.approx(est["grads"], rel=0.05)
    if world_size == 2:
        assert all(got["optimizer"] == pytest.approx(est["optimizer"], rel=0.05) for got, est in results)
    # Adam's state follows the unpadded shard, so with uneven shards the last rank holds less (6% here);
    # summed over ranks it is one full copy, plus each rank's step counters (16 tensors x 4 bytes)
    full = 2 * 4 * 8 * (64 * 64 + 64)
    assert sum(got["optimizer"] for got, _ in results) == full + world_size * 16 * 4


def test_activation_tracker_follows_what_autograd_keeps():
    """Counted while saved (as measure_activations counts them), released when backward frees them; weights
    never count."""
    from parlab.lab.measure import ActivationTracker, measure_activations
    from parlab.lab.models import tiny_blocks

    model = tiny_blocks(2, 16)
    xs = [torch.randn(4, 16) for _ in range(3)]
    tracker = ActivationTracker(model)
    losses = []
    for x in xs:
        with tracker:
            losses.append(model(x).sum())
    one = measure_activations(model, xs[0])
    assert one > 0 and tracker.live == tracker.peak == 3 * one
    losses.pop(0).backward()
    assert tracker.live == 2 * one and tracker.peak == 3 * one
    for loss in losses:
        loss.backward()
    del loss, losses
    assert tracker.live == 0 and tracker.samples[-1][1] == 0


def test_activation_tracker_lets_a_graph_go_without_a_backward():
    """A graph dropped without a backward through it (kept with retain_graph, or a pipeline's split backward
    whose weight half never visits the input half's nodes) is freed, and its bytes leave the count. ReLU
    saves its own output: a tracker holding that tensor would keep the whole graph alive in a cycle."""
    import gc

    from parlab.lab.measure import ActivationTracker
    from parlab.lab.models import tiny_blocks

    model = tiny_blocks(2, 16)
    x = torch.randn(4, 16, requires_grad=True)
    tracker = ActivationTracker(model)
    with tracker:
        out = model(x)
    torch.autograd.grad(out.sum(), x, retain_graph=True)  # the input gradient only: the graph stays
    assert tracker.live == tracker.peak > 0
    del out
    gc.collect()
    assert tracker.live == 0


# ---- accountings: 16 vs 18 bytes per parameter; integral floats ------------------------------------

def test_num_params_accepts_integral_floats():
    assert estimate_memory(num_params=7.5e9).total == estimate_memory(num_params=7_500_000_000).total


def test_fp32_gradients_make_18_bytes_and_buckets_a_second_gradient_copy():
    psi = 1000
    # Megatron-LM, docs/source/api-guide/dist_optimizer.md: "float16 param, fp32 grads: 18"
    assert estimate_memory(num_params=psi, precision="bf16", fp32_grads=True).total == 18 * psi
    est = estimate_memory(num_params=psi, world_size=4, gradient_buckets=True)
    assert (est.buckets, est.total) == (4 * psi, 20 * psi)
    assert estimate_memory(num_params=psi, precision="bf16", world_size=4, zero_stage=1,
                           gradient_buckets=True).buckets == 2 * psi


# ---- activations follow the architecture: estimate vs measured, four families, two lengths ---------

def _family_configs():
    small = dict(vocab_size=256)
    return {
        "gpt2 (dropout 0.1, gelu_new)": GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=256,
                                                  bos_token_id=0, eos_token_id=0, **small),
        "gpt2 (dropout 0)": GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=256, bos_token_id=0,
                                       eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, **small),
        "llama (GQA, SwiGLU, RMSNorm)": LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=172,
                                                   num_attention_heads=4, num_key_value_heads=2,
                                                   max_position_embeddings=256, **small),
        "bloom": BloomConfig(n_layer=2, hidden_size=64, n_head=4, **small),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(_family_configs()))
def test_activation_estimate_follows_the_architecture(family, dtype):
    cfg = _family_configs()[family]
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(dtype).train()
    precision = "fp32" if dtype == torch.float32 else "bf16"
    for seq_len in (32, 128):
        x = torch.randint(0, 256, (2, seq_len))
        measured = measure_activations(model, x, labels=x)
        est = estimate_memory(model, precision=precision, micro_batch=2, seq_len=seq_len)
        assert est.activations == pytest.approx(measured, rel=0.05), (family, seq_len)
        assert est.activations == pytest.approx(measured, rel=0.002)  # in fact: all but a few scalars


@pytest.mark.parametrize("config", [
    LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=172, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, vocab_size=256),
    Qwen2Config(num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
                num_key_value_heads=1, max_position_embeddings=256, vocab_size=256),
], ids=["llama", "qwen2"])
def test_fused_attention_keeps_no_scores(config):
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    x = torch.randint(0, 256, (2, 128))
    measured = measure_activations(model, x, labels=x)
    assert estimate_memory(model, micro_batch=2, seq_len=128).activations == pytest.approx(measured, rel=0.01)
    eager = estimate_memory(model, micro_batch=2, seq_len=128, attention="eager").activations
    assert eager > 1.2 * measured  # the s×s scores the fused kernel does not keep


def test_a_config_is_followed_not_assumed():
    # GPT-2's default config has dropout 0.1 and gelu_new; a plain GPT layer would count neither alike
    gpt2 = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256)
    arch = Architecture.from_config(gpt2, attention="eager")
    assert (arch.attn_dropout, arch.resid_dropout, arch.activation) == (0.1, 0.1, "gelu_new")
    llama = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=8)
    arch = Architecture.from_config(llama)
    assert (arch.gated_mlp, arch.intermediate, arch.norm, arch.kv_heads, arch.attn_dropout) == \
        (True, 11008, "rmsnorm", 8, 0.0)
    assert arch.attention == "sdpa"  # what transformers builds by default
    assert llama._attn_implementation is None  # reading it did not change the config
    assert Architecture.from_config(gpt2, dropout=False).resid_dropout == 0.0
    with pytest.raises(ValueError, match="dropout=True"):
        estimate_memory(GPT2Config(resid_pdrop=0.0, attn_pdrop=0.0), micro_batch=1, dropout=True)


def test_activation_functions_are_counted_as_they_save():
    assert activation_saves("gelu", 4) == (4.0, False)       # native: its input
    assert activation_saves("gelu_new", 4) == (16.0, False)  # x, tanh, 0.5·x, 1 + tanh
    assert activation_saves("silu", 2) == (2.0, False)
    assert activation_saves("relu", 4) == (4.0, True)        # relu keeps its output, not its input


def test_korthikanti_layer_is_the_papers_count():
    s, b, h, a = 2048, 1, 12288, 96
    terms = layer_terms(Architecture.gpt(h, 1, a), s, b, bytes_per_value=2, device="cuda")
    assert sum(t.bytes for t in terms) == activation_bytes_per_layer(s, b, h, a)
    for t in (2, 8):
        for sp in (False, True):
            per_rank = sum(term.per_rank(t, sp) for term in terms)
            assert per_rank == pytest.approx(activation_bytes_per_layer(s, b, h, a, tp_size=t, sequence_parallel=sp))
    # without a config the estimator counts this layer, as chapters 04-06 compare against the paper
    est = estimate_memory(num_params=10**9, precision="bf16", micro_batch=b, seq_len=s, hidden=h, layers=4, heads=a)
    assert est.activations == 4 * activation_bytes_per_layer(s, b, h, a)
    # a GPT-2 config's layer is that layer plus LayerNorm's fp32 mean and 1/std per token (two norms)
    gpt2 = Architecture.from_config(GPT2Config(n_embd=h, n_head=a, activation_function="gelu"), attention="eager")
    stats = 2 * (2 * s * b * 4)
    assert sum(t.bytes for t in layer_terms(gpt2, s, b, 2, "cuda")) == activation_bytes_per_layer(s, b, h, a) + stats


def test_checkpointing_peak_holds_one_recomputed_layer():
    cfg = GPT2Config(n_layer=4, n_embd=64, n_head=4, n_positions=128, vocab_size=64, bos_token_id=0,
                     eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, use_cache=False)
    cfg._attn_implementation = "eager"
    x = torch.randint(0, 64, (2, 128))
    peaks, estimates = [], []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg).train()
        if checkpointing:  # transformers >= 5 names it activation_checkpointing_enable
            enable = getattr(model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable({"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model(x, labels=x).loss.backward()  # gradients exist from now on: the next backward allocates none
        model.zero_grad(set_to_none=False)
        peaks.append(peak_memory(lambda: model(x, labels=x).loss.backward())[1])
        estimates.append(estimate_memory(model, micro_batch=2, seq_len=128, checkpointing=checkpointing).activations)
    # the backward's own temporaries are the same with and without checkpointing, so the peaks differ by
    # what the estimates differ by: (layers - 1) layers' activations less the layer inputs kept
    assert peaks[0] - peaks[1] == pytest.approx(estimates[0] - estimates[1], rel=0.05)
    one_layer_only_inputs = estimate_memory(num_params=1, micro_batch=2, seq_len=128, hidden=64, layers=4,
                                            heads=4, checkpointing=True, dropout=False, device="cpu")
    assert estimates[1] > one_layer_only_inputs.activations  # the recomputed layer and the ends are counted


def test_a_built_models_own_activation_is_counted_not_its_configs_name():
    from transformers.activations import ACT2FN
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=256, bos_token_id=0, eos_token_id=0,
                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)  # activation_function: gelu_new
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg)
    for block in model.transformer.h:  # swapped for PyTorch's GeLU, as chapter 05 does; the config still says gelu_new
        block.mlp.act = ACT2FN["gelu"]
    x = torch.randint(0, 256, (2, 64))
    assert estimate_memory(model, micro_batch=2, seq_len=64).activations == \
        pytest.approx(measure_activations(model, x, labels=x), rel=0.002)
    assert estimate_memory(cfg, micro_batch=2, seq_len=64, device="cpu").activations > \
        1.2 * estimate_memory(model, micro_batch=2, seq_len=64).activations  # the config alone: gelu_new
