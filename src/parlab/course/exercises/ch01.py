"""Chapter 01's exercises: what a gated MLP keeps for backward (checked against a measurement), how a GPT
layer's activations scale with the micro-batch and the sequence (Korthikanti et al. 2022), and the largest
model whose states fit a GPU under ZeRO (Rajbhandari et al. 2020).

While the learner's function runs, the package's own answers (the measurement, the estimator, the
reference functions here, each listed in ``core.ANSWERS``) are refused however the function reaches them
(:func:`~parlab.course.exercises.core.refusing`)."""

from __future__ import annotations

import math
import random

import torch
from torch import nn

from parlab.course.exercises.core import ExerciseFailed, Passed, _name, call_in_order, refusing
from parlab.lab.language import say


class GatedReLUMLP(nn.Module):
    """``down(relu(gate(x)) * up(x))``: (s, b, h) -> (s, b, i) -> (s, b, h), no biases."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down(torch.relu(self.gate(x)) * self.up(x))


MLP_CASES = [dict(s=16, b=2, h=32, i=96, bytes_per_value=4), dict(s=64, b=1, h=48, i=128, bytes_per_value=4),
             dict(s=32, b=3, h=64, i=64, bytes_per_value=2)]


def _measured_mlp_bytes(s, b, h, i, bytes_per_value):
    from parlab.lab.measure import measure_activations

    dtype = {4: torch.float32, 2: torch.bfloat16}[bytes_per_value]
    torch.manual_seed(0)
    mlp = GatedReLUMLP(h, i).to(dtype)
    x = torch.randn(s, b, h, dtype=dtype, requires_grad=True) * 1  # (s, b, h), an op's output as in a model
    return measure_activations(mlp, x)


def _with_a_fresh_case(cases: list[dict], draw) -> list[dict]:
    """The fixed cases and one drawn anew at every check: a table of answers copied from the check's own
    messages cannot pass it."""
    return cases + [draw(random.Random())]


def check_gated_mlp_bytes(fn) -> Passed:
    """Chapter 01: ``fn(s, b, h, i, bytes_per_value)`` → the bytes a gated ReLU MLP,
    ``down(relu(gate(x)) * up(x))``, keeps for backward, its input ``x`` included; checked against
    ``measure_activations`` in fp32 and bf16 over three cases and one drawn anew (``fn`` may not call the
    measurement: count the tensors yourself)."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote", fn=fn))
    cases = _with_a_fresh_case(MLP_CASES, lambda r: dict(s=r.randrange(8, 49), b=r.randrange(1, 4),
                                                          h=8 * r.randrange(2, 9), i=8 * r.randrange(2, 17),
                                                          bytes_per_value=r.choice((2, 4))))
    for case in cases:
        measured = _measured_mlp_bytes(**case)
        with refusing("ch01.1", say("the exercise asks you to count the tensors yourself (activation_saves tells "
                                    "you what ReLU keeps), not to measure or estimate them")):
            got = call_in_order(fn, _measured_mlp_bytes, case)
        if got == measured:
            continue
        s, b, h, i, d = case.values()
        args = ", ".join(f"{k}={v}" for k, v in case.items())
        hint = ""
        if got == measured + d * s * b * i:
            hint = say(" You counted one s·b·i tensor too many: ask activation_saves what ReLU keeps, and which "
                       "tensors are the same storage.")
        elif got == measured - d * s * b * h:
            hint = say(" The input x is kept too (by the gate and up projections: one tensor).")
        elif isinstance(got, (int, float)) and got and measured % got == 0:
            hint = say(" Check the bytes per value: the case may be bf16.")
        raise ExerciseFailed(say("{fn}({args}) = {got!r}; measured {measured:,} bytes.{hint}", fn=_name(fn),
                                 args=args, got=got, measured=measured, hint=hint))
    return Passed(say("{fn} matches what autograd keeps in all {cases} cases", fn=_name(fn), cases=len(cases)))


def _layer_bytes(s, b, h, a):
    # Korthikanti et al. 2022, §4.1: one GPT layer with dropout, 16-bit values, 1-byte masks
    return s * b * h * (34 + 5 * a * s / h)


SCALING_CASES = [dict(h=1600, a=25, s=1024, b=8), dict(h=4096, a=32, s=4096, b=1), dict(h=768, a=12, s=512, b=4),
                 dict(h=12288, a=96, s=2048, b=1), dict(h=64, a=4, s=128, b=2)]


