"""The memory estimator against the ZeRO paper, and against what ranks really hold (chapter 01)."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig

import parlab
from parlab.measure import (
    ZERO_PAPER_TABLE1,
    activation_bytes_per_layer,
    count_params,
    estimate_memory,
    measure_activations,
    measure_memory,
)


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


@pytest.mark.parametrize("kwargs, word", [
    (dict(num_params=10, optimizer="lamb"), "optimizer='lamb'"),
    (dict(num_params=10, zero_stage=4), "zero_stage=4"),
    (dict(num_params=10, precision="int8"), "precision='int8'"),
    (dict(num_params=10, world_size=6, tp_size=4), "world_size=6"),
    (dict(num_params=-3), "num_params=-3"),
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
    from parlab.measure import ActivationTracker, measure_activations
    from parlab.models import tiny_blocks

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
