"""Where a model's outputs stop being comparable element by element: after a selection whose length depends on
the data.

NonMaxSuppression (NonZero, Unique likewise) returns as many rows as the data select.  Two builds of one model
(7-bit weights or activations, signed activations or not) then differ in which boxes they keep before they differ
in how well they compute them, and an SNR of the outputs reads that noise: on a small detector 8.0 and 6.1 dB for
two builds whose boxes and scores before NMS were far closer to float32 than that.  What compares element by
element is what feeds the selection (the boxes and scores NMS reads) and the outputs no selection reaches.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from qdeploy.graph.order import outer_reads

if TYPE_CHECKING:
    import onnx

__all__ = ["DATA_DEPENDENT_SELECTIONS", "comparable_tensors"]

DATA_DEPENDENT_SELECTIONS = frozenset({"NonMaxSuppression", "NonZero", "Unique"})


def comparable_tensors(model: onnx.ModelProto) -> list[str] | None:
    """None when no output of the main graph depends on a selection (the outputs compare as they are); else the
    tensors to compare instead: what the selections read that the graph computes (not its inputs, initializers
    or constants), then the outputs no selection reaches.  None too when a selection reads nothing computed."""
    graph = model.graph
    selections = [node for node in graph.node if node.op_type in DATA_DEPENDENT_SELECTIONS]
    if not selections:
        return None
    reached = _downstream({name for node in selections for name in node.output if name}, graph)
    outputs = [output.name for output in graph.output]
    if not reached & set(outputs):
        return None
    given = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    constant = {name for node in graph.node if node.op_type == "Constant" for name in node.output}
    read = [name for node in selections for name in node.input
            if name and name not in given and name not in constant and name not in reached]
    if not read:
        return None
    kept = [name for name in outputs if name not in reached]
    return list(dict.fromkeys(read + kept))


def _downstream(start: set[str], graph: onnx.GraphProto) -> set[str]:
    """Every tensor of the main graph computed from ``start`` (those included); what a subgraph reads from outside
    counts as read by the node that holds it."""
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in {*node.input, *outer_reads(node)}:
            readers[name].append(node)
    reached, pending = set(start), list(start)
    while pending:
        for node in readers.get(pending.pop(), []):
            for name in node.output:
                if name and name not in reached:
                    reached.add(name)
                    pending.append(name)
    return reached

