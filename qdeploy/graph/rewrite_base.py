"""What a graph rewrite is: ``Replacement`` and the ``@rewrite`` registry.

The rules (``qdeploy.graph.rewrite_rules``) register themselves here; ``qdeploy.graph.rewrites`` applies them.
They read and edit the graph through ``qdeploy.graph.edit.GraphEditor`` (onnx-ir), as fake-quant lowering does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx_ir as ir

    from qdeploy.graph.edit import GraphEditor

__all__ = ["FLOAT_TYPES", "REGISTRY", "Replacement", "Rewrite", "RewriteFn", "rewrite"]

log = logging.getLogger(__name__)

FLOAT_TYPES = frozenset({1, 10, 11})  # float, float16, double: numpy computes them exactly as stored


@dataclass
class Replacement:
    """What a matched rewrite puts in place of ``remove``: ``add``, whose last node's output takes over ``replaces``.

    The new initializers are already registered (``GraphEditor.initializer``); weights only ``remove`` read go.
    """

    remove: list[ir.Node]
    add: list[ir.Node]
    replaces: ir.Value
    """The removed nodes' output that the rest of the graph reads (its uses and name move to the new output)."""


RewriteFn = Callable[["GraphEditor", "ir.Node"], "Replacement | str | None"]


@dataclass(frozen=True)
class Rewrite:
    """A registered rewrite: its name (the recipe's word for it), the op it starts from, what it does."""

    name: str
    anchors: tuple[str, ...]
    """Op types it is tried on."""
    description: str
    default: bool
    computes_constants: bool
    """It computes new weights (a kind of folding): off when simplify's fold_constants is false."""
    fn: RewriteFn


REGISTRY: dict[str, Rewrite] = {}


def rewrite(name: str, *, anchor: str | tuple[str, ...], description: str, default: bool = False,
            computes_constants: bool = False) -> Callable[[RewriteFn], RewriteFn]:
    """Register ``fn`` as the rewrite ``name``, tried on every node of op type ``anchor`` (or of one of them)."""

    def register(fn: RewriteFn) -> RewriteFn:
        if name in REGISTRY:
            raise ValueError(f"rewrite '{name}' is registered twice")
        anchors = (anchor,) if isinstance(anchor, str) else tuple(anchor)
        REGISTRY[name] = Rewrite(name, anchors, description, default, computes_constants, fn)
        return fn

    return register
