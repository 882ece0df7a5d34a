"""Checks for the learner's exercises, by chapter; ``core`` is the checker they all use.

- ``core``: :func:`check_ranks`, :func:`check_function`, :func:`check_choice` (a function on N ranks against
  a reference; plain functions over cases; a choice), :func:`first_difference`, :class:`Passed`,
  :class:`ExerciseFailed`; and the one refusal: :data:`~parlab.course.exercises.core.ANSWERS` names the package
  functions that answer each exercise, :func:`refusing` makes their code fail the check while the learner's runs.
- ``ch00``: :func:`check_my_slice`, :func:`check_hang_prediction`.
- ``ch01``: :func:`check_gated_mlp_bytes`, :func:`check_activation_scaling`, :func:`check_max_params`,
  :func:`check_largest_models`.
- ``ch02``: :func:`check_recursive_doubling`, :func:`check_crossover_bytes`, :func:`check_send_buffer`,
  :func:`check_below_crossover`.
- ``ch03``: :func:`check_weighted_average`, :func:`check_ddp_buckets`, :func:`check_early_buckets`.
- ``ch04``: :func:`check_reduce_to_owners`, :func:`check_peak_gathered`, :func:`check_accumulation_volume`,
  :func:`check_keep_gathered`.
- ``ch05``: :func:`check_row_parallel_forward`, :func:`check_tp_collectives`, :func:`check_sp_costs`.
- ``ch06``: :func:`check_one_f_one_b_order`, :func:`check_smallest_micro_batches`,
  :func:`check_peak_activations`, :func:`check_message_cost`, :func:`check_interleave_tradeoff`.
- ``ch07``: :func:`check_group_ranks`, :func:`check_model_states`, :func:`check_layout_choice`.
- ``ch08``: :func:`check_sharded_training`.
- ``ch09``: :func:`check_culprit`, :func:`check_mfu`.
- ``ch10``: :func:`check_online_softmax_combine`, :func:`check_received`, :func:`check_dispatch_plan`.

Each check passes the reference answer and fails a planted wrong one with a precise message
(``tests/test_exercises.py``). The chapters do not contain the answers; their solutions sit in collapsed
``solution`` cells that only define them. A new check goes in its chapter's module, its name in ``_WHERE``
below (and in ``__all__``), the package functions that answer it in ``core.ANSWERS``, and a planted wrong
answer in ``tests/test_exercises.py``.
"""

import importlib

# Lazy: importing ``parlab.course.exercises`` does not pull in every chapter's checks (and what they import).
_WHERE = {name: module for module, names in {
    "ch00": ["check_hang_prediction", "check_my_slice"],
    "ch01": ["check_activation_scaling", "check_gated_mlp_bytes", "check_largest_models", "check_max_params"],
    "ch02": ["check_below_crossover", "check_crossover_bytes", "check_recursive_doubling", "check_send_buffer"],
    "ch03": ["check_ddp_buckets", "check_early_buckets", "check_weighted_average"],
    "ch04": ["check_accumulation_volume", "check_keep_gathered", "check_peak_gathered", "check_reduce_to_owners"],
    "ch05": ["check_row_parallel_forward", "check_sp_costs", "check_tp_collectives"],
    "ch06": ["check_interleave_tradeoff", "check_message_cost", "check_one_f_one_b_order", "check_peak_activations", "check_smallest_micro_batches"],
    "ch07": ["check_group_ranks", "check_layout_choice", "check_model_states"],
    "ch08": ["check_sharded_training"],
    "ch09": ["check_culprit", "check_mfu"],
    "ch10": ["check_dispatch_plan", "check_online_softmax_combine", "check_received"],
    "core": ["ExerciseFailed", "Passed", "check_choice", "check_function", "check_ranks", "first_difference",
             "ANSWERS", "refusing", "refused_answers", "without", "record_group"],
}.items() for name in names}


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f"parlab.course.exercises.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'parlab.course.exercises' has no attribute {name!r}")


__all__ = ["ExerciseFailed", "Passed", "check_function", "check_ranks", "first_difference", "check_choice",
           "ANSWERS", "refusing", "refused_answers", "without", "record_group",
           "check_my_slice", "check_hang_prediction", "check_gated_mlp_bytes", "check_activation_scaling",
           "check_max_params", "check_largest_models", "check_recursive_doubling", "check_crossover_bytes",
           "check_send_buffer", "check_below_crossover", "check_weighted_average", "check_ddp_buckets",
           "check_early_buckets", "check_reduce_to_owners", "check_peak_gathered",
           "check_accumulation_volume", "check_keep_gathered", "check_row_parallel_forward",
           "check_tp_collectives", "check_sp_costs", "check_one_f_one_b_order",
           "check_smallest_micro_batches", "check_peak_activations", "check_message_cost",
           "check_interleave_tradeoff", "check_group_ranks", "check_model_states", "check_layout_choice",
           "check_sharded_training", "check_culprit", "check_mfu", "check_online_softmax_combine", "check_received",
           "check_dispatch_plan"]
