"""The same job through the Hugging Face Trainer and accelerate, and what they do on CPU ranks (chapter 09).

- :func:`trainer_job` trains :mod:`parlab.lab.job.train_fsdp`'s model and data with ``transformers.Trainer`` on
  this rank. Inside ``parlab.launch`` the process group already exists and the Trainer joins it; under
  ``torchrun -m parlab.lab.job.hf`` the Trainer (through accelerate) creates it, as in any script.
- :func:`accelerate_loop` is the same job as an ``Accelerator(...)``/``prepare`` loop.
- :func:`reference_job` is what the chapter's ``trainer.py`` and ``accel.py`` must reproduce: their job file in
  one process, on the whole global batch.
- :func:`write_job` writes a copy of a page's job file with some keys changed, and :func:`same_model` checks an
  exported folder against :func:`reference_job`'s weights.
- :func:`accelerate_fsdp` asks accelerate for FSDP2 and reports what it set up. On CPU ranks it reports
  ``DistributedType.MULTI_CPU`` and a model wrapped in ``DistributedDataParallel``: accelerate (and the
  Trainer, which prepares models through it) quietly falls back to DDP, without a warning. A laptop test of
  an FSDP config tests the data pipeline and the loss, not the sharding.
- :data:`TRAINER_FSDP`, :data:`ACCELERATE_FSDP_YAML` and :func:`deepspeed_config` are the configurations the
  chapter maps, line by line, onto what chapters 03–07 built.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from parlab.lab import runtime
from parlab.lab.job.train_fsdp import CONFIG, build_model, dataset
from parlab.lab.launch.cluster import exit_without_teardown

#: The Trainer's FSDP2: ``TrainingArguments(fsdp=True, fsdp_config=TRAINER_FSDP)``.
TRAINER_FSDP = {
    "version": 2,                                   # fully_shard (FSDP2), not the FSDP1 wrapper class
    "transformer_layer_cls_to_wrap": ["GPT2Block"],  # one unit per block: fully_shard(block) per block
    "reshard_after_forward": True,                  # free after forward, gather again for backward: 3Ψ, ZeRO-3
    "activation_checkpointing": False,
    "cpu_ram_efficient_loading": False,
}

#: ``accelerate launch --config_file fsdp.yaml train.py``: the same, as accelerate's config file.
ACCELERATE_FSDP_YAML = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_machines: 1
num_processes: 4                        # world_size: one process per GPU
mixed_precision: bf16                   # MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16): both;
                                        # fp32 reduction needs the plugin's explicit mixed_precision_policy
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: GPT2Block
  fsdp_reshard_after_forward: true      # false: keep gathered until backward, ZeRO-3 at 2Ψ instead of 3Ψ
  fsdp_state_dict_type: SHARDED_STATE_DICT   # torch.distributed.checkpoint: one file per rank
  fsdp_offload_params: false
  fsdp_activation_checkpointing: false
"""


