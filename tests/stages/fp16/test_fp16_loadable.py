"""A float16 model ONNX Runtime does not load (an error, or a crash of its optimisations) gets the fewest nodes kept
float32 that make it load (``qdeploy.stages.fp16._loadable``), instead of failing the variant: a bidirectional GRU
tagger's fp16 variant failed on ONNX Runtime 1.32 with "crashed loading it" until a user named the node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import StageResult
from qdeploy.core.errors import StageError
from qdeploy.stages import fp16
from qdeploy.stages.fp16 import Fp16Config
from qdeploy.stages.fp16._loadable import fewest_for_loading
from qdeploy.targets import ort_probe
from tests.helpers.fp16 import artifact, context

NODES = [f"n{index:03d}" for index in range(200)]


def _counting(rule: Callable[[set[str]], bool]) -> tuple[Callable[[list[str]], bool], list[list[str]]]:
    """``loads`` by a rule on the set kept float32, with the sets it was asked about."""
    asked: list[list[str]] = []

    def loads(nodes: list[str]) -> bool:
        asked.append(list(nodes))
        return rule(set(nodes))

    return loads, asked


def test_one_culprit_among_many_is_found_in_a_few_loads() -> None:
    loads, asked = _counting(lambda kept: "n137" in kept)
    search = fewest_for_loading(NODES, loads)
    assert search is not None and search.nodes == ["n137"] and not search.exhausted
    assert search.loads == len(asked) <= 2 * 8 + 1  # about log2(200) halvings, a few more at worst


def test_nodes_needed_together_are_all_kept_and_nothing_else() -> None:
    loads, _ = _counting(lambda kept: {"n010", "n150", "n199"} <= kept)
    search = fewest_for_loading(NODES, loads, max_loads=200)
    assert search is not None and sorted(search.nodes) == ["n010", "n150", "n199"] and not search.exhausted


def test_either_of_two_culprits_is_enough() -> None:
    loads, _ = _counting(lambda kept: bool({"n020", "n021"} & kept))
    search = fewest_for_loading(NODES, loads)
    assert search is not None and len(search.nodes) == 1 and search.nodes[0] in {"n020", "n021"}


def test_a_failure_float32_does_not_cure_returns_none_after_one_load() -> None:
    loads, asked = _counting(lambda kept: False)
    assert fewest_for_loading(NODES, loads) is None and asked == [NODES]
    assert fewest_for_loading([], loads) is None


def test_the_load_limit_returns_a_set_that_loaded_and_says_it_may_not_be_minimal() -> None:
    rule = lambda kept: {f"n{index:03d}" for index in range(0, 200, 25)} <= kept  # noqa: E731
    loads, asked = _counting(rule)
    search = fewest_for_loading(NODES, loads, max_loads=6)
    assert search is not None and search.exhausted and search.loads == len(asked) <= 6
    assert rule(set(search.nodes))  # every accepted set loaded
    assert search.record("e")["minimal"] is False


def _transposed_matmul(path: Path) -> Path:
    """x [4, 1, 64] -> Transpose(1, 0, 2) -> MatMul(w [64, 5]) -> Relu -> y: a bidirectional GRU's head; float16,
    ONNX Runtime 1.32's CPU provider crashes creating a session for the first two."""
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 5)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
                               helper.make_node("MatMul", ["t", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5])], [weight])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _run(tmp_path: Path, **config: object) -> StageResult:
    source = onnx.load(_transposed_matmul(tmp_path / "float.onnx"))
    (tmp_path / "work").mkdir(exist_ok=True)
    return fp16.run(artifact(tmp_path, source, "exported.onnx"), Fp16Config(**config), context(tmp_path / "work"))


