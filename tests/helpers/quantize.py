"""Small graphs, artifacts, contexts and runtime runners of the quantize tests."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qdeploy.calibration import data_context
from qdeploy.core.context import Artifact, StageContext
from qdeploy.pipeline.recipe.schema import DatasetSpec
from tests.helpers.models import REPO

if TYPE_CHECKING:
    from qdeploy.stages.quantize.ptq._ptq import StaticBuilder

DEMO_MODEL = REPO / "recipes" / "models" / "demo_cnn.onnx"


DEMO_VAL = REPO / "recipes" / "data" / "val"


def save_artifact(tmp_path: Path, model: onnx.ModelProto, name: str = "model.onnx") -> Artifact:
    path = tmp_path / name
    onnx.save(model, str(path))
    return artifact_at(path)


def artifact_at(path: Path) -> Artifact:
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key="k", sha256="s",
                    size_bytes=path.stat().st_size, stages=("export",), parent=None)


def npy_folder(tmp_path: Path, shape: tuple[int, ...], count: int, *, seed: int = 0, name: str = "calib",
               uniform: bool = False) -> Path:
    """A folder of ``count`` seeded samples of ``shape`` (.npy, one per file): normal, or uniform in [0, 1)."""
    folder = tmp_path / name
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for index in range(count):
        sample = rng.random(shape) if uniform else rng.standard_normal(shape)
        np.save(folder / f"s{index:02d}.npy", sample.astype(np.float32))
    return folder


def stage_context(tmp_path: Path, datasets: dict[str, Path] | None = None,
                  ranges: dict[str, tuple[float | None, float | None]] | None = None) -> StageContext:
    """A stage context whose datasets are npy/npz folders; ranges may bound random inputs."""
    data = {name: DatasetSpec(reader="npy", path=str(folder)) for name, folder in (datasets or {}).items()}
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return data_context("v", work, datasets=data, resolve=lambda p: tmp_path / p, input_ranges=ranges)


def static_builder(tmp_path: Path, model: onnx.ModelProto, samples: list[dict[str, np.ndarray]], *,
                   channel_peaks: bool = False, **settings: object) -> tuple[StaticBuilder, Path]:
    """ptq's builder for ``model``, prepared and calibrated (minmax) on ``samples`` as the stage does: uint8
    activations, per-channel symmetric int8 weights, op set 'balanced'; ``settings`` (runtime, openvino_runs...)
    go to the builder, ``channel_peaks`` the depthwise inputs' peaks too.  The builder and the prepared model."""
    from qdeploy.stages.quantize.ptq._prepare import prepare
    from qdeploy.stages.quantize.ptq._ptq import BALANCED_OP_TYPES, StaticBuilder, calibrate

    source = tmp_path / "model.onnx"
    onnx.save(model, str(source))
    prepared = prepare(source, tmp_path).path
    op_types = list(BALANCED_OP_TYPES)
    ranges, calibrated = calibrate(prepared, op_types, lambda: iter(samples), tmp_path, "minmax", 99.999)
    peaks = {"channel_peaks": calibrated.channel_peaks} if channel_peaks else {}
    builder = StaticBuilder(prepared, ranges, [], per_channel=True, activation_type="uint8", weight_type="int8",
                            symmetric_activations=False, symmetric_weights=True, op_types=op_types,
                            **peaks, **settings)  # type: ignore[arg-type]
    return builder, prepared


