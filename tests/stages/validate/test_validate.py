"""The validate stage: verdicts, what really ran, where a failing artifact goes wrong, the noise floor."""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qdeploy.stages.validate as validate
from qdeploy.core.errors import RecipeError
from qdeploy.core.tolerance import DEFAULT_TOLERANCES, Tolerance
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.stages.validate import ValidateConfig, output_tolerances
from qdeploy.stages.validate._floor import noise_floor_summary
from qdeploy.stages.validate.config import RANDOM_DATA_WARNING, REFERENCE_MODEL_ROW
from tests.helpers.models import tiny_cnn, write_recipe
from tests.helpers.validate import RECIPE, artifact, by_pair, chain_model, context, perturbed, to_fp16


def overflow_model() -> onnx.ModelProto:
    """x in [1, 2] -> Mul 'scale' (x200) -> Mul 'square' (up to 160000: past float16's 65504) -> Div -> y."""
    nodes = [helper.make_node("Mul", ["x", "k"], ["a"], name="scale"),
             helper.make_node("Mul", ["a", "a"], ["sq"], name="square"),
             helper.make_node("Div", ["sq", "d"], ["y"], name="shrink")]
    graph = helper.make_graph(nodes, "overflow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
                              [numpy_helper.from_array(np.array(200, np.float32), "k"),
                               numpy_helper.from_array(np.array(1e4, np.float32), "d")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model










# --- verdicts and what ran

def test_correct_artifact_passes_everywhere_and_says_what_ran(tmp_path: Path) -> None:
    model = chain_model()
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "copy": artifact(tmp_path / "copy.onnx", chain_model())}
    targets = ["ort:cpu", "openvino:cpu", "reference:cpu"]
    rows = by_pair(validate.run(artifacts, targets, ValidateConfig(samples=3), context(tmp_path)))
    assert len(rows) == 6
    for (variant, target), row in rows.items():
        assert row.status == "passed", row
        assert row.divergence is None and row.unattainable == [] and row.samples == 3
        assert row.noise_floor is (variant == "exported" and target != "ort:cpu")
        assert RANDOM_DATA_WARNING in row.warnings
        assert row.outputs[0]["passed"] is True
        assert row.outputs[0]["tolerance"] == DEFAULT_TOLERANCES["fp32"].model_dump(exclude_none=True)
    ort = rows[("copy", "ort:cpu")]
    assert ort.execution["providers"] == ["CPUExecutionProvider"]
    assert ort.execution["node_counts"]["CPUExecutionProvider"] >= 5
    assert sum(ort.execution["precisions"].values()) == ort.execution["node_counts"]["CPUExecutionProvider"]
    assert rows[("copy", "openvino:cpu")].execution["precision"] == "f32"
    assert "f32 inference precision" in rows[("copy", "openvino:cpu")].effective_precision
    assert rows[("copy", "reference:cpu")].execution["precision"] == "declared"
    json.dumps([row.to_json() for row in rows.values()], allow_nan=False)


@pytest.mark.parametrize(("weight", "node", "position"), [("w2", "mm2", 2), ("w4", "mm4", 4)])
@pytest.mark.parametrize("target", ["ort:cpu", "openvino:cpu"])
def test_perturbed_weight_fails_and_names_its_node(tmp_path: Path, target: str, weight: str, node: str,
                                                   position: int) -> None:
    model = chain_model()
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "broken": artifact(tmp_path / "broken.onnx", perturbed(model, weight))}
    rows = by_pair(validate.run(artifacts, [target], ValidateConfig(samples=4), context(tmp_path)))
    row = rows[("broken", target)]
    assert row.status == "failed"
    divergence = row.divergence
    assert (divergence["node"], divergence["op_type"], divergence["tensor"]) == (node, "MatMul", f"h{position}")
    assert divergence["compared"] == 2 * position - 1  # every earlier MatMul and Relu output agreed
    assert divergence["target"] == target and divergence["max_abs_err"] > 0
    assert f"first diverging node '{node}' (MatMul), tensor 'h{position}'" in row.reason
    assert len(divergence["samples"]) == 2


