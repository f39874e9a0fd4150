"""ONNX Runtime's quantizers on an indexed graph (stages/quantize/ptq/_fast_ort.py): the same model as ORT's own, and
no whole-graph scan per node.  Timings live in benchmarks/scaling.py; here the scans are counted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from benchmarks.scaling_models import SHAPES
from qdeploy.calibration.readers import model_inputs, random_samples
from qdeploy.stages.quantize.ptq._prepare import prepare
from qdeploy.stages.quantize.ptq._ptq import DynamicBuilder, StaticBuilder, calibrate, default_op_types
from tests.helpers.quantize import tiny_conv

SCANNING = ("input_name_to_nodes", "output_name_to_node", "replace_input_of_all_nodes", "replace_input_of_nodes",
            "replace_output_of_all_nodes", "get_initializer", "add_initializer", "initializer_extend",
            "remove_node", "remove_initializer", "clean_initializers", "find_node_by_name", "is_graph_output")
"""ORT's ONNXModel methods that walk the whole graph (or all initializers) on every call."""


def prepared(tmp_path: Path, model: onnx.ModelProto) -> Path:
    source = tmp_path / "source.onnx"
    onnx.save(model, str(source))
    return prepare(source, tmp_path).path


def static(path: Path, tmp_path: Path, op_set: str = "balanced", per_channel: bool = True,
           symmetric: bool = False) -> onnx.ModelProto:
    feeds = list(random_samples(model_inputs(path), 2))
    op_types = default_op_types("ptq", "int8", op_set)
    ranges, _ = calibrate(path, op_types, lambda: iter(feeds), tmp_path, "minmax", 99.9)
    return StaticBuilder(path, ranges, [], per_channel=per_channel, activation_type="uint8", weight_type="int8",
                         symmetric_activations=symmetric, symmetric_weights=True, op_types=op_types)([])


def dynamic(path: Path, tmp_path: Path, weight_type: str = "int8", per_channel: bool = True) -> onnx.ModelProto:
    return DynamicBuilder(path, [], tmp_path, per_channel=per_channel, weight_type=weight_type,
                          op_types=default_op_types("dynamic", weight_type))([])


@pytest.fixture
def ort_own(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The builders with ONNX Runtime's own quantizer classes (what qdeploy used before)."""
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

    from qdeploy.stages.quantize.ptq import _fast_ort as quantize_fast_ort

    monkeypatch.setattr(quantize_fast_ort, "FastQDQQuantizer", QDQQuantizer)
    monkeypatch.setattr(quantize_fast_ort, "FastONNXQuantizer", ONNXQuantizer)
    yield


def same(a: onnx.ModelProto, b: onnx.ModelProto) -> bool:
    return a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)


MODELS = {"tiny_conv": tiny_conv, **{name: (lambda make=make: make(240)) for name, make in SHAPES.items()}}


@pytest.mark.parametrize("name", [  # the fast loop keeps a conv and a transformer
    name if name in ("tiny_conv", "transformer") else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(MODELS)])
def test_the_indexed_quantizers_write_exactly_what_onnxruntimes_own_write(tmp_path: Path, name: str,
                                                                         request: pytest.FixtureRequest) -> None:
    path = prepared(tmp_path, MODELS[name]())
    variants = [("static", {"op_set": "balanced"}), ("static", {"op_set": "onnxruntime", "per_channel": False,
                                                                "symmetric": True}),
                ("dynamic", {}), ("dynamic", {"weight_type": "uint8", "per_channel": False})]
    fast = [static(path, tmp_path, **kw) if kind == "static" else dynamic(path, tmp_path, **kw)
            for kind, kw in variants]
    request.getfixturevalue("ort_own")
    for (kind, kw), ours in zip(variants, fast, strict=True):
        theirs = static(path, tmp_path, **kw) if kind == "static" else dynamic(path, tmp_path, **kw)
        assert same(ours, theirs), (name, kind, kw)
    assert all(len(model.graph.node) > len(MODELS[name]().graph.node) for model in fast[:2])  # QDQ was added


