"""The benchmark's sessions held at once: every artifact of a target, unless the runner's budget says otherwise."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx
import pytest

from qdeploy.calibration import data_context
from qdeploy.core.context import Artifact
from qdeploy.stages import benchmark
from qdeploy.stages.benchmark import BenchmarkConfig, session_bytes
from qdeploy.stages.benchmark._resident import split_to_fit
from tests.helpers.models import tiny_cnn

SIZE = 1_000  # bytes each artifact is said to have: the budget is what counts, not the real file


@pytest.fixture(scope="module")
def three(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Artifact]:
    folder = tmp_path_factory.mktemp("resident")
    artifacts = {}
    for name in ("a", "b", "c"):
        path = folder / f"{name}.onnx"
        onnx.save(tiny_cnn(seed=1, channels=4), path)
        artifacts[name] = Artifact(path=path, sidecar=path.with_suffix(".json"), key=name, sha256="",
                                   size_bytes=SIZE, stages=(), parent=None)
    return artifacts


def test_split_to_fit_keeps_the_order_and_puts_an_item_over_the_budget_alone() -> None:
    items = {"a": 1, "b": 2, "c": 3, "d": 4}
    cost = {"a": 400, "b": 500, "c": 2_000, "d": 100}
    assert split_to_fit(items, cost, None) == [items]
    assert split_to_fit(items, cost, 10_000) == [items]
    assert split_to_fit(items, cost, 1_000) == [{"a": 1, "b": 2}, {"c": 3}, {"d": 4}]
    assert split_to_fit({}, {}, 1) == []


def test_the_anchor_is_timed_again_in_every_group_it_fits_beside() -> None:
    items = {"a": 1, "b": 2, "c": 3, "d": 4}
    cost = {"a": 400, "b": 500, "c": 2_000, "d": 100}
    assert split_to_fit(items, cost, 1_000, anchor="a") == [{"a": 1, "b": 2}, {"c": 3}, {"a": 1, "d": 4}]
    assert split_to_fit(items, cost, 10_000, anchor="a") == [items]  # all fit: one group, no second timing
    assert split_to_fit(items, {**cost, "a": 1_500}, 1_000, anchor="a") == [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}]
    # every other item too large to sit beside it: the anchor is still timed, in a group of its own
    assert split_to_fit({"a": 1, "c": 3}, cost, 1_000, anchor="a") == [{"a": 1}, {"c": 3}]


def test_openvino_sessions_are_counted_as_float32_weights_held_twice(three: dict[str, Artifact]) -> None:
    fp32 = dataclasses.replace(three["a"], stages=("export",))
    fp16 = dataclasses.replace(three["a"], stages=("export", "fp16"), size_bytes=SIZE // 2)
    assert session_bytes(fp32, "ort:cpu") == SIZE and session_bytes(fp32, "openvino:cpu") == 2 * SIZE
    assert session_bytes(fp16, "openvino:cpu") == 2 * SIZE  # decompressed to float32


def test_a_budget_loads_and_times_the_artifacts_in_groups_that_fit(three: dict[str, Artifact]) -> None:
    seen: list[str] = []
    ctx = data_context("*", Path("work"), on_progress=seen.append)
    config = BenchmarkConfig(warmup=1, iterations=2, rounds=2, threads=1, busy_seconds=0)
    rows = benchmark.run(three, ["ort:cpu"], config, ctx, session_budget=2 * SIZE)
    steps = [f"{message.split(' · ')[0]} {'load' if 'loading' in message else 'round'}" for message in seen]
    assert steps == ["a load", "b load", "a round", "b round", "a round", "b round",  # a and b fit together
                     "a load", "c load", "a round", "c round", "a round", "c round"]  # then a again beside c
    assert [row.variant for row in rows] == ["a", "b", "c"] and all(row.status == "ok" for row in rows)
    assert "interleaved with a, b on ort:cpu" in rows[0].notes[-1] and "interleaved with a, c" in rows[2].notes[-1]
    assert [row.round_group for row in rows] == [0, 0, 1]  # c shares no round with the first a or with b ...
    assert rows[2].anchor["variant"] == "a" and len(rows[2].anchor["round_p50_ms"]) == 2  # ... but with a again
    assert rows[0].anchor is None and rows[1].anchor is None


def test_throughput_rows_of_a_later_group_carry_the_anchor_timed_again(three: dict[str, Artifact]) -> None:
    ctx = data_context("*", Path("work"))
    config = BenchmarkConfig(mode="throughput", rounds=2, threads=1, throughput={"seconds": 0.05})
    rows = benchmark.run(three, ["ort:cpu"], config, ctx, session_budget=2 * SIZE)
    assert [row.variant for row in rows] == ["a", "b", "c"] and all(row.status == "ok" for row in rows)
    assert rows[2].anchor["variant"] == "a" and len(rows[2].anchor["round_inferences_per_s"]) == 2
    assert rows[0].anchor is None and rows[1].anchor is None


def test_without_a_budget_or_within_it_every_artifact_is_interleaved(three: dict[str, Artifact]) -> None:
    seen: list[str] = []
    ctx = data_context("*", Path("work"), on_progress=seen.append)
    config = BenchmarkConfig(warmup=1, iterations=1, rounds=1, threads=1)
    rows = benchmark.run(three, ["ort:cpu"], config, ctx, session_budget=3 * SIZE)
    assert [message.split(" · ")[0] for message in seen if "loading" in message] == ["a", "b", "c"]
    assert not any("interleaved with" in note for row in rows for note in row.notes)
    assert all(row.round_group is None for row in rows)
