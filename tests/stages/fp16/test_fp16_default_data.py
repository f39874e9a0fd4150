"""With data in the recipe, the fp16 stage analyses activations by default: an overflow is found when the artifact
is built, not only when reference:cpu validation fails later; the data it read is part of its cache key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import StageContext
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.stages import fp16
from qdeploy.stages.fp16 import Fp16Config
from qdeploy.stages.fp16.config import reads_default_dataset
from tests.helpers.fp16 import artifact, context
from tests.helpers.models import write_recipe


def _overflowing_model() -> onnx.ModelProto:
    """y = (x * 1000) * 0.001: the intermediate leaves float16's range (65504) for |x| > 65."""
    nodes = [helper.make_node("Mul", ["x", "big"], ["h"], name="scale_up"),
             helper.make_node("Mul", ["h", "small"], ["y"], name="scale_down")]
    inits = [numpy_helper.from_array(np.array(1000.0, np.float32), "big"),
             numpy_helper.from_array(np.array(0.001, np.float32), "small")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _samples(seed: int = 0, count: int = 3) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(100, 200, (1, 64)).astype(np.float32)} for _ in range(count)]


def _with_default(ctx: StageContext, dataset: str | None) -> StageContext:
    return dataclasses.replace(ctx, default_dataset=dataset)


def test_validation_data_drives_activation_analysis_when_the_config_names_none(tmp_path: Path) -> None:
    ctx = _with_default(context(tmp_path, {"val": _samples()}), "val")
    result = fp16.run(artifact(tmp_path, _overflowing_model()), Fp16Config(), ctx)
    analysis = result.findings.activation_analysis
    assert analysis["data"] == "val" and analysis["source"] == "validate.data (default)" and analysis["samples"] == 3
    assert {entry["node"] for entry in result.findings.kept_in_fp32} == {"scale_up", "scale_down"}
    assert result.findings.fidelity["emulated"]["passed"] is True

    off = fp16.run(artifact(tmp_path, _overflowing_model()), Fp16Config(use_validation_data=False), ctx)
    assert off.findings.activation_analysis.startswith("not run") and off.findings.kept_in_fp32 == []
    assert not reads_default_dataset(Fp16Config(use_validation_data=False))
    assert not reads_default_dataset(Fp16Config(calibration={"data": "val"}))


def _run(tmp_path: Path) -> tuple[dict, int]:
    result = run_recipe(load_recipe_file(tmp_path / "recipe.yaml"), RunOptions(out_dir=tmp_path / "out",
                                                                          show_progress=False))
    return json.loads((tmp_path / "out" / "report.json").read_text()), result.exit_code


def test_recipe_with_validation_data_builds_an_fp16_artifact_that_passes_true_float16(tmp_path: Path) -> None:
    onnx.save(_overflowing_model(), str(tmp_path / "m.onnx"))
    (tmp_path / "val").mkdir()
    for index, sample in enumerate(_samples()):
        np.save(tmp_path / "val" / f"{index}.npy", sample["x"])
    write_recipe(tmp_path, """
        name: t
        model: {onnx: m.onnx}
        data: {val: {reader: npy, path: val}}
        variants:
          half: [fp16]
        targets: [ort:cpu]
        validate: {data: val, samples: 2, tolerance: {cosine_min: 0.99}}
        benchmark: {enabled: false}
        """)
    report, code = _run(tmp_path)
    rows = {(row["variant"], row["target"]): row for row in report["validation"]}
    assert rows[("half", "reference:cpu")]["status"] == "passed", rows[("half", "reference:cpu")]["reason"]
    assert code == 0
    step = next(a for a in report["artifacts"] if a["name"] == "half")["lineage"][-1]
    assert {entry["node"] for entry in step["findings"]["kept_in_fp32"]} == {"scale_up", "scale_down"}

    again, _ = _run(tmp_path)
    assert next(a for a in again["artifacts"] if a["name"] == "half")["cached"] is True
    np.save(tmp_path / "val" / "0.npy", np.full((1, 64), 150.0, np.float32))  # other data: analysed again
    changed, _ = _run(tmp_path)
    assert next(a for a in changed["artifacts"] if a["name"] == "half")["cached"] is False


def _cancelling_model() -> onnx.ModelProto:
    """y = ((x + 1000) - 1000) * 3: no overflow anywhere, but float16 keeps x + 1000 to steps of 0.5."""
    nodes = [helper.make_node("Add", ["x", "offset"], ["shifted"], name="shift"),
             helper.make_node("Sub", ["shifted", "offset"], ["back"], name="unshift"),
             helper.make_node("Mul", ["back", "three"], ["y"], name="scale")]
    inits = [numpy_helper.from_array(np.array(1000.0, np.float32), "offset"),
             numpy_helper.from_array(np.array(3.0, np.float32), "three")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_missed_emulation_check_is_repaired_by_default_by_keeping_the_fewest_nodes_float32(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    samples = [{"x": rng.uniform(-1, 1, (1, 64)).astype(np.float32)} for _ in range(4)]
    ctx = _with_default(context(tmp_path, {"val": samples}), "val")

    reported = fp16.run(artifact(tmp_path, _cancelling_model()), Fp16Config(repair=False), ctx)
    assert reported.findings.kept_in_fp32 == []  # nothing overflows...
    assert reported.findings.fidelity["emulated"]["passed"] is False  # ...yet float16 loses x

    repaired = fp16.run(artifact(tmp_path, _cancelling_model()), Fp16Config(), ctx)
    budget = repaired.findings.budget
    assert budget["trigger"].startswith("repair: the float16 emulation check missed") and budget["met"] is True
    kept = {entry["node"] for entry in repaired.findings.kept_in_fp32}
    assert "shift" in kept and "scale" not in kept  # the cancellation, not the harmless Mul
    assert repaired.findings.fidelity["emulated"]["passed"] is True
