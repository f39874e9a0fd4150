"""What the simplify stage found (report.json ``lineage[].findings`` of a simplify step)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from qdeploy.core.findings import Findings

__all__ = ["EquivalenceCheck", "FoldSkipped", "NoiseFloorSkipped", "NoiseFloorUsed", "OptimizerRecord",
           "RewritesRecord", "SimplifyFindings", "Unchecked"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FoldSkipped(_Record):
    """A tensor left unfolded: its size and why."""

    tensor: str
    bytes: int | None
    reason: str


class RewritesRecord(_Record):
    """``RewriteReport.as_findings``: rewrite -> matches applied; rewrite -> node -> why a match was refused."""

    applied: dict[str, int]
    refused: dict[str, dict[str, str]]


class OptimizerRecord(_Record):
    """onnxoptimizer calls, and net nodes removed and added per op type."""

    calls: int
    removed: dict[str, int]
    added: dict[str, int]


class NoiseFloorSkipped(_Record):
    """Every output was within check_atol and check_rtol: the original's noise floor was not measured."""

    measured: Literal[False]
    why: str


class NoiseFloorUsed(_Record):
    """The original's own noise floor (two optimisation levels of ONNX Runtime), per output, and the absolute
    tolerance it allowed there (``max(check_atol, factor x floor)``, ``qdeploy.stages.simplify._noise``)."""

    measured: Literal[True]
    levels: str
    per_output: dict[str, float]
    factor: float
    atol_used: dict[str, float]


class EquivalenceCheck(_Record):
    """The original and the simplified model ran on the same inputs and agreed (``qdeploy.stages.simplify._check``)."""

    samples: int
    atol: float
    rtol: float
    max_abs_err: float
    noise_floor: NoiseFloorUsed | NoiseFloorSkipped
    input_shapes: dict[str, list[int]]
    inputs: str
    """Where the check inputs came from (the recipe's validation data, or generated)."""


class Unchecked(_Record):
    """Why the outputs could not be compared (never a pass; the runner's guard reports it)."""

    unchecked: str


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
    fold_skipped: list[FoldSkipped]
    """Tensors left unfolded and why."""
    fold_failed_ops: list[str]
    passes: list[str]
    rewrites: RewritesRecord
    optimizer: OptimizerRecord
    passes_changed: list[str]
    iterations: int
    seconds: dict[str, float]
    """Phase -> seconds."""
    check: EquivalenceCheck | Unchecked
    """The equivalence check: samples and worst error, or why it is unchecked."""
    notes: list[str]

    def unchecked(self) -> str | None:
        return self.check.unchecked if isinstance(self.check, Unchecked) else None
