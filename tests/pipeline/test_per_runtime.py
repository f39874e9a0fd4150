"""One variant line, one int8 artifact per runtime: ``quantize: {per_runtime: true}`` makes ``int8@ort`` and
``int8@openvino``, each validated, benchmarked, gated and recommended on its own runtime's targets only."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from qdeploy.core.runtimes import built_for, runtime_of_variant
from qdeploy.pipeline.loader import load_recipe_file
from qdeploy.pipeline.recipe import Recipe
from qdeploy.pipeline.runner import RunOptions, run_recipe
from tests.helpers.models import write_recipe
from tests.helpers.quantize import tiny_conv

SPLIT = {"int8": [{"quantize": {"per_runtime": True, "reduce_range": "weights"}}]}


def _recipe(variants: dict, targets: list[str], **more: object) -> Recipe:
    return Recipe.model_validate({"name": "r", "model": {"onnx": "m.onnx"}, "variants": variants,
                                  "targets": targets, **more})


def test_per_runtime_splits_a_variant_into_one_build_per_runtime_of_the_targets() -> None:
    recipe = _recipe(SPLIT, ["ort:cpu", "openvino:cpu", "ort:cuda"])
    assert list(recipe.variants) == ["int8@ort", "int8@openvino"]
    for runtime in ("ort", "openvino"):
        config = recipe.variants[f"int8@{runtime}"][0].config
        assert config.runtime == runtime and config.per_runtime is False
        assert list(config.verify_targets) == [f"{runtime}:cpu"]
        assert config.reduce_range == "weights"  # the user's settings carry over
    assert list(_recipe(SPLIT, ["ort:cpu"]).variants) == ["int8@ort"]  # only the runtimes the recipe targets


@pytest.mark.parametrize(("variants", "more", "message"), [
    (SPLIT, {"gates": [{"variant": "int8", "target": "ort:cpu", "metric": "cosine", "min": 0.9}]},
     "per_runtime splits into"),
    (SPLIT, {"gates": [{"variant": "int8@ort", "target": "openvino:cpu", "metric": "speedup", "min": 1.0}]},
     "never runs on openvino:cpu"),
    (SPLIT, {"validate": {"reference": "int8"}}, "the reference must run on every target"),
    ({"x@openvino": [], "y": []}, {"targets": ["ort:cpu"]}, "hold no openvino target"),
    ({"x@gpu": []}, {}, "may hold letters"),
    ({**SPLIT, "int8@ort": []}, {}, "both written in the recipe and made by per_runtime"),
    ({"int8": [{"quantize": {"mode": "dynamic", "per_runtime": True}}]}, {}, "dynamic and lower graphs"),
    ({"int8": [{"quantize": {"mode": "weight_only", "per_runtime": True}}]}, {}, "weight_only builds one graph"),
])
def test_what_a_split_cannot_mean_is_refused_by_name(variants: dict, more: dict, message: str) -> None:
    fields = {"targets": ["ort:cpu", "openvino:cpu"], **more}
    with pytest.raises(ValueError, match=message):
        Recipe.model_validate({"name": "r", "model": {"onnx": "m.onnx"}, "variants": variants, **fields})


def test_a_runtimes_variant_pairs_with_its_own_targets_only() -> None:
    assert runtime_of_variant("int8@openvino") == "openvino" and runtime_of_variant("int8") is None
    assert runtime_of_variant("a@b") is None and runtime_of_variant("@ort") is None
    assert built_for("int8@ort", "ort:cuda") and not built_for("int8@ort", "openvino:cpu")
    assert built_for("int8", "reference:cpu") and not built_for("int8@openvino", "reference:cpu")


RECIPE = """
    name: split
    model: {{onnx: float.onnx}}
    variants:
      int8: [{{quantize: {{per_runtime: true, reduce_range: weights}}}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {{samples: 2}}
    benchmark: {{batch_sizes: [1], warmup: 1, iterations: 3, rounds: 2}}
    gates:
      - {{variant: int8@ort, target: "ort:cpu", metric: cosine, min: 0.9}}
      - {{variant: int8@openvino, target: "openvino:cpu", metric: cosine, min: 0.9}}
    """


def test_a_split_variant_runs_end_to_end_on_its_own_runtime(tmp_path: Path) -> None:
    onnx.save(tiny_conv(), str(tmp_path / "float.onnx"))
    result = run_recipe(load_recipe_file(write_recipe(tmp_path, RECIPE.format())),
                        RunOptions(out_dir=tmp_path / "run", show_progress=False))
    report = result.report
    assert result.exit_code == 0, report.get("unmeasured")
    pairs = {(row["variant"], row["target"]) for row in report["validation"]}
    assert {("int8@ort", "ort:cpu"), ("int8@openvino", "openvino:cpu")} <= pairs
    assert not {("int8@ort", "openvino:cpu"), ("int8@openvino", "ort:cpu")} & pairs
    timed = {(row["variant"], row["target"]) for row in report["benchmarks"]}
    assert ("int8@ort", "ort:cpu") in timed and ("int8@ort", "openvino:cpu") not in timed
    assert ("exported", "openvino:cpu") in timed  # the reference still runs everywhere
    assert not report["unmeasured"]
    built = {row["name"]: row for row in report["artifacts"]}
    assert built["int8@ort"]["key"] != built["int8@openvino"]["key"]  # one cache entry each
    verdict = report["verdict"]["targets"]
    assert "int8@openvino" not in verdict["ort:cpu"].get("rejected", {})
    assert "int8@ort" not in verdict["openvino:cpu"].get("rejected", {})
    assert all(gate["passed"] for gate in report["gates"])


def test_the_variant_option_names_a_split_variant_by_its_recipe_name(tmp_path: Path) -> None:
    from qdeploy.core.errors import QdeployInputError
    from qdeploy.pipeline.runner import plan_run

    recipe = _recipe({**SPLIT, "fp32": []}, ["ort:cpu", "openvino:cpu"])
    plan = plan_run(recipe, RunOptions(out_dir=tmp_path, variants=["int8"], show_progress=False))
    assert plan.variants == ["int8@ort", "int8@openvino"]
    assert plan_run(recipe, RunOptions(out_dir=tmp_path, variants=["int8@ort"])).variants == ["int8@ort"]
    with pytest.raises(QdeployInputError, match="--variant int9: not in the recipe"):
        plan_run(recipe, RunOptions(out_dir=tmp_path, variants=["int9"]))


def _conv_hardswish_conv() -> onnx.ModelProto:
    """Conv -> Mul/Add (a BatchNorm left unfolded) -> HardSwish written out (Add, Clip, Mul, Div) -> Conv, as
    Paddle exports PP-OCR's blocks."""
    import numpy as np
    from onnx import helper

    from tests.helpers.quantize import init, make_model

    rng = np.random.default_rng(1)
    inits = [init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3), init("w2", rng.standard_normal((8, 8, 1, 1)) * 0.3),
             init("gamma", rng.uniform(0.5, 1.5, (1, 8, 1, 1))), init("beta", rng.uniform(-0.5, 0.5, (1, 8, 1, 1))),
             init("three", 3.0), init("zero", 0.0), init("six", 6.0)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "gamma"], ["bn_mul"], name="bn_mul"),
             helper.make_node("Add", ["bn_mul", "beta"], ["bn"], name="bn_add"),
             helper.make_node("Add", ["bn", "three"], ["shifted"], name="hs_add"),
             helper.make_node("Clip", ["shifted", "zero", "six"], ["clipped"], name="hs_clip"),
             helper.make_node("Mul", ["bn", "clipped"], ["scaled"], name="hs_mul"),
             helper.make_node("Div", ["scaled", "six"], ["hs"], name="hs_div"),
             helper.make_node("Conv", ["hs", "w2"], ["y"], name="conv2")]
    return make_model(nodes, inits, {"x": [1, 3, 16, 16]}, {"y": [1, 8, 16, 16]})


