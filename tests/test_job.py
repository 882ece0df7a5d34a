"""Chapter 08's job: the Trainer under parlab.launch as under torchrun and as one process, the accelerate loop
as one process, the silent DDP fallback of FSDP on CPU, the resharded resume from a sharded checkpoint, and
the exercise's check in both directions (a loop without fully_shard, one that does not resume from its
checkpoint, one that shards only the root); the chapter's own train.py is tests/test_own_job.py's; a group
timeout and py-spy on a hung rank."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cloudpickle
import nbformat
import pytest
import torch
import torch.distributed as dist
from torch.testing import assert_close

import parlab
from parlab.course.exercises import ExerciseFailed
from parlab.course.exercises.ch08 import check_sharded_training
from parlab.lab.job import checkpoint, hf, train_fsdp
from parlab.lab.job.reference import one_process
from parlab.lab.job.torchrun import torchrun
from parlab.lab.launch.plan import make_plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # as functions in a notebook cell travel

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftover_ranks")]
CPU = not torch.cuda.is_available()
NOTEBOOK = Path(__file__).parents[1] / "notebooks" / "08_your_own_job.ipynb"


@pytest.mark.skipif(not CPU, reason="the CPU ranks' Trainer (gloo)")
def test_trainer_under_launch_is_the_trainer_under_torchrun(tmp_path):
    cfg = {"steps": 2}
    launched = parlab.launch(hf.trainer_job, 2, kwargs={"cfg": cfg}, timeout=120, output="none")[0]
    torchrun("parlab.lab.job.hf", 2, "--config", '{"steps": 2}', "--out", str(tmp_path / "r.pt"), module=True)
    run = torch.load(tmp_path / "r.pt", weights_only=False)
    assert len(launched["losses"]) == 2
    # in order (train_sampling_strategy="sequential"), its logged losses are one process's
    assert_close(torch.tensor(launched["losses"]), torch.tensor(one_process(cfg)["losses"]), rtol=1e-5, atol=1e-6)
    assert_close(torch.tensor(launched["losses"]), torch.tensor(run["losses"]))
    for name, p in run["params"].items():
        assert_close(launched["params"][name], p, msg=name)
    assert launched["distributed_type"] == run["distributed_type"] == "MULTI_CPU"
    assert launched["wrapped"] == run["wrapped"] == "DistributedDataParallel"


def test_the_accelerate_loop_is_one_process():
    cfg = {"steps": 2}
    losses = parlab.launch(hf.accelerate_loop, 3, kwargs={"cfg": cfg}, timeout=120, output="none")[0]
    assert_close(torch.tensor(losses), torch.tensor(one_process(cfg)["losses"]), **make_plan(3).tolerance)


@pytest.mark.skipif(not CPU, reason="the fallback happens on CPU ranks only")
def test_fsdp_asked_on_cpu_ranks_is_ddp_without_a_word(capfd):
    asked = parlab.launch(hf.accelerate_fsdp, 2, announce=False)
    assert asked == [{"distributed_type": "MULTI_CPU", "wrapped": "DistributedDataParallel", "sharded": False}] * 2
    trainer = parlab.launch(hf.trainer_job, 2, kwargs={"cfg": {"steps": 1}, "fsdp": True}, timeout=120)[0]
    assert (trainer["distributed_type"], trainer["wrapped"]) == ("MULTI_CPU", "DistributedDataParallel")
    assert "fsdp" not in capfd.readouterr().err.lower()  # no warning says so
    # ... while the plain script's fully_shard does shard on the same CPU ranks
    sharded = parlab.launch(_is_sharded, 2, announce=False)
    assert sharded == [True, True]


def _is_sharded():
    from torch.distributed.tensor import DTensor

    model = train_fsdp.shard(train_fsdp.build_model(train_fsdp.CONFIG), train_fsdp.CONFIG)
    return all(isinstance(p, DTensor) for p in model.parameters())


def _resume(cfg, path, drop_momentum):
    if drop_momentum:  # the planted bug: the optimizer's state is not restored
        load = train_fsdp.load
        train_fsdp.load = lambda model, opt, p: (load(model, opt, p), opt.state.clear())[0]
    return train_fsdp.train(cfg, load_from=path)


@pytest.mark.parametrize("saved_at, resumed_at", [(3, 2)])
def test_resharded_resume_continues_the_uninterrupted_run(tmp_path, saved_at, resumed_at):
    cfg = dict(train_fsdp.CONFIG, steps=4)
    path = str(tmp_path / "ckpt")
    reference = one_process(cfg)
    first = parlab.launch(train_fsdp.train, saved_at, args=(cfg, 2, path), announce=False)[0]
    saved = checkpoint.contents(path)
    assert list(saved["files"]) == list(range(saved_at))  # one file per rank: no full copy anywhere
    assert any("momentum_buffer" in k for k in saved["tensor_bytes"])
    rest = parlab.launch(_resume, resumed_at, args=(cfg, path, False), announce=False)[0]
    tol = {**make_plan(resumed_at).tolerance, **make_plan(saved_at).tolerance}  # the GPU's where either ran on GPUs
    assert_close(torch.tensor(first["losses"] + rest["losses"]), torch.tensor(reference["losses"]), **tol)
    for name, p in reference["params"].items():
        assert_close(rest["params"][name], p, **tol, msg=lambda m, name=name: f"{name}: {m}")
    # the same resume without the momentum is caught, by a wide margin
    wrong = parlab.launch(_resume, resumed_at, args=(cfg, path, True), announce=False)[0]
    gap = max((wrong["params"][n] - p).abs().max().item() for n, p in reference["params"].items())
    print(f"resume without momentum: weights off by up to {gap:.2e} (assert_close allows ~1e-5)")
    assert gap > 1e-3


# -- the exercise ----------------------------------------------------------------------------------------

def _solution(replace: dict | None = None):
    """The chapter's solution, with the names the chapter imported before it; ``replace``: planted bugs."""
    from torch.distributed.fsdp import fully_shard

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    cells = [c for c in notebook.cells if "solution" in c.metadata.get("tags", [])]
    assert len(cells) == 1 and cells[0].metadata.get("jupyter", {}).get("source_hidden") is True
    check = next(c.source for c in notebook.cells if "check_sharded_training(" in c.source)
    namespace = {"torch": torch, "dist": dist, "fully_shard": fully_shard}
    exec(compile(check.split("\nshow_source(")[0], "<imports>", "exec"), namespace)  # the exercise cell's imports
    source = cells[0].source
    for line, new in (replace or {}).items():
        assert line in source, f"the plant's line is not in the solution: {line}"
        source = source.replace(line, new)
    exec(compile(source, "<solution>", "exec"), namespace)
    return namespace["solution_sharded_loop"]


