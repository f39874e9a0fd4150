"""The simplify stage's equivalence check: original and simplified model on the same seeded random inputs.

The inputs are the recipe's validation data when it has some; otherwise they
are shaped and typed from the model: a symbolic dimension gets 1 on axis 0 (the
batch) and a moderate size elsewhere (retried with 1 when the original model
refuses it); integer inputs get values safe for the op that uses them
(``qdeploy.stages.simplify._check_inputs``) unless the recipe's ``model.inputs`` gives
``low``/``high``.  The check runs under a memory bound.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.calibration.readers import InputInfo, model_inputs, random_samples
from qdeploy.core.context import StageContext
from qdeploy.core.errors import StageError
from qdeploy.core.values import one_line
from qdeploy.stages.simplify._check_inputs import (
    bounded_memory,
    compared_values,
    is_memory_error,
    recipe_samples,
    safe_integer_ranges,
    unfeedable_inputs,
    with_compared_values,
)
from qdeploy.stages.simplify._noise import NOISE_LEVEL, noise_bounds, noise_floor, ort_outputs, ort_session
from qdeploy.stages.simplify.findings import EquivalenceCheck, NoiseFloorSkipped, NoiseFloorUsed, Unchecked
from qdeploy.targets.onnxruntime import SessionInterface

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.stages.simplify.config import SimplifyConfig

log = logging.getLogger(__name__)

STAGE = "simplify"

@dataclass(frozen=True)
class SimplifyCheck:
    """Outcome of comparing a model's outputs with a reference's."""

    passed: bool
    max_abs_err: float
    reason: str = ""
    output: str = ""
    """The output that failed."""


def compare_simplified(expected: dict[str, np.ndarray], actual: dict[str, np.ndarray], *, atol: float, rtol: float,
                       atols: dict[str, float] | None = None) -> SimplifyCheck:
    """Every output within atol + rtol * |expected| (floats) or equal (others); the largest absolute error.

    ``atols``: output name -> the absolute part for that output, where it differs from ``atol``."""
    worst = 0.0
    for name, reference in expected.items():
        if name not in actual:
            return SimplifyCheck(False, math.inf, f"output '{name}' is missing; outputs are {sorted(actual)}", name)
        error, problem = _output_error(reference, actual[name], (atols or {}).get(name, atol), rtol)
        worst = max(worst, error)
        if problem:
            return SimplifyCheck(False, worst, f"output '{name}': {problem}", name)
    return SimplifyCheck(True, worst)


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
        return error, f"max abs error {error:.3g} beyond atol {atol:.3g}, rtol {rtol}"
    return error, ""


SYMBOLIC_SIZES = (32, 1, 256)
"""Sizes tried, in order, for a symbolic dimension other than the batch (axis 0, which gets 1)."""
SESSION_LEVEL = "ORT_ENABLE_ALL"
"""Both models run as ONNX Runtime runs them in deployment (several times faster than unoptimized on CPU
convolutions); its rewrites change float results by rounding only, which a long recurrence can carry far
(``qdeploy.stages.simplify._noise`` measures how far when the configured tolerance is missed)."""
QDQ_SESSION_LEVEL = "ORT_ENABLE_BASIC"
"""For models with QuantizeLinear/DequantizeLinear: ORT fuses QDQ into int8 kernels only at higher levels, and a
fusion taken in one model but not the other would differ by a quantization step, not by a bug of ours."""


def check_equivalence(original: Path, model: onnx.ModelProto, config: SimplifyConfig,
                      ctx: StageContext, *, saved: Path | None = None) -> EquivalenceCheck | Unchecked:
    """Run original and simplified models on the same inputs; StageError when they disagree.

    The simplified model must load in ONNX Runtime with the original's input and output types whenever the
    original loads.  When the outputs cannot be compared (inputs a check cannot build, an original that fails
    on them, the memory bound), the findings say "unchecked" and why: that is never a pass.
    ``saved``: where the simplified model is saved with external data (a model above 2 GB loads from there).
    """
    level = QDQ_SESSION_LEVEL if any(node.op_type in ("QuantizeLinear", "DequantizeLinear")
                                     for node in model.graph.node) else SESSION_LEVEL
    try:
        reference = _session(str(original), level)
    except Exception as exc:  # custom ops or a runtime too old: nothing to compare against
        return Unchecked(unchecked=f"the original model does not load in ONNX Runtime (custom ops?): {one_line(exc)}")
    unfeedable = unfeedable_inputs(model)
    with bounded_memory():
        feeds, failure = (None, "") if unfeedable else _feeds_the_original_accepts(reference, original, model,
                                                                                   config, ctx)
        # one session holds the weights at a time: the original's outputs are computed before the candidate loads
        reference = SessionInterface(reference)
        candidate = _candidate(str(saved) if saved is not None else model.SerializeToString(), level, ctx)
        same_interface(reference, candidate, STAGE, ctx.variant)
        if unfeedable:
            return Unchecked(unchecked=f"check inputs cannot be built for {', '.join(unfeedable)}; the simplified "
                                       "model loads in ONNX Runtime with the original's input and output types")
        if feeds is None:
            return Unchecked(unchecked=f"the original model fails on the check inputs: {failure}; the simplified "
                                       "model loads in ONNX Runtime with the original's input and output types")
        try:
            actual = _candidate_outputs(candidate, feeds, ctx)
            del candidate  # the noise floor loads the original again: one session holds the weights at a time
            worst, floor = _judge(original, level, feeds, actual, config, ctx)
        except _MemoryBound as exc:
            return Unchecked(unchecked=f"the check went past its memory bound: {exc}; the simplified model loads "
                                       "in ONNX Runtime with the original's input and output types")
    shapes = {name: list(array.shape) for name, array in feeds[0][0].items()}
    return EquivalenceCheck(samples=len(feeds), atol=config.check_atol, rtol=config.check_rtol, max_abs_err=worst,
                            noise_floor=floor, input_shapes=shapes, inputs=feeds.source)


def _candidate(model: str | bytes, level: str, ctx: StageContext) -> Any:
    try:
        return _session(model, level)
    except Exception as exc:
        raise StageError(STAGE, ctx.variant, f"the simplified model does not load in ONNX Runtime "
                         f"while the original does: {one_line(exc)}") from exc


def same_interface(reference: Any, candidate: Any, stage: str, variant: str) -> None:
    """StageError unless both sessions have the same input and output names and types."""
    for kind in ("inputs", "outputs"):
        want = [(value.name, value.type) for value in getattr(reference, f"get_{kind}")()]
        got = [(value.name, value.type) for value in getattr(candidate, f"get_{kind}")()]
        if want != got:
            raise StageError(stage, variant, f"the new model's {kind} {got} differ from the original's {want}")


def _candidate_outputs(candidate: Any, feeds: Feeds, ctx: StageContext) -> list[dict[str, np.ndarray]]:
    """The simplified model's outputs on every check sample."""
    actual = []
    for index, (sample, _) in enumerate(feeds):
        try:
            actual.append(_outputs(candidate, sample))
        except Exception as exc:
            if _is_memory(exc):
                raise _MemoryBound(one_line(exc)) from exc
            raise StageError(STAGE, ctx.variant, f"the simplified model fails on check sample {index} "
                             f"where the original runs: {one_line(exc)}") from exc
    return actual