def test_fp16_overflow_fails_with_nan_inf_named_where_precision_is_declared(tmp_path: Path) -> None:
    model = overflow_model()
    onnx.save(model, str(tmp_path / "model.onnx"))
    ctx = context(tmp_path, """
        name: t
        model: {onnx: model.onnx, inputs: [{name: x, low: 1.0, high: 2.0}]}
        variants: {fp16: []}
        """)
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "fp16": artifact(tmp_path / "fp16.onnx", to_fp16(model), ("export", "fp16"))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's float16 overflow, the very point of the test
        rows = by_pair(validate.run(artifacts, ["ort:cpu", "reference:cpu"], ValidateConfig(samples=6), ctx))
    row = rows[("fp16", "reference:cpu")]
    assert row.status == "failed"
    assert "NaN/Inf" in row.reason and row.metrics.nonfinite > 0
    assert row.divergence["node"] == "square" and row.divergence["tensor"] == "sq"
    assert row.divergence["nonfinite"] > 0 and "NaN/Inf" in row.divergence["reason"]
    assert "declared precision" in row.effective_precision
    ort = rows[("fp16", "ort:cpu")]  # ORT's CPU provider computes what it lacks fp16 kernels for in float32
    float32_kernels = ort.execution["precisions"].get("FP32", 0)
    assert any("fp16 overflow and rounding are not exercised" in w for w in ort.warnings) == (float32_kernels > 0)


def test_missing_gpu_targets_are_unavailable_not_cpu_results(tmp_path: Path) -> None:
    import onnxruntime
    import openvino

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers() or \
            any(d.startswith("GPU") for d in openvino.Core().available_devices):
        pytest.skip("a GPU exists here")
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", chain_model())}
    targets = ["ort:cuda", "ort:tensorrt", "openvino:gpu"]
    rows = validate.run(artifacts, targets, ValidateConfig(samples=1), context(tmp_path))
    assert [row.target for row in rows] == targets
    for row in rows:
        assert row.status == "unavailable"
        assert row.reason.startswith(f"target {row.target} is not available here; this machine's")
        assert not row.metrics.measured and not row.has("execution") and not row.has("outputs")


def test_gpu_provider_that_falls_back_to_cpu_fails_that_target(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("CUDA exists here; no fallback to provoke")
    real = onnxruntime.get_available_providers()
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [*real, "CUDAExecutionProvider"])
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", chain_model())}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ORT's own warning about the missing provider
        rows = by_pair(validate.run(artifacts, ["ort:cpu", "ort:cuda"], ValidateConfig(samples=1),
                                    context(tmp_path)))
    row = rows[("exported", "ort:cuda")]
    assert row.status == "failed"
    assert "silently fell back to CPUExecutionProvider" in row.reason
    assert not row.metrics.measured and not row.has("execution")  # no CPU numbers under the GPU's name
    assert rows[("exported", "ort:cpu")].status == "passed"


class _RecordingCore:
    """Delegates to the real OpenVINO Core; records compile configs and can hide ops from query_model."""

    def __init__(self, core: Any, hidden: frozenset[str] = frozenset()) -> None:
        self._core, self.hidden, self.configs = core, hidden, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def compile_model(self, model: Any, device: str, config: dict) -> Any:
        self.configs.append(dict(config))
        return self._core.compile_model(model, device, config)

    def query_model(self, model: Any, device: str) -> dict:
        return {k: v for k, v in self._core.query_model(model, device).items() if k not in self.hidden}


def test_openvino_pins_f32_for_float32_artifacts_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qdeploy.targets.openvino as targets_openvino

    recorder = _RecordingCore(targets_openvino._ov_core())
    monkeypatch.setattr(targets_openvino, "_ov_core", lambda: recorder)
    model = chain_model()
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "fp16": artifact(tmp_path / "fp16.onnx", to_fp16(model), ("export", "fp16"))}
    rows = by_pair(validate.run(artifacts, ["openvino:cpu"], ValidateConfig(samples=2), context(tmp_path)))
    pinned_f32 = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
    assert recorder.configs == [pinned_f32, {}]  # fp32 pinned; fp16 as the device runs it
    pinned = rows[("exported", "openvino:cpu")]
    assert pinned.execution["precision"] == "f32" and "BF16" not in pinned.execution["precisions"]
    assert rows[("fp16", "openvino:cpu")].execution["precision"] in ("f32", "bf16", "f16")  # read back