def test_exercise_solution_passes_and_the_check_reads_no_solution():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    checks = [c.source for c in notebook.cells if "check_sharded_training(" in c.source]
    assert checks and all("solution" not in c for c in checks)
    print(check_sharded_training(_solution(), world_size=2, resume_world_size=3))


def test_exercise_fails_a_checkpoint_without_the_optimizer():
    # the planted bug: the optimizer's state is left out of what is saved (and loaded)
    model_only = _solution({'dict(zip(("model", "optim"), get_state_dict(model, opt)))':
                            '{"model": get_state_dict(model, opt)[0]}'})
    with pytest.raises(ExerciseFailed, match="no optimizer state") as failed:
        check_sharded_training(model_only, world_size=2, resume_world_size=3)
    print(failed.value)


def test_exercise_fails_losses_summed_over_ranks():
    solution = _solution()

    def summed(first_step, steps, save_to=None, load_from=None):
        # the planted bug: each rank's loss all-reduced with SUM (the default op), not averaged
        losses = []
        for value in solution(first_step, steps, save_to, load_from):
            t = torch.tensor(value)
            dist.all_reduce(t)
            losses.append(t.item())
        return losses

    with pytest.raises(ExerciseFailed, match="it is 2 times the loop's: each rank's loss was summed") as failed:
        check_sharded_training(summed, world_size=2, resume_world_size=3)
    print(failed.value)


ROWS = "losses = single_process_loop(first_step, steps, model, opt, rows=mine)"


def test_exercise_fails_every_rank_training_on_the_whole_batch():
    # the planted bug: the shard step forgotten; every rank trains on the whole batch. The losses and weights
    # are the loop's (FSDP averages equal gradients), so only the rows each rank looked up can tell
    whole = _solution({ROWS: ROWS.replace("rows=mine", "rows=lambda x: x.to(runtime.device())")})
    with pytest.raises(ExerciseFailed, match="every rank trained on the whole batch of 12 rows each step .*"
                                             "the shard step is missing") as failed:
        check_sharded_training(whole, world_size=2, resume_world_size=3)
    print(failed.value)