Disagreement = tuple[int, SimplifyCheck]
"""The first check sample whose outputs disagree, and how."""


def _judge(original: Path, level: str, feeds: Feeds, actual: list[dict[str, np.ndarray]], config: SimplifyConfig,
           ctx: StageContext) -> tuple[float, NoiseFloorUsed | NoiseFloorSkipped]:
    """The worst error and the noise floor of a comparison that passes: at the configured tolerance, else within
    the original's own noise floor (``qdeploy.stages.simplify._noise``); StageError naming the config fields
    otherwise."""
    worst, failed = _compare_samples(feeds, actual, config, None, ctx)
    if failed is None:
        return worst, NoiseFloorSkipped(measured=False, why="every output within check_atol and check_rtol")
    floor, why = _measured_floor(original, feeds, config)
    bounds = noise_bounds(floor, config.check_atol, config.check_noise_factor)
    if floor:
        worst, failed = _compare_samples(feeds, actual, config, bounds, ctx)
    if failed is not None:
        raise StageError(STAGE, ctx.variant, _disagreement(failed, feeds.source, floor, bounds, level, config, why))
    return worst, NoiseFloorUsed(measured=True, levels=f"{NOISE_LEVEL} vs {level}", per_output=floor,
                                 factor=config.check_noise_factor, atol_used=bounds)


def _compare_samples(feeds: Feeds, actual: list[dict[str, np.ndarray]], config: SimplifyConfig,
                     atols: dict[str, float] | None, ctx: StageContext) -> tuple[float, Disagreement | None]:
    """(largest error, the first disagreement or None) over the check samples."""
    worst = 0.0
    for index, ((_, expected), got) in enumerate(zip(feeds, actual, strict=True)):
        try:
            comparison = compare_simplified(expected, got, atol=config.check_atol, rtol=config.check_rtol,
                                            atols=atols)
        except Exception as exc:
            if _is_memory(exc):
                raise _MemoryBound(one_line(exc)) from exc
            raise StageError(STAGE, ctx.variant, f"the check cannot compare the outputs of check sample {index}: "
                             f"{one_line(exc)}") from exc
        worst = max(worst, comparison.max_abs_err)
        if not comparison.passed:
            return worst, (index, comparison)
    return worst, None