#: The start of chapter 09's ``trainer.py`` and ``accel.py`` (the page writes the rest with ``%%writefile -a``;
#: its Under the hood part prints these): the imports, the job file read as chapter 08's ``train.py`` reads it
#: (its paths relative to it), the model loaded, and the lines that make a resume exact.
SCRIPT_START = {
    "trainer.py": r"""# torchrun --nproc-per-node N trainer.py trainer.json: the Trainer on any transformers causal LM
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

KEYS = {"pretrained", "data", "out", "steps", "save_every", "global_batch", "accumulation", "lr", "momentum",
        "max_grad_norm"}
job = json.load(open(sys.argv[1]))
if KEYS - set(job):  # fail now, not after the whole run
    sys.exit(f"{sys.argv[1]} lacks {sorted(KEYS - set(job))}")
here = os.path.dirname(os.path.abspath(sys.argv[1]))
path = {key: os.path.join(here, job[key]) for key in ("pretrained", "data", "out")}  # relative: to the job file
latest = get_last_checkpoint(path["out"]) if os.path.isdir(path["out"]) else None  # the newest checkpoint-<step>
model, info = AutoModelForCausalLM.from_pretrained(latest or path["pretrained"], dtype=torch.float32,  # fp32
                                                   output_loading_info=True)  # renames keys: embed_out → lm_head
if info["missing_keys"] or info["unexpected_keys"]:  # a weight the file lacks would start untrained
    sys.exit(f"refusing to train: {latest or path['pretrained']} does not fit the model: {info}")
model.loss_type = "ForCausalLM"
class SameAsCheckpoint(TrainerCallback):  # after the Trainer's resume: every weight the checkpoint's, or stop
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if latest is None:  # a fresh start
            return
        saved = dict(AutoModelForCausalLM.from_pretrained(latest, dtype=torch.float32).named_parameters())
        for name, p in model.named_parameters():
            whole = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2: gathered from the shards
            if not torch.equal(whole.detach().cpu(), saved[name].detach()):
                raise RuntimeError(f"refusing to resume: {name} differs from {latest}'s")
""",
    "accel.py": r"""# torchrun --nproc-per-node N accel.py accel.json: an accelerate loop on any transformers causal LM
import contextlib
import json
import os
import sys

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from transformers import AutoModelForCausalLM

KEYS = {"pretrained", "data", "out", "steps", "save_every", "global_batch", "accumulation", "lr", "momentum",
        "max_grad_norm", "processes"}
job = json.load(open(sys.argv[1]))
if KEYS - set(job):  # fail now, not after the whole run
    sys.exit(f"{sys.argv[1]} lacks {sorted(KEYS - set(job))}")
here = os.path.dirname(os.path.abspath(sys.argv[1]))
path = {key: os.path.join(here, job[key]) for key in ("pretrained", "data", "out")}  # relative: to the job file
os.makedirs(path["out"], exist_ok=True)
model = AutoModelForCausalLM.from_pretrained(path["pretrained"], dtype=torch.float32)  # fp32, whatever was saved
model.loss_type = "ForCausalLM"
gpu = torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))  # one GPU per process
fsdp = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                      transformer_cls_names_to_wrap=sorted(model._no_split_modules))
acc = Accelerator(cpu=not gpu, fsdp_plugin=fsdp if gpu else None)
opt = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])
data = torch.load(path["data"])  # {"input_ids", "labels" (-100 where padded)}: (rows, seq_len) each
rows = [{"input_ids": x, "labels": y} for x, y in zip(data["input_ids"], data["labels"])]
micro = job["global_batch"] // (acc.num_processes * job["accumulation"])
loader = torch.utils.data.DataLoader(rows, batch_size=micro)  # batches of {"input_ids", "labels"}
model, opt, loader = acc.prepare(model, opt, loader)  # rank r takes batches r, r + N, ...
done = max((int(d[5:]) for d in os.listdir(path["out"]) if d.startswith("step_")), default=0)  # steps saved
if done:
    acc.load_state(os.path.join(path["out"], f"step_{done}"))  # weights, optimizer, random states
batches = iter(acc.skip_first_batches(loader, done * job["accumulation"]))
""",
}


def write_script_start(folder: str, name: str) -> str:
    """Write ``folder/name`` with :data:`SCRIPT_START`'s lines for ``name``; returns the path."""
    if name not in SCRIPT_START:
        raise ValueError(f"name={name!r}: a script of chapter 09 is one of {sorted(SCRIPT_START)}")
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(SCRIPT_START[name])
    return path


def deepspeed_config(stage: int, micro_batch: int = 4, accumulation: int = 2) -> dict:
    """DeepSpeed's JSON for ZeRO ``stage`` (0–3), as ``TrainingArguments(deepspeed=...)`` or
    ``deepspeed.initialize(config=...)`` take it ("auto": the Trainer fills in its own arguments)."""
    zero = {"stage": stage}
    if stage >= 1:
        zero |= {"overlap_comm": True, "reduce_bucket_size": 5e8}  # stage 2: reduce-scatter bucket by bucket
    if stage >= 2:
        zero |= {"contiguous_gradients": True}  # chapter 04's flat buffers for the gradient shards
    if stage == 3:
        zero |= {"stage3_prefetch_bucket_size": 5e7,  # prefetch: gather the next block during this one
                 "stage3_param_persistence_threshold": 1e5,  # parameters this small stay whole on every rank
                 "stage3_gather_16bit_weights_on_model_save": True}  # a full copy on save: a choice, not DCP
    return {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": accumulation,
            "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": zero}


