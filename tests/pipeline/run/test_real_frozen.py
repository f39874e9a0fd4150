"""silero-vad (``tests.real_models.SILERO_VAD``, the 16 kHz opset-15 export) on openvino:cpu, with ``sr`` frozen.

OpenVINO 2026.4 cannot read the model as exported: its Ifs (squeeze a dimension when it is 1) leave the rank of
the decoder's Conv input and of the final ReduceMean's input unknown.  In this export ``sr`` decides no If (it
only enters ``stateN`` as ``sr * 0``): the Ifs are decided by the length of ``input``.  So the recipe freezes
``sr`` at 16000, as silero-vad is deployed, and fixes the window to the 576 samples (64 context + 512 new)
silero-vad feeds at 16 kHz; the batch stays symbolic.  Then every openvino:cpu row is measured: exported, fp32,
fp16 and int8 (measured passing on the AVX512-VNNI development machine; int8's cosine 0.985 is near its 0.98
budget, so on CPUs without VNNI it is asserted measured only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from qdeploy.core.runtimes import is_device_default
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from tests.helpers.int8 import exact_int8
from tests.real_models import RealModelError
from tests.real_recipes import QUICK, write_recipe

pytestmark = pytest.mark.slow

FROZEN = [{"name": "sr", "value": 16000}, {"name": "input", "shape": ["batch", 576]}]


def _report(folder: Path, inputs: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        path = write_recipe("silero-vad", folder, QUICK)
    except RealModelError as exc:
        if exc.unreachable:
            pytest.skip(f"silero-vad: the package index cannot be reached: {exc}")
        raise
    recipe = yaml.safe_load(path.read_text())
    recipe["model"]["inputs"] = inputs
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return run_recipe(load_recipe_file(path), RunOptions(out_dir=folder / "run", show_progress=False)).report


def test_silero_vad_with_sr_frozen_runs_on_openvino_through_the_whole_recipe(tmp_path: Path) -> None:
    report = _report(tmp_path, FROZEN)
    assert report["failures"] == [] and report["unreadable_targets"] == {}
    export = report["artifacts"][0]["lineage"][0]
    assert export["findings"]["frozen_inputs"] == {"sr": {"value": 16000, "dtype": "int64"}}
    rows = {row["variant"]: row for row in report["validation"] if row["target"] == "openvino:cpu"
            and not is_device_default(row["variant"])}  # exported@default where the CPU runs float32 in bf16
    assert set(rows) == {"exported", "fp32", "fp16", "int8"}
    for variant, row in rows.items():
        assert row["status"] in ("passed", "failed") and "cosine" in row["metrics"], (variant, row["reason"])
    must_pass = ["exported", "fp32", "fp16", *(["int8"] if exact_int8() else [])]
    assert {variant: rows[variant]["status"] for variant in must_pass} == dict.fromkeys(must_pass, "passed"), {
        variant: (row["status"], row["metrics"].get("cosine"), row["reason"]) for variant, row in rows.items()}


def test_freezing_sr_alone_leaves_silero_vad_unreadable_and_says_so_once(tmp_path: Path) -> None:
    """sr decides no If in this export: freezing it folds ``sr * 0`` away, and the report says once why
    OpenVINO still cannot read the model, pointing to the input's shape."""
    report = _report(tmp_path, FROZEN[:1])
    why = report["unreadable_targets"].get("openvino:cpu", "")
    assert "cannot read the original model" in why and "model.inputs[].shape" in why
    assert report["artifacts"][0]["lineage"][0]["findings"]["nodes_folded"] == 2  # the Mul and the Cast
