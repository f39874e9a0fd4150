"""The user's task metric: labels read beside the inputs, the value on every row, gates on it."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from pydantic import ValidationError

from qdeploy.core.errors import DataError, RecipeError
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.run.runner import RunOptions, run_recipe
from qdeploy.stages.validate import ValidateConfig
from qdeploy.stages.validate._task import check_metric, evaluate, read_labels, stack
from tests.helpers.models import write_recipe
from tests.helpers.validate import chain_model, chain_numpy

METRICS = '''
import numpy as np

def accuracy(outputs, labels):
    return float(np.mean(np.argmax(outputs["logits"], axis=-1) == labels))

def broken(outputs, labels):
    return outputs["probabilities"]
'''


def _labelled_dataset(folder: Path, model: onnx.ModelProto, count: int = 6) -> float:
    """count .npz samples with x and label; half the labels agree with the model: returns that accuracy."""
    folder.mkdir()
    rng = np.random.default_rng(5)
    hits = 0
    for index in range(count):
        x = rng.standard_normal((1, 6)).astype(np.float32)
        predicted = int(np.argmax(chain_numpy(model, x), axis=-1)[0])
        label = predicted if index % 2 == 0 else (predicted + 1) % 10
        hits += label == predicted
        np.savez(folder / f"s{index:02d}.npz", x=x, label=np.array([label], np.int64))
    return hits / count


def _recipe(tmp_path: Path, metric: str, gates: str) -> Path:
    """The chain model, the metrics file and a recipe validating on the 'val' folder with that metric."""
    onnx.save(chain_model(), str(tmp_path / "model.onnx"))
    (tmp_path / "metrics.py").write_text(METRICS)
    body = textwrap.dedent(f"""
        name: task
        model: {{onnx: model.onnx}}
        data:
          val: {{reader: npy, path: val}}
        variants: {{fp32: []}}
        targets: [ort:cpu]
        validate: {{data: val, metric: "{metric}"}}
        benchmark: {{enabled: false}}
        """) + gates
    return write_recipe(tmp_path, body)


def test_task_metric_is_reported_and_gated(tmp_path: Path) -> None:
    model = chain_model()
    expected = _labelled_dataset(tmp_path / "val", model)
    assert expected == 0.5
    gates = textwrap.dedent("""
        gates:
          - {variant: fp32, target: "ort:cpu", metric: task_metric, min: 0.5}
          - {variant: fp32, target: "ort:cpu", metric: task_metric, min: 0.6}
        """)
    recipe = load_recipe_file(_recipe(tmp_path, "metrics.py:accuracy", gates))
    report = run_recipe(recipe, RunOptions(out_dir=tmp_path / "out", show_progress=False)).report
    row = next(r for r in report["validation"] if r["variant"] == "fp32")
    assert row["metrics"]["task_metric"] == pytest.approx(expected)
    assert row["task_metric_reference"] == pytest.approx(expected)
    assert not any("labels=None" in w for w in row["warnings"])
    assert [(g["value"], g["passed"]) for g in report["gates"]] == [(pytest.approx(0.5), True),
                                                                   (pytest.approx(0.5), False)]


def test_a_failing_metric_is_a_warning_and_fails_its_gate(tmp_path: Path) -> None:
    _labelled_dataset(tmp_path / "val", chain_model())
    gates = "gates:\n  - {variant: fp32, target: \"ort:cpu\", metric: task_metric, min: 0.1}\n"
    recipe = load_recipe_file(_recipe(tmp_path, "metrics.py:broken", gates))
    report = run_recipe(recipe, RunOptions(out_dir=tmp_path / "out", show_progress=False)).report
    row = next(r for r in report["validation"] if r["variant"] == "fp32")
    assert row["status"] == "passed"  # the tensors still agree
    assert row["metrics"]["task_metric"] is None and row["task_metric_reference"] is None
    assert any("KeyError" in w and "probabilities" in w for w in row["warnings"])
    gate = report["gates"][0]
    assert gate["passed"] is False and "KeyError" in gate["reason"]


def test_gate_on_task_metric_without_a_metric_says_what_is_missing() -> None:
    from qdeploy.core.rows import ValidationRow
    from qdeploy.pipeline.recipe.schema import GateSpec
    from qdeploy.pipeline.results.gates import evaluate_gates

    row = ValidationRow(variant="v", target="ort:cpu", status="passed", metrics={"cosine": 1.0})
    gate = GateSpec(variant="v", target="ort:cpu", metric="task_metric", min=0.5)
    result = evaluate_gates([gate], [row], [], "v", [], {})[0]
    assert result.passed is False
    assert result.reason == "task_metric needs validate.metric in the recipe ('file.py:function')"


def test_metric_references_are_checked_without_running_them(tmp_path: Path) -> None:
    (tmp_path / "metrics.py").write_text(METRICS + "\nraise SystemExit('user code must not run at check time')\n")
    onnx.save(chain_model(), str(tmp_path / "model.onnx"))
    recipe = load_recipe_file(write_recipe(tmp_path, "name: t\nmodel: {onnx: model.onnx}\nvariants: {v: []}\n"))
    check_metric("metrics.py:accuracy", recipe.resolve)
    with pytest.raises(RecipeError, match=r"defines no function 'acc'; it defines \['accuracy', 'broken'\]"):
        check_metric("metrics.py:acc", recipe.resolve)
    with pytest.raises(RecipeError, match=r"'nothere\.py' does not exist"):
        check_metric("nothere.py:f", recipe.resolve)
    with pytest.raises(ValidationError, match=r"metric must be 'file\.py:function'"):
        ValidateConfig(metric="metrics.py")


def test_labels_follow_the_reader_order_and_limit(tmp_path: Path) -> None:
    folder = tmp_path / "val"
    folder.mkdir()
    for index in (3, 1, 2):
        np.savez(folder / f"s{index}.npz", x=np.zeros((1, 6), np.float32), labels=np.array([index]))
    onnx.save(chain_model(), str(tmp_path / "model.onnx"))
    recipe = load_recipe_file(write_recipe(tmp_path, """
        name: t
        model: {onnx: model.onnx}
        data: {val: {reader: npy, path: val}, noise: {reader: random}}
        variants: {v: []}
        """))
    labels = read_labels(recipe.data, recipe.resolve, "val", ["x"], limit=2)
    assert [int(label[0]) for label in labels] == [1, 2]
    assert read_labels(recipe.data, recipe.resolve, "noise", ["x"], limit=None) is None
    np.savez(folder / "s4.npz", x=np.zeros((1, 6), np.float32))
    with pytest.raises(DataError, match=r"1 do not, e\.g\. s4\.npz"):
        read_labels(recipe.data, recipe.resolve, "val", ["x"], limit=None)


def test_stack_and_evaluate() -> None:
    assert stack([np.zeros((1, 3)), np.ones((2, 3))]).shape == (3, 3)
    ragged = stack([np.zeros((1, 3)), np.zeros((1, 4))])
    assert isinstance(ragged, list) and len(ragged) == 2
    assert stack([np.array(1), np.array(2)]).tolist() == [1, 2]
    outputs = [{"y": np.array([[1.0]])}, {"y": np.array([[3.0]])}]
    assert evaluate(lambda o, labels: o["y"].mean(), "m.py:f", outputs, None) == (2.0, "")
    value, why = evaluate(lambda o, labels: float("nan"), "m.py:f", outputs, None)
    assert value is None and why == "validate.metric 'm.py:f' returned nan, not a finite number"


def test_a_metric_file_too_deep_for_pythons_parser_is_a_recipe_error(tmp_path: Path) -> None:
    """A 200,000-term expression made `check` die of a RecursionError ("internal error")."""
    from qdeploy.stages.validate._task import check_metric

    (tmp_path / "metrics.py").write_text("def accuracy(outputs, labels):\n    return " + "+".join(["1"] * 200_000))
    with pytest.raises(RecipeError, match="nested too deeply"):
        check_metric("metrics.py:accuracy", lambda name: tmp_path / name)


def test_a_label_whose_header_claims_a_trillion_elements_is_a_data_error(tmp_path: Path) -> None:
    """Labels go through the one checked loader (qdeploy.core.arrayfiles), as samples do."""
    import zipfile

    (tmp_path / "val").mkdir()
    header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1000000, 1000000), }"
    header += " " * (117 - len(header)) + "\n"
    with zipfile.ZipFile(tmp_path / "val" / "a.npz", "w") as archive:
        with archive.open("x.npy", "w") as member:
            np.lib.format.write_array(member, np.zeros((1, 6), np.float32))
        archive.writestr("label.npy", b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode())
    datasets = {"val": SimpleNamespace(reader="npy", path="val", samples=None)}
    with pytest.raises(DataError, match=r"a\.npz: 'label\.npy' claims shape \[1000000, 1000000\] int64"):
        read_labels(datasets, lambda path: tmp_path / path, "val", ["x"], None)
