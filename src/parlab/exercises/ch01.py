"""Chapter 01's exercise: memory of model states per GPU under ZeRO (Rajbhandari et al. 2020, Table 1)."""

from __future__ import annotations

from parlab.exercises.core import Passed, check_function


def _zero_reference(num_params, n_d, stage, k=12):
    from parlab.measure import estimate_memory

    optimizer = {12: "adam", 8: "momentum", 4: "sgd"}[k]  # K = fp32 master (4) + optimizer state
    return estimate_memory(num_params=int(num_params), precision="bf16", optimizer=optimizer,
                           world_size=n_d, zero_stage=stage).total / 1e9


def check_zero_memory(fn) -> Passed:
    """Chapter 01's exercise: ``fn(num_params, n_d, stage, k=12)`` → GB of model states per GPU under
    ZeRO stage 0–3 with mixed precision (2 + 2 + K bytes per parameter), checked over the ZeRO paper's
    grid (Rajbhandari et al. 2020, Table 1) and K = 4, 8."""
    cases = [dict(num_params=psi, n_d=nd, stage=s) for psi in (7.5e9, 128e9) for nd in (1, 4, 64)
             for s in range(4)]
    cases += [dict(num_params=7.5e9, n_d=16, stage=s, k=k) for s in range(4) for k in (4, 8)]
    return check_function(fn, _zero_reference, cases)
