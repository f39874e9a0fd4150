"""What the export stage found (report.json ``lineage[].findings`` of the export step)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from qdeploy.core.findings import Findings

__all__ = ["CustomOp", "ExportFindings", "FrozenInput", "NodesNamed", "ShapeChange"]

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
