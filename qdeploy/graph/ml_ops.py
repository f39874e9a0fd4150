"""Simple ``ai.onnx.ml`` operators written out in standard ONNX ops, for OpenVINO.

OpenVINO's ONNX frontend (2026.4) converts no ``ai.onnx.ml`` operator but Normalizer: a scikit-learn pipeline
converted by skl2onnx (a StandardScaler before a network: ``Scaler``; a SimpleImputer: ``Imputer``; a linear
model: ``LinearRegressor``) could not be read at all on ``openvino:cpu``.  These operators are element-wise
arithmetic, a selection or one matrix product, each the same computation in standard ops:

- ``Scaler``: ``(X - offset) * scale`` in float32;
- ``Binarizer``: ``Where(X > threshold, 1, 0)`` in X's type;
- ``Imputer``: ``Where(IsNaN(X) or X == replaced, imputed, X)``;
- ``ArrayFeatureExtractor``: ``Gather`` of the flattened indices along the last axis (a 1-D X gives [1, k]);
- ``LinearRegressor`` (no post transform): ``X @ coefficients^T + intercepts`` in float32;
- ``LinearClassifier`` (integer labels, a row of coefficients per class, no post transform, softmax or
  logistic): those scores, the label of the highest raw score (``ArgMax``, the first of equals, as ONNX Runtime)
  and the scores through Softmax or Sigmoid.

A non-float input is cast to float32 first, as ONNX Runtime's kernels convert it (a double input is then
computed in float32, not in double).  Applied to the copy OpenVINO reads (``qdeploy.targets.openvino_read``),
top-level graph only, where the input's type and rank are known; the artifact is unchanged.  Tree ensembles,
string labels, a one-row binary classifier, label encoders and ZipMap are left as they are (OpenVINO still
refuses those, and says so).

Edits protobuf directly: the model may be a graph without its weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.light import graph_ranks, inferred_model
from qdeploy.graph.utils import default_opset, node_attributes, tensor_types
from qdeploy.graph.writer import GraphWriter

if TYPE_CHECKING:
    import onnx

__all__ = ["lower_ml_ops"]

ML = "ai.onnx.ml"
MIN_OPSET = 9
"""The standard opset from which every op written here (Where, IsNaN) exists."""
_FLOAT, _DOUBLE, _INT32, _INT64 = 1, 11, 6, 7


class _Writer(GraphWriter):
    """Standard nodes that replace one ml node: fresh names, constants as initializers."""

    def __init__(self, graph: onnx.GraphProto, node: onnx.NodeProto, taken: set[str]) -> None:
        super().__init__(graph, node, taken, separator="_")

    def op(self, op_type: str, inputs: list[str], hint: str, output: str | None = None, **attrs: object) -> str:
        from onnx import helper

        out = output or self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.fresh(op_type.lower()), **attrs))
        return out

    def as_float(self, value: str, elem_type: int) -> str:
        return value if elem_type == _FLOAT else self.op("Cast", [value], "float", to=_FLOAT)


def lower_ml_ops(model: onnx.ModelProto) -> list[str]:
    """Write out each simple ml node of the top-level graph in standard ops, in place; ``"Scaler '<node>'"`` for
    each node so written.  Nothing when the model's standard opset is below ``MIN_OPSET``."""
    graph = model.graph
    if not any(node.domain == ML and node.op_type in _LOWERINGS for node in graph.node) or not _standard_opset(model):
        return []
    types = _value_types(model)
    taken = {name for node in graph.node for name in (*node.input, *node.output)}
    taken |= {init.name for init in graph.initializer} | {value.name for value in graph.input}
    lowered, kept = [], []
    for node in graph.node:
        lowering = _LOWERINGS.get(node.op_type) if node.domain == ML else None
        known = types.get(node.input[0]) if node.input else None
        writer = _Writer(graph, node, taken)
        if lowering is None or known is None or not lowering(writer, node_attributes(node), *known):
            kept.append(node)
            continue
        kept.extend(writer.nodes)
        lowered.append(f"{node.op_type} '{node.name or node.output[0]}'")
    if lowered:
        del graph.node[:]
        graph.node.extend(kept)
    return lowered


def _standard_opset(model: onnx.ModelProto) -> bool:
    """Whether the standard ops written here exist in the model's opset (a pure ml graph gets one imported)."""
    from onnx import helper

    opset = default_opset(model)
    if not opset:
        model.opset_import.append(helper.make_opsetid("", 13))
    return not opset or opset >= MIN_OPSET


