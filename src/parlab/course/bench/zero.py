"""ZeRO's stages (``parlab.lab.parallel.zero``) beside PyTorch's DDP and FSDP2, as chapter 04 runs them.

- :func:`train` (``zero_train.py``): the chapter's training run on each rank: any wrapper (the course's
  stages, or PyTorch's behind :class:`Wrapped`), its collectives, bytes, memory, a timeline, and the
  **reduced gradients of the first step** (:class:`FirstGradients`), which a parity check compares before
  Adam can hide a wrong scale; :func:`single_process`, the reference; :func:`margin`; :func:`plot_stage3_step`.
- :func:`measure` (``zero_measure.py``): step time and memory per rank, every implementation on the same model
  in the same ranks, timed in alternating rounds (chapter 04, sections 7 and 8; ``benchmarks/zero.py``);
  :func:`plot` draws them.
- :func:`time_apart` (``zero_model.py``; chapter 04, under the hood G): the compute that
  ``parlab.decide.planner.predict_dp_step`` takes, and what that model leaves out, each implementation timed alone
  and with its peers; the model's GPU predictions (:func:`gpu_step_times`, :func:`plot_gpu_model`).

Every name is importable from here, as ``from parlab.course.bench import zero as zero_bench`` uses them.
"""

from parlab.course.bench.zero_measure import KINDS, LABELS, PRESETS, make_model, measure, plot, prepare
from parlab.course.bench.zero_model import GPU_MODELS, gpu_compute, gpu_fitting, gpu_step_times, plot_gpu_model, time_apart
from parlab.course.bench.zero_train import FirstGradients, Wrapped, margin, plot_stage3_step, single_process, train

__all__ = ["KINDS", "LABELS", "PRESETS", "GPU_MODELS", "FirstGradients", "Wrapped", "gpu_compute", "gpu_fitting",
           "gpu_step_times", "make_model", "margin", "measure", "plot", "plot_gpu_model", "plot_stage3_step", "prepare",
           "single_process", "time_apart", "train"]