def _on_gpu() -> bool:
    """GPU mode by the course's one decision: inside a launch, the group's (a CPU-mode rank on a GPU machine
    must say use_cpu, or accelerate puts rank r on cuda:r); under ``torchrun -m parlab.lab.job.hf``, before any
    group, one GPU for every process on this machine."""
    if dist.is_initialized() or "PARLAB_DEVICE" in os.environ:
        return runtime.device().type == "cuda"
    return runtime.choose(int(os.environ.get("LOCAL_WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))).gpu


def training_arguments(cfg, output_dir, fsdp=False):
    """The job's `TrainingArguments`: the same batch, accumulation, optimizer, clipping and rows as one process."""
    from transformers import TrainingArguments

    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
    cpu = not _on_gpu()
    return TrainingArguments(
        output_dir=output_dir, use_cpu=cpu, ddp_backend="gloo" if cpu else None,
        per_device_train_batch_size=cfg["global_batch"] // (world * cfg["accumulation"]),
        gradient_accumulation_steps=cfg["accumulation"], max_steps=cfg["steps"],
        train_sampling_strategy="sequential",  # rows in order, as one process takes them (default: shuffled)
        optim="sgd", optim_args=f"momentum={cfg['momentum']}", learning_rate=cfg["lr"], weight_decay=0.0,
        lr_scheduler_type="constant", max_grad_norm=cfg["max_grad_norm"] or 0.0, seed=0,
        ddp_find_unused_parameters=False,  # DDP's default here searches every step for unused weights and warns
        logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True, remove_unused_columns=False,
        **({"fsdp": True, "fsdp_config": TRAINER_FSDP} if fsdp else {}))


def trainer_job(cfg: dict | None = None, fsdp: bool = False) -> dict:
    """``Trainer.train()`` on this rank: the logged losses (full floats in this transformers; older ones round to 4 decimals), what
    accelerate set up, the wrapped model's class, and (rank 0) the final weights."""
    from transformers import Trainer

    cfg = dict(CONFIG, **(cfg or {}))
    rows = [{"input_ids": x, "labels": x} for x in dataset(cfg)]
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model=build_model(cfg), args=training_arguments(cfg, out, fsdp), train_dataset=rows)
        trainer.train()
    params = {n: p.detach().cpu().clone() for n, p in trainer.model.named_parameters()}
    return {"losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "distributed_type": trainer.accelerator.distributed_type.name,
            "wrapped": type(trainer.model_wrapped).__name__,
            "params": params if dist.get_rank() == 0 else None}


def reference_job(job_file: str) -> dict:
    """The chapter's ``trainer.py``/``accel.py`` job in one process: the model folder and the rows that
    ``job_file`` names (paths relative to it, as the scripts read them), the rows in order, each step's whole
    global batch at once, its loss the mean over the tokens with a label, clipping, SGD with momentum at a
    constant learning rate. Losses and final weights."""
    from transformers import AutoModelForCausalLM

    with open(job_file) as f:
        job = json.load(f)
    here = os.path.dirname(os.path.abspath(job_file))
    model = AutoModelForCausalLM.from_pretrained(os.path.join(here, job["pretrained"]), dtype=torch.float32)
    model.loss_type = "ForCausalLM"  # (the folder does not keep it)
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])
    data, batch = torch.load(os.path.join(here, job["data"])), job["global_batch"]
    if len(data["input_ids"]) < job["steps"] * batch:
        raise ValueError(f"{job_file}: {job['steps']} steps of {batch} rows need {job['steps'] * batch} rows; "
                         f"{job['data']} holds {len(data['input_ids'])}")
    losses = []
    for step in range(job["steps"]):
        rows = slice(step * batch, (step + 1) * batch)
        loss = model(input_ids=data["input_ids"][rows], labels=data["labels"][rows]).loss  # mean over labelled tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), job["max_grad_norm"])
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def write_job(folder: str, name: str, page: str = "trainer.json", **changes) -> str:
    """``folder/job-<name>.json``: the job file ``folder/page`` with ``changes``, its output ``out-<name>`` (its
    paths stay relative to the folder, as the scripts read them): as you would edit your own."""
    with open(os.path.join(folder, page)) as f:
        job = json.load(f)
    path = os.path.join(folder, f"job-{name}.json")
    with open(path, "w") as f:
        json.dump(dict(job, out=f"out-{name}", **changes), f, indent=1)
    return path


