"""int8 that is right on every x86 CPU: `reduce_range`, build-CPU independence, and why validation diverges.

Accuracy bounds that depend on the CPU's int8 path say which path they hold for (``tests/helpers/int8.py``); the
saturation-free forms are checked on every CPU by comparing the fused int8 kernels with the graph's exact
arithmetic.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import qdeploy.stages.validate as validate
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.stages import quantize
from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig
from qdeploy.stages.quantize._common import resolve_reduce_range
from qdeploy.stages.validate import ValidateConfig
from qdeploy.targets.int8_path import SEVEN_BIT_KEY, weights_beyond_seven_bits
from tests.helpers.int8 import exact_int8, run_ort_unfused, this_cpu
from tests.helpers.models import tiny_cnn, write_recipe
from tests.helpers.quantize import (
    DEMO_MODEL,
    DEMO_VAL,
    artifact_at,
    cosine,
    make_model,
    run_ort,
    save_artifact,
    stage_context,
)
from tests.helpers.validate import artifact, chain_model, context

VNNI_FLAGS = "avx2 avx512f avx512bw avx512_vnni"
AVX2_FLAGS = "avx2 fma f16c"


@pytest.mark.parametrize(("settings", "targets", "expected"), [
    ({}, ("ort:cpu", "ort:cuda"), "choose"),
    ({}, ("openvino:cpu",), "choose"),
    ({}, (), "choose"),  # targets unknown: assume a CPU may run it
    ({}, ("ort:cuda", "ort:tensorrt"), "none"),  # GPU int8 does not saturate
    ({"weight_type": "uint8"}, ("ort:cpu",), "none"),  # U8U8 kernels do not saturate
    ({"activation_type": "int8"}, ("ort:cpu",), "weights"),  # ORT shifts int8 activations to uint8
    ({"mode": "dynamic"}, ("ort:cpu",), "weights"),  # activations are quantized at run time, full range
    ({"reduce_range": True}, ("ort:cuda",), "weights"),
    ({"reduce_range": "activations"}, ("ort:cuda",), "activations"),
    ({"reduce_range": False}, ("ort:cpu",), "none"),
])
def test_auto_follows_the_recipe_targets(settings: dict, targets: tuple[str, ...], expected: str) -> None:
    assert resolve_reduce_range(QuantizeConfig(**settings), targets)[0] == expected


def test_seven_bit_activations_need_uint8_ptq() -> None:
    for settings in ({"mode": "dynamic"}, {"activation_type": "int8"}):
        with pytest.raises(ValueError, match="reduce_range 'activations' needs mode ptq"):
            QuantizeConfig(reduce_range="activations", **settings)
    with pytest.raises(ValueError, match=r"quantize\.lower does not take 'reduce_range'"):
        QuantizeConfig(mode="lower", reduce_range=True)


def quantize_demo(tmp_path: Path, reduce_range: object = "auto") -> quantize.StageResult:
    config = QuantizeConfig(calibration=CalibrationRef(data="val", samples=8), reduce_range=reduce_range,
                            verify_targets=[])
    return quantize.run(artifact_at(DEMO_MODEL), config, stage_context(tmp_path, {"val": DEMO_VAL}))


def demo_feeds() -> list[np.ndarray]:
    return [np.load(path)[None] for path in sorted(DEMO_VAL.iterdir())]


def test_artifact_bytes_do_not_depend_on_the_build_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = {}
    for flags in (VNNI_FLAGS, AVX2_FLAGS):
        monkeypatch.setenv("QDEPLOY_CPU_FLAGS", flags)
        folder = tmp_path / flags.split()[-1]
        folder.mkdir()
        result = quantize_demo(folder)
        built[flags] = (result.model.SerializeToString(), result.findings.reduce_range)
    assert built[VNNI_FLAGS] == built[AVX2_FLAGS]


def test_auto_artifact_is_exact_on_this_cpu_and_meets_the_demo_gate(tmp_path: Path) -> None:
    """Fails on the old code on CPUs without VNNI (cosine 0.911 on ort:cpu): full-range int8 saturated there."""
    result = quantize_demo(tmp_path)
    chosen = result.findings.reduce_range
    assert chosen["setting"] == "auto" and chosen["seven_bit"] in ("weights", "activations")
    assert set(chosen["measured"]) == {"weights", "activations"}
    assert {prop.key: prop.value for prop in result.model.metadata_props}[SEVEN_BIT_KEY] == chosen["seven_bit"]
    assert "int8_saturation_warning" not in result.report()
    reference = onnx.load(str(DEMO_MODEL))
    for x in demo_feeds():
        fused, exact = run_ort(result.model, {"input": x})[0], run_ort_unfused(result.model, {"input": x})[0]
        # no saturation whatever this CPU's int8 path (fused requantization rounds a little differently: 0.99988)
        assert cosine(fused, exact) > 0.9995
        assert cosine(fused, run_ort(reference, {"input": x})[0]) >= 0.98


def test_full_range_weights_saturate_only_where_the_cpu_lacks_vnni(tmp_path: Path) -> None:
    result = quantize_demo(tmp_path, reduce_range=False)
    assert result.findings.reduce_range["seven_bit"] == "none"
    assert "saturating int16" in result.findings.int8_saturation_warning
    assert weights_beyond_seven_bits(result.model)
    agreement = min(cosine(run_ort(result.model, {"input": x})[0], run_ort_unfused(result.model, {"input": x})[0])
                    for x in demo_feeds())
    if exact_int8():  # VNNI, arm64: the fused kernels compute the graph exactly (up to requantization rounding)
        assert agreement > 0.9995
    else:  # vpmaddubsw clips pair sums: the demo's cosine to fp32 falls from 0.999 to 0.97 on an AVX2-only EPYC
        assert agreement < 0.995, f"{this_cpu().kind}: expected saturation of full-range int8"


def test_dynamic_mode_keeps_weights_within_seven_bits(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 32)).astype(np.float32)
    model = make_model([onnx.helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                       [onnx.numpy_helper.from_array(weight, "w")], {"x": [8, 64]}, ["y"])
    result = quantize.run(save_artifact(tmp_path, model), QuantizeConfig(mode="dynamic"), stage_context(tmp_path))
    assert result.findings.reduce_range["seven_bit"] == "weights"
    assert weights_beyond_seven_bits(result.model) == []
    x = (rng.standard_normal((8, 64)) * 4).astype(np.float32)
    assert cosine(run_ort(result.model, {"x": x})[0], x @ weight) > 0.995


@pytest.mark.parametrize(("flags", "named"), [(AVX2_FLAGS, True), (VNNI_FLAGS, False)])
def test_diverging_int8_on_a_cpu_without_vnni_names_saturation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               flags: str, named: bool) -> None:
    float_model = chain_model(width=32)
    quantized = quantize.run(save_artifact(tmp_path, float_model, "float.onnx"),
                             QuantizeConfig(reduce_range=False, verify_targets=[]), stage_context(tmp_path)).model
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", float_model),
                 "int8": artifact(tmp_path / "int8.onnx", quantized, stages=("export", "quantize"))}
    monkeypatch.setenv("QDEPLOY_CPU_FLAGS", flags)
    config = ValidateConfig(samples=2, localize=False, tolerance={"cosine_min": 0.99999999})
    rows = validate.run(artifacts, ["ort:cpu"], config, context(tmp_path))
    row = next(row for row in rows if row.variant == "int8")
    assert row.status == "failed"
    assert ("saturating int16" in row.reason and "quantize.reduce_range" in row.reason) is named


def test_recipe_targets_decide_auto_and_enter_the_cache_key(tmp_path: Path) -> None:
    onnx.save(tiny_cnn(channels=16), str(tmp_path / "tiny.onnx"))
    body = """
        name: t
        model: {{onnx: tiny.onnx}}
        data: {{calib: {{reader: random, samples: 4, seed: 1}}}}
        variants: {{int8: [{{quantize: {{calibration: {{data: calib}}, verify_targets: []}}}}]}}
        targets: [{targets}]
        validate: {{samples: 2}}
        benchmark: {{enabled: false}}
        """
    seen = {}
    for targets in ("ort:cpu", "ort:cuda"):
        recipe = load_recipe_file(write_recipe(tmp_path, body.format(targets=targets)))
        run_recipe(recipe, RunOptions(out_dir=tmp_path / "out", cache_dir=tmp_path / "cache", show_progress=False))
        report = json.loads((tmp_path / "out" / "report.json").read_text())
        step = report["artifacts"][0]["lineage"][-1]
        seen[targets] = (step["findings"]["reduce_range"]["seven_bit"], step["cached"])
    assert seen["ort:cpu"][0] in ("weights", "activations")
    assert seen["ort:cuda"] == ("none", False)  # another artifact, not the cached one
