"""The activation analysis's peaks computed in the graph equal the ones numpy takes of the exposed tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.stages.fp16 import _activations
from qdeploy.stages.fp16._activations import run_float32
from tests.helpers.peak import peak_mib


def _model(opset: int) -> onnx.ModelProto:
    """x -> Mul(1e4) -> big; Log(x) -> -inf at 0, NaN below it; Slice to nothing -> an empty tensor;
    Neg(Abs) -> only negative values; all summed into y."""
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["big"]),
        helper.make_node("Log", ["x"], ["logged"]),
        helper.make_node("Abs", ["x"], ["magnitude"]),
        helper.make_node("Neg", ["magnitude"], ["negative"]),
        helper.make_node("Slice", ["x", "start", "end", "axis"], ["empty"]),
        helper.make_node("Add", ["big", "negative"], ["sum"]),
        helper.make_node("ReduceSum", ["empty"], ["empty_sum"], keepdims=1),
        helper.make_node("Add", ["sum", "logged"], ["with_log"]),
        helper.make_node("Add", ["with_log", "empty_sum"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(1e4, np.float32), "scale"),
             numpy_helper.from_array(np.array([2], np.int64), "start"),
             numpy_helper.from_array(np.array([2], np.int64), "end"),
             numpy_helper.from_array(np.array([1], np.int64), "axis")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


FEEDS = [{"x": np.array([[0.5, 2.0, 0.0, -1.0, 3.0, 0.25]], np.float32)},
         {"x": np.array([[1.5, 4.0, 0.125, 2.0, 5.0, 0.75]], np.float32)}]


@pytest.mark.parametrize("opset", [13, 18])
def test_probes_record_what_the_exposed_tensors_give(tmp_path: Path, opset: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(opset)
    probed = run_float32(model, FEEDS, tmp_path)
    monkeypatch.setattr(_activations, "PROBE_MIN_OPSET", 99)  # the fallback: every tensor exposed, numpy's peaks
    exposed = run_float32(model, FEEDS, tmp_path)
    assert probed.stats.keys() == exposed.stats.keys()
    assert probed.stats == exposed.stats
    assert "empty" not in probed.stats  # nothing to record of an empty tensor
    logged = probed.stats["logged"]  # -inf and NaN on the first sample: peaks of the finite values, flagged
    assert logged.nonfinite and logged.abs_max == pytest.approx(-np.log(0.125)) and logged.max == pytest.approx(
        np.log(5.0))
    assert probed.stats["negative"].max == pytest.approx(-0.0) and probed.stats["big"].abs_max == 5e4
    for got, want in zip(probed.outputs, exposed.outputs, strict=True):
        np.testing.assert_array_equal(got["y"], want["y"])


def test_a_probe_holds_scalars_not_the_tensor(tmp_path: Path) -> None:
    """The probe file's outputs are the graph's own and four small ones per tensor, never a tensor itself."""
    run_float32(_model(13), FEEDS[:1], tmp_path)
    probe = onnx.load(str(tmp_path / "fp16_probe.onnx"))
    names = [value.name for value in probe.graph.output]
    assert names[0] == "y" and all(name.split("__peak_")[-1] in ("abs", "max", "bad", "shape") for name in names[1:])
    assert {name.split("__peak_")[0] for name in names[1:]} == {"big", "logged", "magnitude", "negative", "empty",
                                                                "sum", "empty_sum", "with_log"}


def test_analysis_sessions_keep_no_memory_pattern_or_arena(tmp_path: Path) -> None:
    """From its second run on, a memory pattern allocates a block for every planned activation beside the run's
    own (0.55 GB more on a 135M-parameter decoder's emulation): analysis sessions run without it and the arena."""
    from qdeploy.stages.fp16._activations import probe_session

    path = tmp_path / "m.onnx"
    onnx.save(_model(13), str(path))
    options = probe_session(path, in_order=True).get_session_options()
    assert not options.enable_mem_pattern and not options.enable_cpu_mem_arena


def test_a_graph_that_uses_the_probes_names_is_analysed_from_its_tensors(tmp_path: Path) -> None:
    """A tensor already named like a probe output: the probes would clash, so the tensors are exposed instead, and
    the statistics are the same."""
    model = _model(13)
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    for node in renamed.graph.node:
        node.input[:] = ["big__peak_abs" if name == "big" else name for name in node.input]
        node.output[:] = ["big__peak_abs" if name == "big" else name for name in node.output]
    for value in renamed.graph.value_info:
        if value.name == "big":
            value.name = "big__peak_abs"
    (tmp_path / "renamed").mkdir()
    result = run_float32(renamed, FEEDS, tmp_path / "renamed")
    names = [value.name for value in onnx.load(str(tmp_path / "renamed" / "fp16_probe.onnx")).graph.output]
    assert "big__peak_abs" in names and not any(name.endswith("__peak_shape") for name in names)  # exposed
    assert result.stats["big__peak_abs"] == run_float32(model, FEEDS, tmp_path).stats["big"]


def test_the_probes_hold_one_activation_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight 16 MB activations in a chain: each tensor's probes run right after it is made (the session runs the
    model's order), so the run holds a few at once; probes at the end of the graph kept every one alive.  glibc
    returns large blocks at once here (a fixed mmap threshold): the peak measures what is alive, not the heap."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    setup = """
        import numpy as np
        from pathlib import Path
        import onnx
        from onnx import TensorProto, helper
        from qdeploy.stages.fp16._activations import run_float32

        n, x, nodes = 1 << 22, "x", []
        for i in range(8):
            nodes.append(helper.make_node("Sin" if i % 2 else "Cos", [x], [f"a{i}"], name=f"n{i}"))
            x = f"a{i}"
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
                                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n])])
        model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
        feeds = [{"x": np.ones(n, np.float32)}]
    """
    measured = f"""
        run = run_float32(model, feeds, Path({str(tmp_path)!r}))
        assert sorted(run.stats) == sorted(["x", *(f"a{{i}}" for i in range(8))])
    """
    peak = peak_mib(tmp_path, setup, measured, timeout=120)
    assert peak < 160, peak  # ~120 MB; all eight alive at the end: ~200 MB


def test_a_rearranged_weight_is_measured_from_the_weight_not_probed(tmp_path: Path) -> None:
    """A weight's Transpose holds the weight's values on every input: its peaks come from the weight (one read),
    not from probes on every sample (on a tied 49k x 576 embedding they held 0.4 GB per run)."""
    weight = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32) * 3
    weight[2, 1] = -70000.0  # beyond float16: what decides the reader stays float32
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("Reshape", ["wt", "shape"], ["wr"]),
             helper.make_node("MatMul", ["x", "wr"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
                              [numpy_helper.from_array(weight, "w"),
                               numpy_helper.from_array(np.array([4, 6], np.int64), "shape")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    run = run_float32(model, [{"x": np.ones((1, 4), np.float32)}], tmp_path)
    for name, shape in (("wt", (4, 6)), ("wr", (4, 6))):
        assert run.stats[name].abs_max == 70000.0 and run.stats[name].max == float(weight.max())
        assert run.stats[name].shape == shape
    probe = onnx.load(str(tmp_path / "fp16_probe.onnx"), load_external_data=False)
    assert not [out.name for out in probe.graph.output if out.name.startswith(("wt__", "wr__"))]
    assert "y" in run.stats  # activations are probed as before


def test_no_tensor_to_watch_adds_nothing_to_the_graph() -> None:
    """The probes' constants come with probes only: unused, ONNX Runtime printed a warning for each on the terminal
    ("Removing initializer '__peak_zero'. It is not used by any node")."""
    from qdeploy.stages.fp16._peak_probes import add_peak_probes

    graph = _model(17).graph
    before = graph.SerializeToString()

    assert add_peak_probes(graph, []) == {}
    assert graph.SerializeToString() == before
