"""reference:cpu's MaxPool: strided slices and np.maximum instead of onnx's Python loop over every output element
(PP-OCRv6's tiny detector spent most of its fp16 stage there), equal to ONNX Runtime in every padding mode, where
onnx's own kernel gets SAME_LOWER's output shape wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from qdeploy.targets.evaluator import build_evaluator, run_evaluator

CASES = [
    ([1, 2, 11, 13], {"kernel_shape": [2, 2], "strides": [1, 1], "auto_pad": "SAME_UPPER"}),
    ([1, 2, 11, 13], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ([2, 3, 11, 13], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ([1, 2, 11, 13], {"kernel_shape": [2, 3], "strides": [2, 1], "auto_pad": "VALID"}),
    ([1, 2, 11, 13], {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2, 0, 1, 2]}),
    ([1, 2, 17], {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ([1, 4, 16], {"kernel_shape": [3], "auto_pad": "SAME_UPPER"}),  # onnx's own kernel raises IndexError here
    ([1, 2, 11, 13], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
]


def _pool(shape: list[int], attributes: dict[str, Any], element: int) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], **attributes)], "pool",
                              [helper.make_tensor_value_info("x", element, shape)],
                              [helper.make_tensor_value_info("y", element, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(("shape", "attributes"), CASES)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_max_pool_equals_onnxruntime(shape: list[int], attributes: dict[str, Any], dtype: type) -> None:
    element = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    x = np.random.default_rng(0).normal(size=shape).astype(dtype)
    model = _pool(shape, attributes, element)

    ours = run_evaluator(build_evaluator(model), {"x": x})[0]
    # ONNX Runtime's CPU MaxPool has no float16 kernel: the same values in float32 (a maximum is exact)
    expected = ort.InferenceSession(_pool(shape, attributes, TensorProto.FLOAT).SerializeToString(),
                                    providers=["CPUExecutionProvider"]).run(None, {"x": x.astype(np.float32)})[0]

    assert ours.dtype == dtype and np.array_equal(ours, expected.astype(dtype))


def test_same_lower_is_a_case_onnx_own_kernel_gets_wrong() -> None:
    shape, attributes = CASES[1]
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    model = _pool(shape, attributes, TensorProto.FLOAT)

    assert ReferenceEvaluator(model).run(None, {"x": x})[0].shape != run_evaluator(build_evaluator(model),
                                                                                    {"x": x})[0].shape
