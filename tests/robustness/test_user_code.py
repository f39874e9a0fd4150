"""The recipe's own Python misbehaving: a task metric that never returns, or that calls ``sys.exit(3)``.

The old code called the metric with no time limit (``qdeploy run`` hung for ever, ``budget.max_seconds``
notwithstanding: it is checked between evaluations) and let ``SystemExit`` through (qdeploy ended with the
metric's status 3, no message, no report, its lock and an empty ``.published/`` left in --out).  Each case runs
the CLI in a fresh interpreter, as a user would, so a stuck thread would keep the process from exiting.
"""

from __future__ import annotations

import fcntl
import json
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.models import tiny_cnn, write_recipe
from tests.robustness.helpers import run_cli

METRICS = '''
import sys
import time

import numpy as np


def accuracy(outputs, labels):
    return float((np.asarray(outputs["logits"]).argmax(-1) == np.asarray(labels).reshape(-1)).mean())


def hang(outputs, labels):
    while True:
        time.sleep(0.05)


def leave(outputs, labels):
    sys.exit(3)


def interrupt(outputs, labels):
    raise KeyboardInterrupt
'''

RECIPE = """
name: user-code
model: {onnx: model.onnx}
data:
  labelled: {reader: npy, path: labelled}
variants:
  fp32: []
  int8:
    - quantize:
        calibration: {data: labelled, samples: 4}
        tolerance: {metric: "metrics.py:METRIC", max_drop: 0.05, metric_timeout_seconds: 1}
        budget: {data: labelled, samples: 4, max_seconds: 5}
targets: [ort:cpu]
validate: {data: labelled, samples: 2}
benchmark: {enabled: false}
report: {formats: [json]}
"""

LIMIT = 120
"""Seconds a case may take, starting Python included; the hanging metric used to never return."""


def _recipe(folder: Path, metric: str, body: str = RECIPE) -> Path:
    import onnx

    onnx.save(tiny_cnn(), folder / "model.onnx")
    (folder / "metrics.py").write_text(METRICS)
    data = folder / "labelled"
    data.mkdir()
    rng = np.random.default_rng(0)
    for index in range(4):
        np.savez(data / f"{index}.npz", input=rng.standard_normal((1, 3, 16, 16)).astype(np.float32),
                 label=np.array([index % 10]))
    return write_recipe(folder, body.replace("METRIC", metric))


def _run(recipe: Path) -> tuple[object, float, Path]:
    out = recipe.parent / "out"
    started = time.monotonic()
    result = run_cli("run", str(recipe), "-q", "--out", str(out), timeout=LIMIT)
    return result, time.monotonic() - started, out


def _lock_released(out: Path) -> bool:
    with (out / ".qdeploy.lock").open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(handle, fcntl.LOCK_UN)
        return True


def _failure(out: Path) -> dict:
    report = json.loads((out / "report.json").read_text())
    return next(failure for failure in report["failures"] if failure["variant"] == "int8")


def test_a_task_metric_that_never_returns_fails_its_stage_within_the_deadline(tmp_path: Path) -> None:
    result, seconds, out = _run(_recipe(tmp_path, "hang"))
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    assert seconds < 60, seconds  # one 1 s deadline, not a hang
    reason = _failure(out)["reason"]
    assert "task metric metrics.py:hang did not return within 1 s" in reason
    assert _lock_released(out) and (out / "artifacts" / "fp32.onnx").exists()


@pytest.mark.parametrize(("metric", "said"), [("leave", "called sys.exit(3) instead of returning"),
                                               ("interrupt", "raised KeyboardInterrupt")])
def test_a_task_metric_that_exits_is_the_user_code_failing_and_the_run_reports_it(tmp_path: Path, metric: str,
                                                                                said: str) -> None:
    result, _, out = _run(_recipe(tmp_path, metric))
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])  # not the metric's 3
    assert "Traceback" not in result.stderr
    reason = _failure(out)["reason"]
    assert f"task metric metrics.py:{metric} {said}" in reason
    assert said in result.stderr
    assert _lock_released(out) and list((out / ".published").iterdir())


def test_a_validate_metric_that_exits_is_reported_on_its_rows(tmp_path: Path) -> None:
    body = RECIPE.replace("validate: {data: labelled, samples: 2}",
                          'validate: {data: labelled, samples: 2, metric: "metrics.py:leave"}')
    body = body.replace('"metrics.py:METRIC"', '"metrics.py:accuracy"')
    result, _, out = _run(_recipe(tmp_path, "accuracy", body))
    assert result.returncode != 3 and "Traceback" not in result.stderr, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    warnings = [warning for row in report["validation"] for warning in row.get("warnings", [])]
    assert any("task metric metrics.py:leave called sys.exit(3)" in warning for warning in warnings), warnings
    assert _lock_released(out)