def check_activation_scaling(fn) -> Passed:
    """Chapter 01: ``fn(h, a, s, b)`` → ``(by_batch, by_sequence)``: by what factor one GPT layer's
    activations (Korthikanti et al.'s count) shrink when the micro-batch ``b`` is halved, and when the
    sequence ``s`` is halved instead. Checked to 0.1 % over five layers, from a tiny one to GPT-3's, and one
    drawn anew."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote", fn=fn))
    cases = _with_a_fresh_case(SCALING_CASES, lambda r: dict(h=64 * r.randrange(1, 65), a=r.choice((4, 8, 16, 32)),
                                                              s=128 * r.randrange(1, 65), b=r.randrange(1, 9)))
    for case in cases:
        s, b, h, a = case["s"], case["b"], case["h"], case["a"]
        full = _layer_bytes(s, b, h, a)
        expected = (full / _layer_bytes(s, b / 2, h, a), full / _layer_bytes(s / 2, b, h, a))
        try:
            with refusing("ch01.2", say("the exercise asks for the factors worked out from the formula "
                                        "s·b·h·(34 + 5·a·s/h), not taken from the estimator")):
                got = call_in_order(fn, ("h", "a", "s", "b"), case)
        except ExerciseFailed as failure:
            if isinstance(getattr(failure, "raised", None), ZeroDivisionError) and b == 1:
                raise ExerciseFailed(say("{failure}\nAt b=1, b // 2 is 0: a micro-batch of 1 halved is b / 2 = 0.5 in "
                                         "the formula (the factor is a ratio of two counts, not a batch you run).",
                                         failure=failure)) from None
            raise
        ok = (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(g, (int, float)) for g in got)
              and all(math.isclose(g, e, rel_tol=1e-3) for g, e in zip(got, expected)))
        if not ok:
            args = ", ".join(f"{k}={v}" for k, v in case.items())
            hint = ""
            if isinstance(got, (tuple, list)) and len(got) == 2 and math.isclose(got[1], 2, rel_tol=1e-3):
                hint = say(" Halving s halves the 34·s·b·h part, but the attention scores, 5·a·s²·b, are s × s: "
                           "they shrink four times.")
            raise ExerciseFailed(say("{fn}({args}): expected ({by_batch:.4g}, {by_sequence:.4g}), got {got!r:.60}."
                                     "{hint}", fn=_name(fn), args=args, by_batch=expected[0],
                                     by_sequence=expected[1], got=got, hint=hint))
    return Passed(say("{fn} predicts both factors for all {cases} layers", fn=_name(fn), cases=len(cases)))


def _per_param_bytes(n_d, stage, k=12, grad_bytes=2):
    # mixed precision (ZeRO's accounting): 2 bytes of weight, grad_bytes of gradient (2 in bf16, 4 kept in
    # fp32), k of optimizer state
    return (2 / (n_d if stage >= 3 else 1) + grad_bytes / (n_d if stage >= 2 else 1)
            + k / (n_d if stage >= 1 else 1))


def _max_params(gpu_gb, n_d, stage, k=12, grad_bytes=2):
    return gpu_gb * 1e9 / _per_param_bytes(n_d, stage, k, grad_bytes)


MAX_PARAMS_CASES = ([dict(gpu_gb=g, n_d=nd, stage=s) for g in (24, 80) for nd in (1, 8, 64) for s in range(4)]
                    + [dict(gpu_gb=80, n_d=16, stage=s, k=k) for s in range(4) for k in (4, 8)]
                    # fp32 gradients: 2-byte weights and 4-byte gradients, so a total tells which one a stage shards
                    + [dict(gpu_gb=80, n_d=8, stage=s, k=12, grad_bytes=4) for s in range(4)])


def check_max_params(fn) -> Passed:
    """Chapter 01: ``fn(gpu_gb, n_d, stage, k=12, grad_bytes=2)`` → the most parameters whose mixed-precision
    model states (ZeRO's accounting: 2 bytes of weight, ``grad_bytes`` of gradient, K of optimizer state) fit in
    ``gpu_gb`` GB per GPU with ZeRO ``stage`` over ``n_d`` data-parallel GPUs; activations ignored. Checked to
    1% over GPU sizes, stages, degrees, K and fp32 gradients (whose 4 bytes tell a stage that shards the
    gradients from one that shards the 2-byte weights), and one case drawn anew, without the estimator."""
    if not callable(fn):
        raise TypeError(say("fn={fn!r} must be the function you wrote", fn=fn))
    cases = _with_a_fresh_case(MAX_PARAMS_CASES, lambda r: dict(gpu_gb=r.randrange(8, 200), n_d=r.randrange(2, 513),
                                                                 stage=r.randrange(4), k=r.choice((4, 8, 12))))
    for case in cases:
        expected = _max_params(**case)
        with refusing("ch01.3", say("the exercise asks for the bytes per parameter worked out yourself, not the "
                                    "estimator's")):
            got = call_in_order(fn, _max_params, case)
        if not isinstance(got, (int, float)) or not math.isclose(got, expected, rel_tol=0.01):
            args = ", ".join(f"{k}={v!r}" for k, v in case.items())
            raise ExerciseFailed(say("{fn}({args}): expected {expected:.4g}, got {got}.{hint}", fn=_name(fn),
                                     args=args, expected=expected, got=f"{got!r:.12}".rstrip("."),
                                     hint=_max_params_mistake(got, **case)))
    return Passed(say("{fn} agrees with the reference on all {cases} cases", fn=_name(fn), cases=len(cases)))


def _max_params_mistake(got, gpu_gb, n_d, stage, k=12, grad_bytes=2) -> str:
    """The hint naming the mistake ``got`` makes, when it is one a learner makes (units, sharding, K), else ''."""
    if not isinstance(got, (int, float)) or isinstance(got, bool) or not got > 0:
        return ""
    right = _max_params(gpu_gb, n_d, stage, k, grad_bytes)
    stages = {1: say("the optimizer state"), 2: say("the optimizer state and the gradients"),
              3: say("the optimizer state, the gradients and the weights")}
    mistakes = [
        (right / 1e9, say(" That is 10⁹ times too few: gpu_gb is in GB, so the GPU holds gpu_gb × 10⁹ bytes, and "
                          "the answer is a number of parameters, not billions.")),
        (right * 1e9, say(" That is 10⁹ times too many: divide the GPU's bytes, gpu_gb × 10⁹, by the bytes per "
                          "parameter.")),
        (right * 2**30 / 1e9, say(" You took a GB as 2³⁰ bytes (a GiB): a GPU's GB here, as in ZeRO's paper, is "
                                  "10⁹ bytes.")),
        (gpu_gb * 1e9 / (4 / (n_d if stage >= 3 else 1) + 4 / (n_d if stage >= 2 else 1) + k / (n_d if stage >= 1
                                                                                                  else 1)),
         say(" You counted 4 bytes each for the weights and gradients: in mixed precision they are 2 each (bf16), "
             "and the fp32 copy is part of the K bytes of optimizer state.")),
    ]
    if k != 12:
        mistakes.append((_max_params(gpu_gb, n_d, stage, 12, grad_bytes),
                         say(" That is for K = 12: this case has k={k} bytes of optimizer state per parameter.",
                             k=k)))
    if grad_bytes != 2:
        if stage == 2:  # the weights and the gradients swapped: only unequal bytes tell them apart
            mistakes.append((gpu_gb * 1e9 / (2 / n_d + grad_bytes + k / n_d),
                             say(" You sharded the weights instead of the gradients: stage 2 divides the gradients "
                                 "(grad_bytes={grad_bytes} each here) and the optimizer state over the n_d={n_d} "
                                 "GPUs; every GPU keeps its whole 2-byte weights until stage 3.",
                                 grad_bytes=grad_bytes, n_d=n_d)))
        mistakes.append((_max_params(gpu_gb, n_d, stage, k),
                         say(" That is for 2-byte gradients: this case keeps them in fp32, grad_bytes={grad_bytes} "
                             "bytes per parameter.", grad_bytes=grad_bytes)))
    for other in range(4):
        if other != stage:
            mistakes.append((_max_params(gpu_gb, n_d, other, k, grad_bytes),
                             say(" That is what fits at stage {other}: stage {stage} shards {sharded} over the "
                                 "n_d={n_d} GPUs.", other=other, stage=stage, sharded=stages[stage], n_d=n_d)
                             if stage else
                             say(" That is what fits at stage {other}: stage {stage} shards nothing, so n_d does "
                                 "not matter.", other=other, stage=stage)))
    for value, hint in mistakes:
        if not math.isclose(value, right, rel_tol=0.01) and math.isclose(got, value, rel_tol=0.01):
            return hint
    return ""


def check_largest_models(one_gpu: float, zero3_64: float) -> Passed:
    """Chapter 01, the question after ``max_params``: on 80 GB GPUs, the largest model (in billions of
    parameters) whose mixed-precision Adam states fit one GPU, and the largest that fits 64 GPUs with ZeRO-3.
    Within 2 %."""
    expected = (_max_params(80, 1, 0) / 1e9, _max_params(80, 64, 3) / 1e9)
    for what, got, want in (("one_gpu", one_gpu, expected[0]), ("zero3_64", zero3_64, expected[1])):
        if not isinstance(got, (int, float)) or not math.isclose(got, want, rel_tol=0.02):
            hint = say(" (in billions of parameters, e.g. 7 for a 7 B model)") if isinstance(got, (int, float)) \
                and got > 1e6 else ""
            raise ExerciseFailed(say("{what} = {got!r:.12}: not the largest model that fits{hint}. How many bytes "
                                     "per parameter stay on one GPU, and how many bytes does it have?", what=what,
                                     got=got, hint=hint))
    return Passed(say("one 80 GB GPU holds the states of {one_gpu:.3g} B parameters; 64 with ZeRO-3, "
                      "{zero3_64:.3g} B: ZeRO-3 multiplies it by N_d", one_gpu=expected[0], zero3_64=expected[1]))
