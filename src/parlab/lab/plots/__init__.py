"""The course's pictures: every sequence of numbers the chapters measure is drawn with one of these.

- :func:`rank_tensors`   every rank's tensor before and after a collective (chapter 02)
- :func:`memory_bars`    stacked bytes per component (params, grads, DDP buckets, optimizer, activations) per bar
                         (chapter 01; ZeRO stages in 04)
- :func:`gantt`          per-rank timeline of compute / comm / idle events (chapters 02, 03, 06)
- :func:`bandwidth`      time, algbw and busbw against message size, with an α-β fit (chapter 02)
- :func:`pipeline`       a pipeline's forwards and backwards per rank, idle time, activations held (chapter 06)
- :func:`comm_bytes`     bytes per rank, one segment per op (chapter 03: DataParallel vs DDP)
- :func:`matmul_split`   a matrix product split by columns and by rows over the ranks (chapter 05)
- :func:`mesh`           which rank sits where on a mesh, and which ranks talk on each axis (chapter 07)
- :func:`step_through`   a mechanism that moves in steps: its first frame as a picture, a slider for the rest

The mechanisms, each drawn from the objects the chapter's next cell runs (the learner's pattern,
docs/course_design.md):

- ``ranks``         :func:`world` (the launcher, its ranks, their devices and values), :func:`hang` (who waits
                    in a collective) (chapter 00)
- ``model_states``  :func:`bytes_per_parameter`, :func:`zero_stages` (who holds which model state) (chapter 01)
- ``activations``   :func:`layer_saves` (what a block keeps for backward), :func:`checkpointing_steps` (01)
- ``decision_tree`` :func:`advice_tree`: the guide's rules as the tree ``parlab.decide.advice`` walks (01)
- ``ring``          :func:`ring_steps`: a ring all-reduce's 2(n−1) steps, from the ring's own schedule (02)
- ``cost_model``    :func:`alpha_beta`: the α-β model's two regimes (02); ``links``: :func:`gpu_links` (02)
- ``dataflow``      :func:`ddp_step`, :func:`dp_vs_ddp`: one step's data flow (03)
- ``buckets``       :func:`bucket_list`, :func:`layer_steps`: DDP's buckets, and their firing during backward (03)
- ``shards``        :func:`zero_steps`, :func:`draw_kept`: who holds which shard when, ZeRO stages 1–3 (04)
- ``slices``        :func:`linear_frames`, :func:`mlp_frames`, :func:`heads_frames`, :func:`vocab_frames`,
                    :func:`sequence_frames`: which rank holds which slice before and after each collective (05)
- ``pipeline_messages`` :func:`messages_at`, :func:`stage_boundaries`: what travels between stages, when (06)
- ``model_split``   :func:`model_on_mesh`; ``step_parts``: :func:`step_parts`; ``layout_choice``: :func:`decision`
                    (what each rank holds on a mesh; a step priced by part; every layout priced) (07)
- ``rank_holdings`` :func:`held_shards`, :func:`checkpoint_pieces`: each rank's shards, and its checkpoint's (08)
- ``launch_tree``   :func:`launch_trees`; ``collective_records``: :func:`records` (where ranks' records diverge);
                    ``step_memory``: :func:`over_a_step` (09)
- ``ring_attention`` :func:`ring_attention_steps`, :func:`ring_step_times`; ``experts``: :func:`dispatch_steps`,
                    :func:`expert_groups`, :func:`kept_per_expert` (10)

One module per kind of picture: ``tensors`` (rank_tensors, matmul_split), ``memory`` (memory_bars),
``timeline`` (gantt), ``pipeline``, ``comm`` (bandwidth, comm_bytes), ``mesh``, and ``colors`` (the palette
they share); every name is importable from ``parlab.lab.plots`` as before.

Each returns the matplotlib ``Figure``; end the notebook line with ``;`` so it is drawn once.
``memory_bars(..., pyplot=False)`` makes a plain ``Figure`` that pyplot never sees: a widget callback,
which JupyterLab's kernel subshells run on another thread than the cells, draws that way.
"""

from parlab.lab.plots.activations import checkpointing_steps, layer_saves
from parlab.lab.plots.buckets import bucket_list, layer_steps
from parlab.lab.plots.colors import KIND_COLORS, MEMORY_COLORS, PIPELINE_COLORS
from parlab.lab.plots.comm import bandwidth, comm_bytes
from parlab.lab.plots.cost_model import alpha_beta
from parlab.lab.plots.dataflow import ddp_step, dp_vs_ddp
from parlab.lab.plots.decision_tree import advice_tree
from parlab.lab.plots.links import gpu_links
from parlab.lab.plots.memory import memory_bars
from parlab.lab.plots.mesh import AXIS_TALK, mesh
from parlab.lab.plots.model_states import bytes_per_parameter, zero_stages
from parlab.lab.plots.pipeline import pipeline
from parlab.lab.plots.ranks import hang, world
from parlab.lab.plots.ring import ring_steps
from parlab.lab.plots.shards import draw_kept, zero_steps
from parlab.lab.plots.collective_records import records
from parlab.lab.plots.experts import dispatch_steps, expert_groups, kept_per_expert
from parlab.lab.plots.launch_tree import launch_trees
from parlab.lab.plots.layout_choice import decision
from parlab.lab.plots.model_split import model_on_mesh
from parlab.lab.plots.pipeline_messages import messages_at, stage_boundaries
from parlab.lab.plots.rank_holdings import checkpoint_pieces, held_shards
from parlab.lab.plots.ring_attention import ring_attention_steps, ring_step_times
from parlab.lab.plots.slices import heads_frames, linear_frames, mlp_frames, sequence_frames, vocab_frames
from parlab.lab.plots.step_memory import over_a_step
from parlab.lab.plots.step_parts import step_parts
from parlab.lab.plots.steps import step_through
from parlab.lab.plots.tensors import matmul_split, rank_tensors
from parlab.lab.plots.timeline import LANES, gantt

__all__ = ["AXIS_TALK", "KIND_COLORS", "LANES", "MEMORY_COLORS", "PIPELINE_COLORS", "advice_tree", "alpha_beta",
           "bandwidth", "bucket_list", "bytes_per_parameter", "checkpoint_pieces", "checkpointing_steps",
           "comm_bytes", "ddp_step", "decision", "dispatch_steps", "dp_vs_ddp", "draw_kept", "expert_groups",
           "gantt", "gpu_links", "hang", "heads_frames", "held_shards", "kept_per_expert", "launch_trees",
           "layer_saves", "layer_steps", "linear_frames", "matmul_split", "memory_bars", "mesh", "messages_at",
           "mlp_frames", "model_on_mesh", "over_a_step", "pipeline", "rank_tensors", "records",
           "ring_attention_steps", "ring_step_times", "ring_steps", "sequence_frames", "stage_boundaries",
           "step_parts", "step_through", "vocab_frames", "world", "zero_stages", "zero_steps"]