@pytest.mark.parametrize(("ran", "status"), [("bf16", "passed"), ("f32", "failed")])
def test_a_float16_graph_openvino_ran_in_bfloat16_is_held_to_the_bf16_tolerance(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ran: str, status: str) -> None:
    """On a bf16 CPU OpenVINO runs an fp16 artifact in bfloat16 (its default there): 8 significant bits, where the
    fp16 default tolerance (30 dB) assumes 11. Outputs 25 dB from the reference pass as bf16, fail as anything else."""
    real = validate._run_model

    def run_at_25_db(target: str, path: Path, feeds: Any, *, pin_f32: bool, **more: Any) -> Any:
        outputs, executed = real(target, path, feeds, pin_f32=pin_f32, **more)
        if target != "openvino:cpu" or pin_f32:
            return outputs, executed
        rng = np.random.default_rng(0)
        noisy = [{name: value + rng.standard_normal(value.shape).astype(value.dtype)
                  * np.sqrt(np.mean(value.astype(np.float64) ** 2)) * 10 ** (-25 / 20) for name, value in out.items()}
                 for out in outputs]
        return noisy, {**executed, "precision": ran}

    monkeypatch.setattr(validate, "_run_model", run_at_25_db)
    model = chain_model()
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "fp16": artifact(tmp_path / "fp16.onnx", to_fp16(model), ("export", "fp16"))}
    row = by_pair(validate.run(artifacts, ["openvino:cpu"], ValidateConfig(samples=4), context(tmp_path)))[
        ("fp16", "openvino:cpu")]
    assert row.status == status, row.reason
    expected = DEFAULT_TOLERANCES["bf16" if ran == "bf16" else "fp16"]
    assert row.tolerance == expected.model_dump(exclude_none=True)
    assert (row.tolerance_basis or "").startswith("held to the bf16 default tolerance") == (ran == "bf16")


def test_ops_openvino_does_not_support_are_warned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qdeploy.targets.openvino as targets_openvino

    recorder = _RecordingCore(targets_openvino._ov_core(), frozenset({"mm3"}))
    monkeypatch.setattr(targets_openvino, "_ov_core", lambda: recorder)
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", chain_model())}
    row = validate.run(artifacts, ["openvino:cpu"], ValidateConfig(samples=1), context(tmp_path))[0]
    assert row.execution["unsupported_ops"] == ["mm3 (MatMul)"]
    assert any(w.startswith("query_model: 1 ops unsupported on CPU: mm3 (MatMul)") for w in row.warnings)


# --- tolerances

def test_per_output_tolerances_override_field_by_field(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    w, v = (rng.standard_normal((4, 5)).astype(np.float32) for _ in range(2))

    def two_outputs(scale_b: float) -> onnx.ModelProto:
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "W"], ["a"], name="ma"),
             helper.make_node("MatMul", ["x", "V"], ["b"], name="mb")], "two",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 5]),
             helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 5])],
            [numpy_helper.from_array(w, "W"), numpy_helper.from_array(v * np.float32(scale_b), "V")])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    artifacts = {"exported": artifact(tmp_path / "ref.onnx", two_outputs(1.0)),
                 "off": artifact(tmp_path / "off.onnx", two_outputs(1.01))}  # b off by 1%: SNR 40 dB
    strict = validate.run(artifacts, ["ort:cpu"], ValidateConfig(samples=2), context(tmp_path))
    assert by_pair(strict)[("off", "ort:cpu")].reason.startswith("output 'b': snr_db 40")
    config = ValidateConfig(samples=2, outputs={"b": Tolerance(snr_db_min=30)})
    row = by_pair(validate.run(artifacts, ["ort:cpu"], config, context(tmp_path)))[("off", "ort:cpu")]
    assert row.status == "passed", row.reason
    tolerances = {out["name"]: out["tolerance"] for out in row.outputs}
    assert tolerances == {"a": {"cosine_min": 0.9999, "snr_db_min": 60.0},
                          "b": {"cosine_min": 0.9999, "snr_db_min": 30.0}}
    assert row.tolerance == {"cosine_min": 0.9999, "snr_db_min": 60.0}


