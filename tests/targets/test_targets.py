"""Target adapters: numerical agreement with numpy, ONNX output names, honest unavailability."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.errors import DataError, ModelError, TargetUnavailable
from qdeploy.targets import KNOWN_TARGETS, ExecutionInfo, TargetFellBack, available_targets, get_target

RNG = np.random.default_rng(0)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = np.array([0.5, -0.25, 0.0], dtype=np.float32)
RUNNABLE = ["ort:cpu", "openvino:cpu", "reference:cpu"]


@pytest.fixture
def mlp_path(tmp_path: Path) -> Path:
    """x[N,4] -> z = x@W + B (an output that Relu also consumes) -> y = Identity(Relu(z))."""
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"]),
        helper.make_node("Add", ["h", "B"], ["z"]),
        helper.make_node("Relu", ["z"], ["r"]),
        helper.make_node("Identity", ["r"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializer=[numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    return path


def _expected(x: np.ndarray) -> dict[str, np.ndarray]:
    z = x.astype(np.float64) @ W.astype(np.float64) + B
    return {"z": z, "y": np.maximum(z, 0.0)}


@pytest.mark.parametrize("name", RUNNABLE)
def test_outputs_match_numpy_and_carry_onnx_names(mlp_path: Path, name: str) -> None:
    session = get_target(name).load(mlp_path, threads=1)
    assert session.input_names == ["x"]
    assert session.output_names == ["z", "y"]
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    outputs = session.run({"x": x})
    assert list(outputs) == ["z", "y"]
    expected = _expected(x)
    assert (expected["y"] == 0).any() and (expected["y"] > 0).any()  # Relu really clips something
    for key in ("z", "y"):
        assert isinstance(outputs[key], np.ndarray)
        assert outputs[key].shape == (5, 3)
        np.testing.assert_allclose(outputs[key], expected[key], rtol=1e-5, atol=1e-6)
    session.close()


def test_ort_cpu_reports_what_ran(mlp_path: Path) -> None:
    session = get_target("ort:cpu").load(mlp_path)
    info = session.executed
    assert (info.runtime, info.device, info.providers, info.precision) == (
        "onnxruntime", "CPUExecutionProvider", ["CPUExecutionProvider"], None)
    assert info.node_counts == {}
    session.run({"x": np.ones((2, 4), np.float32)})
    assert set(info.node_counts) == {"CPUExecutionProvider"}
    assert info.node_counts["CPUExecutionProvider"] >= 1
    assert sum(info.op_types.values()) == info.node_counts["CPUExecutionProvider"]
    again = session.run({"x": np.ones((2, 4), np.float32)})  # profiling ended after the first run
    np.testing.assert_allclose(again["y"], _expected(np.ones((2, 4)))["y"], rtol=1e-5, atol=1e-6)


def test_openvino_pins_f32_and_reports_runtime_precisions(mlp_path: Path) -> None:
    session = get_target("openvino:cpu").load(mlp_path, pin_f32=True)
    info = session.executed
    assert info.runtime == "openvino"
    assert info.device == "CPU" and info.providers == ["CPU"]
    assert info.precision == "f32"
    assert info.node_counts.get("FP32", 0) >= 1
    assert set(info.node_counts) <= {"FP32", "I32", "I64"}  # nothing ran in bf16/f16
    assert any(note.startswith("query_model: all") for note in info.notes)


def test_reference_reports_declared_precision(mlp_path: Path) -> None:
    info = get_target("reference:cpu").load(mlp_path).executed
    assert info.precision == "declared"
    assert info.op_types == {"MatMul": 1, "Add": 1, "Relu": 1, "Identity": 1}
    assert get_target("reference:cpu").benchmarkable is False
    assert get_target("ort:cpu").benchmarkable is True


def test_execution_info_to_dict_is_json_ready() -> None:
    info = ExecutionInfo("ort:cpu", "onnxruntime", "CPUExecutionProvider", ["CPUExecutionProvider"], None,
                         {"CPUExecutionProvider": 3}, ["a note"])
    assert info.to_dict() == {
        "target": "ort:cpu", "runtime": "onnxruntime", "device": "CPUExecutionProvider",
        "providers": ["CPUExecutionProvider"], "precision": None,
        "node_counts": {"CPUExecutionProvider": 3}, "notes": ["a note"], "op_types": {}, "precisions": {},
        "unsupported_ops": [],
    }


def _really_unavailable(name: str) -> bool:
    import onnxruntime
    import openvino

    if name.startswith("ort:"):
        wanted = {"ort:cuda": "CUDAExecutionProvider", "ort:tensorrt": "TensorrtExecutionProvider"}[name]
        return wanted not in onnxruntime.get_available_providers()
    return not any(d.startswith("GPU") for d in openvino.Core().available_devices)


@pytest.mark.parametrize(("name", "exists"), [
    ("ort:cuda", "CPUExecutionProvider"), ("ort:tensorrt", "CPUExecutionProvider"), ("openvino:gpu", "CPU"),
])
def test_missing_targets_are_unavailable_with_a_reason(mlp_path: Path, name: str, exists: str) -> None:
    if not _really_unavailable(name):
        pytest.skip(f"{name} exists on this machine")
    ok, reason = get_target(name).availability()
    assert ok is False
    assert reason.startswith(f"target {name} is not available here; this machine's")  # never "requested"
    assert exists in reason
    assert "AzureExecutionProvider" not in reason
    assert available_targets()[name] == reason.split("; ", 1)[1]  # doctor's listing names the target itself
    with pytest.raises(TargetUnavailable, match=name):
        get_target(name).load(mlp_path)


def test_available_targets_lists_every_known_target() -> None:
    targets = available_targets()
    assert list(targets) == list(KNOWN_TARGETS)
    assert targets["ort:cpu"] == "" and targets["openvino:cpu"] == "" and targets["reference:cpu"] == ""


def test_silent_gpu_fallback_is_refused(mlp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("CUDA exists here; no fallback to provoke")
    real = onnxruntime.get_available_providers()
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [*real, "CUDAExecutionProvider"])
    assert get_target("ort:cuda").availability() == (True, "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ORT's own warning about the missing provider
        with pytest.raises(TargetFellBack, match="silently fell back to CPUExecutionProvider"):
            get_target("ort:cuda").load(mlp_path)


def test_unknown_target_raises_value_error_naming_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown target 'foo:bar'; known targets: ort:cpu, ort:cuda"):
        get_target("foo:bar")


@pytest.mark.parametrize("name", RUNNABLE)
def test_bad_model_file_raises_model_error(tmp_path: Path, name: str) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"this is not a protobuf")
    with pytest.raises(ModelError, match=r"broken\.onnx"):
        get_target(name).load(bad)
    with pytest.raises(ModelError, match="not found"):
        get_target(name).load(tmp_path / "absent.onnx")


@pytest.mark.parametrize("name", RUNNABLE)
def test_feeds_that_miss_an_input_raise_data_error(mlp_path: Path, name: str) -> None:
    session = get_target(name).load(mlp_path)
    with pytest.raises(DataError, match=r"missing \['x'\]"):
        session.run({"input": np.ones((1, 4), np.float32)})


def test_importing_targets_imports_no_runtime() -> None:
    code = ("import sys, qdeploy.targets, qdeploy.core.compare; "
            "print(sorted(m for m in ('onnxruntime', 'openvino', 'onnx') if m in sys.modules))")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert result.stdout.strip() == "[]"


class _RecordingCore:
    """Delegates to the real OpenVINO Core and records the config given to compile_model."""

    def __init__(self, core: object) -> None:
        self._core = core
        self.configs: list[dict] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._core, name)

    def compile_model(self, model: object, device: str, config: dict) -> object:
        self.configs.append(dict(config))
        return self._core.compile_model(model, device, config)


@pytest.mark.parametrize(("pin_f32", "threads", "expected"), [
    (True, 1, {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "INFERENCE_NUM_THREADS": 1}),
    (False, None, {}),
])
def test_openvino_compile_config_follows_pin_and_threads(mlp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         pin_f32: bool, threads: int | None, expected: dict) -> None:
    import qdeploy.targets.openvino as targets

    recorder = _RecordingCore(targets._ov_core())
    monkeypatch.setattr(targets, "_ov_core", lambda: recorder)
    session = get_target("openvino:cpu").load(mlp_path, threads=threads, pin_f32=pin_f32)
    assert recorder.configs == [expected]
    if threads:
        assert session.runtime_settings()["INFERENCE_NUM_THREADS"] == threads


def test_ort_threads_set_intra_op_threads(mlp_path: Path) -> None:
    session = get_target("ort:cpu").load(mlp_path, threads=1)
    assert session.runtime_settings()["intra_op_num_threads"] == 1


def test_ort_counts_each_kernel_once_even_inside_a_loop(tmp_path: Path) -> None:
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "one"], ["acc_out"], name="inner_add"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="inner_id")], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones((1, 4), np.float32), "one")])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "c", "x"], ["y"], name="loop", body=body)], "looped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.array(5, np.int64), "n"), numpy_helper.from_array(np.array(True), "c")])
    path = tmp_path / "loop.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    session = get_target("ort:cpu").load(path)
    np.testing.assert_array_equal(session.run({"x": np.zeros((1, 4), np.float32)})["y"], np.full((1, 4), 5.0))
    info = session.executed
    assert info.node_counts == {"CPUExecutionProvider": 3}  # Loop, Add, Identity: the body ran 5 times
    assert info.op_types == {"Loop": 1, "Add": 1, "Identity": 1}
    assert info.precisions == {"I64": 1, "FP32": 1, "BOOL": 1}  # each kernel by its first input's type


def test_ort_precisions_count_float_kernels(mlp_path: Path) -> None:
    session = get_target("ort:cpu").load(mlp_path)
    session.run({"x": np.ones((2, 4), np.float32)})
    assert session.executed.precisions == {"FP32": session.executed.node_counts["CPUExecutionProvider"]}


def test_ort_counts_an_integer_kernel_fed_float_in_its_weights_type(tmp_path: Path) -> None:
    """DynamicQuantizeMatMul (dynamic int8, fused by ORT) reads a float input and int8 weights: an int8 kernel,
    which the report used to show as float32 ("fp32+i64 kernels" for a dynamic int8 BERT)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
                              [numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")])
    source, quantized = tmp_path / "mm.onnx", tmp_path / "mm_int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(source))
    quantize_dynamic(str(source), str(quantized), weight_type=QuantType.QInt8)
    session = get_target("ort:cpu").load(quantized)
    session.run({"x": rng.standard_normal((2, 64)).astype(np.float32)})
    assert session.executed.op_types == {"DynamicQuantizeMatMul": 1}
    assert session.executed.precisions == {"I8": 1}


def test_openvino_precision_with_and_without_the_f32_hint(mlp_path: Path) -> None:
    """Pinned: f32 everywhere. Unpinned: the plugin's default, bf16 where the CPU has it.

    On a CPU without bf16 both read f32, and what is checked is that the hint is passed and the precision read back
    from the compiled model; on a bf16 CPU (AVX512-BF16 or AMX) the unpinned run must report bf16 kernels.
    """
    from qdeploy.targets.openvino import _ov_core

    capabilities = _ov_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    pinned = get_target("openvino:cpu").load(mlp_path, pin_f32=True).executed
    default = get_target("openvino:cpu").load(mlp_path, pin_f32=False).executed
    assert pinned.precision == "f32" and set(pinned.precisions) <= {"FP32", "I32", "I64"}
    assert default.precision == ("bf16" if "BF16" in capabilities else "f32")
    if "BF16" in capabilities:
        assert default.precisions.get("BF16", 0) >= 1


def test_reference_target_runs_qdq_models_below_opset_19(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
         helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq")], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "s"), numpy_helper.from_array(np.array(3, np.uint8), "zp")])
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    x = np.array([-2.0, -0.6, 0.0, 1.26, 200.0], np.float32)
    expected = get_target("ort:cpu").load(path).run({"x": x})["y"]
    np.testing.assert_array_equal(expected, [-1.5, -0.5, 0.0, 1.5, 126.0])  # uint8 clips below zero point 3
    np.testing.assert_array_equal(get_target("reference:cpu").load(path).run({"x": x})["y"], expected)


def test_runtime_errors_keep_their_cause_not_their_cpp_source_locations() -> None:
    """OpenVINO prefixes each level of an error with where its C++ raised it; the one-line message drops those and
    keeps the cause (issue 27: silero-vad's "rank has to be known" was cut off) and, when long, the summary."""
    from qdeploy.targets.base import short_message

    cause = "The input data tensor's rank has to be known (static)"
    raw = ("Exception from src/inference/src/cpp/core.cpp:84:\nCheck 'false' failed at "
           "src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\nFrontEnd API failed with "
           "OpConversionFailure: Model wasn't fully converted. -- Conv-15 with a message: failed at "
           f"src/frontends/onnx/frontend/src/op/conv.cpp:38: {cause} " + "x" * 250 + " Summary: Conv-15")
    message = short_message(RuntimeError(raw))
    assert cause in message and ".cpp" not in message and message.endswith("Summary: Conv-15")
    long = short_message(RuntimeError("start " + "y" * 5000 + " the end"))
    assert long.startswith("start") and long.endswith("the end") and " ... " in long and len(long) <= 700


class _QueryCountingCore:
    """OpenVINO's Core, counting query_model; ``refuse`` makes compile_model fail."""

    def __init__(self, core: object, refuse: bool = False) -> None:
        self._core, self.refuse, self.queries = core, refuse, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._core, name)

    def query_model(self, model: object, device: str) -> dict:
        self.queries += 1
        return self._core.query_model(model, device)

    def compile_model(self, model: object, device: str, config: dict) -> object:
        if self.refuse:
            raise RuntimeError("Unsupported operation of type: MatMul")
        return self._core.compile_model(model, device, config)


@pytest.mark.parametrize("refuse", [False, True])
def test_a_search_trial_asks_openvino_query_model_only_to_explain_a_failed_compile(
        mlp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse: bool) -> None:
    """query_model costs about a compile (a budget search loads dozens of candidates); a reported session keeps
    its note, a trial asks only when the compile fails, so the error still says what the device supports."""
    import qdeploy.targets.openvino as targets_openvino
    from qdeploy.targets import load_as_deployed

    counting = _QueryCountingCore(targets_openvino._ov_core(), refuse)
    monkeypatch.setattr(targets_openvino, "_ov_core", lambda: counting)
    if refuse:
        with pytest.raises(ModelError, match=r"query_model: all \d+ ops supported on CPU"):
            load_as_deployed("openvino:cpu", mlp_path, trial=True)
        assert counting.queries == 1
        return
    with load_as_deployed("openvino:cpu", mlp_path, trial=True) as session:
        assert session.run({"x": np.ones((2, 4), np.float32)})["y"].shape == (2, 3)
        assert targets_openvino.NOT_QUERIED in session.executed.notes
    assert counting.queries == 0
    with load_as_deployed("openvino:cpu", mlp_path) as session:
        assert any(note.startswith("query_model: all") for note in session.executed.notes)
    assert counting.queries == 1
