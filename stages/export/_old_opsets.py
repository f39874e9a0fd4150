"""What onnx's version converter gets wrong going up from opsets before 7, mended before it runs.

PRelu's slope was per channel up to opset 6 (a ``[C]`` slope scales axis 1 of ``[N, C, ...]``); from opset 7 it
broadcasts like numpy, so the same ``[C]`` slope meets the last axis.  The converter copies the node unchanged:
PyTorch 0.3's ``PReLU(num_parameters=C)`` then fails at run time ("Attempting to broadcast an axis by a dimension
other than 1. 3 by 5"), or silently scales the wrong axis where the sizes happen to agree.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from qdeploy.graph.light import tensor_ranks
from qdeploy.graph.utils import node_readers

if TYPE_CHECKING:
    import onnx

__all__ = ["PER_CHANNEL_PRELU_UNTIL", "per_channel_prelu_slopes"]

log = logging.getLogger(__name__)

PER_CHANNEL_PRELU_UNTIL = 6
"""The last opset whose PRelu applies a rank-1 slope along axis 1."""


def per_channel_prelu_slopes(model: onnx.ModelProto) -> list[str]:
    """Rank-1 PRelu slopes (initializers) reshaped to ``[C, 1, ...]`` against their input's rank, which reads the
    same at opset 6 and broadcasts along axis 1 from opset 7 on; the nodes changed.  Only for a model at opset 6 or
    older that will be converted past it."""
    from onnx import numpy_helper

    ranks = tensor_ranks(model)
    weights = {init.name: init for init in model.graph.initializer}
    readers = node_readers(model.graph.node)
    changed = []
    for node in model.graph.node:
        if node.op_type != "PRelu" or len(node.input) < 2 or node.input[1] not in weights:
            continue
        slope, rank = weights[node.input[1]], ranks.get(node.input[0], 0)
        if len(slope.dims) != 1 or slope.dims[0] <= 1 or rank <= 2:
            continue
        values = numpy_helper.to_array(slope).reshape(slope.dims[0], *[1] * (rank - 2))
        name = slope.name if len(readers[slope.name]) == 1 else f"{slope.name}_per_channel_{len(changed)}"
        reshaped = numpy_helper.from_array(values, name)
        if name == slope.name:
            slope.CopyFrom(reshaped)
        else:
            model.graph.initializer.append(reshaped)
            node.input[1] = name
        changed.append(node.name or node.output[0])
    if changed:
        log.info("PRelu slopes made per channel for opset 7 and later: %s", ", ".join(changed[:5]))
    return changed
