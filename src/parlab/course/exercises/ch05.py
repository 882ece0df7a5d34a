"""Chapter 05's exercises: a row-parallel layer's forward, run on ranks against the dense layer (the package's
own forward refused while the learner's runs); where the collectives go in a chain of column- and
row-parallel layers, checked boundary by boundary; and sequence parallelism's costs, a number and two
choices."""

from __future__ import annotations

import random
import warnings

import torch
import torch.nn.functional as F

import parlab
from parlab.course.exercises.core import ExerciseFailed, Passed, _name, call_in_order, check_choice, later, refusing
from parlab.lab.language import say

IN, OUT, BATCH = 12, 6, 5


def _row_parallel_on_rank(fn) -> dict:
    from parlab.lab.measure import record_comm
    from parlab.lab.parallel.tensor import RowParallelLinear

    g = torch.Generator().manual_seed(7)
    dense = torch.nn.Linear(IN, OUT)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(OUT, IN, generator=g))
        dense.bias.copy_(torch.randn(OUT, generator=g))  # not zero: a bias added t times must show
    x = torch.randn(BATCH, IN, generator=g)
    layer = RowParallelLinear(dense)
    cols = layer.shards["weight"][1]
    mine = x[:, cols].clone().requires_grad_()  # (batch, in / t): this rank's features
    try:
        # the exercise is this forward: the package's own (the layer called, or its class's forward) refused
        with record_comm() as log, refusing("ch05.1", say(PACKAGE_FORWARD)):
            y = fn(layer, mine)
    except NotImplementedError:
        return {"problem": say("row_parallel_forward is not written yet (it raises NotImplementedError)")}
    except ExerciseFailed as refused:
        return {"problem": str(refused)}
    if not isinstance(y, torch.Tensor):
        return {"problem": say("row_parallel_forward returned {kind}; return the layer's output",
                               kind=type(y).__name__)}
    partial = F.linear(x[:, cols], layer.weight.detach())
    out = {"y": y.detach().clone(), "want": dense(x).detach(), "partial": partial, "bias": dense.bias.detach(),
           "ops": [(r.op, r.bytes) for r in log.records]}
    if y.requires_grad:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (y * torch.arange(1.0, OUT + 1)).sum().backward()
        # an in-place torch.distributed collective on a tensor autograd tracks has no backward of its own:
        # PyTorch passes the gradient through unchanged, and warns that this is deprecated
        out["untracked"] = any("autograd kernel was not registered" in str(w.message) for w in caught)
        dense.zero_grad()
        whole = x.clone().requires_grad_()
        (dense(whole) * torch.arange(1.0, OUT + 1)).sum().backward()
        out["grads"] = [(name, got.clone() if got is not None else None, want)
                        for name, got, want in (("x", mine.grad, whole.grad[:, cols]),
                                                ("weight", layer.weight.grad, dense.weight.grad[:, cols]),
                                                ("bias", layer.bias.grad, dense.bias.grad))]
    return out


PACKAGE_FORWARD = later.say("row_parallel_forward called the layer's own forward (the package's answer): write it "
                            "from layer.weight, layer.bias and layer.comm")


