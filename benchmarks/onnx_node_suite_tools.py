"""The tools of ``benchmarks/onnx_node_suite.py`` and the verdict on what each hands back (run in its workers)."""

from __future__ import annotations

import hashlib
import shutil
import traceback
from pathlib import Path
from typing import Any

FP16_RTOL = FP16_ATOL = 1e-2


def is_float_case(case: dict[str, Any]) -> bool:
    """Every graph input and output is a float32 tensor (the cases a float16 conversion is about)."""
    import onnx

    model = onnx.load_from_string(case["model"])
    initializers = {init.name for init in model.graph.initializer}
    values = [value for value in model.graph.input if value.name not in initializers] + list(model.graph.output)
    return bool(values) and all(value.type.HasField("tensor_type") and value.type.tensor_type.elem_type == 1
                                for value in values)


def baseline(case: dict[str, Any]) -> str:
    """'' when ONNX Runtime reproduces the case's expected outputs; otherwise why not."""
    try:
        session = _session(case["model"])
    except Exception as exc:
        return f"ONNX Runtime cannot load the case: {_short(exc)}"
    return _verdict(session, case, case["rtol"], case["atol"])[1]


def run_tool(tool: str, case: dict[str, Any], work: Path) -> tuple[str, str]:
    """(outcome, detail) of one tool on one case."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        produced, refused = _RUNNERS[tool](case, work)
    except _Crash as crash:
        return "crash", crash.detail
    if produced is None:
        return "refused", refused
    fp16 = tool in ("qdeploy-fp16", "onnxconverter-common")
    try:
        session = _session(produced)
    except Exception as exc:
        return "unloadable", _short(exc)
    rtol, atol = (FP16_RTOL, FP16_ATOL) if fp16 else (case["rtol"], case["atol"])
    outcome, detail = _verdict(session, case, rtol, atol)
    return outcome, detail or (refused if outcome == "correct" else detail)


class _Crash(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _qdeploy(stage: str, case: dict[str, Any], work: Path) -> tuple[bytes | None, str]:
    """The stage's artifact as the runner would store it (after the publishing guard), or the named error."""
    import importlib

    from qdeploy.core.context import Artifact
    from qdeploy.core.errors import QdeployError
    from qdeploy.pipeline.recipe.schema import Recipe
    from qdeploy.pipeline.run.guard import guard_artifact

    path = work / "model.onnx"
    path.write_bytes(case["model"])
    data = _write_data(case, work / "data")
    recipe = Recipe(name="node-suite", model={"onnx": str(path)}, variants={"v": []},
                    data={"case": {"reader": "npy", "path": str(work / "data")}} if data else {},
                    validate={"data": "case"} if data else {})
    module = importlib.import_module(f"stages.{stage}")
    config_class = getattr(module, "SimplifyConfig" if stage == "simplify" else "Fp16Config")
    config = config_class() if stage == "simplify" or not data else config_class(calibration={"data": "case"})
    artifact = Artifact(path=path, sidecar=work / "model.json", key="case", size_bytes=path.stat().st_size,
                        sha256=hashlib.sha256(case["model"]).hexdigest(), stages=("export",), parent=None)
    ctx = recipe.stage_context("v", work / "scratch")
    ctx.work_dir.mkdir()  # as the runner does
    try:
        result = module.run(artifact, config, ctx)
        guard = guard_artifact(artifact, result, stage, ctx)
    except QdeployError as exc:
        return None, _short(exc)
    except Exception as exc:
        raise _Crash(f"{type(exc).__name__}: {_short(exc)} @ {_where(exc)}") from exc
    note = "" if guard.get("checked", True) else f"unchecked: {guard.get('unchecked')}"
    return result.model.SerializeToString(), note


