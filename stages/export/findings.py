"""What the export stage found (report.json ``lineage[].findings`` of the export step)."""

from __future__ import annotations

from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict

from qdeploy.core.findings import Findings

__all__ = ["CustomOp", "ExportFindings", "ExportRecord", "ExporterChoice", "FreezeRecord", "FrozenInput",
           "FrozenInputSummary", "NodesNamed", "ShapeChange", "ShapeChangeRecord"]

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


class ExportRecord(TypedDict, total=False):
    """The findings as the stage gathers them, key by key, before ``ExportFindings`` declares them."""

    source: str
    exporter: str
    exporter_setting: str
    exporter_fallback: str
    torch_version: str
    max_abs_err_vs_torch: float
    opset_in: int
    opset: int
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


class ExportFindings(Findings):
    """Where the model came from, its opset before and after, what the recipe's inputs changed, custom ops.

    The stage gathers these as it goes (``_prepare`` and the torch export add theirs) and declares them here once
    it is done; keys it did not write stay out of the report."""

    source: str
    """'onnx' or 'torch'."""
    exporter: str | None = None
    exporter_setting: str | None = None
    exporter_fallback: str | None = None
    """Why ``auto`` fell back to the TorchScript exporter."""
    torch_version: str | None = None
    max_abs_err_vs_torch: float | None = None
    opset_in: int
    opset: int
    decomposed_for_opset: dict[str, int] | None = None
    """Rewrite -> nodes decomposed for an older opset."""
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
