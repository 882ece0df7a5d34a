"""The tiny models and batches shared by the chapters (``parlab.lab.models``)."""

from __future__ import annotations

import pytest
import torch

from parlab.lab.models import TinyMLP, regression_batch, shard, tiny_gpt2, tiny_mlp, token_batch


def test_same_seed_same_model_other_seed_other_model():
    a, b, c = tiny_mlp(seed=3), tiny_mlp(seed=3), tiny_mlp(seed=4)
    for (name, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), name
    assert not all(torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))
    assert len({tuple(p.shape) for p in a.parameters()}) >= 4  # several shapes, biases and a LayerNorm


def test_building_a_model_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    tiny_mlp(seed=9)
    tiny_gpt2(seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_gpt2_is_deterministic_and_learns():
    model = tiny_gpt2(seed=0)
    x = token_batch(8, seq_len=16, seed=1)
    assert torch.equal(model(input_ids=x).logits, model.train()(input_ids=x).logits)  # no dropout
    assert model.transformer.wte.weight is model.lm_head.weight  # tied, as in GPT-2
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        loss = model(input_ids=x, labels=x).loss
        first = first if first is not None else loss.item()
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert loss.item() < 0.8 * first  # the synthetic text has structure a model can pick up


def test_batches_are_reproducible_and_shaped():
    x, y = regression_batch(6, d_in=5, d_out=2, seed=1)
    assert x.shape == (6, 5) and y.shape == (6, 2)
    assert torch.equal(regression_batch(6, d_in=5, d_out=2, seed=1)[1], y)
    t = token_batch(3, seq_len=7, vocab_size=11, seed=2)
    assert t.shape == (3, 7) and t.dtype == torch.long and 0 <= t.min() and t.max() < 11


@pytest.mark.parametrize("call, match", [
    (lambda: TinyMLP(d_in=0), "d_in"),
    (lambda: tiny_gpt2(n_embd=30, n_head=4), "divisible by n_head"),
    (lambda: token_batch(0), "batch_size"),
    (lambda: shard(torch.zeros(4), 0, 0), "world_size"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()
