"""One variant line, one int8 artifact per runtime: ``quantize: {per_runtime: true}`` makes ``int8@ort`` and
``int8@openvino``, each validated, benchmarked, gated and recommended on its own runtime's targets only; the
default ``auto`` does so where the runtimes' placements differ for the model, and builds one file for both
names where they agree (``pipeline/run/per_runtime.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from qdeploy.core.runtimes import built_for, runtime_of_variant
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
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


PLAIN = {"int8": [{"quantize": {"mode": "ptq"}}], "fp32": []}


def test_auto_splits_a_plain_ptq_variant_where_the_targets_hold_both_runtimes() -> None:
    """per_runtime auto (the default): split at load, the config as written (the build specialises it only where
    the placements differ); one runtime, false, the reference or an explicit runtime: one variant."""
    recipe = _recipe(PLAIN, ["ort:cpu", "openvino:cpu"], gates=[
        {"variant": "int8", "target": target, "metric": "cosine", "min": 0.9}
        for target in ("ort:cpu", "openvino:cpu")])
    assert list(recipe.variants) == ["int8@ort", "int8@openvino", "fp32"]
    for name in ("int8@ort", "int8@openvino"):
        config = recipe.variants[name][0].config
        assert config.per_runtime == "auto" and config.runtime is None
    assert [gate.variant for gate in recipe.gates] == ["int8@ort", "int8@openvino"]  # the recipe's name still works
    assert list(_recipe(PLAIN, ["ort:cpu", "ort:cuda"]).variants) == ["int8", "fp32"]
    assert list(_recipe({"int8": [{"quantize": {"per_runtime": False}}]}, ["ort:cpu", "openvino:cpu"]).variants) \
        == ["int8"]
    assert list(_recipe({"int8": [{"quantize": {"runtime": "openvino"}}]}, ["ort:cpu", "openvino:cpu"]).variants) \
        == ["int8"]
    assert "int8" in _recipe(PLAIN, ["ort:cpu", "openvino:cpu"], validate={"reference": "int8"}).variants
    assert _recipe({"int8@openvino": [{"quantize": {}}]}, ["ort:cpu", "openvino:cpu"]).variants.keys() \
        == {"int8@openvino"}


def test_gates_naming_a_split_variant_point_at_the_build_for_their_target() -> None:
    recipe = _recipe(SPLIT, ["ort:cpu", "openvino:cpu"],
                     gates=[{"variant": "int8", "target": "openvino:cpu", "metric": "cosine", "min": 0.9}])
    assert recipe.gates[0].variant == "int8@openvino"


@pytest.mark.parametrize(("variants", "more", "message"), [
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
    from qdeploy.pipeline.run.runner import plan_run

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


PLAIN_RECIPE = """
    name: plain
    model: {onnx: float.onnx}
    variants:
      int8: [{quantize: {mode: ptq, reduce_range: weights}}]
    targets: [ort:cpu, openvino:cpu]
    validate: {samples: 2}
    benchmark: {enabled: false}
    gates:
      - {variant: int8, target: "openvino:cpu", metric: cosine, min: 0.9}
    """


def _mlp() -> onnx.ModelProto:
    """Relu -> MatMul -> Relu -> MatMul: no convolution and no negative activation to quantize, so ONNX Runtime's
    and OpenVINO's placements agree (signed inputs put int8 in OpenVINO's graph: test_placement.py)."""
    import numpy as np
    from onnx import helper

    from tests.helpers.quantize import init, make_model

    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Relu", ["x"], ["x0"], name="relu0"),
             helper.make_node("MatMul", ["x0", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    return make_model(nodes, [init("w1", rng.standard_normal((16, 32)) * 0.3),
                              init("w2", rng.standard_normal((32, 8)) * 0.3)], {"x": [1, 16]}, {"y": [1, 8]})


@pytest.fixture(scope="module", params=["differ", "agree"])
def plain_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, Path]:
    """A plain ptq recipe (no per_runtime) on both runtimes, run on a CNN (placements differ) and an MLP (agree)."""
    folder = tmp_path_factory.mktemp(request.param)
    onnx.save(tiny_conv() if request.param == "differ" else _mlp(), str(folder / "float.onnx"))
    result = run_recipe(load_recipe_file(write_recipe(folder, PLAIN_RECIPE)),
                        RunOptions(out_dir=folder / "run", show_progress=False))
    assert result.exit_code == 0, (result.report.get("failures"), result.report.get("gates"))
    return request.param, result.report, folder / "run"


@pytest.mark.slow
def test_a_plain_recipe_gets_one_graph_per_runtime_only_where_the_placements_differ(
        plain_run: tuple[str, dict, Path]) -> None:
    from qdeploy.stages.quantize.ptq._placement import quantized_placement

    case, report, out = plain_run
    rows = {row["name"]: row for row in report["artifacts"]}
    assert {"int8@ort", "int8@openvino"} <= rows.keys()
    graphs = {name: onnx.load(str(out / "artifacts" / f"{name}.onnx")) for name in ("int8@ort", "int8@openvino")}
    placed = {name: quantized_placement(model) for name, model in graphs.items()}
    notes = {name: rows[name]["per_runtime"] for name in graphs}
    if case == "differ":
        assert placed["int8@ort"] != placed["int8@openvino"]
        assert rows["int8@ort"]["sha256"] != rows["int8@openvino"]["sha256"]
        assert "same_file_as" not in rows["int8@openvino"]
        assert all(note["graphs"] == 2 and note["differs_at"] >= 4 for note in notes.values())
        assert {"conv1", "conv2", "relu1", "relu2"} <= set(notes["int8@ort"]["nodes"])
        assert notes["int8@ort"]["note"].startswith(
            f"one graph per runtime: placements differ at {notes['int8@ort']['differs_at']} nodes")
        configs = {name: rows[name]["lineage"][-1]["config"] for name in graphs}
        assert configs["int8@ort"]["runtime"] == "ort" and configs["int8@openvino"]["runtime"] == "openvino"
    else:  # one build, one file: the second name is the first's file, measured once
        assert rows["int8@ort"]["key"] == rows["int8@openvino"]["key"]
        assert rows["int8@openvino"]["same_file_as"] == "int8@ort"
        assert all(note["graphs"] == 1 and note["differs_at"] == 0 for note in notes.values())
        assert notes["int8@ort"]["note"].startswith("one graph for both runtimes: placements agree")
    verdict = report["verdict"]["targets"]  # each runtime ships its own build
    assert verdict["ort:cpu"]["variant"] == "int8@ort" and verdict["openvino:cpu"]["variant"] == "int8@openvino"
    assert [gate["variant"] for gate in report["gates"]] == ["int8@openvino"]
    assert notes["int8@ort"]["note"] in (out / "report.md").read_text()
    written = {(item["target"], item["variant"]) for item in report["packages"]["written"]}
    assert {("ort:cpu", "int8@ort"), ("openvino:cpu", "int8@openvino")} <= written


@pytest.mark.slow
def test_package_variant_names_the_build_for_the_target(plain_run: tuple[str, dict, Path], tmp_path: Path) -> None:
    from qdeploy.pipeline.publish.package.publish import package_from_run

    _, _, out = plain_run
    made = package_from_run(out, "openvino:cpu", ["int8"], tmp_path)
    assert [json.loads((path / "manifest.json").read_text())["variant"] for path in made] == ["int8@openvino"]


def test_a_placement_check_that_fails_gives_each_runtime_its_own_build(tmp_path: Path) -> None:
    """Deciding must never hand OpenVINO ONNX Runtime's graph unchecked: a failed comparison splits."""
    from types import SimpleNamespace

    from qdeploy.pipeline.publish.store import ArtifactStore
    from qdeploy.pipeline.run.per_runtime import build_config, note_runtime_builds
    from tests.helpers.quantize import artifact_at

    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    recipe = _recipe(PLAIN, ["ort:cpu", "openvino:cpu"])
    state = SimpleNamespace(store=ArtifactStore(tmp_path / "cache"), use_cache=True, work_root=tmp_path / "work",
                            placements={})
    step = recipe.variants["int8@openvino"][0]
    config = build_config(state, "int8@openvino", step, artifact_at(tmp_path / "broken.onnx"))
    assert config.runtime == "openvino" and state.placements["int8"].error
    assert build_config(state, "fp32", recipe.variants["int8@ort"][0], artifact_at(tmp_path / "broken.onnx")) \
        is recipe.variants["int8@ort"][0].config  # not a runtime's build: as written
    rows = [{"name": "int8@ort", "sha256": "a", "seconds": 1.0}, {"name": "int8@openvino", "sha256": "b"}]
    decisions = note_runtime_builds(rows, state.placements)
    assert rows[1]["per_runtime"]["note"].startswith("one graph per runtime: the placements could not be compared")
    assert decisions["int8"].graphs == 2 and decisions["int8"].builds == ("int8@ort", "int8@openvino")
    assert rows[0]["per_runtime"] == decisions["int8"].row()  # one typed decision, written to each build's row