def _diagnose(r: dict, t: int) -> str | None:
    if "problem" in r:
        return r["problem"]
    y, want = r["y"], r["want"]
    if y.shape != want.shape:
        return say("the output has shape {shape}; expected (batch, out_features) = {expected}", shape=tuple(y.shape),
                   expected=tuple(want.shape))
    if torch.allclose(y, want, atol=1e-5):
        pass
    elif torch.allclose(y, r["partial"] + r["bias"], atol=1e-5) or torch.allclose(y, r["partial"], atol=1e-5):
        return say("the output is this rank's partial sum: the ranks' results were never added up")
    elif torch.allclose(y, want + (t - 1) * r["bias"], atol=1e-5):
        return say("the bias was added on every rank before the sum, so it counts {t} times", t=t)
    elif torch.allclose(y, want - r["bias"], atol=1e-5):
        return say("the bias is missing")
    elif any(torch.allclose(y, (want - r["bias"]) / t + b, atol=1e-5) for b in (r["bias"], 0, r["bias"] / t)):
        return say("the output is the ranks' partial sums divided by t = {t}: an average, as data parallelism "
                   "averages gradients. Here each rank's X_r·A_r is one term of a single sum: add them, do not "
                   "divide by t", t=t)
    else:
        return say("the output differs from the dense layer's by up to {most:.3g}", most=(y - want).abs().max().item())
    reductions = [op for op in r["ops"] if op[0] == "all_reduce"]
    if len(r["ops"]) != 1 or len(reductions) != 1:
        return say("expected one all-reduce of the output; the collectives were {ops}", ops=r["ops"])
    if "grads" not in r:
        return say("the output does not require grad: autograd cannot train through it")
    for name, got, want in r["grads"]:
        if got is None:
            return say("no gradient reached {name}", name=name)
        if name == "bias" and torch.allclose(got, want / t, atol=1e-5):
            return say("the output is right, but the bias's gradient is 1/{t} of the dense layer's: the bias was "
                       "divided by t and added on every rank before the sum, so each rank's copy learns {t} times "
                       "too slowly. Add the whole bias once, after the sum", t=t)
        if torch.allclose(got, want / t, atol=1e-5):
            return say("the gradient of {name} is 1/{t} of the dense layer's: something divides by t that should not",
                       name=name, t=t)
        if name == "x" and torch.allclose(got, t * want, atol=1e-5):
            return say("the gradient of x is {t} times too large: the collective's backward summed gradients that "
                       "every rank already holds whole (g's backward is the identity)", t=t)
        if not torch.allclose(got, want, atol=1e-5):
            return say("the gradient of {name} is wrong (up to {most:.3g} off)", name=name,
                       most=(got - want).abs().max().item())
    if r.get("untracked"):
        return say("the result is right, but the all-reduce is one autograd cannot see (an in-place "
                   "torch.distributed collective): PyTorch lets the gradient through unchanged and warns that this "
                   "is deprecated; use the package's operator for it, so that backward is the one you chose")
    return None


def check_row_parallel_forward(fn, world_size: int = 2) -> Passed:
    """Chapter 05: ``fn(layer, x)`` as ``RowParallelLinear.forward`` on ``world_size`` ranks, against the
    dense layer: the output, one all-reduce, and the gradients of the weight and bias slices."""
    if not callable(fn):
        raise TypeError(say("fn must be a function row_parallel_forward(layer, x); got {kind}", kind=type(fn).__name__))
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 2 <= world_size <= IN or IN % world_size:
        raise ValueError(say("world_size must be an int >= 2 dividing {features}; got {world_size!r}", features=IN,
                             world_size=world_size))
    per_rank = parlab.launch(_row_parallel_on_rank, world_size=world_size, args=(fn,), announce=False, output="all")
    for rank, r in enumerate(per_rank):
        problem = _diagnose(r, world_size)
        if problem:
            raise ExerciseFailed(say("row_parallel_forward on rank {rank} of {world_size}: {problem}", rank=rank,
                                     world_size=world_size, problem=problem))
    return Passed(say("the row-parallel layer matches the dense one on {world_size} ranks, output and gradients, "
                      "with one all-reduce", world_size=world_size))


# -- where do the collectives go? -------------------------------------------------------------------------

COPIED = later.say("work out what each rank holds at each boundary, and what the next layer needs")

NEEDS = {"column": "whole", "row": "split"}  # what each layer needs on every rank
GIVES = {"column": "split", "row": "partial"}  # what it leaves there
OPS = ("none", "split", "all_gather", "all_reduce", "reduce_scatter")


