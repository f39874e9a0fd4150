"""Gates on a row of OpenVINO's precision settings ('int4@f32': a weight-only artifact run with float32
activations, the row the verdict may ship; 'exported@default'): named in the recipe, pointed at per_runtime's build,
measured on that row, and a missing row explained."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from qdeploy.core.errors import RecipeError
from qdeploy.core.rows import BenchmarkRow, ValidationRow
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.recipe.schema import GateSpec
from qdeploy.pipeline.results.gates import evaluate_gates, run_passes, validations_hold
from tests.helpers.models import write_recipe
from tests.helpers.quantize import tiny_conv
from tests.helpers.reports import bench_row

RECIPE = """
    name: settings
    model: {{onnx: float.onnx}}
    variants:
      int8: [{{quantize: {{mode: ptq, per_runtime: true}}}}]
      int4: [{{quantize: {{mode: weight_only}}}}]
    targets: [ort:cpu, openvino:cpu]
    gates:
      - {{variant: {variant}, target: "{target}", metric: latency_ms, max: 100}}
    """


def _gate_variant(tmp_path: Path, variant: str, target: str = "openvino:cpu") -> str:
    onnx.save(tiny_conv(), str(tmp_path / "float.onnx"))
    recipe = load_recipe_file(write_recipe(tmp_path, RECIPE.format(variant=variant, target=target)))
    return recipe.gates[0].variant


def test_a_gate_may_name_a_settings_row_and_follows_the_per_runtime_split(tmp_path: Path) -> None:
    assert _gate_variant(tmp_path, "int4@f32") == "int4@f32"
    assert _gate_variant(tmp_path, "int8@f32") == "int8@openvino@f32"
    assert _gate_variant(tmp_path, "exported@default") == "exported@default"


@pytest.mark.parametrize(("variant", "target", "says"), [
    ("int4@f32", "ort:cpu", "a row of OpenVINO's precision settings"),
    ("int9@f32", "openvino:cpu", "names variant 'int9@f32'"),
    ("int4@default", "openvino:cpu", "only the reference runs at the device's default precision"),
])
def test_a_settings_gate_on_another_runtime_or_variant_is_refused(tmp_path: Path, variant: str, target: str,
                                                                   says: str) -> None:
    with pytest.raises(RecipeError, match=says):
        _gate_variant(tmp_path, variant, target)


def _row(variant: str, ms: float) -> BenchmarkRow:
    return BenchmarkRow.from_json(bench_row(variant, "openvino:cpu", ms, [ms, ms * 1.01, ms * 0.99]))


def test_a_settings_gate_is_measured_on_its_row_and_a_missing_row_says_why() -> None:
    rows = [_row("fp32", 20.0), _row("int4", 12.0), _row("int4@f32", 8.0)]
    gates = [GateSpec(variant="int4@f32", target="openvino:cpu", metric="latency_ms", max=10.0),
             GateSpec(variant="int4@f32", target="openvino:cpu", metric="size_bytes", max=1000.0),
             GateSpec(variant="int8@f32", target="openvino:cpu", metric="latency_ms", max=10.0)]
    on_row, size, missing = evaluate_gates(gates, [], rows, "fp32", [], {"int4": 800, "int8": 900})
    assert (on_row.value, on_row.passed) == (8.0, True)  # the f32 row, not int4's default-precision 12 ms
    assert (size.value, size.passed) == (800.0, True)  # the row runs int4's file
    assert missing.passed is False and "weight-only artifact" in missing.reason and "gate int8 itself" in missing.reason


def _validated(variant: str, status: str) -> ValidationRow:
    return ValidationRow(variant=variant, target="openvino:cpu", status=status,
                         reason="output 'y': snr_db 19.74 < snr_db_min 20" if status == "failed" else "")


def test_a_failed_device_default_row_fails_no_run_unless_a_gate_names_it() -> None:
    """'exported@default' exists only on CPUs whose OpenVINO default is below float32 (a PP-OCRv4 seal detector
    read 19.7 dB there against bf16's 20): the run's exit status must not depend on the CPU kind."""
    rows = [_validated("exported", "passed"), _validated("exported@default", "failed"), _validated("int8", "passed")]
    assert validations_hold(rows) and run_passes([], rows, [], [])
    assert not validations_hold([*rows[:2], _validated("int8", "failed")])  # a recipe variant's failure still counts
    gate = GateSpec(variant="exported@default", target="openvino:cpu", metric="cosine", min=0.999)
    (result,) = evaluate_gates([gate], rows, [], "exported", [], {})
    assert result.passed is False and not run_passes([result], rows, [], [])
