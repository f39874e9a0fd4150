"""Validation holds the outputs of a pair only as long as it compares them, but the noise floor's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import qdeploy.stages.validate as validate
from qdeploy.stages.validate import ValidateConfig
from tests.helpers.validate import artifact, by_pair, chain_model, context


def test_only_the_noise_floor_rows_keep_their_outputs_to_the_end(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", chain_model()),
                 "a": artifact(tmp_path / "a.onnx", chain_model()),
                 "b": artifact(tmp_path / "b.onnx", chain_model())}
    held: dict[tuple[str, str], bool] = {}
    original = validate.flag_unattainable

    def spy(outcomes: list[Any], *args: Any) -> None:  # what is still held when the floor is applied, at the end
        held.update({(o.row.variant, o.row.target): o.outputs is not None for o in outcomes})
        original(outcomes, *args)

    monkeypatch.setattr(validate, "flag_unattainable", spy)
    rows = by_pair(validate.run(artifacts, ["ort:cpu", "openvino:cpu"], ValidateConfig(samples=2),
                                context(tmp_path)))
    assert all(row.status == "passed" for row in rows.values())
    assert held == {(variant, target): variant == "exported" and target == "openvino:cpu"
                    for variant in artifacts for target in ("ort:cpu", "openvino:cpu")}
    assert rows[("exported", "openvino:cpu")].noise_floor  # the floor still works from the one it kept
