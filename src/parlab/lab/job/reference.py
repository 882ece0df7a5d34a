"""The job of :mod:`parlab.lab.job.train_fsdp` in one process, on the whole global batch: what every run of it,
on any number of ranks and through any library, must reproduce (chapter 08)."""

from __future__ import annotations

import torch

from parlab.lab.job.train_fsdp import CONFIG, build_model, dataset


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


def script_job(job: dict, folder: str = ".") -> dict:
    """Chapter 08's ``train.py`` in one process: the model from ``job["pretrained"]``, the rows of
    ``job["data"]``, each step's global batch drawn by a generator of its own seeded ``job["seed"]`` (as every
    rank of the script draws it), the whole batch at once, its loss the mean over the tokens with a label, clipping,
    SGD with momentum and a linear warm-up of the learning rate. Losses and final weights. Paths relative
    to ``folder`` (the job file's, as the script reads them)."""
    import os

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(os.path.join(folder, job["pretrained"]))
    model.loss_type = "ForCausalLM"  # (the folder does not keep it)
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=job["warmup"])
    data = torch.load(os.path.join(folder, job["data"]))
    sampler = torch.Generator().manual_seed(job["seed"])  # the script's own generator for the rows
    losses = []
    for _ in range(job["steps"]):
        rows = torch.randperm(len(data["input_ids"]), generator=sampler)[:job["global_batch"]]
        loss = model(input_ids=data["input_ids"][rows], labels=data["labels"][rows]).loss  # mean over labelled tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job["max_grad_norm"])
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}