def test_output_tolerances_merge_rules() -> None:
    config = ValidateConfig.model_validate({"tolerance": {"cosine_min": 0.99, "atol": 0.1},
                                            "outputs": {"boxes": {"atol": 0.5}, "scores": {"atol": None}}})
    merged = output_tolerances(config, "int8")
    assert merged["boxes"] == Tolerance(cosine_min=0.99, atol=0.5)
    assert merged["scores"] == Tolerance(cosine_min=0.99)  # an explicit null removes the limit
    defaults = output_tolerances(ValidateConfig.model_validate({"outputs": {"y": {"top1_agreement_min": 0.9}}}),
                                 "fp16")
    assert defaults["y"] == DEFAULT_TOLERANCES["fp16"].model_copy(update={"top1_agreement_min": 0.9})


def test_unknown_output_in_tolerances_is_a_recipe_error(tmp_path: Path) -> None:
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", chain_model())}
    config = ValidateConfig(samples=1, outputs={"logit": Tolerance(atol=1.0)})
    with pytest.raises(RecipeError, match=r"validate.outputs.*\['logit'\].*outputs \['logits'\]"):
        validate.run(artifacts, ["ort:cpu"], config, context(tmp_path))


def test_tolerances_below_the_noise_floor_are_flagged_unattainable(tmp_path: Path) -> None:
    model = tiny_cnn()
    onnx.save(model, str(tmp_path / "model.onnx"))
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model), "copy": artifact(tmp_path / "copy.onnx", model)}
    config = ValidateConfig(samples=2, tolerance=Tolerance(atol=0.0), localize=False)
    rows = by_pair(validate.run(artifacts, ["ort:cpu", "openvino:cpu"], config, context(tmp_path)))
    floor = rows[("exported", "openvino:cpu")]
    assert floor.noise_floor is True and rows[("exported", "ort:cpu")].noise_floor is False
    summary = noise_floor_summary(list(rows.values()))
    assert summary is not None and summary["variant"] == "exported" and list(summary["targets"]) == ["openvino:cpu"]
    assert summary["targets"]["openvino:cpu"]["max_abs_err"] == floor.metrics.max_abs_err
    assert noise_floor_summary([rows[("copy", "ort:cpu")], rows[("exported", "ort:cpu")]]) is None
    if floor.metrics.max_abs_err == 0.0:
        pytest.skip("OpenVINO and ORT agree bit for bit on this machine: no floor to exceed")
    flagged = rows[("copy", "openvino:cpu")].unattainable
    assert len(flagged) == 1
    assert flagged[0].startswith(f"output 'logits': max_abs_err {floor.metrics.max_abs_err:.4g} > atol 0")
    assert "noise floor" in flagged[0] and "variant 'exported'" in flagged[0]
    assert rows[("copy", "ort:cpu")].unattainable == []  # same runtime as the reference: no floor to meet
    loose = ValidateConfig(samples=2, tolerance=Tolerance(atol=1.0))
    assert by_pair(validate.run(artifacts, ["ort:cpu", "openvino:cpu"], loose, context(tmp_path)))[
        ("copy", "openvino:cpu")].unattainable == []


# --- reference_model

def test_reference_model_serves_as_the_reference_end_to_end(tmp_path: Path) -> None:
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    original = chain_model()
    onnx.save(original, str(tmp_path / "original.onnx"))
    onnx.save(perturbed(original, "w3"), str(tmp_path / "model.onnx"))  # "converted elsewhere", wrongly
    recipe = load_recipe_file(write_recipe(tmp_path, """
        name: refmodel
        model: {onnx: model.onnx}
        variants: {fp32: []}
        targets: [ort:cpu, openvino:cpu]
        validate: {reference_model: original.onnx, samples: 2}
        benchmark: {enabled: false}
        """))
    report = run_recipe(recipe, RunOptions(out_dir=tmp_path / "out", show_progress=False)).report
    rows = by_pair(report["validation"])
    for target in ("ort:cpu", "openvino:cpu"):
        for variant in ("exported", "fp32"):
            assert rows[(variant, target)].status == "failed"
            assert rows[(variant, target)].divergence["node"] == "mm3"
            assert rows[(variant, target)].noise_floor is False
    floor = rows[(REFERENCE_MODEL_ROW, "openvino:cpu")]
    assert floor.noise_floor is True and floor.status == "passed"
    assert (REFERENCE_MODEL_ROW, "ort:cpu") not in rows