def _value_types(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Value name -> (element type, rank) where shape inference or a declaration knows both."""
    graph = inferred_model(model).graph
    ranks = graph_ranks(graph)
    return {name: (elem_type, ranks[name]) for name, elem_type in tensor_types(graph).items() if name in ranks}


def _per_feature(values: object, dtype: type) -> np.ndarray:
    """An attribute list as a constant that broadcasts along the last axis (one value: to every feature)."""
    array = np.asarray(values, dtype=dtype)
    return array.reshape(()) if array.size == 1 else array


def _scaler(w: _Writer, attrs: dict[str, object], elem_type: int, rank: int) -> bool:
    offset, scale = attrs.get("offset", [0.0]), attrs.get("scale", [1.0])
    if elem_type not in (_FLOAT, _DOUBLE, _INT32, _INT64) or len(offset) != len(scale):  # type: ignore[arg-type]
        return False
    offset_const = w.constant("offset", _per_feature(offset, np.float32))
    shifted = w.op("Sub", [w.as_float(w.node.input[0], elem_type), offset_const], "shifted")
    w.op("Mul", [shifted, w.constant("scale", _per_feature(scale, np.float32))], "", output=w.node.output[0])
    return True


def _binarizer(w: _Writer, attrs: dict[str, object], elem_type: int, rank: int) -> bool:
    dtype = {_FLOAT: np.float32, _DOUBLE: np.float64, _INT32: np.int32, _INT64: np.int64}.get(elem_type)
    if dtype is None:
        return False
    threshold = float(attrs.get("threshold", 0.0))  # type: ignore[arg-type]
    if dtype in (np.int32, np.int64) and not threshold.is_integer():
        return False  # ORT compares an integer with a float threshold; a rounded one could flip an element
    above = w.op("Greater", [w.node.input[0], w.constant("threshold", np.array(threshold, dtype))], "above")
    w.op("Where", [above, w.constant("one", np.array(1, dtype)), w.constant("zero", np.array(0, dtype))], "",
         output=w.node.output[0])
    return True


def _imputer(w: _Writer, attrs: dict[str, object], elem_type: int, rank: int) -> bool:
    if elem_type == _FLOAT and attrs.get("imputed_value_floats"):
        imputed, replaced, dtype = attrs["imputed_value_floats"], float(attrs.get("replaced_value_float", 0.0)), \
            np.float32  # type: ignore[arg-type]
    elif elem_type == _INT64 and attrs.get("imputed_value_int64s"):
        imputed, replaced, dtype = attrs["imputed_value_int64s"], int(attrs.get("replaced_value_int64", 0)), \
            np.int64  # type: ignore[arg-type]
    else:
        return False
    x = w.node.input[0]
    if isinstance(replaced, float) and math.isnan(replaced):
        missing = w.op("IsNaN", [x], "missing")
    else:
        missing = w.op("Equal", [x, w.constant("replaced", np.array(replaced, dtype))], "missing")
    w.op("Where", [missing, w.constant("imputed", _per_feature(imputed, dtype)), x], "", output=w.node.output[0])
    return True


def _feature_extractor(w: _Writer, attrs: dict[str, object], elem_type: int, rank: int) -> bool:
    if rank < 1 or len(w.node.input) != 2:
        return False
    flat = w.op("Reshape", [w.node.input[1], w.constant("flat", np.array([-1], np.int64))], "indices")
    if rank > 1:
        w.op("Gather", [w.node.input[0], flat], "", output=w.node.output[0], axis=rank - 1)
        return True
    picked = w.op("Gather", [w.node.input[0], flat], "picked", axis=0)
    w.op("Reshape", [picked, w.constant("row", np.array([1, -1], np.int64))], "", output=w.node.output[0])
    return True


def _linear_regressor(w: _Writer, attrs: dict[str, object], elem_type: int, rank: int) -> bool:
    coefficients = np.asarray(attrs.get("coefficients", []), np.float32)
    intercepts = np.asarray(attrs.get("intercepts", [0.0]), np.float32)
    targets = int(attrs.get("targets", 1))  # type: ignore[arg-type]
    if _text(attrs.get("post_transform", b"NONE")) != b"NONE" or rank != 2 or not coefficients.size \
            or coefficients.size % targets or intercepts.size not in (1, targets):
        return False
    weights = w.constant("weights", coefficients.reshape(targets, -1).T.copy())
    product = w.op("MatMul", [w.as_float(w.node.input[0], elem_type), weights], "product")
    w.op("Add", [product, w.constant("intercepts", intercepts)], "", output=w.node.output[0])
    return True


def _linear_classifier(w: _Writer, attrs: dict[str, object], elem_type: int, rank: int) -> bool:
    labels = np.asarray(attrs.get("classlabels_ints", []), np.int64)
    coefficients = np.asarray(attrs.get("coefficients", []), np.float32)
    intercepts = np.asarray(attrs.get("intercepts", []), np.float32)
    transform = {b"NONE": None, b"SOFTMAX": "Softmax", b"LOGISTIC": "Sigmoid"}.get(
        _text(attrs.get("post_transform", b"NONE")), "unknown")
    if labels.size < 2 or rank != 2 or transform == "unknown" or coefficients.size % labels.size \
            or intercepts.size not in (0, labels.size):
        return False
    weights = w.constant("weights", coefficients.reshape(labels.size, -1).T.copy())
    scores = w.op("MatMul", [w.as_float(w.node.input[0], elem_type), weights], "scores")
    if intercepts.size:
        scores = w.op("Add", [scores, w.constant("intercepts", intercepts)], "biased")
    best = w.op("ArgMax", [scores], "best", axis=1, keepdims=0)
    w.op("Gather", [w.constant("labels", labels), best], "", output=w.node.output[0], axis=0)
    if len(w.node.output) > 1 and w.node.output[1]:
        if transform is None:
            w.op("Identity", [scores], "", output=w.node.output[1])
        else:
            w.op(transform, [scores], "", output=w.node.output[1], **({"axis": 1} if transform == "Softmax" else {}))
    return True


def _text(value: object) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)  # type: ignore[arg-type]


_LOWERINGS: dict[str, Callable[[_Writer, dict[str, object], int, int], bool]] = {
    "Scaler": _scaler, "Binarizer": _binarizer, "Imputer": _imputer, "ArrayFeatureExtractor": _feature_extractor,
    "LinearRegressor": _linear_regressor, "LinearClassifier": _linear_classifier,
}
"""Each lowering writes its nodes into the writer and says whether it could (else the ml node stays)."""
