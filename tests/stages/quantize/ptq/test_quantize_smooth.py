"""SmoothQuant before ptq (``smooth_quant: alpha``): outlier activation channels move into the weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from qdeploy.core.context import StageResult
from qdeploy.stages import quantize
from qdeploy.stages.quantize import QuantizeConfig
from tests.helpers.models import DEMO_RECIPE
from tests.helpers.quantize import cosine, init, make_model, run_ort, save_artifact, stage_context

CHANNELS = 64


def outlier_model() -> onnx.ModelProto:
    """h = x * gamma (four channels x60, as trained transformers' LayerNorm gains make them), read by two MatMuls
    (one shared smoothing) and by an Add (which must keep reading h itself)."""
    rng = np.random.default_rng(0)
    gamma = np.ones(CHANNELS, np.float32)
    gamma[[3, 17, 40, 58]] = 60.0
    inits = [init("gamma", gamma), init("w1", rng.standard_normal((CHANNELS, CHANNELS)) * 0.1),
             init("w2", rng.standard_normal((CHANNELS, 32)) * 0.1), init("bias", rng.standard_normal(CHANNELS))]
    nodes = [helper.make_node("Mul", ["x", "gamma"], ["h"], name="norm_gain"),
             helper.make_node("MatMul", ["h", "w1"], ["y1"], name="proj1"),
             helper.make_node("MatMul", ["h", "w2"], ["y2"], name="proj2"),
             helper.make_node("Add", ["h", "bias"], ["residual"], name="residual")]
    return make_model(nodes, inits, {"x": [1, 16, CHANNELS]},
                      {"y1": [1, 16, CHANNELS], "y2": [1, 16, 32], "residual": [1, 16, CHANNELS]})


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((1, 16, CHANNELS)).astype(np.float32)}


def _write_calibration(folder: Path) -> Path:
    folder.mkdir()
    for index in range(16):
        np.savez(folder / f"{index:03d}.npz", **_feeds(100 + index))
    return folder


def _quantized(tmp_path: Path, **settings: object) -> StageResult:
    tmp_path.mkdir()
    artifact = save_artifact(tmp_path, outlier_model())
    ctx = stage_context(tmp_path, {"calib": _write_calibration(tmp_path / "calib")})
    config = QuantizeConfig(calibration={"data": "calib", "samples": 16}, reduce_range="weights", **settings)
    return quantize.run(artifact, config, ctx)


def _worst_error(model: onnx.ModelProto) -> float:
    """1 - cosine of the worst MatMul output against float32 on an unseen sample."""
    feeds = _feeds(7)
    pairs = zip(run_ort(model, feeds)[:2], run_ort(outlier_model(), feeds)[:2], strict=True)
    return max(1.0 - cosine(got, want) for got, want in pairs)


def test_smoothing_lifts_an_outlier_activation_and_keeps_the_function(tmp_path: Path) -> None:
    plain = _worst_error(_quantized(tmp_path / "plain").model)
    result = _quantized(tmp_path / "smooth", smooth_quant=0.5)
    smoothed = _worst_error(result.model)
    assert smoothed < plain / 4, (plain, smoothed)
    found = result.findings.smooth_quant
    assert found["smoothed_tensors"] == 1 and sorted(found["tensors"]["h"]["nodes"]) == ["proj1", "proj2"]
    assert found["tensors"]["h"]["max_scale"] > 5 * found["tensors"]["h"]["min_scale"]  # the outliers moved

    float_model = onnx.load(str(tmp_path / "smooth" / "work" / "smoothed.onnx"))
    feeds = _feeds(3)
    for got, want in zip(run_ort(float_model, feeds), run_ort(outlier_model(), feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)  # the same function before quantization
    divided = [node for node in float_model.graph.node if node.op_type == "Mul" and node.input[0] == "h"]
    assert len(divided) == 1  # one division shared by both MatMuls; the Add still reads h itself
    assert {node.input[0] for node in float_model.graph.node if node.op_type == "MatMul"} == {divided[0].output[0]}
    assert next(node for node in float_model.graph.node if node.op_type == "Add").input[0] == "h"


@pytest.mark.parametrize(("settings", "message"), [
    ({"mode": "dynamic", "smooth_quant": 0.5},
     r"quantize\.dynamic does not take 'smooth_quant' \(it applies to mode ptq\)"),
    ({"engine": "nncf", "smooth_quant": 0.5}, r"quantize\.ptq with engine nncf does not take 'smooth_quant'"),
    ({"smooth_quant": 1.0}, "smooth_quant 1.0 must be 'auto' or an alpha strictly between 0 and 1"),
    ({"smooth_quant": 1.5}, "smooth_quant 1.5 must be 'auto' or an alpha strictly between 0 and 1"),
    ({"smooth_quant": "autox"}, "smooth_quant 'autox' must be 'auto' or an alpha strictly between 0 and 1"),
])
def test_smoothing_is_refused_where_it_means_nothing(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        QuantizeConfig(**settings)


def test_a_gemm_with_a_transposed_weight_is_smoothed_along_its_input_axis(tmp_path: Path) -> None:
    """Gemm(transB=1) keeps its weight as [out, in]: s multiplies the weight's columns, not its rows."""
    from qdeploy.stages.quantize.ptq._smooth import smooth

    rng = np.random.default_rng(4)
    gamma = np.ones(CHANNELS, np.float32)
    gamma[[5, 9]] = 80.0
    model = make_model([helper.make_node("Mul", ["x", "gamma"], ["h"], name="gain"),
                        helper.make_node("Gemm", ["h", "w", "b"], ["y"], name="fc", transB=1)],
                       [init("gamma", gamma), init("w", rng.standard_normal((32, CHANNELS)) * 0.1),
                        init("b", np.zeros(32))], {"x": [16, CHANNELS]}, {"y": [16, 32]})
    path = tmp_path / "gemm.onnx"
    onnx.save(model, str(path))
    samples = [{"x": rng.standard_normal((16, CHANNELS)).astype(np.float32)} for _ in range(4)]
    smoothed, found = smooth(path, lambda: iter(samples), 0.5, ["Gemm"], set(), tmp_path)
    assert found["smoothed_tensors"] == 1
    feeds = {"x": rng.standard_normal((16, CHANNELS)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(onnx.load(str(smoothed)), feeds)[0], run_ort(model, feeds)[0],
                               rtol=1e-4, atol=1e-4)


def _calibration_error(model: onnx.ModelProto) -> float:
    """1 - cosine of the worst output against float32 over the calibration samples (what the search scores on)."""
    errors = []
    for index in range(16):
        feeds = _feeds(100 + index)
        pairs = zip(run_ort(model, feeds), run_ort(outlier_model(), feeds), strict=True)
        errors.extend(1.0 - cosine(got, want) for got, want in pairs)
    return max(errors)


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> StageResult:
    return _quantized(tmp_path_factory.mktemp("search") / "auto", smooth_quant="auto")


def test_auto_records_every_trial_and_keeps_the_closest(searched: StageResult) -> None:
    from qdeploy.stages.quantize.ptq._smooth_search import GRID

    found = searched.findings.smooth_quant
    search = found["search"]
    assert [trial["alpha"] for trial in search["trials"]] == [None, *GRID]
    assert search["scored_on"] == "calibration" and search["samples"] == 16 and search["seconds"] > 0
    ratios = {trial["alpha"]: trial["error_ratio"] for trial in search["trials"]}
    assert search["chosen"] in GRID and found["alpha"] == search["chosen"]
    assert ratios[search["chosen"]] == min(ratios.values())
    assert ratios[search["chosen"]] < ratios[None] / 4  # smoothing the outliers is the point
    assert found["tensors"]["h"]["max_scale"] > 5 * found["tensors"]["h"]["min_scale"]
    assert '"trials"' in searched.findings.model_dump_json()  # the sidecar carries them


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.8])
def test_auto_is_as_close_as_any_fixed_alpha_and_closer_than_none(searched: StageResult, tmp_path: Path,
                                                                   alpha: float) -> None:
    auto = _calibration_error(searched.model)
    fixed = _calibration_error(_quantized(tmp_path / "fixed", smooth_quant=alpha).model)
    assert auto <= fixed * 1.05 + 1e-6, (alpha, auto, fixed)  # within float noise of the best
    if alpha == 0.3:
        assert auto < _calibration_error(_quantized(tmp_path / "plain").model) / 4


