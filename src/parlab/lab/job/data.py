"""A tokenizer and a dataset that exist offline (chapter 08): a byte-level BPE trained with Hugging Face
``tokenizers`` on the course's own notebooks, and rows of token ids cut from their paragraphs.

Byte-level BPE (GPT-2's tokenizer) starts from the 256 byte values, so any text has a tokenization, and adds
the most frequent adjacent pair as a new token until ``vocab_size`` is reached. Each paragraph of markdown
becomes one row of at most ``seq_len`` tokens; shorter rows are padded, and their padding gets the label
``-100``, which the loss ignores: the rows hold unequal numbers of tokens that count, as real text does.
"""

from __future__ import annotations

import glob
import json
import os

import torch

IGNORE = -100  # the label the loss skips (torch's cross_entropy default ignore_index)


def course_paragraphs(folder: str | None = None) -> list[str]:
    """The paragraphs of every markdown cell of the course's notebooks, in file order."""
    folder = folder or os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "notebooks")
    paths = sorted(glob.glob(os.path.join(folder, "*.ipynb")))
    if not paths:
        raise FileNotFoundError(f"no notebooks (*.ipynb) in {os.path.abspath(folder)!r}")
    paragraphs = []
    for path in paths:
        with open(path) as f:
            cells = json.load(f)["cells"]
        for cell in cells:
            if cell["cell_type"] == "markdown":
                paragraphs += [p.strip() for p in "".join(cell["source"]).split("\n\n") if p.strip()]
    return paragraphs


def train_tokenizer(texts: list[str], vocab_size: int = 384):
    """A byte-level BPE of ``vocab_size`` tokens (the 256 bytes, merges, and ``<pad>`` as id 0)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size <= 257:
        raise ValueError(f"vocab_size must exceed the 256 byte values and <pad>; got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def token_rows(tokenizer, texts: list[str], rows: int, seq_len: int) -> dict:
    """The first ``rows`` texts of at least 2 tokens, as ``input_ids`` (rows, seq_len) padded with ``<pad>``
    and ``labels``: the ids, ``-100`` where padded."""
    pad = tokenizer.token_to_id("<pad>")
    ids = [e.ids[:seq_len] for e in tokenizer.encode_batch(texts) if len(e.ids) >= 2][:rows]
    if len(ids) < rows:
        raise ValueError(f"rows={rows}: only {len(ids)} texts of 2 tokens or more")
    input_ids = torch.full((rows, seq_len), pad, dtype=torch.long)
    labels = torch.full((rows, seq_len), IGNORE, dtype=torch.long)
    for r, row in enumerate(ids):
        input_ids[r, :len(row)] = labels[r, :len(row)] = torch.tensor(row)
    return {"input_ids": input_ids, "labels": labels}  # (rows, seq_len) each