def _reference_tp_collectives(splits: list[str]) -> list[str]:
    """The op at each boundary of a chain of tensor-parallel linear layers (elementwise activations
    between them): before the first, between each pair, after the last (whose output must be whole)."""
    move = {  # (what a rank holds, what comes next needs) -> the op in forward
        ("whole", "whole"): "none", ("whole", "split"): "split", ("split", "whole"): "all_gather",
        ("split", "split"): "none", ("partial", "whole"): "all_reduce", ("partial", "split"): "reduce_scatter",
    }
    return [move[held, need] for held, need in _states(splits)]


def _states(splits):
    """(what each rank holds, what comes next needs) at each boundary."""
    held = ["whole"] + [GIVES[s] for s in splits]
    return list(zip(held, [NEEDS[s] for s in splits] + ["whole"]))


CASES = (["column", "row"], ["column"], ["row"], ["column", "column"], ["row", "row"], ["row", "column"],
         ["column", "row", "column", "row"], ["row", "column", "column", "row"])


def check_tp_collectives(fn) -> Passed:
    """Chapter 05: ``fn(splits)`` must return, for a chain such as ``["column", "row"]``, one op per
    boundary (len(splits) + 1 of them), each one of ``OPS``."""
    if not callable(fn):
        raise TypeError(say("fn must be a function tp_collectives(splits); got {kind}", kind=type(fn).__name__))
    draw = random.Random()  # and chains new at every call: a table computed over the fixed ones fails
    cases = list(CASES)
    while len(cases) < len(CASES) + 3:
        chain = [draw.choice(("column", "row")) for _ in range(draw.randrange(2, 7))]
        cases += [] if chain in cases else [chain]
    for splits in cases:
        want, states = _reference_tp_collectives(splits), _states(splits)
        try:
            with refusing("ch05.2", say(COPIED)):
                got = fn(list(splits))
        except NotImplementedError:
            raise ExerciseFailed(say("tp_collectives is not written yet (it raises NotImplementedError)")) from None
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            raise ExerciseFailed(say("tp_collectives({splits}) returned {got!r}: expected a list of {ops} ops, one per "
                                     "boundary (before the first layer, between layers, after the last)",
                                     splits=splits, got=got, ops=len(want)))
        for i, (g, w, (held, need)) in enumerate(zip(got, want, states)):
            if g not in OPS:
                raise ExerciseFailed(say("tp_collectives({splits})[{i}] = {got!r} is not one of {ops}", splits=splits,
                                         i=i, got=g, ops=OPS))
            if g != w:
                where = (say("before the first layer") if i == 0 else say("after the last layer") if i == len(splits)
                         else say("between {before} and {after}", before=splits[i - 1], after=splits[i]))
                holds = {"whole": say("the whole tensor"), "split": say("its slice of the features"),
                         "partial": say("a partial sum")}
                raise ExerciseFailed(say("tp_collectives({splits}): {where} you said {got!r}, but there each rank "
                                         "holds {held} and what follows needs {need}", splits=splits, where=where,
                                         got=g, held=holds[held], need=holds[need]))
    return Passed(say("tp_collectives agrees with the reference on all {cases} chains, 3 of them drawn anew",
                      cases=len(cases)))


# -- think: what sequence parallelism costs and why ----------------------------------------------------------

#: (b) why, under sequence parallelism, a LayerNorm's weight gradients are summed over the ranks
NORM_CHOICES = {
    "a": (later.say("the LayerNorm's weights are split across the ranks, so each holds a slice of the gradient"),
          later.say("Every rank holds the whole LayerNorm weight (it is replicated, not split); what differs is the "
                    "input.")),
    "b": later.say("each rank's LayerNorm sees only its s/t tokens, so its gradient is a partial sum over the tokens"),
    "c": (later.say("the all-gather before the column-parallel layer changes the LayerNorm's gradient"),
          later.say("The all-gather's backward is a reduce-scatter of the activation gradient; it does not touch the "
                    "weight gradient's sum over tokens.")),
}
#: (c) why transformers' literal plan (one f per projection) sends no more all-reduces forward
LITERAL_CHOICES = {
    "a": later.say("f is the identity forward: its all-reduce runs only in backward"),
    "b": (later.say("PyTorch fuses the separate f's of Q, K and V into one all-reduce forward"),
          later.say("Nothing is fused: count the forward collectives a single f adds first.")),
    "c": (later.say("the literal plan splits Q, K and V by rows, which needs no forward all-reduce"),
          later.say("The literal plan splits Q, K and V by columns (colwise), like Megatron's.")),
}


