"""What the export stage found (report.json ``lineage[].findings`` of the export step)."""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict

from qdeploy.core.findings import Findings

__all__ = ["CausalLm", "CausalLmCheck", "CausalLmRecord", "CustomOp", "ExportFindings", "ExportRecord",
           "ExporterChoice", "FreezeRecord", "FrozenInput", "FrozenInputSummary", "NodesNamed", "ShapeChange",
           "ShapeChangeRecord", "TiedEmbedding", "TiedEmbeddingRecord"]

Dims = list[int | str | None] | None
"""A declared shape: sizes, symbolic names, unknown dimensions; None for an unknown rank."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CustomOp(_Record):
    """A node of an op neither runtime knows, that quantize's lowering rewrites (``LOWERABLE_OPS``)."""

    node: str
    op_type: str
    domain: str


class ShapeChange(_Record):
    """An output whose shape inference changed after the recipe's input overrides."""

    declared: Dims
    now: Dims


class FrozenInput(_Record):
    """A frozen input: its value when small (else its shape and sha256), and its dtype."""

    value: Any
    dtype: str


class NodesNamed(_Record):
    """Nodes named because they had no name, renamed because an earlier node had theirs, and a few examples."""

    unnamed_named: int
    duplicates_renamed: int
    examples: list[str]


class TiedEmbedding(_Record):
    """The LM head reads the embedding table through a Transpose instead of a transposed copy: stored once."""

    table: str
    bytes_saved: int
    """The table's bytes: the transposed copy an exporter's constant folding would have stored."""
    head: str
    form: str


class CausalLmCheck(_Record):
    """The export against PyTorch on real tokens: max abs error of logits and presents, prefill and decode."""

    text: str
    tokens: str
    """'tokenizer' (the model's own), or why seeded ids stood in."""
    prefill_tokens: int
    prefill_logits: float
    prefill_presents: float
    decode_logits: float
    decode_presents: float
    bound: float
    """The largest error accepted (on logits and presents alike)."""


class CausalLm(_Record):
    """What was exported: the checkpoint, the model class, the cache's shapes, the check against PyTorch."""

    checkpoint: str
    architecture: str
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_word_embeddings: bool
    layout: str
    """The cache layout, in words (which exporter's names and shapes)."""
    load_seconds: float
    export_seconds: float
    transformers_version: str
    check: CausalLmCheck


class TiedEmbeddingRecord(TypedDict):
    """``TiedEmbedding`` as the export gathers it (``_causal_lm.tie_embedding``)."""

    table: str
    bytes_saved: int
    head: str
    form: str


class CausalLmRecord(TypedDict):
    """``CausalLm`` as the export gathers it (``_causal_lm_source.export_causal_lm``)."""

    checkpoint: str
    architecture: str
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_word_embeddings: bool
    layout: str
    load_seconds: float
    export_seconds: float
    transformers_version: str
    check: dict[str, float | int | str]


class ShapeChangeRecord(TypedDict):
    """``ShapeChange`` as the stage gathers it (``_shapes.reinfer_output_shapes``)."""

    declared: Dims
    now: Dims


class FrozenInputSummary(TypedDict):
    """``FrozenInput`` as the stage gathers it (``_freeze.freeze_inputs``)."""

    value: Any
    """``_values.describe``: the value itself when small, else its shape and sha256."""
    dtype: str


class FreezeRecord(TypedDict, total=False):
    """What freezing inputs did (``_freeze.freeze_inputs``); empty when nothing was frozen."""

    frozen_inputs: dict[str, FrozenInputSummary]
    ifs_inlined: list[str]
    nodes_folded: int
    nodes_removed: int


class ExporterChoice(TypedDict, total=False):
    """Which torch exporter wrote the model (``_exporter.export_with_torch``); the setting and the fallback's
    reason only for ``auto``."""

    exporter: str
    exporter_setting: str
    exporter_fallback: str
    trace_warnings: list[str]


