"""ONNX Runtime's int8 convolutions on AMX CPUs: deep ones get weight zero point -1 (ONNX Runtime's AMX GEMM instead
of its symmetric, AVX-only convolution kernel) in the graph for ONNX Runtime, only where the CPU has AMX-INT8,
with outputs bit-identical to the symmetric graph's.  The CPU is injected ($QDEPLOY_CPU_FLAGS): the decisions are
the same on any machine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from qdeploy.stages.quantize.ptq import _placement
from qdeploy.stages.quantize.ptq._amx_convs import gemm_pays, route_convs_to_gemm
from qdeploy.stages.quantize.ptq._placement import placement_differences
from qdeploy.targets.int8_path import FLAGS_ENV
from tests.helpers.quantize import init, make_model, producers, run_ort, save_artifact, stage_context

AMX = "avx512f avx512_vnni amx_tile amx_int8 amx_bf16 avx512_bf16"
VNNI = "avx512f avx512_vnni avx512_bf16"


def _cnn() -> onnx.ModelProto:
    """stem (3 -> 16, depth 27) -> deep (16 -> 160 1x1, then 160 -> 160 3x3: depth 1440) -> grouped (160, 10
    groups) -> pool -> fc; input 1x3x12x12."""
    rng = np.random.default_rng(0)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))).astype(np.float32)

    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="stem", pads=[1] * 4),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="widen"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="deep", pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], name="grouped", pads=[1] * 4, group=10),
             helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
             helper.make_node("GlobalAveragePool", ["r3"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc", transB=1)]
    inits = [init("w0", weight(16, 3, 3, 3)), init("w1", weight(160, 16, 1, 1)), init("w2", weight(160, 160, 3, 3)),
             init("b2", rng.uniform(0, 0.1, 160)), init("w3", weight(160, 16, 3, 3)), init("fc", weight(10, 160))]
    return make_model(nodes, inits, {"x": [1, 3, 12, 12]}, {"y": [1, 10]})


def _context(folder: Path) -> object:
    folder.mkdir(parents=True, exist_ok=True)
    return stage_context(folder)


def _weight_zero_points(model: onnx.ModelProto) -> dict[str, set[int]]:
    """Conv name -> the zero points of its weight's DequantizeLinear."""
    made_by = producers(model)
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    found = {}
    for conv in (node for node in model.graph.node if node.op_type == "Conv"):
        dq = made_by[conv.input[1]]
        found[conv.name] = set(numpy_helper.to_array(initializers[dq.input[2]]).ravel().tolist())
    return found


@pytest.mark.parametrize(("depth", "pixels", "pays"), [
    (27, 12544, False), (64, 3136, False), (576, 3136, False), (576, 784, True), (256, 784, True),
    (128, 784, False), (1152, 3136, True), (4608, None, True), (576, None, False)])
def test_the_gemm_pays_for_deep_reductions_and_moderate_ones_on_small_images(depth: int, pixels: int | None,
                                                                              pays: bool) -> None:
    """What the AMX measurements showed (module docstring): 1x1 from 64 channels at 56x56 lost 0.65x, 3x3 from 64
    at 56x56 0.92x, 3x3 from 64 at 28x28 won 1.31x, 3x3 from 128 at 56x56 1.43x."""
    assert gemm_pays(depth, pixels) is pays


def test_the_graph_for_onnx_runtime_routes_deep_convolutions_to_the_gemm_on_amx(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    artifact = save_artifact(tmp_path, _cnn())
    monkeypatch.setenv(FLAGS_ENV, AMX)
    routed = quantize.run(artifact, QuantizeConfig(runtime="ort"), _context(tmp_path / "amx"))
    monkeypatch.setenv(FLAGS_ENV, VNNI)
    plain = quantize.run(artifact, QuantizeConfig(runtime="ort"), _context(tmp_path / "vnni"))
    zero_points = _weight_zero_points(routed.model)
    assert zero_points["deep"] == {-1}  # depth 1440 at 12x12
    assert zero_points["stem"] == zero_points["widen"] == zero_points["grouped"] == {0}
    assert set(_weight_zero_points(plain.model)["deep"]) == {0}
    assert routed.findings.to_report()["ort_conv_gemm"]["names"] == ["deep"]
    assert "ort_conv_gemm" not in plain.findings.to_report()
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 12, 12)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(routed.model, feeds)[0], run_ort(plain.model, feeds)[0])


