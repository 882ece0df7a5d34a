"""Tiny models and deterministic batches shared by the chapters and their tests.

Everything here is ordinary single-device code: the strategies in ``parlab.lab.parallel`` wrap it. Models are
small enough to train in seconds on a laptop CPU, and built with a seed so that every rank (and a
single-process reference) can build the very same model. Used from chapter 03 on.
"""

from __future__ import annotations

import torch
from torch import nn

from parlab.lab.checks import positive_int


class TinyMLP(nn.Module):
    """A small MLP whose parameters have several shapes: weights, biases, a LayerNorm's scale and shift.

    (batch, d_in) -> (batch, d_out). Several shapes matter to the DDP chapter: buckets must pack and
    unpack tensors of different sizes, and a bug that swaps two of them should not go unnoticed.
    """

    def __init__(self, d_in: int = 16, hidden: int = 32, d_out: int = 8):
        super().__init__()
        for name, value in (("d_in", d_in), ("hidden", hidden), ("d_out", d_out)):
            positive_int(name, value, "a layer width")
        self.d_in, self.d_out = d_in, d_out
        self.inp = nn.Linear(d_in, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.mid = nn.Linear(hidden, hidden * 2)
        self.out = nn.Linear(hidden * 2, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.inp(x)))  # (batch, hidden)
        h = torch.tanh(self.mid(h))  # (batch, 2 * hidden)
        return self.out(h)  # (batch, d_out)


def tiny_mlp(seed: int = 0, **sizes) -> TinyMLP:
    """A :class:`TinyMLP` whose initial parameters depend only on ``seed``."""
    with torch.random.fork_rng(devices=[]):  # CPU generator only: no CUDA context
        torch.manual_seed(seed)
        return TinyMLP(**sizes)


class ResidualBlock(nn.Module):
    """x + down(relu(up(x))): (batch, hidden) -> (batch, 4 hidden) -> (batch, hidden).

    The unit the model-parallel strategies cut: tensor parallelism splits ``up`` by columns and ``down`` by
    rows (one all-reduce per block), pipeline parallelism gives each stage a run of blocks.
    """

    def __init__(self, hidden: int = 16):
        super().__init__()
        positive_int("hidden", hidden, "a layer width")
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def tiny_blocks(num_blocks: int = 4, hidden: int = 16, seed: int = 0) -> nn.Sequential:
    """A stack of :class:`ResidualBlock` whose initial parameters depend only on ``seed``."""
    positive_int("num_blocks", num_blocks, "blocks in the stack")
    with torch.random.fork_rng(devices=[]):  # CPU generator only: no CUDA context
        torch.manual_seed(seed)
        return nn.Sequential(*[ResidualBlock(hidden) for _ in range(num_blocks)])


def regression_batch(batch_size: int, d_in: int = 16, d_out: int = 8, seed: int = 0):
    """Inputs (batch_size, d_in) and targets (batch_size, d_out) for a fixed random linear map plus noise.

    The same ``seed`` gives the same batch in every process, so each rank can build the global batch and
    take its own shard of it.
    """
    positive_int("batch_size", batch_size, "examples in the batch")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch_size, d_in, generator=g)
    w = torch.randn(d_in, d_out, generator=torch.Generator().manual_seed(12345))  # the same map for all seeds
    y = x @ w + 0.1 * torch.randn(batch_size, d_out, generator=g)
    return x, y