class ExportRecord(TypedDict, total=False):
    """The findings as the stage gathers them, key by key, before ``ExportFindings`` declares them."""

    source: str
    exporter: str
    exporter_setting: str
    exporter_fallback: str
    trace_warnings: list[str]
    torch_version: str
    max_abs_err_vs_torch: float
    opset_in: int
    opset: int
    opset_imports_merged: list[str] | None = None
    """Domains the model imported more than once at one version, merged into one import each."""
    functions_inlined: list[str] | None = None
    """The model-local functions (domain.name) expanded into their nodes."""
    weight_inputs_removed: int
    sparse_weights_densified: list[str]
    runtime_fusions_undone: dict[str, int]
    runtime_names_renamed: int
    stft_made_portable: list[str]
    ir_version_raised: str
    prelu_slopes_per_channel: list[str]
    decomposed_for_opset: dict[str, int]
    output_shapes_reinferred: dict[str, ShapeChangeRecord]
    frozen_inputs: dict[str, FrozenInputSummary]
    ifs_inlined: list[str]
    nodes_folded: int
    nodes_removed: int
    minus_one_dims_named: list[str]
    custom_ops: list[dict[str, str]]
    """``CustomOp``s: node, op type, domain."""
    node_names: dict[str, object]
    """``NodesNamed`` (``qdeploy.graph.names.NodeNaming.summary``)."""
    causal_lm: CausalLmRecord
    tied_embedding: TiedEmbeddingRecord


class ExportFindings(Findings):
    """Where the model came from, its opset before and after, what the recipe's inputs changed, custom ops.

    The stage gathers these as it goes (``_prepare`` and the torch export add theirs) and declares them here once
    it is done; keys it did not write stay out of the report."""

    source: str
    """'onnx', 'torch' or 'causal_lm'."""
    exporter: str | None = None
    exporter_setting: str | None = None
    exporter_fallback: str | None = None
    """Why ``auto`` fell back to the TorchScript exporter."""
    trace_warnings: list[str] | None = None
    """The TorchScript tracer's warnings ('file:line: message', at most 10): tensor values of the forward it turned
    into Python constants on the example input, where the ONNX model may compute other inputs wrongly."""
    torch_version: str | None = None
    max_abs_err_vs_torch: float | None = None
    opset_in: int
    opset: int
    opset_imports_merged: list[str] | None = None
    """Domains the model imported more than once at one version, merged into one import each."""
    functions_inlined: list[str] | None = None
    """The model-local functions (domain.name) expanded into their nodes."""
    weight_inputs_removed: int | None = None
    """Initializers the model also listed as graph inputs (IR 3, ``keep_initializers_as_inputs``), listed no more."""
    sparse_weights_densified: list[str] | None = None
    """Sparse weights (``sparse_initializer``, a Constant's ``sparse_value``) written out dense."""
    runtime_fusions_undone: dict[str, int] | None = None
    """ONNX Runtime's FusedConv, FusedGemm, FusedMatMul (a model it saved optimized) written as standard ops."""
    runtime_names_renamed: int | None = None
    """Tensors named as ONNX Runtime's passes name theirs (``gemm_input_shape_token_6``), renamed: it could not
    load such a model again ("Attempt to replace the existing tensor")."""
    stft_made_portable: list[str] | None = None
    """STFT nodes given the specification's rank-3 signal and an explicit frame_length (``_stft``): onnx's reference
    evaluator and OpenVINO could not run the rank-2 form ONNX Runtime accepts."""
    ir_version_raised: str | None = None
    """'3 -> 7': a file below IR 4 (which lists weights as inputs) or below what its opsets need, raised."""
    decomposed_for_opset: dict[str, int] | None = None
    """Rewrite -> nodes decomposed for an older opset."""
    prelu_slopes_per_channel: list[str] | None = None
    """PRelu nodes of an opset-6 model whose rank-1 slope became [C, 1, ...] before the conversion to opset 7 or
    later (per channel until 6, numpy broadcasting from 7)."""
    output_shapes_reinferred: dict[str, ShapeChange] | None = None
    frozen_inputs: dict[str, FrozenInput] | None = None
    """Input -> its frozen value's summary and dtype."""
    ifs_inlined: list[str] | None = None
    nodes_folded: int | None = None
    nodes_removed: int | None = None
    minus_one_dims_named: list[str] | None = None
    custom_ops: list[CustomOp]
    node_names: NodesNamed | None = None
    """Nodes the model left without a name, or whose name an earlier node had, named uniquely (how many of each,
    a few examples): later stages and the report refer to nodes by these names."""
    causal_lm: CausalLm | None = None
    """A causal_lm source: the checkpoint, the cache's shapes and the check against PyTorch on real tokens."""
    tied_embedding: TiedEmbedding | None = None
    """A tied embedding stored once: the LM head reads the Gather's table through a Transpose."""
