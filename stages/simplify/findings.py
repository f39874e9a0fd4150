"""What the simplify stage found (report.json ``lineage[].findings`` of a simplify step)."""

from __future__ import annotations

from typing import Any

from qdeploy.core.findings import Findings

__all__ = ["SimplifyFindings"]


class SimplifyFindings(Findings):
    """Node counts before and after, what folding, rewrites and onnxoptimizer did, and the equivalence check."""

    nodes_before: dict[str, int]
    """Op type -> nodes of the input model."""
    nodes_after: dict[str, int]
    node_count_before: int
    node_count_after: int
    folded_tensors: int
    folded_nodes: int
    folded: dict[str, int]
    """Folded tensor -> its bytes (the first ``MAX_LISTED``)."""
    constants_converted: int
    fold_skipped: list[dict[str, Any]]
    """Tensors left unfolded and why (report-only records)."""
    fold_failed_ops: list[str]
    passes: list[str]
    rewrites: dict[str, Any]
    """``RewriteReport.as_findings``: rewrite -> matches applied, and refusals."""
    optimizer: dict[str, Any]
    """onnxoptimizer calls, and net nodes removed and added per op type."""
    passes_changed: list[str]
    iterations: int
    seconds: dict[str, float]
    """Phase -> seconds."""
    check: dict[str, Any]
    """The equivalence check (``qdeploy.stages.simplify._check``): samples and worst error, or why it is
    unchecked."""
    notes: list[str]

    def unchecked(self) -> str | None:
        reason = self.check.get("unchecked")
        return str(reason) if reason else None
