"""The job of :mod:`parlab.job.train_fsdp` in one process, on the whole global batch: what every run of it,
on any number of ranks and through any library, must reproduce (chapter 08)."""

from __future__ import annotations

import torch

from parlab.job.train_fsdp import CONFIG, build_model, dataset


def one_process(cfg: dict | None = None, steps: int | None = None) -> dict:
    """Losses, gradient norms (before clipping) and final weights of ``steps`` steps in one process."""
    cfg = dict(CONFIG, **(cfg or {}))
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    data, batch = dataset(cfg), cfg["global_batch"]
    losses, norms = [], []
    for step in range(steps or cfg["steps"]):
        x = data[step * batch:(step + 1) * batch]  # (global_batch, seq_len)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        if cfg["max_grad_norm"]:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"]).item())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
