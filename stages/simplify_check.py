"""The simplify stage's equivalence check: original and simplified model on the same seeded random inputs.

Inputs are shaped and typed from the model: a symbolic dimension gets 1 on
axis 0 (the batch) and a moderate size elsewhere (retried with 1 when the
original model refuses it); an integer input that indexes a table (token ids
into an embedding's Gather) gets values within the table, others 0..99 unless
the recipe's ``model.inputs`` gives ``low``/``high``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.context import StageContext
from pipeline.errors import StageError

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from stages.simplify import SimplifyConfig

log = logging.getLogger(__name__)

STAGE = "simplify"

@dataclass(frozen=True)
class Comparison:
    """Outcome of comparing a model's outputs with a reference's."""

    passed: bool
    max_abs_err: float
    reason: str = ""


def compare_outputs(expected: dict[str, Any], actual: dict[str, Any], *, atol: float, rtol: float) -> Comparison:
    """Every output within atol + rtol * |expected| (floats) or equal (others); the largest absolute error."""
    worst = 0.0
    for name, reference in expected.items():
        if name not in actual:
            return Comparison(False, math.inf, f"output '{name}' is missing; outputs are {sorted(actual)}")
        error, problem = _output_error(reference, actual[name], atol, rtol)
        worst = max(worst, error)
        if problem:
            return Comparison(False, worst, f"output '{name}': {problem}")
    return Comparison(True, worst)


def _output_error(expected: Any, actual: Any, atol: float, rtol: float) -> tuple[float, str]:
    """(max abs error, reason it fails or '') of one output."""
    import numpy as np

    if isinstance(expected, list) or isinstance(actual, list):
        if not (isinstance(expected, list) and isinstance(actual, list)) or len(expected) != len(actual):
            return math.inf, "sequence outputs differ in kind or length"
        results = [_output_error(e, a, atol, rtol) for e, a in zip(expected, actual, strict=True)]
        return max((err for err, _ in results), default=0.0), next((why for _, why in results if why), "")
    expected, actual = np.asarray(expected), np.asarray(actual)
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        return math.inf, (f"{actual.dtype}{list(actual.shape)} where the original gives "
                          f"{expected.dtype}{list(expected.shape)}")
    if expected.dtype.kind not in "fbiu":
        return (0.0, "") if np.array_equal(expected, actual) else (math.inf, "values differ")
    ref, got = expected.astype(np.float64), actual.astype(np.float64)
    finite = np.isfinite(ref) & np.isfinite(got)
    diff = np.abs(ref[finite] - got[finite])
    error = float(diff.max()) if diff.size else 0.0
    if not np.array_equal(ref[~finite], got[~finite], equal_nan=True):
        return math.inf, "NaN/Inf values differ"
    if expected.dtype.kind != "f":
        return (error, f"max abs error {error:.3g} where exact equality is required") if error else (0.0, "")
    if bool((diff > atol + rtol * np.abs(ref[finite])).any()):
        return error, f"max abs error {error:.3g} beyond atol {atol}, rtol {rtol}"
    return error, ""


SYMBOLIC_SIZES = (32, 1)
"""Sizes tried, in order, for a symbolic dimension other than the batch (axis 0, which gets 1)."""
SESSION_LEVEL = "ORT_ENABLE_ALL"
"""Both models run as ONNX Runtime runs them in deployment (several times faster than unoptimized on CPU
convolutions); its rewrites change float results by rounding only, far below the check's tolerance."""
QDQ_SESSION_LEVEL = "ORT_ENABLE_BASIC"
"""For models with QuantizeLinear/DequantizeLinear: ORT fuses QDQ into int8 kernels only at higher levels, and a
fusion taken in one model but not the other would differ by a quantization step, not by a bug of ours."""


