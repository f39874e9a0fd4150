"""The planner: variants share transform prefixes; the schema describes recipes as users write them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.plan import build_plan, describe_plan, recipe_json_schema
from tests.helpers.models import DEMO_RECIPE, write_recipe


def test_shared_prefix_is_one_node(tmp_path: Path, tiny_model_path: Path) -> None:
    recipe = load_recipe_file(write_recipe(tmp_path, """
        name: t
        model: {onnx: tiny.onnx}
        variants:
          a: [simplify, fp16]
          b: [simplify, quantize]
          c: [{simplify: {skip_fuse_bn: true}}, fp16]
        """))
    plan = build_plan(recipe)
    stages = [node.stage for node in plan.nodes]
    assert stages.count("simplify") == 2  # a and b share one; c's config differs
    shared = plan.node(plan.variants["a"][:1])
    assert shared.variants == ["a", "b"]
    assert plan.node(plan.variants["c"][:1]).variants == ["c"]
    assert len(plan.nodes) == 1 + 2 + 3  # export, two simplify configs, three leaves


def test_describe_plan_lists_targets_and_availability() -> None:
    text = describe_plan(load_recipe_file(DEMO_RECIPE))
    assert "recipe demo-cnn: valid" in text
    assert "ort:cpu: available" in text
    assert "ort:cuda: unavailable" in text  # no GPU on these machines
    assert "[fp32, fp16, int8@ort, int8@openvino]" in text
    assert "per_runtime auto: int8 -> int8@ort, int8@openvino" in text


def test_schema_validates_the_demo_recipe_and_rejects_typos() -> None:
    schema = recipe_json_schema()
    json.dumps(schema)
    demo = yaml.safe_load(DEMO_RECIPE.read_text())
    jsonschema.validate(demo, schema)
    demo["variants"]["fp16"][1] = {"fp16": {"keep_io_typez": True}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(demo, schema)
