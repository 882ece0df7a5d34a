"""Chapter 01's exercises: what a gated MLP keeps for backward (checked against a measurement), and the
largest model whose states fit a GPU under ZeRO (Rajbhandari et al. 2020)."""

from __future__ import annotations

import torch
from torch import nn

from parlab.exercises.core import ExerciseFailed, Passed, _name, check_function


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
    from parlab.measure import measure_activations

    dtype = {4: torch.float32, 2: torch.bfloat16}[bytes_per_value]
    torch.manual_seed(0)
    mlp = GatedReLUMLP(h, i).to(dtype)
    x = torch.randn(s, b, h, dtype=dtype, requires_grad=True) * 1  # (s, b, h), an op's output as in a model
    return measure_activations(mlp, x)


def check_gated_mlp_bytes(fn) -> Passed:
    """Chapter 01: ``fn(s, b, h, i, bytes_per_value)`` → the bytes a gated ReLU MLP,
    ``down(relu(gate(x)) * up(x))``, keeps for backward, its input ``x`` included; checked against
    ``measure_activations`` in fp32 and bf16."""
    if not callable(fn):
        raise TypeError(f"fn={fn!r} must be the function you wrote")
    for case in MLP_CASES:
        measured, got = _measured_mlp_bytes(**case), fn(**case)
        if got == measured:
            continue
        s, b, h, i, d = case.values()
        args = ", ".join(f"{k}={v}" for k, v in case.items())
        hint = ""
        if got == measured + d * s * b * i:
            hint = (" You counted one s·b·i tensor too many: ask activation_saves what ReLU keeps, and which "
                    "tensors are the same storage.")
        elif got == measured - d * s * b * h:
            hint = " The input x is kept too (by the gate and up projections: one tensor)."
        elif isinstance(got, (int, float)) and got and measured % got == 0:
            hint = " Check the bytes per value: the case may be bf16."
        raise ExerciseFailed(f"{_name(fn)}({args}) = {got!r}; measured {measured:,} bytes.{hint}")
    return Passed(f"{_name(fn)} matches what autograd keeps in all {len(MLP_CASES)} cases")


def _per_param_bytes(n_d, stage, k=12):
    # mixed precision (ZeRO's accounting): 2 bytes of weight, 2 of gradient, k of optimizer state
    return 2 / (n_d if stage >= 3 else 1) + 2 / (n_d if stage >= 2 else 1) + k / (n_d if stage >= 1 else 1)


def _max_params(gpu_gb, n_d, stage, k=12):
    return gpu_gb * 1e9 / _per_param_bytes(n_d, stage, k)


def check_max_params(fn) -> Passed:
    """Chapter 01: ``fn(gpu_gb, n_d, stage, k=12)`` → the most parameters whose mixed-precision model states
    (ZeRO's accounting: 2 + 2 + K bytes each) fit in ``gpu_gb`` GB per GPU with ZeRO ``stage`` over ``n_d``
    data-parallel GPUs; activations ignored. Checked to 1% over GPU sizes, stages, degrees and K."""
    cases = [dict(gpu_gb=g, n_d=nd, stage=s) for g in (24, 80) for nd in (1, 8, 64) for s in range(4)]
    cases += [dict(gpu_gb=80, n_d=16, stage=s, k=k) for s in range(4) for k in (4, 8)]
    return check_function(fn, _max_params, cases)