def test_exercise_fails_a_resume_that_draws_the_first_steps_batches():
    # the planted bug: every run starts at step 0's batch, whatever first_step says
    replayed = _solution({ROWS: ROWS.replace("(first_step, steps,", "(0, steps,")})
    with pytest.raises(ExerciseFailed, match="steps 2–3 trained on the batches of steps 0–1: draw each step's "
                                             "batch with seed=step") as failed:
        check_sharded_training(replayed, world_size=2, resume_world_size=3)
    print(failed.value)


def test_exercise_calls_the_function_by_position():
    solution = _solution()

    def renamed(start, count, save=None, load=None):  # other names, the same logic: it must pass
        return solution(start, count, save, load)

    print(check_sharded_training(renamed, world_size=2, resume_world_size=3))


def _replicated(first_step, steps, save_to=None, load_from=None):
    """A planted wrong answer: no fully_shard; every rank trains the whole model on the whole batch (so its
    losses are the single-process loop's) and saves and loads through DCP."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from parlab.course.exercises.ch08 import LOOP
    from parlab.lab.models import tiny_llama, token_batch

    model = tiny_llama(heads=4, kv_heads=4, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LOOP["lr"], momentum=LOOP["momentum"])
    if load_from:
        model_state, opt_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": opt_state}
        dcp.load(state, checkpoint_id=load_from)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    losses = []
    for step in range(first_step, first_step + steps):
        x = token_batch(LOOP["global_batch"], LOOP["seq_len"], seed=step)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if save_to:
        dcp.save(dict(zip(("model", "optim"), get_state_dict(model, opt))), checkpoint_id=save_to)
    return losses


def test_exercise_fails_a_loop_that_never_calls_fully_shard():
    with pytest.raises(ExerciseFailed, match="no forward ran through a module fully_shard had made") as failed:
        check_sharded_training(_replicated, world_size=2, resume_world_size=3)
    print(failed.value)


EACH_BLOCK = "for unit in [*model.model.layers, model]:  # each block, then the root"


def test_exercise_fails_a_loop_that_shards_only_the_root():
    # the planted bug: fully_shard on the model's root only; the losses are the same, the units are not
    root_only = _solution({EACH_BLOCK: "for unit in [model]:  # the root only"})
    with pytest.raises(ExerciseFailed, match="fully_shard was called on the model's root only") as failed:
        check_sharded_training(root_only, world_size=2, resume_world_size=3)
    print(failed.value)


def test_exercise_fails_a_loop_that_does_not_resume_from_its_checkpoint():
    solution = _solution()

    def replays(first_step, steps, save_to=None, load_from=None):
        # the planted bug: load_from is ignored; the first steps are replayed instead (and a real sharded
        # checkpoint is saved), which gives the right losses unless the checkpoint is not the replay's
        return solution(0, first_step + steps, save_to=save_to)[first_step:]

    with pytest.raises(ExerciseFailed, match=r"on 3 ranks, asked for steps 2–3, your function trained steps 0–3: "
                                             r"load the model and optimizer from load_from") as failed:
        check_sharded_training(replays, world_size=2, resume_world_size=3)
    print(failed.value)


def test_exercise_refuses_sizes_it_cannot_run_before_running():
    with pytest.raises(ValueError, match="must differ from world_size"):
        check_sharded_training(_replicated, world_size=2, resume_world_size=2)
    with pytest.raises(ValueError, match="resume_world_size must be an int ≥ 2 dividing the batch of 12; got 5"):
        check_sharded_training(_replicated, world_size=2, resume_world_size=5)


def test_exercise_refuses_the_package_script():
    def borrowed(first_step, steps, save_to=None, load_from=None):
        return train_fsdp.train(dict(train_fsdp.CONFIG), steps, save_to, load_from)["losses"]

    with pytest.raises(ExerciseFailed, match="write the FSDP2 and checkpoint code yourself"):
        check_sharded_training(borrowed, world_size=2, resume_world_size=3)


# -- GPUs (the GPU CI job: pytest -m gpu) ----------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_trainer_fsdp_shards_on_gpus():
    result = parlab.launch(hf.trainer_job, 2, kwargs={"cfg": {"steps": 2}, "fsdp": True}, timeout=300)[0]
    assert result["distributed_type"] == "FSDP" and len(result["losses"]) == 2
    assert parlab.launch(hf.accelerate_fsdp, 2)[0]["sharded"]


@pytest.mark.gpu
def test_memory_snapshot_of_a_predicted_out_of_memory(tmp_path):
    from parlab.lab.job import debug

    job = dict(n_layer=8, n_embd=1024, n_head=16, seq_len=512)
    oom = parlab.launch(debug.cuda_out_of_memory, 1, args=(job, str(tmp_path / "oom.pickle")), timeout=300)[0]
    assert oom["out_of_memory"] and (tmp_path / "oom.pickle").stat().st_size > 0


# -- the learner's train.py, as the chapter writes it: tests/test_own_job.py -----------------------------


def test_the_tokenizer_and_rows_refuse_what_they_cannot_make():
    from parlab.lab.job import data

    with pytest.raises(ValueError, match="vocab_size must exceed the 256 byte values"):
        data.train_tokenizer(["some text"], vocab_size=256)
    tokenizer = data.train_tokenizer(["a short text", "another one, a little longer"], vocab_size=270)
    with pytest.raises(ValueError, match="rows=5: only 2 texts"):
        data.token_rows(tokenizer, ["a short text", "another one, a little longer"], rows=5, seq_len=8)
    rows = data.token_rows(tokenizer, ["a short text", "another one, a little longer"], rows=2, seq_len=64)
    assert ((rows["labels"] == -100) == (rows["input_ids"] == tokenizer.token_to_id("<pad>"))).all()
    assert tokenizer.decode(rows["input_ids"][0][rows["labels"][0] != -100].tolist()) == "a short text"


# -- a hang, with a cluster's tools -----------------------------------------------------------------------

def test_a_group_timeout_ends_a_collective_only_one_rank_called():
    from parlab.lab.job import debug

    errors = parlab.launch(debug.collective_timeout, 2, kwargs={"seconds": 1}, timeout=60, announce=False)
    assert errors[1] is None and "Timed out waiting 1000ms" in errors[0]


def _py_spy_cannot_attach() -> str | None:
    """Why py-spy cannot read another process of this user here, or None when it can."""
    import subprocess

    from parlab.lab.job import debug

    exe = debug.py_spy_exe()
    if exe is None:
        return "py-spy is not installed (pip install -e '.[dev]')"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, text=True)
    sleeper.stdout.readline()  # Python is up: on a busy machine a dump at once found no interpreter yet
    try:
        done = subprocess.run([exe, "dump", "--pid", str(sleeper.pid)], capture_output=True, text=True, timeout=60)
    finally:
        sleeper.kill()
        sleeper.wait()
        sleeper.stdout.close()
    return None if done.returncode == 0 else f"py-spy cannot attach here (ptrace): {done.stderr.strip()[:200]}"


def test_py_spy_finds_a_hung_rank_inside_its_collective():
    from parlab.lab.job import debug

    reason = _py_spy_cannot_attach()
    if reason:
        pytest.skip(reason)
    dump = parlab.launch(debug.py_spy_dump, 2, timeout=120, announce=False)[1]
    main_thread = dump.split("\nThread ")[1]
    frames = [line.strip() for line in main_thread.splitlines()[1:]]
    assert frames[0].startswith("all_reduce (torch/distributed/distributed_c10d.py"), main_thread
    assert any(f.startswith("py_spy_dump (parlab/lab/job/debug.py") for f in frames), main_thread


def _empty_llama(restore_buffers: bool):
    """Chapter 08's ``train.py`` way of building a model without its weights, on a tiny Llama (RoPE keeps its
    frequencies in a buffer no state dict carries): parameters on the meta device, buffers kept, storage
    made empty with ``to_empty``, then the buffers put back (or not, to plant the bug)."""
    from accelerate import init_empty_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64)
    with init_empty_weights():
        model = LlamaForCausalLM(config)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    model.to_empty(device="cpu")
    if restore_buffers:
        [b.copy_(buffers[name]) for name, b in model.named_buffers()]
    return model, LlamaForCausalLM(config), buffers


@pytest.mark.parametrize("restore_buffers", [True, False])
def test_the_script_build_keeps_buffers_no_state_dict_carries(restore_buffers):
    model, built, buffers = _empty_llama(restore_buffers)
    assert any("inv_freq" in name for name in buffers)  # the buffer at stake exists in this model
    model.load_state_dict(built.state_dict())  # what set_model_state_dict gives: the state dict only
    ids = torch.arange(16).reshape(2, 8)
    same = torch.allclose(model(ids).logits, built(ids).logits)
    assert same == restore_buffers  # without the restore, RoPE's frequencies are garbage: different logits