def test_the_stage_keeps_the_node_onnx_runtime_crashes_on_float32_and_ships_a_model_that_loads(
        tmp_path: Path) -> None:
    half = onnx.load(_transposed_matmul(tmp_path / "probe.onnx"))
    from onnxconverter_common.float16 import convert_float_to_float16

    if ort_probe.load_error(convert_float_to_float16(half, keep_io_types=True)) is None:
        pytest.skip("this ONNX Runtime loads a float16 batch-transposed MatMul: the crash the search cures is gone")
    result = _run(tmp_path)
    findings = result.findings.to_report()
    repair = findings["load_repair"]
    assert "crashed" in repair["error"] and repair["minimal"] and len(repair["kept_float32"]) == 1
    kept = [entry for entry in findings["kept_in_fp32"] if entry["node"] == repair["kept_float32"][0]]
    assert kept == [{"node": repair["kept_float32"][0], "op_type": kept[0]["op_type"],
                     "reason": "onnxruntime load: ONNX Runtime crashes loading the model with it float16"}]
    assert kept[0]["op_type"] in {"Transpose", "MatMul"} and "loads in onnxruntime" in findings["checker"]
    assert any(node.op_type == "Cast" and node.attribute[0].i == TensorProto.FLOAT16
               for node in result.model.graph.node)  # the other nodes still run in float16
    session = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((4, 1, 64)).astype(np.float32)
    expected = np.maximum(x.transpose(1, 0, 2) @ onnx.numpy_helper.to_array(half.graph.initializer[0]), 0)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, atol=0.05, rtol=0.01)


def test_a_model_that_loads_gets_no_search_and_one_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = ort_probe.load_error

    def counted(source: object, feed: object = None) -> str | None:
        calls.append(source)
        return None if isinstance(source, onnx.ModelProto) else real(source)  # type: ignore[arg-type]

    monkeypatch.setattr(fp16, "load_error", counted)
    findings = _run(tmp_path).findings.to_report()
    assert "load_repair" not in findings and len(calls) == 1
    assert findings["checker"].endswith("loads in onnxruntime CPUExecutionProvider")


def test_a_load_failure_float32_nodes_do_not_cure_fails_the_variant_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp16, "load_error", lambda source, feed=None: "InvalidGraph: something else")
    with pytest.raises(StageError, match=r"something else.*keeping every converted node float32 does not make it"):
        _run(tmp_path)


def test_without_the_onnxruntime_check_nothing_is_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp16, "load_error", lambda source, feed=None: pytest.fail("loaded"))
    findings = _run(tmp_path, onnxruntime_check=False).findings.to_report()
    assert "load_repair" not in findings and "not checked" in findings["checker"]


def test_a_kernel_that_refuses_only_at_run_time_is_searched_like_a_load_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With data the probe runs the first sample the float32 model ran (ONNX Runtime 1.32 loads a float16
    ScatterElements with a reduction, then fails every run); here a stand-in runtime refuses a float16 MatMul only
    when it is run, and the search keeps that node float32."""
    feeds: list[object] = []

    def refuses_half_matmul_at_run(source: object, feed: object = None) -> str | None:
        feeds.append(feed)
        model = source if isinstance(source, onnx.ModelProto) else onnx.load(source)  # type: ignore[arg-type]
        types = {value.name: value.type.tensor_type.elem_type for value in model.graph.value_info}
        types.update((init.name, init.data_type) for init in model.graph.initializer)
        half = any(node.op_type == "MatMul" and types.get(node.input[1]) == TensorProto.FLOAT16
                   for node in model.graph.node)
        return "RuntimeException running one sample: no float16 MatMul" if half and feed is not None else None

    monkeypatch.setattr(fp16, "load_error", refuses_half_matmul_at_run)
    sample = {"x": np.random.default_rng(2).standard_normal((4, 1, 64)).astype(np.float32)}
    source = onnx.load(_transposed_matmul(tmp_path / "float.onnx"))
    (tmp_path / "work").mkdir()
    result = fp16.run(artifact(tmp_path, source, "exported.onnx"), Fp16Config(calibration={"data": "cal"}),
                      context(tmp_path / "work", {"cal": [sample, sample]}))
    findings = result.findings.to_report()
    assert feeds and all(feed is not None and set(feed) == {"x"} for feed in feeds)  # type: ignore[arg-type]
    matmul = next(node.name for node in result.model.graph.node if node.op_type == "MatMul")
    assert findings["load_repair"]["kept_float32"] == [matmul]
    assert {"node": matmul, "op_type": "MatMul",
            "reason": "onnxruntime load: ONNX Runtime fails running a sample of the model with it float16"
            } in findings["kept_in_fp32"]
