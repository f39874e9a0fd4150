"""Locating a divergence that lives inside OpenVINO's fusions: exposing the intermediates hides it, prefix
sub-models compiled whole find it (stages/validate/_localize_fused.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import qdeploy.stages.validate as validate
from qdeploy.core.tolerance import Tolerance
from qdeploy.stages.validate import ValidateConfig
from qdeploy.stages.validate._localize import Localizer, TensorPair
from qdeploy.stages.validate._localize_fused import _cuts, locate_fused, prefix_model, refine
from tests.helpers.quantize import init, save_artifact, stage_context
from tests.helpers.text_cnn import SHIFT_CHANNELS, SHIFT_LENGTH, causal_shift
from tests.helpers.validate import artifact, by_pair, context

TOLERANCE = Tolerance(cosine_min=0.99)


def _models(movers: int = 1) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The float reference and its QDQ candidate.  Reference: x [1, 3, 6] -> ``movers`` Transposes (t0, t1, ...)
    -> Pad (2 steps in front) -> 'padded' -> Max with u -> y.  Candidate: the last Transpose's output, the Pad's and
    u go through Q/DQ pairs reading one scale and zero point, as ORT's quantizer writes them.  OpenVINO's
    PadTransformation rewrites that shared zero point for every reader: wrong at the padded steps, unless the Q/DQ
    outputs are graph outputs (exposed, the Pad is left alone)."""
    float_nodes, current = [], "x"
    for index in range(movers):
        float_nodes.append(helper.make_node("Transpose", [current], [f"t{index}"], name=f"transpose{index}",
                                            perm=[0, 2, 1]))
        current = f"t{index}"
    tail = [helper.make_node("Pad", [current, "pads"], ["padded"], name="pad", mode="constant"),
            helper.make_node("Max", ["padded", "u"], ["y"], name="merge")]
    shape = [1, 3, 6] if movers % 2 else [1, 6, 3]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
              helper.make_tensor_value_info("u", TensorProto.FLOAT, [1, 8, 3])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 3])]
    pads = init("pads", [0, 2, 0, 0, 0, 0], np.int64)
    reference = helper.make_graph([*float_nodes, *tail], "reference", inputs, outputs, [pads])

    def qdq(source: str) -> list[onnx.NodeProto]:
        return [helper.make_node("QuantizeLinear", [source, "s", "z"], [f"{source}_q"], name=f"{source}_q"),
                helper.make_node("DequantizeLinear", [f"{source}_q", "s", "z"], [f"{source}_dq"], name=f"{source}_dq")]

    quantized = [*float_nodes, *qdq(current),
                 helper.make_node("Pad", [f"{current}_dq", "pads"], ["padded"], name="pad", mode="constant"),
                 *qdq("padded"), *qdq("u"), helper.make_node("Max", ["padded_dq", "u_dq"], ["y"], name="merge")]
    candidate = helper.make_graph(quantized, "candidate", inputs, outputs,
                                  [pads, init("s", 0.02), init("z", 128, np.uint8)])
    opsets = [helper.make_opsetid("", 13)]
    return (helper.make_model(reference, opset_imports=opsets, ir_version=8),
            helper.make_model(candidate, opset_imports=opsets, ir_version=8))


def _feeds(model: onnx.ModelProto, count: int = 2) -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(4)
    shapes = {value.name: [d.dim_value for d in value.type.tensor_type.shape.dim] for value in model.graph.input}
    return {i: {name: rng.uniform(-2, 2, shape).astype(np.float32) for name, shape in shapes.items()}
            for i in range(count)}


def _saved(tmp_path: Path, movers: int = 1) -> tuple[Path, Path, dict[int, dict[str, np.ndarray]]]:
    reference, candidate = _models(movers)
    onnx.save(reference, str(tmp_path / "reference.onnx"))
    onnx.save(candidate, str(tmp_path / "candidate.onnx"))
    return tmp_path / "reference.onnx", tmp_path / "candidate.onnx", _feeds(reference)


def test_exposing_the_intermediates_hides_what_prefixes_compiled_whole_find(tmp_path: Path) -> None:
    reference, candidate, feeds = _saved(tmp_path)
    localizer = Localizer(reference, "ort:cpu")
    located, why = localizer.locate(candidate, "openvino:cpu", feeds, tolerance=TOLERANCE, pin_f32=True)
    assert located is None and "none of the" in why  # the instrumented graph runs right on OpenVINO
    divergence, found, why = locate_fused(localizer, candidate, "openvino:cpu", feeds, tolerance=TOLERANCE,
                                          pin_f32=True)
    assert divergence is not None, why
    assert (divergence.node, divergence.op_type, divergence.tensor) == ("pad", "Pad", "padded")
    assert divergence.cosine < 0.99 and divergence.max_abs_err == pytest.approx(2.56, abs=0.03)  # 128 x 0.02
    assert "pad" in found["fused_layer"]["original_layers"]
    cost = found["localized_by"]
    assert cost["method"] == "prefix bisection" and cost["baseline_runs"] == 1
    assert cost["compiles"] <= cost["compile_bound"] and cost["left_out_diverging_on_ort"] == 0