def _write_data(case: dict[str, Any], folder: Path) -> bool:
    """The case's inputs as .npz samples keyed by input name, when they are all plain tensors."""
    import numpy as np
    import onnx

    model = onnx.load_from_string(case["model"])
    initializers = {init.name for init in model.graph.initializer}
    names = [value.name for value in model.graph.input if value.name not in initializers]
    samples = [inputs for inputs, _ in case["data"]]
    plain = all(len(inputs) == len(names) and all(isinstance(v, np.ndarray) and v.dtype.kind in "biuf"
                                                  for v in inputs) for inputs in samples)
    # A recipe's dataset refuses NaN/Inf (qdeploy's readers say so): such cases run on seeded random data.
    if not samples or not plain or not all(np.isfinite(v).all() for inputs in samples for v in inputs):
        return False
    folder.mkdir(parents=True)
    for index, inputs in enumerate(samples):
        np.savez(folder / f"sample{index}.npz", **dict(zip(names, inputs, strict=True)))
    return True


def _onnxsim(case: dict[str, Any], work: Path) -> tuple[bytes | None, str]:
    import onnx
    import onnxsim

    try:
        model, ok = onnxsim.simplify(onnx.load_from_string(case["model"]))
    except Exception as exc:  # a peer's exception is its named refusal
        return None, f"{type(exc).__name__}: {_short(exc)}"
    if not ok:
        return None, "onnxsim's check failed"
    return model.SerializeToString(), ""


def _onnxconverter(case: dict[str, Any], work: Path) -> tuple[bytes | None, str]:
    import onnx
    from onnxconverter_common import float16

    try:
        model = float16.convert_float_to_float16(onnx.load_from_string(case["model"]), keep_io_types=True)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {_short(exc)}"
    return model.SerializeToString(), ""


_RUNNERS = {
    "qdeploy-simplify": lambda case, work: _qdeploy("simplify", case, work),
    "onnxsim": _onnxsim,
    "qdeploy-fp16": lambda case, work: _qdeploy("fp16", case, work),
    "onnxconverter-common": _onnxconverter,
}


def _session(model: bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _verdict(session: Any, case: dict[str, Any], rtol: float, atol: float) -> tuple[str, str]:
    """('correct'|'wrong'|'broken', why) of a session on the case's data sets."""
    inputs = [value.name for value in session.get_inputs()]
    outputs = [value.name for value in session.get_outputs()]
    for index, (feeds, expected) in enumerate(case["data"]):
        try:
            feed = {name: value for name, value in zip(inputs, feeds, strict=False) if value is not None}
            actual = session.run(outputs, feed)
        except Exception as exc:
            return "broken", f"data set {index}: {_short(exc)}"
        for name, want, got in zip(outputs, expected, actual, strict=False):
            problem = _differs(want, got, rtol, atol)
            if problem:
                return "wrong", f"data set {index}, output {name}: {problem}"
    return "correct", ""


def _differs(expected: Any, actual: Any, rtol: float, atol: float) -> str:
    import numpy as np

    if isinstance(expected, list) or isinstance(actual, list):
        if not isinstance(expected, list) or not isinstance(actual, list) or len(expected) != len(actual):
            return "sequence of another kind or length"
        return next((why for e, a in zip(expected, actual, strict=True) if (why := _differs(e, a, rtol, atol))), "")
    if expected is None or actual is None:
        return "" if expected is None and actual is None else "optional present on one side only"
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape:
        return f"shape {list(actual.shape)} where {list(expected.shape)} is expected"
    if expected.dtype == object or actual.dtype == object:
        return "" if np.array_equal(expected.astype(str), actual.astype(str)) else "values differ"
    if expected.dtype.kind not in "fc":
        return "" if np.array_equal(expected, actual) else "values differ"
    with np.errstate(all="ignore"):
        ref, got = expected.astype(np.float64), actual.astype(np.float64)
        close = np.isclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
    if close.all():
        return ""
    worst = float(np.nanmax(np.abs(np.where(close, 0.0, got - ref)))) if close.size else 0.0
    return f"{int((~close).sum())} of {close.size} values beyond rtol {rtol}, atol {atol} (max error {worst:.3g})"


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [frame for frame in frames if "/site-packages/" not in frame.filename]
    frame = (ours or frames)[-1]
    return f"{Path(frame.filename).name}:{frame.lineno}"


def _short(exc: BaseException | str, limit: int = 240) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