def test_auto_scores_on_the_budget_samples_before_the_budget_ranks(tmp_path: Path) -> None:
    result = _quantized(tmp_path / "budget", smooth_quant="auto", tolerance={"cosine_min": 0.99},
                        budget={"samples": 8})
    search = result.findings.smooth_quant["search"]
    assert search["scored_on"] == "budget" and search["samples"] == 6  # 8 less the 2 held back
    assert search["tolerance"] == {"cosine_min": 0.99}
    assert result.findings.budget is not None


@pytest.mark.parametrize("value", ["autox", "1.5"])
def test_a_bad_alpha_in_a_recipe_is_a_recipe_error_naming_the_field(tmp_path: Path, value: str) -> None:
    from qdeploy.core.errors import RecipeError
    from qdeploy.pipeline.recipe.loader import load_recipe_file

    text = DEMO_RECIPE.read_text().replace("{quantize: {mode: ptq, calibration: {data: calib}}}",
                                           f"{{quantize: {{mode: ptq, smooth_quant: {value}}}}}")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text.replace("models/", f"{DEMO_RECIPE.parent}/models/")
                      .replace("path: data/", f"path: {DEMO_RECIPE.parent}/data/"))
    with pytest.raises(RecipeError) as caught:
        load_recipe_file(recipe)
    message = str(caught.value)
    assert "quantize.smooth_quant" in message and "must be 'auto' or an alpha strictly between 0 and 1" in message
