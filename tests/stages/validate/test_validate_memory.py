"""Validation holds the outputs of a pair only as long as it compares them, but the noise floor's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

import qdeploy.stages.validate as validate
from qdeploy.stages.validate import ValidateConfig
from tests.helpers.validate import artifact, by_pair, chain_model, context, to_fp16


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


def test_every_pair_hands_freed_memory_back_when_the_runs_largest_model_is_large(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An int4 artifact of a large model is small itself: the float32 pairs before it still left hundreds of MB
    freed, so the run's largest model decides, for every pair, the true-float16 ones included."""
    import qdeploy.stages.validate._floor as floor

    wide, narrow = chain_model(width=64), chain_model(width=64, depth=1)
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", wide),
                 "small": artifact(tmp_path / "small.onnx", narrow),
                 "half": artifact(tmp_path / "half.onnx", to_fp16(wide), ("export", "fp16"))}
    sizes = sorted(a.size_bytes for a in artifacts.values())
    monkeypatch.setattr(floor, "RELEASE_FROM_BYTES", sizes[-1])  # only the largest model reaches it
    released: list[int] = []
    monkeypatch.setattr(floor, "release_memory", lambda: released.append(1))
    wide_input = """
        name: t
        model: {onnx: model.onnx, inputs: [{name: x, shape: [1, 64]}]}
        variants: {v: []}
        """
    onnx.save(wide, str(tmp_path / "model.onnx"))
    rows = validate.run(artifacts, ["ort:cpu"], ValidateConfig(samples=2), context(tmp_path, wide_input))
    measured = {(row.variant, row.target) for row in rows if row.measured}
    assert measured >= {("half", "reference:cpu"), ("small", "ort:cpu")}
    assert len(released) == len(rows) == 4  # three on ort:cpu, one true-float16 check


def test_outputs_past_the_limit_wait_on_disk_and_validate_the_same(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A language model's logits held for every sample set the run's peak: past the limit they go to disk."""
    import qdeploy.core.output_store as output_store

    artifacts = {"exported": artifact(tmp_path / "ref.onnx", chain_model()),
                 "a": artifact(tmp_path / "a.onnx", chain_model(seed=1))}
    targets = ["ort:cpu", "openvino:cpu"]
    in_memory = [row.to_json() for row in validate.run(artifacts, targets, ValidateConfig(samples=3),
                                                       context(tmp_path))]
    seen: list[type] = []
    original = validate.compare_outputs

    def spy(reference: Any, candidate: Any, *args: Any) -> Any:
        seen.extend(type(sample) for sample in (*reference, *candidate))
        return original(reference, candidate, *args)

    monkeypatch.setattr(validate, "compare_outputs", spy)
    monkeypatch.setattr(output_store, "KEEP_IN_MEMORY_BYTES", 0)
    ctx = context(tmp_path)
    on_disk = [row.to_json() for row in validate.run(artifacts, targets, ValidateConfig(samples=3), ctx)]
    assert output_store.DiskSample in seen
    assert _untimed(on_disk) == _untimed(in_memory)
    assert any(row["status"] == "failed" for row in on_disk)  # a differing artifact is still caught
    assert not list(ctx.work_dir.glob("outputs-*"))  # nothing left behind once validation is done


def _untimed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without the localizer's wall time, the one field two runs of the same pairs differ in."""
    for row in rows:
        if row.get("divergence"):
            row["divergence"]["localized_by"].pop("seconds", None)
    return rows
