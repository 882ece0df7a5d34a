"""A plain FSDP2 training script for a transformers model: torch and transformers only, no parlab (chapter 08).

Run it as any PyTorch job is run::

    torchrun --standalone --nproc-per-node 4 train_fsdp.py --steps 4 --out losses.json
    torchrun --standalone --nproc-per-node 2 train_fsdp.py --steps 2 --save ckpt    # then, at another size:
    torchrun --standalone --nproc-per-node 3 train_fsdp.py --steps 2 --load ckpt

torchrun starts one process per rank and tells each who it is through its environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``); :func:`main` joins the process group
and calls :func:`train`, which only needs an initialised group, so a notebook can run the same function
with ``parlab.launch(train, 4, args=(cfg,))``. The model is a tiny GPT-2 built from a config (nothing is
downloaded) with dropout off, so that runs can be compared number for number.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, DistributedSampler

CONFIG = dict(n_layer=2, n_embd=32, n_head=2, vocab_size=128, seq_len=32, global_batch=24, accumulation=2,
              lr=0.3, momentum=0.9, max_grad_norm=0.5, steps=4, param_dtype=None)


def build_model(cfg):
    """The single-device model, the same on every rank (seed 0)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"],
                        vocab_size=cfg["vocab_size"], n_positions=cfg["seq_len"], resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def dataset(cfg):
    """Synthetic text, one row per sequence: next = (5 * token + 3) mod vocab, plus some random tokens."""
    g = torch.Generator().manual_seed(1)
    rows, v = cfg["global_batch"] * cfg["steps"], cfg["vocab_size"]
    tokens = torch.empty(rows, cfg["seq_len"], dtype=torch.long)
    tokens[:, 0] = torch.randint(v, (rows,), generator=g)
    for t in range(1, cfg["seq_len"]):
        tokens[:, t] = (5 * tokens[:, t - 1] + 3) % v
    noise = torch.rand(rows, cfg["seq_len"], generator=g) < 0.1
    tokens[noise] = torch.randint(v, (int(noise.sum()),), generator=g)
    return tokens  # (steps * global_batch, seq_len)


def choose_device():
    """This process's device and backend, by the course's rule (``parlab.lab.runtime.choose``) written out so this
    file needs no parlab: GPU mode (NCCL, ``cuda:LOCAL_RANK``) only when every process on this machine gets a
    GPU of its own (NCCL refuses two ranks on one GPU); else CPU mode (gloo), and then no GPU is touched at
    all, so ``torchrun --nproc-per-node 4`` on a 2-GPU machine runs on the CPU rather than failing."""
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if torch.cuda.device_count() >= local_world:  # counted through NVML: no CUDA context yet
        return torch.device("cuda", local_rank), "cpu:gloo,cuda:nccl"  # gloo still moves any CPU tensor
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # read when CUDA starts: from here on this process sees no GPU
    return torch.device("cpu"), "gloo"


def rank_device():
    """In an initialised group: ``cuda:LOCAL_RANK`` when the group moves CUDA tensors (its backend names one
    for CUDA, e.g. ``cpu:gloo,cuda:nccl``: never compare it with ``== "nccl"``), else the CPU."""
    backend = str(dist.get_backend()).lower()
    if backend == "nccl" or any(part.strip().startswith("cuda:") for part in backend.split(",")):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", dist.get_rank())))
    return torch.device("cpu")


def mesh():
    """The 1-D DeviceMesh over every rank, on this rank's device type: ``fully_shard`` without ``mesh=``
    builds a CUDA one whenever the machine has a GPU, even over a CPU-only group."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(rank_device().type, (dist.get_world_size(),))


def shard(model, cfg):
    """FSDP2: each transformer block is one unit (gathered for its forward and backward, then freed), then the
    root takes what is left (embeddings, final norm). Parameters become DTensors sharded on dim 0."""
    dtype = cfg["param_dtype"] and getattr(torch, cfg["param_dtype"])
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None)
    ranks = mesh()
    for block in model.transformer.h:
        fully_shard(block, mesh=ranks, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=ranks, mp_policy=mp)
    return model


def save(model, opt, step, path):
    """Every rank writes its own shards (one file each) and rank 0 the metadata: no full copy anywhere."""
    model_state, opt_state = get_state_dict(model, opt)
    dcp.save({"model": model_state, "optim": opt_state, "step": torch.tensor(step)}, checkpoint_id=path)


def load(model, opt, path):
    """Reads the shards this rank needs now, whatever the world size that saved them."""
    model_state, opt_state = get_state_dict(model, opt)
    state = {"model": model_state, "optim": opt_state, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])


def train(cfg, steps=None, save_to=None, load_from=None):
    """Train on this rank's share of each global batch; return the loss of every step (mean over the batch)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = rank_device()
    model = shard(build_model(cfg).to(device), cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    first = load(model, opt, load_from) if load_from else 0
    accumulation = cfg["accumulation"]
    micro = cfg["global_batch"] // (world * accumulation)  # sequences per rank per micro-batch
    assert micro * world * accumulation == cfg["global_batch"], "global_batch must split over ranks × accumulation"
    data = dataset(cfg)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)  # rank r: rows r, r+N, ...
    batches = iter(DataLoader(data, batch_size=micro, sampler=sampler))
    for _ in range(first * accumulation):  # resuming: skip the batches already trained on
        next(batches)
    losses, norms = [], []
    for step in range(first, first + (steps or cfg["steps"] - first)):
        total = torch.zeros((), device=device)
        for i in range(accumulation):
            x = next(batches).to(device)  # (micro, seq_len)
            model.set_requires_gradient_sync(i == accumulation - 1)  # reduce-scatter once, after the last
            loss = model(input_ids=x, labels=x).loss / accumulation
            loss.backward()
            total += loss.detach()
        if cfg["max_grad_norm"]:  # the norm over all shards: clip_grad_norm_ all-reduces the DTensors' parts
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"]).full_tensor().item())
        opt.step()
        opt.zero_grad()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # the ranks' losses -> the global batch's (for printing)
        losses.append(total.item())
    if save_to:
        save(model, opt, first + len(losses), save_to)
    full = {n: p.full_tensor().detach().cpu() for n, p in model.named_parameters()}  # all-gathers: small model
    return {"losses": losses, "norms": norms, "params": full if rank == 0 else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--save", default=None)
    parser.add_argument("--load", default=None)
    parser.add_argument("--config", default="{}", help="JSON: changes to CONFIG")
    parser.add_argument("--out", default=None, help="rank 0 writes the losses here (JSON)")
    args = parser.parse_args()
    cfg = dict(CONFIG, **json.loads(args.config))
    device, backend = choose_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before the group: NCCL binds to it
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    result = train(cfg, args.steps, args.save, args.load)
    if dist.get_rank() == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"losses": result["losses"], "norms": result["norms"], "world_size": dist.get_world_size()}, f)
    dist.destroy_process_group()
    os._exit(0)  # skip the interpreter's teardown, which can abort a gloo rank (PyTorch issue 117762)


if __name__ == "__main__":
    main()
