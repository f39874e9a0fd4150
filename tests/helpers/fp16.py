"""Small graphs, artifacts, contexts and runners of the fp16 tests."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qdeploy.calibration import data_context
from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.pipeline.recipe.schema import DatasetSpec
from qdeploy.stages import fp16
from qdeploy.stages.fp16 import Fp16Config


def make_model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], inputs: list[onnx.ValueInfoProto],
               outputs: list[onnx.ValueInfoProto], opset: int = 17,
               extra_opsets: tuple[tuple[str, int], ...] = ()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, v) for d, v in extra_opsets)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def tensor(name: str, shape: list[Any] | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def const(name: str, values: Any, dtype: Any = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def artifact(tmp_path: Path, model: onnx.ModelProto, name: str = "model.onnx") -> Artifact:
    path = tmp_path / name
    onnx.save(model, str(path))
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key="k", sha256="s",
                    size_bytes=path.stat().st_size, stages=("export",), parent=None)


def context(tmp_path: Path, datasets: dict[str, list[dict[str, np.ndarray]]] | None = None) -> StageContext:
    """A stage context whose recipe holds npz datasets written from the given samples."""
    specs = {}
    for name, samples in (datasets or {}).items():
        folder = tmp_path / name
        folder.mkdir(exist_ok=True)
        for index, sample in enumerate(samples):
            np.savez(folder / f"{index:03d}.npz", **sample)
        specs[name] = DatasetSpec(reader="npy", path=name)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return data_context("v", work, datasets=specs, resolve=lambda p: tmp_path / p)


def run_stage(tmp_path: Path, model: onnx.ModelProto, datasets: dict[str, list[dict[str, np.ndarray]]] | None = None,
              **config: Any) -> StageResult:
    return fp16.run(artifact(tmp_path, model), Fp16Config(**config), context(tmp_path, datasets))


def plain_convert(model: onnx.ModelProto, **kwargs: Any) -> onnx.ModelProto:
    """onnxconverter-common as its users call it (float32 I/O kept); may raise."""
    from onnxconverter_common.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_float_to_float16(copy.deepcopy(model), keep_io_types=True, **kwargs)


def broken_reason(model: onnx.ModelProto) -> str | None:
    """Why a model is unusable (full onnx.checker or ORT load), or None."""
    try:
        onnx.checker.check_model(model, full_check=True)
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        return str(exc)
    return None


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnx's reference evaluator (with qdeploy's kernel corrections): every op in its declared precision."""
    from qdeploy.targets.evaluator import build_evaluator, run_evaluator

    return [np.asarray(out) for out in run_evaluator(build_evaluator(model), feeds)]


def run_target(target: str, model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path) -> list[np.ndarray]:
    """The model on a qdeploy target (qdeploy.targets), outputs in graph order."""
    from qdeploy.targets import get_target

    path = tmp_path / f"on_{target.replace(':', '_')}.onnx"
    onnx.save(model, str(path))
    with get_target(target).load(path) as session:
        outputs = session.run(feeds)
    return [outputs[value.name] for value in model.graph.output]



def prequantized_model(path: Path, depth: int = 256) -> onnx.ModelProto:
    """Conv -> LSTM -> MatMul, quantized by ONNX Runtime's quantize_dynamic (ConvInteger, DynamicQuantizeLSTM,
    MatMulInteger, DynamicQuantizeLinear), as pre-quantized OCR models ship."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    hidden = 16
    inits = [const("K", rng.standard_normal((1, 1, 3, 3)) * 0.3),
             const("W", rng.standard_normal((1, 4 * hidden, 8)) * 0.3),
             const("R", rng.standard_normal((1, 4 * hidden, hidden)) * 0.3), const("B", np.zeros((1, 8 * hidden))),
             const("M", rng.uniform(0.5, 1.0, (hidden, depth))), const("N", rng.uniform(0.5, 1.0, (depth, 4))),
             const("shape", [6, 1, 8], np.int64), const("axes", [1], np.int64)]
    nodes = [helper.make_node("Conv", ["img", "K"], ["feat"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["feat", "shape"], ["seq"], name="to_seq"),
             helper.make_node("LSTM", ["seq", "W", "R", "B"], ["Y"], name="lstm", hidden_size=hidden),
             helper.make_node("Squeeze", ["Y", "axes"], ["h"], name="squeeze"),
             helper.make_node("MatMul", ["h", "M"], ["wide"], name="widen"),
             helper.make_node("Relu", ["wide"], ["act"], name="act"),
             helper.make_node("MatMul", ["act", "N"], ["logits"], name="head")]
    model = make_model(nodes, inits, [tensor("img", [1, 1, 6, 8])], [tensor("logits", [6, 1, 4])])
    onnx.save(model, str(path / "float.onnx"))
    quantize_dynamic(str(path / "float.onnx"), str(path / "quantized.onnx"), weight_type=QuantType.QUInt8)
    return onnx.load(str(path / "quantized.onnx"))


OFFSET_WIDTH = 256


def offset_budget_model() -> onnx.ModelProto:
    """A benign branch first in graph order, then (x + 1000) - 1000: float16 keeps 0.5 steps near 1000."""
    rng = np.random.default_rng(0)
    inits = [const("w", rng.uniform(0.5, 1.5, OFFSET_WIDTH)), const("thousand", 1000.0), const("ten", 10.0)]
    nodes = [helper.make_node("Tanh", ["x"], ["t1"], name="tanh"),
             helper.make_node("Mul", ["t1", "w"], ["t2"], name="scale"),
             helper.make_node("Relu", ["t2"], ["t3"], name="relu"),
             helper.make_node("Sigmoid", ["t3"], ["t4"], name="sigmoid"),
             helper.make_node("Add", ["t4", "t1"], ["a"], name="mix"),
             helper.make_node("Add", ["x", "thousand"], ["b1"], name="shift_up"),
             helper.make_node("Sub", ["b1", "thousand"], ["b2"], name="shift_down"),
             helper.make_node("Mul", ["b2", "ten"], ["b3"], name="amplify"),
             helper.make_node("Add", ["a", "b3"], ["y"], name="out")]
    return make_model(nodes, inits, [tensor("x", [1, OFFSET_WIDTH])], [tensor("y", [1, OFFSET_WIDTH])])


def offset_budget_samples(count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [{"x": rng.uniform(-1, 1, (1, OFFSET_WIDTH)).astype(np.float32)} for _ in range(count)]