def _recompute_answer(batch, seq_len, hidden, tp_size):
    per_input = batch * seq_len * hidden * 4  # fp32
    return 2 * per_input * (tp_size - 1) // tp_size, 2


def check_sp_costs(saved_and_gathers, norms: str, literal: str) -> Passed:
    """Chapter 05, exercise 3. ``saved_and_gathers(batch, seq_len, hidden, tp_size)`` → (bytes of activations
    per GPT-2 layer and rank that Megatron saves by keeping only its sequence chunk of the column-parallel
    layers' gathered inputs (fp32), all-gathers that adds per layer in backward); ``norms`` and ``literal``:
    the letters of :data:`NORM_CHOICES` and :data:`LITERAL_CHOICES` that answer (b) and (c)."""
    if not callable(saved_and_gathers):
        raise TypeError(say("saved_and_gathers must be a function (batch, seq_len, hidden, tp_size) -> (bytes, count)"))
    for case in ({"batch": 4, "seq_len": 32, "hidden": 64, "tp_size": 4}, {"batch": 2, "seq_len": 48, "hidden": 96,
                                                                             "tp_size": 2},
                 {"batch": 1, "seq_len": 4096, "hidden": 8192, "tp_size": 8}):
        want = _recompute_answer(**case)
        with refusing("ch05.3", say("the exercise asks for the bytes worked out yourself, not the check's own "
                                    "answer")):
            got = call_in_order(saved_and_gathers, _recompute_answer, case)
        args = ", ".join(f"{k}={v}" for k, v in case.items())
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            raise ExerciseFailed(say("{fn}({args}) returned {got!r:.60}: return (bytes, all-gathers)",
                                     fn=_name(saved_and_gathers), args=args, got=got))
        if got[0] != want[0]:
            t = case["tp_size"]
            hint = (say(" (half of it: the values are fp32, 4 bytes each, and GPT-2's layer has two column-parallel "
                        "inputs, c_attn's and c_fc's)") if got[0] * 2 == want[0] else
                    say(" (each rank keeps s/t of the tokens: it saves (t − 1)/t of each)")
                    if got[0] == want[0] * t // (t - 1) else
                    say(" (that is {t} times too much, multiplied by t = tp_size: seq_len is the whole sequence, so a "
                        "gathered input is batch·seq_len·hidden values and each rank's chunk 1/t of it; you counted "
                        "as if seq_len were the chunk, and saved (t − 1) chunks of it)", t=t)
                    if got[0] == want[0] * t else "")
            raise ExerciseFailed(say("{fn}({args}): {got!r} bytes saved; expected {expected:,}{hint}",
                                     fn=_name(saved_and_gathers), args=args, got=got[0], expected=want[0], hint=hint))
        if got[1] != want[1]:
            raise ExerciseFailed(say("{fn}({args}): {got!r} all-gathers added per layer; each gathered input is "
                                     "gathered again once in backward: expected {expected}",
                                     fn=_name(saved_and_gathers), args=args, got=got[1], expected=want[1]))
    check_choice(say("(b) norms"), norms, NORM_CHOICES, "b")
    check_choice(say("(c) literal"), literal, LITERAL_CHOICES, "a")
    return Passed(say("sequence parallelism's costs: the bytes saved, the all-gathers added, and both reasons"))