def tiny_gpt2(n_layer: int = 2, n_embd: int = 32, n_head: int = 2, vocab_size: int = 128,
              n_positions: int = 32, seed: int = 0, tie_word_embeddings: bool = True):
    """A transformers ``GPT2LMHeadModel`` built from a config (no download), with dropout off.

    Dropout off makes the forward pass deterministic, so several ranks and a single-process reference can
    be compared number for number. The token embedding and the LM head share one weight (tied), unless
    ``tie_word_embeddings=False`` (a pipeline puts them on different stages, chapter 06).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    for name, value in (("n_layer", n_layer), ("n_embd", n_embd), ("n_head", n_head),
                        ("vocab_size", vocab_size), ("n_positions", n_positions)):
        positive_int(name, value, "a GPT-2 config size")
    if n_embd % n_head:
        raise ValueError(f"n_embd must be divisible by n_head (each head gets n_embd / n_head dims); "
                         f"got n_embd={n_embd}, n_head={n_head}")
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size,
                     n_positions=n_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     # GPT-2's defaults (50256) lie outside a tiny vocabulary; transformers warns about it.
                     bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1,
                     tie_word_embeddings=tie_word_embeddings)
    with torch.random.fork_rng(devices=[]):  # CPU generator only: no CUDA context
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"  # the default, named, so transformers does not warn on every rank
    return model


def token_batch(batch_size: int, seq_len: int = 16, vocab_size: int = 128, seed: int = 0) -> torch.Tensor:
    """Synthetic "text": token ids (batch_size, seq_len) that a language model can learn.

    Each row starts at a random token and follows a fixed rule, next = (5 * token + 3) mod vocab_size,
    with an occasional random token mixed in, so the loss of a causal LM falls as it trains. Same seed,
    same batch, in every process.
    """
    positive_int("batch_size", batch_size, "sequences in the batch")
    positive_int("seq_len", seq_len, "tokens per sequence")
    positive_int("vocab_size", vocab_size, "distinct token ids")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.empty(batch_size, seq_len, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab_size, (batch_size,), generator=g)
    for t in range(1, seq_len):
        tokens[:, t] = (5 * tokens[:, t - 1] + 3) % vocab_size
    noise = torch.rand(batch_size, seq_len, generator=g) < 0.1
    tokens[noise] = torch.randint(vocab_size, (int(noise.sum()),), generator=g)
    return tokens


def shard(batch, rank: int, world_size: int):
    """This rank's contiguous slice of a global batch (a tensor, or a tuple of tensors split alike).

    Needs a batch size divisible by ``world_size``: with equal shards, the mean of the ranks' mean losses
    is the global batch's mean loss, which is what makes data parallelism exact.
    """
    positive_int("world_size", world_size, "the number of ranks")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in 0..{world_size - 1}; got {rank!r}")
    if isinstance(batch, (tuple, list)):
        return type(batch)(shard(t, rank, world_size) for t in batch)
    n = batch.shape[0]
    if n % world_size:
        raise ValueError(f"batch size {n} does not split evenly over world_size={world_size}; use a multiple "
                         f"of {world_size} so every rank gets the same number of examples")
    per = n // world_size
    return batch[rank * per:(rank + 1) * per]  # (batch / world_size, ...)


def tiny_llama(n_layer: int = 2, hidden: int = 32, heads: int = 4, kv_heads: int = 2, intermediate: int = 64,
               vocab_size: int = 128, n_positions: int = 32, seed: int = 0):
    """A transformers ``LlamaForCausalLM`` built from a config (no download): RMSNorm, rotary positions,
    grouped-query attention (``kv_heads`` K/V heads shared by ``heads`` query heads), a gated SwiGLU MLP,
    and an output layer of its own (not tied to the embedding). Used from chapter 05 on.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    for name, value in (("n_layer", n_layer), ("hidden", hidden), ("heads", heads), ("kv_heads", kv_heads),
                        ("intermediate", intermediate), ("vocab_size", vocab_size), ("n_positions", n_positions)):
        positive_int(name, value, "a Llama config size")
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden must be divisible by heads and heads by kv_heads; got hidden={hidden}, "
                         f"heads={heads}, kv_heads={kv_heads}")
    cfg = LlamaConfig(num_hidden_layers=n_layer, hidden_size=hidden, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, intermediate_size=intermediate, vocab_size=vocab_size,
                      max_position_embeddings=n_positions, tie_word_embeddings=False,
                      bos_token_id=vocab_size - 1, eos_token_id=vocab_size - 1)
    with torch.random.fork_rng(devices=[]):  # CPU generator only: no CUDA context
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    model.loss_type = "ForCausalLM"
    return model
