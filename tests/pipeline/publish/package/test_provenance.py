"""A package's limits come from the run's recipe snapshot by the rule validation used: the snapshot's steps,
parsed by their stages' models, declare the same limits the run's recipe declared (``Recipe.declared_tolerances``),
never read back by key."""

from __future__ import annotations

import pytest

from qdeploy.core.errors import QdeployInputError
from qdeploy.pipeline.publish.package.provenance import declared_in_snapshot
from qdeploy.pipeline.recipe.schema import Recipe

VARIANTS = {
    "int8": [{"quantize": {"tolerance": {"cosine_min": 0.5}}}],
    "fp16": ["simplify", {"fp16": {"tolerance": {"snr_db_min": 35.0}}}],
    "both": [{"fp16": {"tolerance": {"cosine_min": 0.9}}}, {"quantize": {"mode": "dynamic",
                                                                        "tolerance": {"cosine_min": 0.7}}}],
    "task": [{"quantize": {"tolerance": {"max_drop": 0.01}, "budget": {"data": "held"}}}],  # no output limits
    "plain": [{"quantize": {}}],
    "fp32": [],
}


def test_the_snapshot_declares_what_the_run_declared() -> None:
    recipe = Recipe.model_validate({"name": "r", "model": {"onnx": "m.onnx"}, "variants": VARIANTS,
                                    "targets": ["ort:cpu", "openvino:cpu"],
                                    "data": {"held": {"reader": "npy", "path": "held"}},
                                    "validate": {"metric": "metrics.py:accuracy"}})
    declared = recipe.declared_tolerances()
    assert set(declared) == {"int8@ort", "int8@openvino", "fp16", "both"}
    snapshot = recipe.model_dump(mode="json", by_alias=True)
    for variant, steps in snapshot["variants"].items():
        assert declared_in_snapshot(steps, variant) == declared.get(variant), variant


@pytest.mark.parametrize(("steps", "message"), [
    ([{"stage": "quantize", "config": {"tolerance": {"cosine_min": 2.0}}}], "step 1 of the variant"),
    ([{"stage": "export", "config": {}}], "unknown stage 'export' in a variant"),
    (["quantize"], "a step of the snapshot is"),
])
def test_a_snapshot_step_this_qdeploy_cannot_read_is_an_input_error(steps: list, message: str) -> None:
    with pytest.raises(QdeployInputError, match=message):
        declared_in_snapshot(steps, "report.json's validation of 'int8' on ort:cpu")