def test_the_bisection_compiles_a_logarithmic_number_of_prefixes(tmp_path: Path) -> None:
    reference, candidate, feeds = _saved(tmp_path, movers=12)
    divergence, found, _ = locate_fused(Localizer(reference, "ort:cpu"), candidate, "openvino:cpu", feeds,
                                        tolerance=TOLERANCE, pin_f32=True)
    assert divergence is not None and divergence.node == "pad"
    cost = found["localized_by"]
    assert cost["cuts"] == 14  # 12 Transposes, the Pad's DequantizeLinear, the Max
    assert cost["compiles"] <= 1 + math.ceil(math.log2(14)) < cost["cuts"]


def test_a_prefix_keeps_only_what_its_outputs_read() -> None:
    _, candidate = _models(movers=3)
    prefix = prefix_model(candidate, 4, ["t2_dq"])
    assert [node.name for node in prefix.graph.node] == ["transpose0", "transpose1", "transpose2", "t2_q", "t2_dq"]
    assert [value.name for value in prefix.graph.input] == ["x"]  # u is not read before the cut
    assert sorted(init.name for init in prefix.graph.initializer) == ["s", "z"]
    assert [value.name for value in prefix.graph.output] == ["t2_dq"]


def test_the_validate_stage_names_the_node_and_the_fused_layer(tmp_path: Path) -> None:
    reference, candidate = _models()
    onnx.save(reference, str(tmp_path / "model.onnx"))
    ctx = context(tmp_path)
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", reference),
                 "int8": artifact(tmp_path / "int8.onnx", candidate, ("export", "quantize"))}
    rows = by_pair(validate.run(artifacts, ["openvino:cpu"], ValidateConfig(samples=4), ctx))
    row = rows[("int8", "openvino:cpu")]
    assert row.status == "failed"
    assert (row.divergence["node"], row.divergence["tensor"]) == ("pad", "padded")
    assert row.divergence["localized_by"]["method"] == "prefix bisection"
    assert "pad" in row.divergence["fused_layer"]["original_layers"]
    assert "first diverging node 'pad' (Pad)" in row.reason and "fused in OpenVINO layer" in row.reason


@pytest.mark.slow
def test_qdeploys_int8_with_shared_zero_points_is_located_at_its_pad(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The causal shift quantized by qdeploy as it was before each Q/DQ node owned its zero point."""
    import qdeploy.stages.quantize.ptq._ptq as ptq
    from qdeploy.stages import quantize
    from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig

    monkeypatch.setattr(ptq, "unshare_qdq_parameters", lambda model: 0)
    rng = np.random.default_rng(2)
    shape = (1, SHIFT_LENGTH, SHIFT_CHANNELS)
    (tmp_path / "calib").mkdir()
    for index in range(8):
        np.save(tmp_path / "calib" / f"s{index}.npy", rng.uniform(-2, 2, shape).astype(np.float32))
    model = causal_shift()
    onnx.save(model, str(tmp_path / "reference.onnx"))
    config = QuantizeConfig(calibration=CalibrationRef(data="calib"), verify_targets=[])
    quantized = quantize.run(save_artifact(tmp_path, model), config,
                             stage_context(tmp_path, {"calib": tmp_path / "calib"})).model
    onnx.save(quantized, str(tmp_path / "int8.onnx"))
    feeds = {i: {"x": rng.uniform(-2, 2, shape).astype(np.float32)} for i in range(2)}
    localizer, tolerance = Localizer(tmp_path / "reference.onnx", "ort:cpu"), Tolerance(cosine_min=0.98)
    located, why = localizer.locate(tmp_path / "int8.onnx", "openvino:cpu", feeds, tolerance=tolerance, pin_f32=True)
    assert located is None
    divergence, found, _ = refine(localizer, tmp_path / "int8.onnx", "openvino:cpu", feeds, located, why,
                                  tolerance=tolerance, pin_f32=True)
    assert divergence is not None and (divergence.node, divergence.op_type) == ("shift", "Pad")
    assert found["fused_layer"]["original_layers"] == ["shift"]


def test_a_node_with_two_matched_outputs_makes_one_cut_holding_both() -> None:
    """Pairs of one node tie on its position (caustic-nmr's GNN: a Split's two halves both matched)."""
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], name="split", axis=0, num_outputs=2),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    pairs = [TensorPair(name, name, node, op) for name, node, op in
             (("b", "split", "Split"), ("a", "split", "Split"), ("y", "add", "Add"))]

    cuts = _cuts(model, pairs)

    assert [cut.end for cut in cuts] == [0, 1]
    assert {pair.candidate for pair in cuts[0].pairs} == {"a", "b"}
    assert [pair.candidate for pair in cuts[1].pairs] == ["y"]