def test_the_openvino_build_quantizes_after_the_chain_a_convolution_fuses(tmp_path: Path) -> None:
    """OpenVINO fuses Conv + BatchNorm's Mul/Add + HardSwish into one int8 convolution when the Q sits before the
    next Conv; a Q right after the first Conv (what ONNX Runtime's QLinearConv wants) splits the chain into a
    separate kernel (PP-OCRv4 rec: 28 of them, 1.24x slower)."""
    import numpy as np

    from qdeploy.stages import quantize
    from qdeploy.stages.quantize import QuantizeConfig
    from tests.helpers.quantize import cosine, run_openvino, run_ort, save_artifact, stage_context

    artifact = save_artifact(tmp_path, _conv_hardswish_conv())
    built = {runtime: quantize.run(artifact, QuantizeConfig(runtime=runtime, reduce_range="weights"),
                                   stage_context(tmp_path)).model for runtime in ("ort", "openvino")}

    def readers_of_first_conv(model: onnx.ModelProto) -> set[str]:  # ORT's pre-processing renames it
        output = next(node for node in model.graph.node if node.op_type == "Conv").output[0]
        return {node.op_type for node in model.graph.node if output in node.input}

    def readers(model: onnx.ModelProto, tensor: str) -> set[str]:
        return {node.op_type for node in model.graph.node if tensor in node.input}

    assert readers_of_first_conv(built["ort"]) == {"QuantizeLinear"}  # QLinearConv for ONNX Runtime
    assert readers_of_first_conv(built["openvino"]) == {"Add", "Mul"}  # the chain stays whole
    assert readers(built["openvino"], "hs") == {"QuantizeLinear"}  # quantized where the next Conv reads it
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    expected = run_ort(_conv_hardswish_conv(), feeds)[0]
    assert cosine(run_openvino(built["openvino"], feeds, tmp_path)[0], expected) > 0.99
    assert cosine(run_ort(built["ort"], feeds)[0], expected) > 0.99