def test_the_graph_for_openvino_and_the_shared_graph_keep_symmetric_weights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenVINO runs int8 convolutions only with symmetric weights."""
    artifact = save_artifact(tmp_path, _cnn())
    monkeypatch.setenv(FLAGS_ENV, AMX)
    for runtime in ("openvino", None):
        built = quantize.run(artifact, QuantizeConfig(runtime=runtime), _context(tmp_path / str(runtime)))
        assert all(points == {0} for points in _weight_zero_points(built.model).values())


def test_routing_makes_one_graph_per_runtime_on_amx_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the runtimes' Q/DQ placements agree (made so here), one graph serves both, except on AMX: ONNX
    Runtime's graph routes its deep convolution to the GEMM, and OpenVINO's must keep it symmetric."""
    rng = np.random.default_rng(0)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1] * 4)],
                       [init("w", rng.standard_normal((32, 128, 3, 3)) * 0.05)], {"x": [1, 128, 8, 8]}, ["y"])
    artifact = save_artifact(tmp_path, model)
    monkeypatch.setattr(_placement, "quantized_placement", lambda built: {"conv": "placed alike"})
    monkeypatch.setenv(FLAGS_ENV, VNNI)
    assert placement_differences(artifact.path, QuantizeConfig(), tmp_path / "vnni") == []
    monkeypatch.setenv(FLAGS_ENV, AMX)
    assert placement_differences(artifact.path, QuantizeConfig(), tmp_path / "amx") == ["conv"]


def test_a_weight_with_no_room_below_or_a_shared_one_is_left_as_it_is() -> None:
    """-128 cannot go one lower; a weight two nodes read would change for both."""
    def qdq_conv(values: np.ndarray, share: bool) -> onnx.ModelProto:
        nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
                 helper.make_node("Conv", ["x", "wd"], ["y"], name="conv")]
        if share:
            nodes.append(helper.make_node("DequantizeLinear", ["wq", "ws2", "wz2"], ["unused"], axis=0))
        zeros = np.zeros(4, np.int8)
        inits = [numpy_helper.from_array(values, "wq"), init("ws", np.full(4, 0.01)), init("ws2", np.full(4, 0.01)),
                 numpy_helper.from_array(zeros, "wz"), numpy_helper.from_array(zeros, "wz2")]
        return make_model(nodes, inits, {"x": [1, 128, 4, 4]}, ["y"])

    rng = np.random.default_rng(0)
    values = rng.integers(-127, 128, (4, 128, 3, 3)).astype(np.int8)
    assert route_convs_to_gemm(qdq_conv(values, share=False)) == ["conv"]
    assert route_convs_to_gemm(qdq_conv(values, share=True)) == []
    values[0, 0, 0, 0] = -128
    assert route_convs_to_gemm(qdq_conv(values, share=False)) == []


def test_the_build_machines_amx_enters_the_cache_key_of_onnx_runtimes_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """An int8 artifact built for ONNX Runtime on a machine without AMX is not reused on one with it."""
    from qdeploy.pipeline.recipe import registry
    from qdeploy.stages.quantize.config import PtqConfig

    facts = registry.stage("quantize").host_facts
    monkeypatch.setenv(FLAGS_ENV, AMX)
    assert facts(PtqConfig(runtime="ort")) == {"amx_int8": True}
    assert facts(PtqConfig(runtime="openvino")) == facts(PtqConfig()) == {}
    monkeypatch.setenv(FLAGS_ENV, VNNI)
    assert facts(PtqConfig(runtime="ort")) == {}


def test_only_onnx_runtimes_cpu_provider_gets_the_routing(monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime's OpenVINO provider compiles the graph with OpenVINO, which needs symmetric weights."""
    from qdeploy.stages.quantize.ptq._amx_convs import amx_gemm_wanted

    monkeypatch.setenv(FLAGS_ENV, AMX)
    assert amx_gemm_wanted("ort", ["ort:cpu"]) and amx_gemm_wanted("ort", [])
    assert not amx_gemm_wanted("ort", ["ort:cpu", "ort:openvino"]) and not amx_gemm_wanted("ort", ["ort:cuda"])
    assert not amx_gemm_wanted("openvino", ["openvino:cpu"]) and not amx_gemm_wanted(None, ["ort:cpu"])