def same_model(folder: str, params: dict, label: str, *, tol: dict) -> int:
    """The model folder a script exported loads with ``from_pretrained`` and holds ``params``, every tensor
    (``assert_close`` with ``tol``, its numbers and the tensor's name shown on a failure). ``tol``: the job's
    tolerance against where ``params`` were computed (``torchrun.tolerance(n)`` against one CPU process).
    Returns how many tensors."""
    from torch.testing import assert_close
    from transformers import AutoModelForCausalLM

    loaded = dict(AutoModelForCausalLM.from_pretrained(folder).named_parameters())
    assert loaded.keys() == params.keys(), f"{label}: {sorted(loaded.keys() ^ params.keys())}"
    for name, p in loaded.items():
        assert_close(p, params[name], **tol, msg=lambda m, name=name: f"{label}, {name}: {m}")
    return len(params)


def accelerate_loop(cfg: dict | None = None) -> list[float]:
    """The job as an accelerate loop on this rank: the global batch's loss of every step."""
    from accelerate import Accelerator

    cfg = dict(CONFIG, **(cfg or {}))
    accelerator = Accelerator(cpu=not _on_gpu(), gradient_accumulation_steps=cfg["accumulation"])
    model = build_model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    micro = cfg["global_batch"] // (accelerator.num_processes * cfg["accumulation"])
    loader = DataLoader(dataset(cfg), batch_size=micro)  # prepared: rank r takes batches r, r + N, ...
    model, opt, loader = accelerator.prepare(model, opt, loader)
    losses, total = [], 0.0
    for x in loader:
        with accelerator.accumulate(model):  # gradients synchronised on the last micro-batch only
            loss = model(input_ids=x, labels=x).loss
            accelerator.backward(loss)  # divided by gradient_accumulation_steps
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), cfg["max_grad_norm"])
            opt.step()  # a no-op until the last micro-batch
            opt.zero_grad()
        total += accelerator.reduce(loss.detach(), "mean").item() / cfg["accumulation"]
        if accelerator.sync_gradients:
            losses, total = losses + [total], 0.0
    return losses


def accelerate_fsdp(cfg: dict | None = None) -> dict:
    """Ask accelerate for FSDP2 on this rank; report what it set up and whether any weight is sharded."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from torch.distributed.tensor import DTensor

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True,
                                            auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["GPT2Block"])
    accelerator = Accelerator(cpu=not _on_gpu(), fsdp_plugin=plugin)
    model = accelerator.prepare(build_model(dict(CONFIG, **(cfg or {}))))
    return {"distributed_type": accelerator.distributed_type.name, "wrapped": type(model).__name__,
            "sharded": any(isinstance(p, DTensor) for p in model.parameters())}


def main():
    """``torchrun --standalone --nproc-per-node N -m parlab.lab.job.hf --out result.json``"""
    parser = argparse.ArgumentParser(description="the Trainer job, under torchrun")
    parser.add_argument("--config", default="{}")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = trainer_job(json.loads(args.config), fsdp=args.fsdp)
    if dist.get_rank() == 0:
        torch.save(result, args.out)
    if dist.is_initialized():
        dist.destroy_process_group()
    exit_without_teardown()  # the Trainer's backward ran DDP's all-reduces on gloo: see its docstring


if __name__ == "__main__":
    main()