def make_model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], inputs: dict[str, list[int]],
               outputs: list[str] | dict[str, list[int]], *, opset: int = 17,
               domains: tuple[str, ...] = ()) -> onnx.ModelProto:
    """A float model from nodes and initializers; inputs and outputs name -> shape (outputs may be unshaped)."""
    shaped = outputs if isinstance(outputs, dict) else dict.fromkeys(outputs)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                           for n, s in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shaped.items()],
                              inits)
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(domain, 1) for domain in domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def init(name: str, values: object, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def run_ort(model: onnx.ModelProto | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    return ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


def run_openvino(model: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path: Path) -> list[np.ndarray]:
    import openvino

    path = tmp_path / "openvino_input.onnx"
    onnx.save(model, str(path))
    compiled = openvino.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    results = compiled(feeds)
    return [np.asarray(results[output]) for output in compiled.outputs]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {out: node for node in model.graph.node for out in node.output}


def tiny_conv() -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm; input x [1,3,16,16]."""
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)

    inits = [init("w1", weight(8, 3, 3, 3)), init("w2", weight(8, 8, 3, 3)), init("b1", rng.uniform(0, 0.2, 8)),
             init("b2", rng.uniform(0, 0.2, 8)), init("fc", weight(10, 8)), init("fcb", np.zeros(10))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc", "fcb"], ["y"], name="fc", transB=1)]
    return make_model(nodes, inits, {"x": [1, 3, 16, 16]}, {"y": [1, 10]})


def concat_head() -> onnx.ModelProto:
    """Two convolutions of a signed input, one through a MaxPool, concatenated into a third (a detector's head)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["y1"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2"], ["y2"], name="c2", pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["y1"], ["p1"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["p1", "y2"], ["cat"], name="cat", axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["y"], name="c3", pads=[1, 1, 1, 1])]
    weights = [init(name, rng.standard_normal(shape) * 0.3) for name, shape in
               (("w1", (8, 4, 3, 3)), ("w2", (8, 4, 3, 3)), ("w3", (8, 16, 3, 3)))]
    return make_model(nodes, weights, {"x": [1, 4, 12, 12]}, {"y": [1, 8, 12, 12]})


GAINS = (1.0, 0.01, 1.0, 0.02, 0.5, 1.0, 0.005, 1.0)
"""Per-channel gains of ``depthwise_block``'s first convolution: BatchNormalization folded in makes such spreads."""


def depthwise_block(activation: str = "HardSwish", gains: tuple[float, ...] = GAINS) -> onnx.ModelProto:
    """x [1, 3, 16, 16] -> Conv (8 channels scaled by ``gains``) -> ``activation`` -> depthwise Conv (weights
    scaled by 1 / gains: each output channel as large as the others) -> Relu -> 1x1 Conv -> y [1, 4, 16, 16]."""
    rng = np.random.default_rng(0)
    channels = len(gains)
    scale = np.asarray(gains, np.float32)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node(activation, ["c0"], ["a0"], name="act0"),
             helper.make_node("Conv", ["a0", "wd"], ["d"], name="dw", pads=[1, 1, 1, 1], group=channels),
             helper.make_node("Relu", ["d"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "wp"], ["y"], name="pw")]
    weights = [init("w0", rng.standard_normal((channels, 3, 3, 3)) * 0.4 * scale[:, None, None, None]),
               init("wd", rng.standard_normal((channels, 1, 3, 3)) * 0.4 / scale[:, None, None, None]),
               init("wp", rng.standard_normal((4, channels, 1, 1)) * 0.4)]
    return make_model(nodes, weights, {"x": [1, 3, 16, 16]}, {"y": [1, 4, 16, 16]})


def openvino_agrees_with_ort(model: onnx.ModelProto, feed: dict[str, np.ndarray] | None = None) -> float:
    """The cosine between OpenVINO's first output (pinned to f32) and ONNX Runtime's on ``feed`` (by default one
    input of ``concat_head``)."""
    import openvino as ov

    feed = feed or {"x": np.random.default_rng(1).uniform(-2, 2, (1, 4, 12, 12)).astype(np.float32)}
    expected = run_ort(model, feed)[0]
    compiled = ov.Core().compile_model(ov.Core().read_model(model.SerializeToString(), b""), "CPU",
                                       {"INFERENCE_PRECISION_HINT": "f32"})
    produced = np.asarray(compiled.create_infer_request().infer(feed)[compiled.output(0)])
    return float(np.dot(expected.ravel(), produced.ravel()) / (np.linalg.norm(expected) * np.linalg.norm(produced)))
