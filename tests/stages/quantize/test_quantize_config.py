"""quantize's settings: one model per mode, chosen by ``mode`` (ptq when absent) and, for ptq, ``engine``."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
from pydantic import ValidationError

from qdeploy.core.errors import RecipeError
from qdeploy.pipeline.run.plan import recipe_json_schema
from qdeploy.stages.quantize.config import (
    DynamicConfig,
    LowerConfig,
    NncfPtqConfig,
    PtqConfig,
    QuantizeConfig,
    WeightOnlyConfig,
)
from tests.helpers.models import DEMO_RECIPE


@pytest.mark.parametrize(("settings", "model"), [
    ({}, PtqConfig),
    ({"calibration": {"data": "calib"}, "method": "entropy"}, PtqConfig),
    ({"mode": "ptq", "engine": "qdeploy"}, PtqConfig),
    ({"engine": "nncf", "nncf_model_type": "transformer"}, NncfPtqConfig),
    ({"mode": "dynamic", "per_channel": False}, DynamicConfig),
    ({"mode": "lower", "calibration": {"data": "calib"}}, LowerConfig),
    ({"mode": "weight_only", "bits": 8, "group_size": 64}, WeightOnlyConfig),
])
def test_each_mode_parses_into_its_own_model(settings: dict, model: type) -> None:
    config = QuantizeConfig.model_validate(settings)
    assert type(config) is model
    assert type(QuantizeConfig(**settings)) is model
    assert QuantizeConfig.model_validate(config.model_dump(mode="json")) == config  # the runner's round trip


def test_a_recipe_without_mode_is_ptq_and_its_dump_holds_only_ptq_fields() -> None:
    dumped = QuantizeConfig().model_dump(mode="json")
    assert dumped["mode"] == "ptq" and dumped["engine"] == "qdeploy"
    assert not {"bits", "group_size", "weight_format", "nncf_model_type"} & set(dumped)
    assert set(QuantizeConfig(mode="lower").model_dump()) == {"mode", "calibration", "verify_targets"}


@pytest.mark.parametrize(("settings", "field", "words"), [
    ({"mode": "weight_only", "per_channel": True}, "per_channel",
     "quantize.weight_only does not take 'per_channel' (it applies to modes ptq and dynamic)"),
    ({"mode": "dynamic", "method": "entropy"}, "method",
     "quantize.dynamic does not take 'method' (it applies to modes ptq and weight_only)"),
    ({"mode": "lower", "tolerance": {"cosine_min": 0.9}}, "tolerance",
     "quantize.lower does not take 'tolerance' (it applies to modes ptq and dynamic)"),
    ({"bits": 8}, "bits", "quantize.ptq does not take 'bits' (it applies to mode weight_only)"),
    ({"engine": "nncf", "percentile": 99.9}, "percentile",
     "quantize.ptq with engine nncf does not take 'percentile' (it applies to mode ptq with engine qdeploy)"),
    ({"mode": "dynamic", "engine": "nncf"}, "engine",
     "quantize.dynamic does not take 'engine' (it applies to mode ptq)"),
    # a field at its default is refused too: the mode does not read it
    ({"mode": "dynamic", "method": "minmax"}, "method", "quantize.dynamic does not take 'method'"),
])
def test_a_field_of_another_mode_is_refused_at_that_field_naming_the_mode(settings: dict, field: str,
                                                                            words: str) -> None:
    with pytest.raises(ValidationError) as caught:
        QuantizeConfig(**settings)
    error = caught.value.errors()[0]
    assert error["loc"] == (field,)
    assert words in error["msg"]


@pytest.mark.parametrize(("settings", "field", "expected"), [
    ({"mode": "int8"}, "mode", "'ptq', 'dynamic', 'lower' or 'weight_only'"),
    ({"engine": "openvino"}, "engine", "'qdeploy' or 'nncf'"),
])
def test_an_unknown_mode_or_engine_lists_the_known_ones(settings: dict, field: str, expected: str) -> None:
    with pytest.raises(ValidationError) as caught:
        QuantizeConfig(**settings)
    error = caught.value.errors()[0]
    assert error["loc"] == (field,) and expected in error["msg"]


def test_a_misspelt_field_stays_an_unknown_field() -> None:
    with pytest.raises(ValidationError) as caught:
        QuantizeConfig(mode="weight_only", bitz=4)
    assert caught.value.errors()[0]["type"] == "extra_forbidden"


def test_the_recipe_error_names_the_line_the_field_and_the_mode(tmp_path: Path) -> None:
    from qdeploy.pipeline.recipe.loader import load_recipe_file

    text = DEMO_RECIPE.read_text().replace("{quantize: {mode: ptq, calibration: {data: calib}}}",
                                           "{quantize: {mode: weight_only, per_channel: true}}")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text.replace("models/", f"{DEMO_RECIPE.parent}/models/")
                      .replace("path: data/", f"path: {DEMO_RECIPE.parent}/data/"))
    with pytest.raises(RecipeError) as caught:
        load_recipe_file(recipe)
    message = str(caught.value)
    assert "variants.int8.1.quantize.per_channel" in message
    assert "quantize.weight_only does not take 'per_channel' (it applies to modes ptq and dynamic)" in message


def test_the_json_schema_has_one_branch_per_mode() -> None:
    schema = recipe_json_schema()
    branches = [schema["$defs"][ref["$ref"].rsplit("/", 1)[1]] for ref in schema["$defs"]["quantize_config"]["oneOf"]]
    modes = [(branch["properties"]["mode"]["const"], branch["properties"].get("engine", {}).get("const"))
             for branch in branches]
    assert modes == [("ptq", "qdeploy"), ("ptq", "nncf"), ("dynamic", None), ("lower", None), ("weight_only", None)]
    assert all(branch["additionalProperties"] is False for branch in branches)
    assert "per_channel" not in schema["$defs"]["quantize_WeightOnlyConfig"]["properties"]

    def recipe(settings: dict) -> dict:
        return {"name": "r", "model": {"onnx": "m.onnx"}, "variants": {"v": [{"quantize": settings}]}}

    for settings in ({}, {"calibration": {"data": "c"}}, {"engine": "nncf"}, {"mode": "dynamic"},
                     {"mode": "weight_only", "bits": 8}):
        jsonschema.validate(recipe(settings), schema)  # exactly one branch matches
    for settings in ({"mode": "weight_only", "per_channel": True}, {"engine": "nncf", "method": "mse"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(recipe(settings), schema)