def test_reference_model_that_does_not_match_is_a_recipe_error(tmp_path: Path) -> None:
    other = chain_model()
    other.graph.input[0].name = "features"
    other.graph.node[0].input[0] = "features"
    onnx.save(other, str(tmp_path / "other.onnx"))
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", chain_model())}
    ctx = context(tmp_path, RECIPE + "validate: {reference_model: other.onnx}\n")
    with pytest.raises(RecipeError, match=r"validate.reference_model.*inputs \['features'\] vs the artifact's \['x'\]"):
        validate.run(artifacts, ["ort:cpu"], ValidateConfig(reference_model="other.onnx"), ctx)
    with pytest.raises(RecipeError, match=r"absent\.onnx' does not exist"):  # the loader refuses it, line named
        context(tmp_path, RECIPE + "validate: {reference_model: absent.onnx}\n")


def test_missing_reference_variant_gives_error_rows(tmp_path: Path) -> None:
    artifacts = {"v": artifact(tmp_path / "v.onnx", chain_model())}
    rows = validate.run(artifacts, ["ort:cpu", "openvino:cpu"], ValidateConfig(), context(tmp_path))
    assert [row.status for row in rows] == ["error", "error"]
    assert all("reference variant 'exported' was not built" in row.reason for row in rows)


def test_worst_samples_put_nan_first_then_the_largest_relative_error() -> None:
    ref = [{"y": np.array([1.0, 2.0])} for _ in range(4)]
    cand = [{"y": np.array([1.0, 2.0])}, {"y": np.array([1.5, 2.0])}, {"y": np.array([np.nan, 2.0])},
            {"y": np.array([1.1, 2.0])}]
    assert validate.worst_samples(ref, cand, 2) == [1, 2]
    assert validate.worst_samples(ref, cand, 1) == [2]
    assert validate.worst_samples(ref, cand, 9) == [0, 1, 2, 3]


def test_a_reference_output_that_is_zero_everywhere_is_said_to_check_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A freshly initialised head gives zeros: a broken artifact (a weight scaled inside the chain) then matches
    the reference exactly and passes, so every row says the comparison cannot tell; one log warning says it too."""
    from qdeploy.stages.validate._reference import unvarying_outputs

    zero_head = chain_model()
    head = next(init for init in zero_head.graph.initializer if init.name == "w_head")
    head.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(head)), "w_head"))
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", zero_head),
                 "broken": artifact(tmp_path / "broken.onnx", perturbed(zero_head, "w2", 3.0))}
    with caplog.at_level(logging.WARNING, logger="qdeploy.stages.validate"):
        rows = by_pair(validate.run(artifacts, ["ort:cpu"], ValidateConfig(samples=3), context(tmp_path)))
    broken = rows[("broken", "ort:cpu")]
    assert broken.status == "passed"  # what the warning is about
    assert any("output 'logits' is zero everywhere on every one of the 3 sample(s)" in warning
               for warning in broken.warnings), broken.warnings
    assert sum("zero everywhere" in record.getMessage() for record in caplog.records) == 1
    plain = by_pair(validate.run({"exported": artifact(tmp_path / "plain.onnx", chain_model())}, ["ort:cpu"],
                                 ValidateConfig(samples=3), context(tmp_path)))
    assert not any("cannot tell" in warning for warning in plain[("exported", "ort:cpu")].warnings)
    same = [{"logits": np.full((1, 10), 0.5, np.float32), "ids": np.zeros((1,), np.int64)} for _ in range(3)]
    [said] = unvarying_outputs(same, "variant 'fp32'")  # integer outputs are not judged
    assert "output 'logits' is the same on all 3 samples" in said
    assert unvarying_outputs(same[:1], "variant 'fp32'") == []  # one sample cannot show a value that never moves
