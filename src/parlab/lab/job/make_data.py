"""python make_data.py data.json: a tokenizer trained offline on a text file, and rows of its token ids.

The job file names every setting; its paths are relative to the job file itself, as train.py's job.json:

    {"text": "corpus.txt", "out": "rows.pt", "tokenizer": "tokenizer", "vocab_size": 384, "seq_len": 32, "rows": 240}

- ``text``: UTF-8 text, paragraphs separated by a blank line. Each paragraph becomes one row.
- ``tokenizer``: a folder written here: ``tokenizer.json`` (a byte-level BPE of ``vocab_size`` tokens, ``<pad>``
  is id 0) and ``tokenizer_config.json``, so that transformers' ``AutoTokenizer.from_pretrained`` loads it.
- ``out``: the rows, the data format of chapters 08 and 09 (``torch.load`` gives it back), a dict of two int64
  tensors of shape (rows, seq_len):

  - ``input_ids``: the first ``rows`` paragraphs of at least 2 tokens, each cut to ``seq_len`` tokens and padded
    on the right with ``<pad>``;
  - ``labels``: the same ids, with -100 where padded (the label the loss skips; no attention mask is needed,
    since padding is on the right of a causal model's rows).

Byte-level BPE (GPT-2's kind) starts from the 256 byte values, so any text has a tokenization, and merges the
most frequent adjacent pair into a new token until ``vocab_size`` is reached. Training is deterministic: the
same text and settings give the same tokenizer and rows. Imports only the standard library, torch and
tokenizers: copy this file alone.
"""

import json
import os
import sys

import torch

KEYS = {"text", "out", "tokenizer", "vocab_size", "seq_len", "rows"}
IGNORE = -100  # the label the loss skips (torch's cross_entropy default ignore_index)


def paragraphs(text: str) -> list[str]:
    """The text's paragraphs: separated by a blank line, stripped, empty ones dropped."""
    return [p.strip() for p in text.split("\n\n") if p.strip()]


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


def main(job_file: str) -> dict:
    """Read the job file, train the tokenizer on its text, save the tokenizer and the rows; return the rows."""
    job = json.load(open(job_file))
    if KEYS - set(job):  # fail now, by name
        sys.exit(f"{job_file} lacks {sorted(KEYS - set(job))}")
    here = os.path.dirname(os.path.abspath(job_file))
    path = {key: os.path.join(here, job[key]) for key in ("text", "out", "tokenizer")}  # relative: to the job file
    texts = paragraphs(open(path["text"], encoding="utf-8").read())
    tokenizer = train_tokenizer(texts, job["vocab_size"])
    os.makedirs(path["tokenizer"], exist_ok=True)
    tokenizer.save(os.path.join(path["tokenizer"], "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>"}  # for AutoTokenizer
    json.dump(config, open(os.path.join(path["tokenizer"], "tokenizer_config.json"), "w"))
    rows = token_rows(tokenizer, texts, job["rows"], job["seq_len"])
    torch.save(rows, path["out"])
    print(f"{path['out']}: {job['rows']} rows of {job['seq_len']} tokens, vocabulary {tokenizer.get_vocab_size()}")
    return rows


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python make_data.py data.json")
    main(sys.argv[1])