def _measured_floor(original: Path, feeds: Feeds, config: SimplifyConfig) -> tuple[dict[str, float], str]:
    """The original's noise floor per output, or {} and why it was not measured."""
    if config.check_noise_factor == 0:
        return {}, "simplify.check_noise_factor is 0, so the original's noise floor was not measured"
    try:
        return noise_floor(original, feeds), ""
    except Exception as exc:  # the configured tolerance then stands alone
        return {}, f"the original's noise floor could not be measured: {one_line(exc)}"


def _disagreement(failed: Disagreement, source: str, floor: dict[str, float], bounds: dict[str, float], level: str,
                  config: SimplifyConfig, why: str) -> str:
    """The failure message: the sample and output, the bound used and where it comes from, the fields to change."""
    index, comparison = failed
    text = f"simplified model disagrees with the original on check sample {index} ({source}): {comparison.reason}"
    name = comparison.output
    if name in floor:
        text += (f"; the original's own noise floor on '{name}' is {floor[name]:.3g} (its outputs under ONNX Runtime "
                 f"at {NOISE_LEVEL} against {level}), so the bound there was max(simplify.check_atol "
                 f"{config.check_atol:g}, simplify.check_noise_factor {config.check_noise_factor:g} x noise floor) "
                 f"= {bounds[name]:.3g}")
    elif why:
        text += f"; {why}"
    return text + "; raise simplify.check_atol (or check_rtol) if a difference this large is acceptable"


class _MemoryBound(Exception):
    """The check needed more memory than ``qdeploy.stages.simplify._check_inputs.bounded_memory`` allows."""


class Feeds(list):  # type: ignore[type-arg]
    """(feeds, original's outputs) pairs, and where the inputs came from."""

    source: str = "seeded random"


def _feeds_the_original_accepts(reference: Any, original: Path, model: onnx.ModelProto, config: SimplifyConfig,
                                ctx: StageContext) -> tuple[Feeds | None, str]:
    """``check_n`` (feeds, original's outputs): the recipe's validation data when it has some, else seeded random
    inputs (the next symbolic size is tried when the original refuses one)."""
    failure = ""
    real = recipe_samples(ctx, original, config.check_n)
    if real:
        try:
            return _with_outputs(reference, real, "the recipe's validation data"), ""
        except Exception as exc:  # fall back to random inputs
            failure = f"on the recipe's validation data: {one_line(exc)}; "
    infos = model_inputs(original)
    ranges = {**safe_integer_ranges(model), **_input_ranges(ctx)}
    choices = {name: values for name, values in compared_values(model).items() if name not in _input_ranges(ctx)}
    sizes = SYMBOLIC_SIZES if any(None in info.shape[1:] for info in infos) else SYMBOLIC_SIZES[:1]
    for size in sizes:
        concrete = [_concrete(info, size) for info in infos]
        try:
            samples = with_compared_values(random_samples(concrete, config.check_n, seed=0, ranges=ranges), choices)
            return _with_outputs(reference, samples, "seeded random"), ""
        except Exception as exc:  # random feeds may be invalid for this model at this size
            failure += one_line(exc)
            if _is_memory(exc):
                return None, f"the check went past its memory bound: {failure}"
    return None, failure


def _with_outputs(reference: Any, samples: Any, source: str) -> Feeds:
    feeds = Feeds()
    feeds.source = source
    for sample in samples:
        feeds.append((sample, _outputs(reference, sample)))
    return feeds


def _is_memory(exc: BaseException) -> bool:
    return is_memory_error(exc)


def _concrete(info: Any, size: int) -> Any:
    """The input with its symbolic dimensions set: 1 on axis 0, ``size`` elsewhere."""
    shape = tuple((1 if axis == 0 else size) if dim is None else dim for axis, dim in enumerate(info.shape))
    return InputInfo(info.name, shape, info.dtype)


def _session(model: str | bytes, level: str) -> Any:
    return ort_session(model, level)


def _outputs(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return ort_outputs(session, feeds)


def _input_ranges(ctx: StageContext) -> dict[str, tuple[float | None, float | None]]:
    return {name: (low, high) for name, (low, high) in ctx.input_ranges.items() if low is not None or high is not None}

