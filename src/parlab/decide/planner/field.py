"""Published runs of today's layouts (issue #52): FP8, context parallelism, mixtures of experts with expert
parallelism, HSDP, interleaved pipelines, on H100/H800, B200 and GB200, priced by the same
:func:`~parlab.decide.planner.step.predict` (``tests/test_planner_field.py``, ``docs/planner.md``).

The rows are data (:data:`~parlab.decide.planner.field_data.FIELD_RUNS`, each with its source); this module turns
each into a workload, a layout and a cluster, and names the rows each fitted constant was fitted on: the
Blackwells' share of peak (:data:`FITTED`), each generation's fixed cost per local expert
(:data:`EXPERT_FITTED`) and each implementation's share of TP hidden, PyTorch's async TP's and Transformer
Engine's (:data:`TP_OVERLAP_FITTED`). Every other row fitted nothing."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from parlab.decide.planner.field_data import FIELD_RUNS
from parlab.decide.planner.hardware import GPUS, Cluster, cluster_of
from parlab.decide.planner.layout import Layout
from parlab.decide.planner.published import baseline_step, baseline_utilization, median_root
from parlab.decide.planner.step import Prediction, predict
from parlab.decide.planner.workload import Workload

#: How each framework's runs are priced: its ZeRO implementation (Megatron-Core's distributed optimizer, FSDP2) and
#: Megatron-Bridge's gradients in bf16 (its performance configs set ``grad_reduce_in_fp32 = False``:
#: ``field_data.MB_NOTE``). What differs run by run (fused kernels, TP's and the all-to-alls' overlap, offloaded
#: layers) is in the row's own keys (``field_models``).
FRAMEWORKS = {"megatron": dict(implementation="megatron", grad_dtype="bf16"),
              "torchtitan": dict(implementation="course"),
              "meta": dict(implementation="megatron"),
              "deepseek": dict(implementation="megatron")}


@dataclass(frozen=True)
class FieldRun:
    """One published row of :data:`~parlab.decide.planner.field_data.FIELD_RUNS`, priced as its source ran it."""

    row: dict

    @property
    def name(self) -> str:
        return self.row["name"]

    @property
    def source(self) -> str:
        return self.row["source"]

    @property
    def generation(self) -> str:
        return self.cluster().gpu.generation

    @property
    def precision(self) -> str:
        return self.row["precision"]

    @property
    def step_s(self) -> float:
        """The published step: the global batch's tokens ÷ (tokens per second per GPU × GPUs)."""
        r = self.row
        return r["global_batch"] * r["seq_len"] / (r["tokens_per_s_per_gpu"] * r["gpus"])

    @property
    def layout(self) -> Layout:
        r = self.row
        zero = str(r.get("zero") or "ddp")
        stage = 0 if zero == "ddp" else 3 if zero.startswith(("fsdp", "hsdp", "zero3")) else 1
        shard = int(zero.split(":")[1]) if zero.startswith("hsdp:") else None
        return Layout(dp=r["dp"], tp=r["tp"], pp=r["pp"], cp=r["cp"], ep=r["ep"], etp=r.get("etp") or 1,
                      vp=r["vp"], zero_stage=stage, shard=shard,
                      cp_kind="all_gather" if r.get("cp_kind") == "all_gather" else "ring")

    def cluster(self, **changes) -> Cluster:
        kind = self.row["gpu"]
        per_node = 4 if kind == "gb200" else 8
        if self.row["framework"] == "torchtitan":  # its hosts' H100s (FIELD_RUNS' notes)
            changes = {"gpu": GPUS["h100_96"], **changes}
        return cluster_of(kind, max(1, self.row["gpus"] // per_node), **changes)

    def workload(self) -> Workload:
        import transformers

        r = self.row
        model = dict(r["model"])
        config = getattr(transformers, model.pop("class"))(**model)
        return Workload(config, global_batch=r["global_batch"], seq_len=r["seq_len"], micro_batch=r["micro_batch"],
                        precision=r["precision"], fp8_recipe=r.get("fp8_recipe") or "tensorwise",
                        fp8_gather=bool(r.get("fp8_gather")), recompute=r["recompute"], recompute_layers=r["recompute_layers"],
                        sequence_parallel=r["tp"] > 1,
                        attention="cudnn" if r["framework"] in ("megatron", "meta") else "sdpa", capacity_factor=r.get("capacity_factor"),
                        fused=r["fused"], offload_layers=r["offload_layers"])

    def options(self) -> dict:
        return {**FRAMEWORKS[self.row["framework"]], "tp_overlap": self.row["tp_overlap"],
                "ep_overlap": self.row["ep_overlap"]}

    def predict(self, cluster: Cluster | None = None, **options) -> Prediction:
        """The planner's prediction of this run on its hardware; ``options`` go to :func:`predict`."""
        return predict(self.workload(), self.layout, cluster or self.cluster(), **{**self.options(), **options})


#: The rows the one new constant of :data:`~parlab.decide.planner.hardware.UTILIZATIONS` was fitted on: the
#: Blackwells' share of peak, 0.56 (:func:`fitted_share`: 0.558), on the dense rows on the fewest GPUs at the
#: shortest sequence, the rule chosen before any other row was priced with it. A generation has one share, of the
#: peak of whatever precision its matrix products run in: FP8 reaches the same share of FP8 peak as bf16 of bf16
#: peak (so FP8's products run at most twice as fast, as the peaks say), and the H100's is chapter 07's (0.68,
#: fitted on MPT in bf16): no H100 row here, FP8 or bf16, fitted it. Every row not named here, in
#: :data:`EXPERT_FITTED` or in :data:`TP_OVERLAP_FITTED` fitted nothing.
FITTED = {"blackwell": ("Llama 3 8B, 8 GB200, FP8 current scaling", "Llama 3 8B, 8 GB200, MXFP8",
                        "Llama 3 8B, 8 B200, FP8 current scaling", "Llama 3 8B, 8 B200, MXFP8")}
#: The rows each generation's :data:`~parlab.decide.planner.hardware.EXPERT_SECONDS` was fitted on
#: (:func:`fitted_expert_seconds`): its MoE rows on the fewest GPUs. The term's form, a fixed cost per local expert
#: per layer and micro-batch, was chosen after the residuals of all 12 MoE rows were seen (``docs/planner.md``):
#: the other rows are out of sample for the constants, not for the form.
EXPERT_FITTED = {"blackwell": ("Qwen3 30B-A3B, 8 GB200, MXFP8", "Qwen3 30B-A3B, 8 B200, MXFP8"),
                 "h100": ("Qwen3 30B-A3B, 16 H100, FP8 current scaling",)}
#: The rows each implementation's share of TP hidden (:data:`~parlab.decide.planner.step.TP_OVERLAP_HIDDEN`) was
#: fitted on (:func:`fitted_tp_overlap`). PyTorch's async TP (``"course"``): torchtitan's two 70B runs that differ in
#: async TP alone. Their ratio, not either step, fixes it: 829 → 876 tokens/s per GPU, 5.7 % faster, where hiding
#: all of TP would have made it 38 %. Transformer Engine's overlap (``"megatron"``): Megatron-Bridge's four rows
#: with TP 4, at which the median of their predicted ÷ published steps is 1; its rows with TP 8 and TP 2 are held out.
TP_OVERLAP_FITTED = {"course": ("Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, Float8",
                                "Llama 3.1 70B, 256 H100, FSDP 32 x TP 8, Float8, async TP"),
                     "megatron": ("Llama 3.1 405B, 256 GB200, FP8 current scaling",
                                  "Llama 3.1 405B, 128 B200, FP8 current scaling, CP 2",
                                  "Llama 3.1 405B, 128 B200, MXFP8, CP 2",
                                  "Llama 3 70B, 64 H100, FP8 current scaling")}
#: Published runs that ran but that the planner says do not fit, each with what it leaves out (``docs/planner.md``).
DOES_NOT_FIT = {
    "GPT-OSS 120B, 64 H100, BF16": "unexplained: 119 GB of 80 at the printed micro-batch of 4 (the recipe preset at "
                                   "97ad8cc6f runs 1, where it fits at 63 GB but is priced 78 % slow; the printed "
                                   "gradient accumulation, 2, matches neither)",
}


def field_runs() -> tuple[FieldRun, ...]:
    """The rows of :data:`~parlab.decide.planner.field_data.FIELD_RUNS` whose time can be priced: those that publish
    tokens per second and name their micro-batch (Llama 3's Table 4 prints TFLOP/s with no FLOP count; DeepSeek-V3
    names no micro-batch)."""
    return tuple(FieldRun(row) for row in FIELD_RUNS if row["tokens_per_s_per_gpu"] and row["micro_batch"])


def runs_named(names) -> tuple[FieldRun, ...]:
    """The priced rows (:func:`field_runs`) called ``names``, in their order; a name no priced row has is refused."""
    by_name = {run.name: run for run in field_runs()}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise KeyError(f"no priced field run is named {unknown}: field_runs() lists the {len(by_name)} there are")
    return tuple(by_name[name] for name in names)


def fitted_names(generation: str) -> tuple[str, ...]:
    """The rows that fitted any of ``generation``'s constants: :data:`FITTED`'s, :data:`EXPERT_FITTED`'s and
    :data:`TP_OVERLAP_FITTED`'s."""
    overlap = tuple(run.name for names in TP_OVERLAP_FITTED.values() for run in runs_named(names)
                    if run.generation == generation)
    return FITTED.get(generation, ()) + EXPERT_FITTED.get(generation, ()) + overlap


def role(run: FieldRun) -> str:
    """``"fitted"`` where the run is in :func:`fitted_names`, else ``"held out"``."""
    return "fitted" if run.name in fitted_names(run.generation) else "held out"


def baseline_shares() -> dict:
    """The trivial model's constant per generation, fitted on every row any of the planner's constants was
    (:func:`fitted_names`): the Blackwells' on :data:`FITTED`'s, :data:`EXPERT_FITTED`'s and their
    :data:`TP_OVERLAP_FITTED` rows, the H100's on chapter 07's MPT rows (``baseline_utilization``),
    :data:`EXPERT_FITTED`'s and its :data:`TP_OVERLAP_FITTED` rows. One constant each, where the planner has two to
    four."""
    from parlab.decide.planner.published import H100_CALIBRATION_RUNS

    rows = {g: list(runs_named(fitted_names(g))) for g in ("h100", "blackwell")}
    return {"h100": baseline_utilization(list(H100_CALIBRATION_RUNS) + rows["h100"]),
            "blackwell": baseline_utilization(rows["blackwell"])}


def errors() -> list[dict]:
    """Every priced row: its role, the planner's and the trivial model's error (predicted ÷ published − 1), and
    whether the planner says it fits."""
    shares, out = baseline_shares(), []
    for run in field_runs():
        p = run.predict()
        out.append({"run": run, "role": role(run), "moe": bool(run.workload().experts), "planner": p.step_s / run.step_s - 1,
                    "trivial": baseline_step(run, shares[run.generation]) / run.step_s - 1,
                    "fits": p.fits, "memory": p.memory.total, "prediction": p})
    return out


def _priced(runs):
    if len({run.generation for run in runs}) != 1:
        raise ValueError("runs mix GPU generations; fit one constant per generation")
    return [(run, run.workload()) for run in runs]


def _median_fit(priced, low: float, high: float, price) -> float:
    """The value in [``low``, ``high``] at which the median of the ``priced`` (run, workload) pairs' predicted ÷
    published steps is 1, each predicted by ``price(run, workload, value)``."""
    return median_root(lambda x: statistics.median(price(run, w, x).step_s / run.step_s for run, w in priced),
                       low, high)


def fitted_share(runs) -> float:
    """The generation's share of peak (the same for bf16 and FP8) at which the median of ``runs``' predicted ÷
    published steps is 1."""
    return _median_fit(_priced(runs), 0.1, 1.0, lambda run, w, u: predict(
        w, run.layout, run.cluster(utilization=u, fp8_utilization=u), **run.options()))


def fitted_expert_seconds(runs) -> float:
    """The generation's fixed cost of a local expert per MoE layer and micro-batch at which the median of
    ``runs``' predicted ÷ published steps is 1 (:data:`EXPERT_FITTED`)."""
    return _median_fit(_priced(runs), 0.0, 0.01, lambda run, w, c: predict(
        w, run.layout, run.cluster(expert_seconds=c), **run.options()))


def fitted_tp_overlap(implementation: str = "course") -> float:
    """The share of the covered TP time ``implementation``'s overlap hides, fitted on its rows of
    :data:`TP_OVERLAP_FITTED`: for ``"course"`` (async TP) where the planner's ratio of the pair's steps (without,
    with async TP) is the published one; for ``"megatron"`` where the median of the rows' predicted ÷ published
    steps is 1."""
    if implementation not in TP_OVERLAP_FITTED:
        raise ValueError(f"implementation={implementation!r}: a TP overlap share is fitted for "
                         f"{', '.join(map(repr, TP_OVERLAP_FITTED))}")
    runs = runs_named(TP_OVERLAP_FITTED[implementation])
    if implementation == "megatron":  # its rows span generations: one share for all
        return _median_fit([(run, run.workload()) for run in runs], 0.0, 1.0, lambda run, w, h: predict(
            w, run.layout, run.cluster(), **{**run.options(), "tp_overlap": h}))
    plain, overlapped = runs
    published = plain.step_s / overlapped.step_s
    base = plain.predict().step_s
    return median_root(lambda h: base / overlapped.predict(tp_overlap=h).step_s / published, 0.0, 1.0)
