"""The simplify stage's name for constant-If inlining, which lives in ``qdeploy.graph.inline_if`` (the export stage
uses it too, after freezing an input)."""

from __future__ import annotations

from qdeploy.graph.inline_if import inline_constant_ifs

__all__ = ["PASS_NAME", "inline_constant_ifs"]

PASS_NAME = "eliminate_if_with_const_cond"