def check_equivalence(original: Path, model: onnx.ModelProto, config: SimplifyConfig,
                      ctx: StageContext) -> dict[str, Any]:
    """Run original and simplified models on seeded random feeds; StageError when they disagree."""
    level = QDQ_SESSION_LEVEL if any(node.op_type in ("QuantizeLinear", "DequantizeLinear")
                                     for node in model.graph.node) else SESSION_LEVEL
    try:
        reference = _session(str(original), level)
    except Exception as exc:  # custom ops or a runtime too old: nothing to compare against
        return {"skipped": f"the original model does not run in ONNX Runtime (custom ops?): {_short(exc)}"}
    feeds, failure = _feeds_the_original_accepts(reference, original, model, config, ctx)
    if feeds is None:
        return {"skipped": f"the original model fails on random inputs: {failure}"}
    try:
        candidate = _session(model.SerializeToString(), level)
    except Exception as exc:
        raise StageError(STAGE, ctx.variant, f"the simplified model does not load in ONNX Runtime "
                         f"while the original does: {_short(exc)}") from exc
    worst = 0.0
    for index, (sample, expected) in enumerate(feeds):
        try:
            actual = _outputs(candidate, sample)
        except Exception as exc:
            raise StageError(STAGE, ctx.variant, f"the simplified model fails on random sample {index} "
                             f"where the original runs: {_short(exc)}") from exc
        comparison = compare_outputs(expected, actual, atol=config.check_atol, rtol=config.check_rtol)
        if not comparison.passed:
            raise StageError(STAGE, ctx.variant, f"simplified model disagrees with the original on random sample "
                             f"{index}: {comparison.reason}")
        worst = max(worst, comparison.max_abs_err)
    shapes = {name: list(array.shape) for name, array in feeds[0][0].items()}
    return {"samples": len(feeds), "max_abs_err": worst, "atol": config.check_atol, "rtol": config.check_rtol,
            "input_shapes": shapes}


Feeds = list[tuple[dict[str, Any], dict[str, Any]]]


def _feeds_the_original_accepts(reference: Any, original: Path, model: onnx.ModelProto, config: SimplifyConfig,
                                ctx: StageContext) -> tuple[Feeds | None, str]:
    """``check_n`` (feeds, original's outputs); the next symbolic size is tried when the original refuses one."""
    from calibration.readers import model_inputs, random_samples

    infos = model_inputs(original)
    ranges = {**integer_ranges(model), **_input_ranges(ctx)}
    failure = ""
    sizes = SYMBOLIC_SIZES if any(None in info.shape[1:] for info in infos) else SYMBOLIC_SIZES[:1]
    for size in sizes:
        concrete = [_concrete(info, size) for info in infos]
        feeds: Feeds = []
        try:
            for sample in random_samples(concrete, config.check_n, seed=0, ranges=ranges):
                feeds.append((sample, _outputs(reference, sample)))
            return feeds, ""
        except Exception as exc:  # random feeds may be invalid for this model at this size
            failure = _short(exc)
    return None, failure


def _concrete(info: Any, size: int) -> Any:
    """The input with its symbolic dimensions set: 1 on axis 0, ``size`` elsewhere."""
    from calibration.readers import InputInfo

    shape = tuple((1 if axis == 0 else size) if dim is None else dim for axis, dim in enumerate(info.shape))
    return InputInfo(info.name, shape, info.dtype)


PASS_THROUGH = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand"})
"""Ops that carry an integer input's values unchanged to the Gather that uses them as indices."""


def integer_ranges(model: onnx.ModelProto) -> dict[str, tuple[float | None, float | None]]:
    """[0, rows) for integer inputs used as Gather indices into a constant table (token ids into an embedding)."""
    graph = model.graph
    tables = {init.name: list(init.dims) for init in graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    ranges: dict[str, tuple[float | None, float | None]] = {}
    for value in graph.input:
        if value.type.tensor_type.elem_type not in (6, 7) or value.name in tables:  # int32, int64
            continue
        limit = _index_limit(value.name, consumers, tables)
        if limit:
            ranges[value.name] = (0, limit)
    return ranges


def _index_limit(name: str, consumers: dict[str, list[onnx.NodeProto]], tables: dict[str, list[int]]) -> int | None:
    """Rows of the smallest constant table that ``name`` (through value-preserving ops) indexes with Gather."""
    limits = []
    frontier, seen = [name], set()
    while frontier:
        current = frontier.pop()
        seen.add(current)
        for node in consumers.get(current, []):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == current \
                    and node.input[0] in tables:
                axis = next((attr.i for attr in node.attribute if attr.name == "axis"), 0)
                dims = tables[node.input[0]]
                if dims:
                    limits.append(dims[axis])
            elif node.op_type in PASS_THROUGH and node.input[0] == current:
                frontier.extend(out for out in node.output if out not in seen)
    return min(limits) if limits else None


def _session(model: str | bytes, level: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _outputs(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    names = [out.name for out in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _input_ranges(ctx: StageContext) -> dict[str, tuple[float | None, float | None]]:
    specs = getattr(getattr(ctx.recipe, "model", None), "inputs", None) or []
    return {spec.name: (spec.low, spec.high) for spec in specs if spec.low is not None or spec.high is not None}


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
