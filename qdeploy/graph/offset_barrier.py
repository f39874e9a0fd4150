"""A Max with -inf (an exact identity) between a huge mask product and the constant it is added to, for OpenVINO.

An additive attention mask is written ``(1 - mask) * finfo.min`` (Hugging Face's extended mask: -3.4e38, or
-1e9, -1e4).  Added to a constant, OpenVINO's CPU plugin (2026.4) regroups ``K + (1 - m) * C`` as
``(K + C) - m * C``: ``K + C`` rounds to ``C`` and K is gone.  qdeploy's simplify folds a T5 encoder's relative
position bias into such a constant at a fixed sequence length (traceforge's flan-t5 encoder); OpenVINO then
computed every attention bias as 0 (cosine 0.80 against ONNX Runtime, the original file 0.9996).  ``Max(x, -inf)``
returns x, and OpenVINO does not regroup across it: the same values, bit for bit, in f32 and bf16.

The barrier goes after a Mul by a constant of magnitude ``LARGE`` or more whose other operand has a constant term
(a Sub or Add with a constant), where a constant is added to the product (past reshapes and slices of it).
Applied to the copy OpenVINO reads (``qdeploy.targets.openvino_read``), top-level graph only; the artifact is
unchanged.

Edits protobuf directly: the model may be a graph without its weights (a constant in a data file is not read,
and a product by it is left as it is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.utils import fresh_name, rename_uses

if TYPE_CHECKING:
    import onnx

__all__ = ["LARGE", "shield_mask_products"]

LARGE = 1e4
"""The magnitude from which a constant factor's offset swamps what OpenVINO adds to it."""
EXTERNAL = 1
_MOVES = frozenset({"Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Slice", "Expand", "Transpose"})
"""Ops that pass their first input's values on, moved or selected."""
_NON_CONSTANT = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                           "Bernoulli"})


def shield_mask_products(model: onnx.ModelProto) -> list[str]:
    """Put ``Max(product, -inf)`` between each such product and the Add that adds a constant to it, in place;
    ``"Mul '<node>'"`` for each product so shielded."""
    from onnx import helper, numpy_helper

    graph = model.graph
    values = {init.name: init for init in graph.initializer}
    values.update({node.output[0]: attr.t for node in graph.node if node.op_type == "Constant"
                   for attr in node.attribute if attr.name == "value"})
    constant = _constant_tensors(graph, set(values))
    producers = {out: node for node in graph.node for out in node.output}
    taken = {name for node in graph.node for name in (*node.input, *node.output)} | set(values)
    shielded: dict[str, str] = {}
    for node in list(graph.node):
        if node.op_type != "Add" or len(node.input) != 2:
            continue
        for position, value in enumerate(node.input):
            product = _through_reshapes(value, producers, constant)
            if node.input[1 - position] not in constant or product is None or product.output[0] in shielded \
                    or not _mask_product(product, producers, constant, values):
                continue
            out = product.output[0]
            lowest, barrier = fresh_name(f"{out}_lowest", taken), fresh_name(f"{out}_shielded", taken)
            taken |= {lowest, barrier}
            rename_uses(graph, out, barrier, outputs=False)  # every reader takes the identity: the same value
            graph.initializer.append(numpy_helper.from_array(np.array(-np.inf, _dtype(product, values)), lowest))
            graph.node.insert(list(graph.node).index(product) + 1,
                              helper.make_node("Max", [out, lowest], [barrier], name=barrier))
            shielded[out] = product.name or out
    return [f"Mul '{name}'" for name in shielded.values()]


def _through_reshapes(value: str, producers: dict[str, onnx.NodeProto], constant: set[str]) -> onnx.NodeProto | None:
    """The node that computes ``value``, past ops that only move or select its elements (a Slice of the whole
    axis, a Reshape: OpenVINO removes or looks through them); None for a constant or a graph input."""
    node = producers.get(value)
    while node is not None and node.op_type in _MOVES and value not in constant:
        value = node.input[0]
        node = producers.get(value)
    return None if value in constant else node


def _constant_tensors(graph: onnx.GraphProto, known: set[str]) -> set[str]:
    """Tensors whose values do not depend on the graph's inputs (its nodes in topological order)."""
    constant = set(known)
    for node in graph.node:
        inputs = [name for name in node.input if name]
        if node.op_type not in _NON_CONSTANT and not any(attr.g.node or attr.graphs for attr in node.attribute) \
                and all(name in constant for name in inputs):
            constant.update(out for out in node.output if out)
    return constant


def _mask_product(product: onnx.NodeProto | None, producers: dict[str, onnx.NodeProto], constant: set[str],
                  values: dict[str, onnx.TensorProto]) -> bool:
    """Whether ``product`` is a Mul by a constant of magnitude ``LARGE`` or more whose other operand is a Sub or
    Add with a constant (an offset OpenVINO folds into a constant added later)."""
    if product is None or product.op_type != "Mul" or len(product.input) != 2:
        return False
    for factor, operand in (product.input, reversed(product.input)):
        if _largest(values.get(factor)) < LARGE or operand in constant:
            continue
        source = producers.get(operand)
        if source is not None and source.op_type in ("Sub", "Add") and any(name in constant for name in source.input):
            return True
    return False


def _largest(tensor: onnx.TensorProto | None) -> float:
    """The largest magnitude in a float constant; 0 for anything else (a constant in a data file included)."""
    from onnx import numpy_helper

    if tensor is None or tensor.data_location == EXTERNAL or tensor.data_type not in (1, 10, 11, 16):
        return 0.0
    array = numpy_helper.to_array(tensor)
    return float(np.max(np.abs(array))) if array.size else 0.0


def _dtype(product: onnx.NodeProto, values: dict[str, onnx.TensorProto]) -> np.dtype:
    """The product's float type, from its constant factor."""
    from onnx import helper

    factor = next(values[name] for name in product.input if name in values)
    return np.dtype(helper.tensor_dtype_to_np_dtype(factor.data_type))