def test_per_runtime_auto_is_decided_in_the_build_outcome_never_on_the_recipe(tmp_path: Path) -> None:
    """The build keeps what the placements showed in its own state and hands back one typed decision per variant;
    the validated recipe, frozen, is the same after the build as before it."""
    from pydantic import ValidationError

    from qdeploy.pipeline.publish.published import discard_generation
    from qdeploy.pipeline.run.runner import build_phase, plan_run

    onnx.save(_mlp(), str(tmp_path / "float.onnx"))
    recipe = load_recipe_file(write_recipe(tmp_path, PLAIN_RECIPE))
    before = recipe.model_dump(mode="json", by_alias=True)
    outcome = build_phase(plan_run(recipe, RunOptions(out_dir=tmp_path / "run", show_progress=False)))
    if outcome.generation is not None:
        discard_generation(outcome.generation)
    assert recipe.model_dump(mode="json", by_alias=True) == before
    assert not outcome.failures
    decision = outcome.per_runtime["int8"]
    assert (decision.builds, decision.graphs, decision.differs_at) == (("int8@ort", "int8@openvino"), 1, 0)
    assert decision.note.startswith("one graph for both runtimes: placements agree")
    rows = {row["name"]: row for row in outcome.published}
    assert rows["int8@ort"]["per_runtime"] == rows["int8@openvino"]["per_runtime"] == decision.row()
    with pytest.raises(ValidationError, match="frozen"):
        recipe.variants = {}
