"""What the fp16 stage found (report.json ``lineage[].findings`` of an fp16 step)."""

from __future__ import annotations

from typing import Any

from qdeploy.core.findings import Findings

__all__ = ["Fp16Findings"]


class Fp16Findings(Findings):
    """Which nodes stayed float32 and why, what the conversion clamped and repaired, and how faithful it is.

    The per-reason maps are node -> why; ``budget`` and ``fidelity`` are report-only records of the search and
    of the emulated (and reference) checks."""

    keep_io_types: bool
    op_block_list: list[str]
    schema_float32_nodes: dict[str, str]
    schema_float32_inputs: list[str]
    normalization_float32_nodes: dict[str, str]
    integer_accumulator_float32_nodes: dict[str, str]
    constant_range_float32_nodes: dict[str, str]
    activation_analysis: str | dict[str, Any]
    """The data the activation ranges were measured on, or why they were not ("not run: ...")."""
    kept_in_fp32: list[dict[str, Any]]
    """Nodes kept float32 for their data: node, op type, reason."""
    budget: dict[str, Any] | None = None
    """The search for float32 nodes that meet the tolerance (mode auto, or a repair); absent when none ran.  Written
    once from the stage's typed budget (``_budget_targets.Fp16Budget``: the emulated ``Float32Choice`` and the
    engine's per-target ``TargetRecord``s); nothing reads it back."""
    fidelity: dict[str, Any] | None = None
    """The emulated check (``emulated``) and the reference evaluator's (``reference``); absent without data."""
    node_block_list: list[str]
    clamp: dict[str, Any]
    repair: dict[str, Any]
    cast_nodes: int
    checker: str
    seconds: float
