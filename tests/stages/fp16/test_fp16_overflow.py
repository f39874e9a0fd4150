"""Activations that overflow float16: measured ranges, overflow patterns, and the float16 fidelity check.

Plain onnxconverter-common converts these models "successfully"; under float16 arithmetic (onnx's
reference evaluator) they produce Inf/NaN or silently wrong outputs, and ONNX Runtime's CPU provider
hides it by running the chain in float32.  qdeploy keeps the overflowing nodes in float32 and says why.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.stages.fp16._activations import ActivationPeaks, overflowing_nodes
from tests.helpers.fp16 import const, make_model, plain_convert, run_ort, run_reference, run_stage, run_target, tensor

T, D = 16, 64


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _hidden_states(seed: int, scale: float = 8.0) -> np.ndarray:
    """Transformer-like activations: mostly moderate, a few outlier channels (as in real LLM/BERT layers)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, T, D)) * scale
    x[..., :3] *= 40  # outlier features
    return x.astype(np.float32)


def _attention(scale_scores: bool = False) -> onnx.ModelProto:
    """Single-head self-attention; without the 1/sqrt(d) scale the scores leave float16's range."""
    rng = np.random.default_rng(0)
    inits = [const("Wq", rng.standard_normal((D, D))), const("Wk", rng.standard_normal((D, D))),
             const("Wv", rng.standard_normal((D, D)) * 0.1), const("inv_sqrt_d", 1 / np.sqrt(D))]
    scores = "s"
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["x", "Wk"], ["k"], name="k_proj"),
             helper.make_node("MatMul", ["x", "Wv"], ["v"], name="v_proj"),
             helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores")]
    if scale_scores:
        nodes.append(helper.make_node("Mul", ["s", "inv_sqrt_d"], ["s_scaled"], name="scale"))
        scores = "s_scaled"
    nodes += [helper.make_node("Softmax", [scores], ["p"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"], name="context")]
    return make_model(nodes, inits, [tensor("x", [1, T, D])], [tensor("y", [1, T, D])])


def test_unnormalized_attention_passes_on_ort_cpu_but_not_in_float16_and_qdeploy_passes_both(tmp_path: Path) -> None:
    model = _attention()
    samples = [{"x": _hidden_states(seed, scale=1.0)} for seed in range(4)]
    x = {"x": _hidden_states(10, scale=1.0)}
    expected = run_ort(model, x)[0]

    plain = plain_convert(model, max_finite_val=65504.0)
    assert _cosine(run_ort(plain, x)[0], expected) > 0.9999  # ORT CPU computes the chain in float32
    with np.errstate(all="ignore"):
        assert np.isnan(run_target("reference:cpu", plain, x, tmp_path)[0]).any()  # true float16: NaN

    result = run_stage(tmp_path, model, {"calib": samples}, calibration={"data": "calib"})
    kept = {entry["node"]: entry for entry in result.findings.kept_in_fp32}
    assert set(kept) == {"scores", "softmax"}
    assert kept["scores"]["reason"] == "unnormalized attention scores"
    assert kept["scores"]["tensor"] == "s" and kept["scores"]["abs_max"] > 65504
    assert kept["scores"]["predicted"] == pytest.approx(kept["scores"]["abs_max"] / 0.25)
    for target in ("ort:cpu", "reference:cpu", "openvino:cpu"):
        got = run_target(target, result.model, x, tmp_path)[0]
        assert np.isfinite(got).all() and _cosine(got, expected) > 0.999, target
    emulated = result.findings.fidelity["emulated"]
    assert emulated["passed"] and emulated["worst"]["nonfinite"] == 0


def test_scaled_attention_within_range_stays_float16(tmp_path: Path) -> None:
    samples = [{"x": _hidden_states(seed, scale=0.05)} for seed in range(4)]
    result = run_stage(tmp_path, _attention(scale_scores=True), {"calib": samples}, calibration={"data": "calib"})
    assert result.findings.kept_in_fp32 == []
    assert result.findings.fidelity["emulated"]["passed"]
    assert result.findings.float16_compute_nodes == 8  # every node of the attention; its edge Casts not counted


def _decomposed_layer_norm() -> onnx.ModelProto:
    """LayerNorm as exporters write it (ReduceMean, Sub, Pow 2, ReduceMean, Sqrt, Div) then a projection."""
    rng = np.random.default_rng(3)
    inits = [const("two", 2.0), const("eps", 1e-5), const("gamma", np.ones(D)), const("beta", np.zeros(D)),
             const("W", rng.standard_normal((D, D)) * 0.2)]
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", axes=[-1]),
             helper.make_node("Sub", ["x", "mean"], ["centered"], name="center"),
             helper.make_node("Pow", ["centered", "two"], ["squared"], name="square"),
             helper.make_node("ReduceMean", ["squared"], ["var"], name="variance", axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
             helper.make_node("Sqrt", ["var_eps"], ["std"], name="std"),
             helper.make_node("Div", ["centered", "std"], ["normed"], name="normalize"),
             helper.make_node("Mul", ["normed", "gamma"], ["scaled"], name="gamma"),
             helper.make_node("Add", ["scaled", "beta"], ["ln"], name="beta"),
             helper.make_node("MatMul", ["ln", "W"], ["y"], name="proj")]
    return make_model(nodes, inits, [tensor("x", [1, T, D])], [tensor("y", [1, T, D])], opset=17)


def test_layer_norm_pow_overflow_is_kept_in_float32_and_listed(tmp_path: Path) -> None:
    from onnx.reference import ReferenceEvaluator

    model = _decomposed_layer_norm()
    x = {"x": _hidden_states(20)}  # outlier channels near 300: (x - mean)**2 passes 65504
    expected = run_ort(model, x)[0]
    plain = plain_convert(model, max_finite_val=65504.0)
    with np.errstate(all="ignore"):
        intermediates = ReferenceEvaluator(plain).run(None, x, intermediate=True)
    assert np.isinf(intermediates["squared"]).any()
    assert _cosine(run_reference(plain, x)[0], expected) < 0.5  # variance Inf: the output collapses

    samples = [{"x": _hidden_states(seed)} for seed in range(4)]
    result = run_stage(tmp_path, model, {"calib": samples}, calibration={"data": "calib", "samples": 4},
                       keep_layer_norms_float32=False)  # the measured ranges decide here
    kept = {entry["node"]: entry for entry in result.findings.kept_in_fp32}
    assert {"square", "variance"} <= set(kept)
    assert kept["square"]["reason"] == "Pow" and kept["square"]["tensor"] == "centered"
    assert kept["square"]["predicted"] == pytest.approx((kept["square"]["abs_max"] / 0.5) ** 2)
    assert "proj" not in kept and "mean" not in kept  # the rest stays float16
    for run in (run_ort, run_reference):
        got = run(result.model, x)[0]
        assert np.isfinite(got).all() and _cosine(got, expected) > 0.999


def test_decomposed_layer_norm_stays_float32_so_onnxruntime_can_load_it(tmp_path: Path) -> None:
    """ORT's CPU LayerNormFusion turns a float16 decomposed LayerNorm into a LayerNormalization with
    mixed float16/float32 inputs that fails to load (default session options)."""
    import onnxruntime as ort

    model = _decomposed_layer_norm()
    with pytest.raises(Exception, match="LayerNormalization"):
        ort.InferenceSession(plain_convert(model).SerializeToString(), providers=["CPUExecutionProvider"])
    result = run_stage(tmp_path, model)  # no data needed
    norms = result.findings.normalization_float32_nodes
    assert set(norms) == {"mean", "center", "square", "variance", "add_eps", "std", "normalize", "gamma", "beta"}
    assert "proj" not in norms
    x = {"x": _hidden_states(21)}
    assert _cosine(run_ort(result.model, x)[0], run_ort(model, x)[0]) > 0.999
    assert _cosine(run_reference(result.model, x)[0], run_ort(model, x)[0]) > 0.999


def test_cancellation_found_only_by_float16_emulation_is_kept_in_float32(tmp_path: Path) -> None:
    """1 / (x - 1000.3) with x near 1000.5: in float16 both round to 1000.5 and the Div makes Inf.
    Activation ranges are tiny, so only the emulated float16 run finds it."""
    nodes = [helper.make_node("Sub", ["x", "c"], ["d"], name="sub"),
             helper.make_node("Reciprocal", ["d"], ["r"], name="reciprocal"),
             helper.make_node("Mul", ["r", "k"], ["y"], name="mul")]
    model = make_model(nodes, [const("c", 1000.3), const("k", 0.01)], [tensor("x", [8])], [tensor("y", [8])])
    x = {"x": np.full(8, 1000.5, np.float32)}
    assert np.isinf(run_reference(plain_convert(model, max_finite_val=65504.0), x)[0]).all()

    result = run_stage(tmp_path, model, {"calib": [x, x]}, calibration={"data": "calib"})
    reasons = {entry["node"]: entry["reason"] for entry in result.findings.kept_in_fp32}
    assert set(reasons) == {"sub", "reciprocal"}
    assert all("float16 emulation" in reason for reason in reasons.values())
    got = run_reference(result.model, x)[0]
    np.testing.assert_allclose(got, run_ort(model, x)[0], rtol=1e-2)


def test_old_style_linear_overflow_keeps_the_chain(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    nodes = [helper.make_node("Mul", ["x", "k"], ["up"], name="scale_up"),
             helper.make_node("Relu", ["up"], ["m1"], name="relu"),
             helper.make_node("Mul", ["m1", "k_inv"], ["y"], name="scale_down")]
    model = make_model(nodes, [const("k", 1000.0), const("k_inv", 0.001)], [tensor("x", [1, 4])],
                       [tensor("y", [1, 4])])
    x = {"x": np.linspace(90, 110, 4, dtype=np.float32).reshape(1, 4)}
    assert np.isinf(run_reference(plain_convert(model, max_finite_val=65504.0), x)[0]).all()
    result = run_stage(tmp_path, model, {"calib": [x]}, calibration={"data": "calib"})
    kept = {entry["node"]: entry for entry in result.findings.kept_in_fp32}
    assert set(kept) == {"scale_up", "relu", "scale_down"}
    assert kept["scale_up"]["tensor"] == "up" and 9e4 < kept["scale_up"]["abs_max"] <= 1.1e5
    for run in (run_ort, run_reference):
        np.testing.assert_allclose(run(result.model, x)[0], x["x"], rtol=1e-3)
    assert not any(node.op_type == "Cast" for node in result.model.graph.node)  # all float32: no Casts
    assert result.findings.float16_compute_nodes == 0  # the float32 model under the variant's name: said so
    assert "no node computes in float16" in caplog.text


def _stats(**tensors: tuple[float, float, tuple[int, ...]]) -> dict[str, ActivationPeaks]:
    return {name: ActivationPeaks(abs_max=a, max=m, shape=s) for name, (a, m, s) in tensors.items()}


@pytest.mark.parametrize("top, kept", [(4.0, False), (6.0, True)])
def test_exp_pattern_predicts_exponential_growth(top: float, kept: bool) -> None:
    model = make_model([helper.make_node("Exp", ["x"], ["y"], name="exp")], [], [tensor("x", [4])],
                       [tensor("y", [4])])
    stats = _stats(x=(top, top, (4,)), y=(float(np.exp(top)),) * 2 + ((4,),))
    found = overflowing_nodes(model, stats, 65504.0, 0.5, set())
    assert bool(found) == kept
    if kept:  # exp(6 / 0.5) = 162755 > 65504 although exp(6) = 403 is far from the limit
        assert found[0]["reason"] == "Exp" and found[0]["predicted"] == pytest.approx(np.exp(12.0))


@pytest.mark.parametrize("length, kept", [(8, False), (4096, True)])
def test_reduce_mean_over_long_axes_counts_the_accumulated_sum(length: int, kept: bool) -> None:
    model = make_model([helper.make_node("ReduceMean", ["x"], ["y"], name="mean", axes=[-1])], [],
                       [tensor("x", [1, length])], [tensor("y", [1, 1])])
    stats = _stats(x=(30.0, 30.0, (1, length)), y=(20.0, 20.0, (1, 1)))
    found = overflowing_nodes(model, stats, 65504.0, 0.5, set())
    assert bool(found) == kept
    if kept:
        assert found[0]["reason"] == "reduction over 4096 elements"
        assert found[0]["predicted"] == pytest.approx(20.0 * 4096 / 0.5)


def test_nodes_already_float32_are_not_listed_again() -> None:
    model = make_model([helper.make_node("Exp", ["x"], ["y"], name="exp")], [], [tensor("x", [4])],
                       [tensor("y", [4])])
    stats = _stats(x=(20.0, 20.0, (4,)), y=(4.8e8, 4.8e8, (4,)))
    assert overflowing_nodes(model, stats, 65504.0, 0.5, {"exp"}) == []


@pytest.mark.parametrize("base, kept", [(100.0, False), (150.0, True)])
def test_a_tensor_multiplied_by_itself_is_predicted_like_pow_2(base: float, kept: bool) -> None:
    model = make_model([helper.make_node("Mul", ["x", "x"], ["y"], name="square")], [], [tensor("x", [4])],
                       [tensor("y", [4])])
    stats = _stats(x=(base, base, (4,)), y=(base**2, base**2, (4,)))
    found = overflowing_nodes(model, stats, 65504.0, 0.5, set())
    assert bool(found) == kept  # 150**2 = 22500 is in range, but (150 / 0.5)**2 = 90000 is not
    if kept:
        assert found[0]["reason"] == "square (x * x)" and found[0]["predicted"] == pytest.approx((base / 0.5) ** 2)