def scans(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, nodes: int, mode: str, shape: str) -> Counter[str]:
    """How often the whole-graph methods of ORT's ONNXModel (and find_by_name over a long plain list) ran while
    quantizing a model of that many nodes."""
    from onnxruntime.quantization.onnx_model import ONNXModel

    from qdeploy.stages.quantize.ptq import _fast_ort as quantize_fast_ort

    quantize_fast_ort.install_find_by_name()
    folder = tmp_path / f"{mode}-{nodes}"
    folder.mkdir()
    path = prepared(folder, SHAPES[shape](nodes))
    counts: Counter[str] = Counter()
    with monkeypatch.context() as patch:
        for method in SCANNING:
            original = getattr(ONNXModel, method)
            patch.setattr(ONNXModel, method, _counting(original, method, counts))
        fast_find = quantize_fast_ort._find_by_name

        def find(name: str, items: object) -> object:
            indexed = isinstance(items, quantize_fast_ort._Initializers | quantize_fast_ort._NodeList)
            if not indexed and (isinstance(items, list | tuple) or type(items).__name__.startswith("Repeated")):
                counts["find_by_name over a plain list"] += len(items) > 50  # type: ignore[arg-type]
            return fast_find(name, items)

        patch.setattr(quantize_fast_ort, "_find_by_name", find)
        quantize_fast_ort.install_find_by_name()
        for module in ("qdq_quantizer", "base_quantizer", "onnx_quantizer", "onnx_model", "operators.matmul",
                       "operators.conv", "operators.gemm"):
            patch.setattr(f"onnxruntime.quantization.{module}.find_by_name", find, raising=False)
        static(path, folder) if mode == "static" else dynamic(path, folder)
    return counts


def _counting(original: object, name: str, counts: Counter[str]) -> object:
    def counted(*args: object, **kwargs: object) -> object:
        counts[name] += 1
        return original(*args, **kwargs)  # type: ignore[operator]
    return counted


@pytest.mark.parametrize(("mode", "shape"), [  # one shape per mode on the fast loop
    pytest.param("static", "chain", marks=pytest.mark.slow), ("static", "conv"),
    pytest.param("static", "transformer", marks=pytest.mark.slow),
    pytest.param("dynamic", "chain", marks=pytest.mark.slow), ("dynamic", "transformer")])
def test_quantizing_scans_the_graph_a_fixed_number_of_times_whatever_its_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, shape: str) -> None:
    """ORT's own quantizer scans the graph once per node (20,000 nodes did not finish in 400 s); the indexed one
    a fixed number of times: the counts must not grow with the node count."""
    small = scans(monkeypatch, tmp_path, 160, mode, shape)
    large = scans(monkeypatch, tmp_path, 640, mode, shape)
    assert large == small, {key: (small[key], large[key]) for key in set(small) | set(large)}
    assert sum(large.values()) <= 8


def test_calibration_of_a_long_chain_reads_every_tensor_once(tmp_path: Path) -> None:
    """Tensors the probe model exposes are looked up in a set: collect_statistics stays linear."""
    from qdeploy.calibration.activations import collect_statistics, float_tensors_of

    path = prepared(tmp_path, SHAPES["chain"](400))
    tensors = float_tensors_of(path)
    feeds = list(random_samples(model_inputs(path), 2))
    stats, samples = collect_statistics(path, tensors, lambda: iter(feeds), tmp_path)
    assert samples == 2 and len(stats) == len(tensors) > 300
    assert all(np.isfinite(item.maximum) for item in stats.values())


def test_openvino_kernel_count_of_a_large_graph_runs_apart_with_a_time_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenVINO's compile grows with the square of a QDQ chain: above a size it runs in a child process, and a
    compile past the limit is 'unchecked' with the reason, never a pass and never a stage that runs for hours."""
    from qdeploy.stages.quantize.ptq import _verify as quantize_verify

    path = prepared(tmp_path, tiny_conv())
    model = static(path, tmp_path)
    output = tmp_path / "quantized.onnx"
    onnx.save(model, str(output))
    in_process = quantize_verify.int8_kernels(output, model, ["openvino:cpu"], tmp_path)["openvino:cpu"]
    monkeypatch.setattr(quantize_verify, "IN_PROCESS_NODES", 0)
    apart = quantize_verify.int8_kernels(output, model, ["openvino:cpu"], tmp_path)["openvino:cpu"]
    assert apart == in_process and apart["int8"] >= 1
    monkeypatch.setattr(quantize_verify, "OPENVINO_CHECK_SECONDS", 0.01)
    late = quantize_verify.int8_kernels(output, model, ["openvino:cpu"], tmp_path)["openvino:cpu"]
    assert late["status"] == "unchecked" and "took longer than 0 s" in late["reason"]
