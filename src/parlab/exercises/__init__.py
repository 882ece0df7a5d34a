"""Checks for the learner's exercises, by chapter; ``core`` is the checker they all use.

- ``core``: :func:`check_ranks` (a function on N ranks against a reference), :func:`check_function`
  (plain functions over cases), :func:`first_difference`, :class:`Passed`, :class:`ExerciseFailed`.
- ``ch00``: :func:`check_mean_over_ranks`.   ``ch01``: :func:`check_zero_memory`.
- ``ch02``: :func:`check_ring_all_reduce`.   ``ch03``: :func:`check_average_gradients`.
- ``ch04``: :func:`check_flat_sharding`, :func:`check_peak_gathered`, :func:`check_smallest_stage`.
- ``ch05``: :func:`check_row_parallel_forward`, :func:`check_tp_collectives`.
- ``ch06``: :func:`check_one_f_one_b_order`, :func:`check_smallest_micro_batches`, :func:`check_peak_activations`.
- ``ch07``: :func:`check_group_ranks`, :func:`check_model_states`, :func:`check_layout_choice`.

Each check passes the package's reference answer and fails a planted wrong one with a precise message
(``tests/test_exercises.py``). A new chapter adds its own module here and one import line below.
"""

from parlab.exercises.ch00 import check_mean_over_ranks
from parlab.exercises.ch01 import check_zero_memory
from parlab.exercises.ch02 import check_ring_all_reduce
from parlab.exercises.ch03 import check_average_gradients, reference_average_gradients
from parlab.exercises.ch04 import check_flat_sharding, check_peak_gathered, check_smallest_stage
from parlab.exercises.ch05 import check_row_parallel_forward, check_tp_collectives, reference_tp_collectives
from parlab.exercises.ch06 import check_one_f_one_b_order, check_peak_activations, check_smallest_micro_batches
from parlab.exercises.ch07 import check_group_ranks, check_layout_choice, check_model_states
from parlab.exercises.core import ExerciseFailed, Passed, check_function, check_ranks, first_difference

__all__ = ["ExerciseFailed", "Passed", "check_function", "check_ranks", "first_difference",
           "check_mean_over_ranks", "check_zero_memory", "check_ring_all_reduce", "check_average_gradients",
           "reference_average_gradients", "check_flat_sharding", "check_peak_gathered", "check_smallest_stage",
           "check_row_parallel_forward", "check_tp_collectives", "reference_tp_collectives",
           "check_one_f_one_b_order", "check_peak_activations", "check_smallest_micro_batches",
           "check_group_ranks", "check_model_states", "check_layout_choice"]
