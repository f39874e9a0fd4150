"""STFT in the specification's form (``stages/export/_stft.py``): onnxscript's audio front ends (onnx-asr) feed it a
rank-2 signal with no frame_length, which ONNX Runtime runs but onnx's reference evaluator and OpenVINO did not;
and onnx's shape inference took an absent ``onesided`` as 0, so a simplified model with static shapes no longer
loaded in ONNX Runtime.  The export stage writes the same function in the form every runtime reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.stages import export
from tests.helpers.models import write_recipe

WINDOW, HOP, SAMPLES, MELS = 16, 8, 256, 4


def front_end() -> onnx.ModelProto:
    """waveforms [batch, N] -> STFT (rank-2 signal, Hann window, no frame_length, no onesided) -> power -> mel."""
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(WINDOW) / WINDOW)).astype(np.float32)
    bins = WINDOW // 2 + 1
    filters = np.abs(np.random.default_rng(0).normal(0, 1, (bins, MELS))).astype(np.float32)
    inits = [numpy_helper.from_array(window, "window"), numpy_helper.from_array(np.array(HOP, np.int64), "hop"),
             numpy_helper.from_array(filters, "filters")]
    nodes = [helper.make_node("STFT", ["waveforms", "hop", "window"], ["spectrum"], name="stft"),
             helper.make_node("ReduceSumSquare", ["spectrum"], ["power"], axes=[-1], keepdims=0, name="power"),
             helper.make_node("MatMul", ["power", "filters"], ["mel"], name="mel")]
    graph = helper.make_graph(nodes, "front_end",
                              [helper.make_tensor_value_info("waveforms", TensorProto.FLOAT, ["batch", "N"])],
                              [helper.make_tensor_value_info("mel", TensorProto.FLOAT, ["batch", "frames", MELS])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feed() -> dict[str, np.ndarray]:
    return {"waveforms": np.sin(np.arange(SAMPLES) / 3.0).astype(np.float32)[None]}


def _exported(tmp_path: Path) -> Any:
    onnx.save(front_end(), tmp_path / "m.onnx")
    recipe = Recipe.model_validate({"name": "t", "model": {"onnx": str(tmp_path / "m.onnx")}, "variants": {"fp32": []}})
    write_recipe(tmp_path, "name: t\nmodel: {onnx: m.onnx}\nvariants: {fp32: []}\n")
    from tests.helpers.fp16 import context

    return export.run(None, recipe.model, context(tmp_path))


def test_the_stft_gets_a_rank_three_signal_its_frame_length_and_onesided(tmp_path: Path) -> None:
    result = _exported(tmp_path)
    stft = next(node for node in result.model.graph.node if node.op_type == "STFT")
    unsqueeze = next(node for node in result.model.graph.node if node.output[0] == stft.input[0])
    assert unsqueeze.op_type == "Unsqueeze" and unsqueeze.input[0] == "waveforms"
    lengths = {init.name: numpy_helper.to_array(init) for init in result.model.graph.initializer}
    assert int(lengths[stft.input[3]]) == WINDOW
    assert [(attribute.name, attribute.i) for attribute in stft.attribute] == [("onesided", 1)]
    assert len(result.findings.stft_made_portable) == 1
    source = ort.InferenceSession(front_end().SerializeToString()).run(None, _feed())[0]
    portable = ort.InferenceSession(result.model.SerializeToString()).run(None, _feed())[0]
    np.testing.assert_array_equal(portable, source)  # the same function on ONNX Runtime
    from onnx.reference import ReferenceEvaluator

    with pytest.raises(Exception):  # noqa: B017 - the evaluator's own failure on the rank-2 form (why this exists)
        ReferenceEvaluator(front_end()).run(None, _feed())
    np.testing.assert_allclose(ReferenceEvaluator(result.model).run(None, _feed())[0], source, rtol=1e-4, atol=1e-4)


def test_a_front_end_with_a_static_length_runs_through_the_recipe_on_both_runtimes(tmp_path: Path) -> None:
    onnx.save(front_end(), tmp_path / "m.onnx")
    (tmp_path / "val").mkdir()
    for index in range(2):
        wave = np.sin(np.arange(SAMPLES) / (3.0 + index))[None].astype(np.float32)
        np.save(tmp_path / "val" / f"{index}.npy", wave)
    recipe = write_recipe(tmp_path, f"""
        name: stft
        model:
          onnx: m.onnx
          inputs: [{{name: waveforms, shape: [1, {SAMPLES}], dtype: float32}}]
        data:
          val: {{reader: npy, path: val}}
        variants:
          fp32: [simplify]
        targets: [ort:cpu, openvino:cpu]
        validate: {{data: val, samples: 2}}
        benchmark: {{batch_sizes: [1], warmup: 1, iterations: 2, rounds: 1}}
        """)
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=tmp_path / "out", show_progress=False))
    rows = {(row["variant"], row["target"]): row for row in result.report["validation"]}
    assert rows[("fp32", "openvino:cpu")]["status"] == "passed", rows[("fp32", "openvino:cpu")]
    assert rows[("fp32", "ort:cpu")]["status"] == "passed"
    assert result.exit_code == 0
