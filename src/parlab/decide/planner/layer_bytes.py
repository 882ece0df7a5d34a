"""What a layer of a :class:`~parlab.decide.planner.workload.Workload` keeps for backward and what its memory-bound
work moves (chapter 07's planner; chapter 01's estimator for what transformers' eager modules keep)."""

from __future__ import annotations

from parlab.decide.planner.counting import FUSED_COUNT_LENGTH, elementwise_traffic, layer_bytes_of


class LayerBytes:
    """The bytes of one layer of a :class:`~parlab.decide.planner.workload.Workload` (whose fields and counts these
    methods read), per micro-batch on one of ``tp`` ranks."""

    def fused_layer_bytes(self, tp: int = 1) -> float:
        """Bytes one layer of a fused stack keeps for backward per micro-batch on one of ``tp`` ranks (sequence
        parallel): each norm's input and output, Q, K and V, attention's output (its log-sum-exp is negligible),
        the MLP's two up-projections and their product: 2·h + 2·h + (a·d_qk + g·(d_qk + d_v)) + a·d_v + 2·f + f
        values per token, in bf16; under FP8 the GEMMs' inputs (the norms' outputs, attention's output and the
        product) are kept in FP8, one byte each (Transformer Engine, torchao). Under full recomputation only the
        layer's input."""
        tokens = self.micro_batch * self.seq_len
        if self.recompute == "full":
            return tokens * self.hidden * self.value_bytes / tp
        h, f, (qk, v) = self.hidden, self.dense.intermediate_size, self.head_dims
        kept16 = 2 * h + self.heads * qk + self.kv_heads * (qk + v) + 2 * f
        gemm_inputs = 2 * h + self.heads * v + f
        per_value = 1 if self.precision == "fp8" else self.value_bytes
        return tokens * (kept16 * self.value_bytes + gemm_inputs * per_value) / tp

    def kept_layer_bytes(self, tp: int = 1) -> float:
        """Bytes one layer keeps for backward per micro-batch on one of ``tp`` ranks, as this workload runs: what
        torchtitan's policy keeps (``recompute="op"``: :meth:`op_layer_bytes`), the layer's input (full
        recomputation), what fused kernels keep (:meth:`fused_layer_bytes`), else what transformers' eager
        modules keep (:meth:`layer_bytes`)."""
        if self.recompute == "op":
            return self.op_layer_bytes(tp)
        if self.fused or self.recompute == "full":
            return self.fused_layer_bytes(tp)
        return self.layer_bytes(tp)

    def layer_bytes(self, tp: int = 1) -> float:
        """Bytes one layer's forward saves for backward on one of ``tp`` ranks (chapter 01's estimator, for this
        architecture and ``attention``: eager keeps the s × s scores, sdpa does not; under ``sequence_parallel``
        split over the tp ranks too)."""
        from parlab.lab.measure.activations import config_json

        return layer_bytes_of(config_json(self.dense), self.kept_attention, self.seq_len, self.micro_batch,
                            self.value_bytes, tp, self.sequence_parallel and tp > 1)

    def elementwise_bytes(self, tp: int = 1) -> tuple[float, float]:
        """(forward, backward) bytes one layer's other ops than its matrix products and attention (norms,
        activation function, rotary embedding, residual adds, casts) read and write per micro-batch on one of
        ``tp`` ranks: bound by memory bandwidth, not FLOPs (:func:`predict` prices them so). Fused, about what
        the layer saves (:meth:`layer_bytes`) once forward and twice backward; eager, each op's own tensors,
        counted (:func:`~parlab.decide.planner.counting.elementwise_traffic`). The ops on the (tokens, h)
        activations run on every tp rank unless ``sequence_parallel``, the others are split over tp."""
        if self.fused or self.elementwise == "fused":
            saved = self.layer_bytes(tp)
            return saved, 2 * saved
        from parlab.lab.measure.activations import config_json

        whole = tp if self.sequence_parallel else 1
        eager = self.attention == "eager"
        forward_h, forward, backward_h, backward = elementwise_traffic(
            config_json(self.dense), self.attention, self.seq_len if eager else FUSED_COUNT_LENGTH, self.value_bytes)
        tokens = self.micro_batch * self.seq_len
        return tokens * (forward_h / whole + forward / tp), tokens * (backward_h / whole + backward / tp)

    @property
    def kept_attention(self) -> str:
        """What the attention keeps for backward: selective recomputation keeps what a fused kernel keeps."""
        return "sdpa" if self.recompute in ("selective", "op") or self.attention == "cudnn" else self.attention

    def op_layer_bytes(self, tp: int = 1) -> float:
        """Bytes one layer keeps per micro-batch on one of ``tp`` ranks under ``recompute="op"``: torchtitan's
        policy keeps every op's output in its list but every second matrix product's (``_save_list``:
        ``aten.mm``, the attention kernels, ``reduce_scatter``; ``torchtitan/parallelisms/parallelize_llama.py``
        at 9dec370), so of a Llama layer: its input (h), q (a·d_qk), v (g·d_v), attention's output (a·d_v) and
        log-sum-exp (a fp32 values), gate (f) and down (h) per token. Under torchao's FP8 the products are
        ``_scaled_mm``, not in the list: only the input and attention's outputs are kept."""
        h, f, (qk, v) = self.hidden, self.dense.intermediate_size, self.head_dims
        products = 0 if self.precision == "fp8" else self.heads * qk + self.kv_heads * v + f + h
        values = h + self.heads * v + products
        return self.micro_batch * self.seq_len * (values * self.value_bytes + 4 * self.heads) / tp
