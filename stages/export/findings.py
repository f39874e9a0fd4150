"""What the export stage found (report.json ``lineage[].findings`` of the export step)."""

from __future__ import annotations

from typing import Any

from qdeploy.core.findings import Findings

__all__ = ["ExportFindings"]


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
    output_shapes_reinferred: dict[str, Any] | None = None
    frozen_inputs: dict[str, Any] | None = None
    """Input -> its frozen value's summary and dtype."""
    ifs_inlined: list[Any] | None = None
    nodes_folded: int | None = None
    nodes_removed: int | None = None
    minus_one_dims_named: list[str] | None = None
    custom_ops: list[dict[str, Any]]
    node_names: dict[str, Any] | None = None
    """Nodes the model left without a name, or whose name an earlier node had, named uniquely (how many of each,
    a few examples): later stages and the report refer to nodes by these names."""
