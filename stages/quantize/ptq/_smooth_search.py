"""``smooth_quant: auto``: SmoothQuant's migration strength alpha chosen by measuring, not guessed.

The paper (Xiao et al. 2023) uses one alpha per model, 0.5 for most and up to 0.75-0.85 where activation
outliers are extreme; Intel Neural Compressor's auto-alpha searches 0..1 in steps of 0.1 (per layer, on the
loss of each block) and ONNX Runtime's ``SmoothQuantAlpha`` takes one fixed value.  qdeploy searches one alpha
for the whole model over ``GRID`` (0.3..0.8 in steps of 0.1): below 0.3 the outliers mostly stay in the
activation, above 0.8 they move wholesale into the weights, whose per-channel int8 grid then loses the small
channels instead; the paper's useful range for encoders and LLMs lies inside.  Each candidate, and no smoothing
at all, is quantized as the recipe asks and compared with float32 on the samples the budget searches on (or
the first calibration samples without a budget) by the tolerance's own error ratio (the recipe's similarity
tolerance, else int8's default cosine/SNR); the lowest ratio wins, an exact tie the earlier candidate.  Never
held-out validation data: that would choose on what is then reported.

Cheap where it can be: the per-channel activation maxima that smoothing divides by are the same for every
alpha, so they are measured once (``_smooth.measure``); the int8 ranges after smoothing differ per alpha and
are calibrated per candidate, through ``shared_calibration``, so the chosen model's calibration is reused by
the build that follows and by the other runtime's build under ``per_runtime``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.tolerance import DEFAULT_TOLERANCES, Tolerance
from qdeploy.graph.external_data import remove_saved, save_onnx
from qdeploy.graph.measured_integers import measured_integers, with_integer_values
from qdeploy.stages.quantize.findings import AlphaSearch, AlphaTrial, SmoothQuantRecord
from qdeploy.stages.quantize.ptq._smooth import AlphaMeasurement, measure, smooth, smoothed_with

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.core.context import StageContext
    from qdeploy.stages.quantize.config import PtqConfig

log = logging.getLogger(__name__)

GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
"""The alphas ``auto`` tries, beside no smoothing."""
SCORE_SAMPLES = 16
"""At most this many samples score each candidate."""

Feeds = dict[str, "np.ndarray"]
Build = Callable[[Path], "onnx.ModelProto"]


def smoothed_for_ptq(prepared: Path, feeds: Callable[[], Any], config: PtqConfig, op_types: list[str],
                     excluded: set[str], ctx: StageContext,
                     budget_feeds: list[Feeds]) -> tuple[Path, SmoothQuantRecord]:
    """The float model ptq calibrates and quantizes (smoothed with the recipe's alpha, or the searched one) and
    what smoothing did."""
    if config.smooth_quant != "auto":
        assert isinstance(config.smooth_quant, float)
        return smooth(prepared, feeds, config.smooth_quant, op_types, excluded, ctx.work_dir)
    start = time.perf_counter()
    measured = measure(prepared, feeds, op_types, excluded, ctx.work_dir)
    scored_on = "budget" if budget_feeds else "calibration"
    samples = _search_samples(budget_feeds) if budget_feeds else list(islice(feeds(), SCORE_SAMPLES))
    # a task-metric tolerance needs labels per candidate: the int8 default similarity stands in for it here
    tolerance = config.tolerance if isinstance(config.tolerance, Tolerance) else DEFAULT_TOLERANCES["int8"]
    tolerance = with_integer_values(tolerance, measured_integers(prepared))
    build = _ptq_build(config, op_types, sorted(excluded), feeds, ctx)
    path, found = search_alpha(measured, build, samples, tolerance, ctx.work_dir, scored_on=scored_on,
                               detections=ctx.detections)
    if "search" in found:  # the whole cost: the maxima's pass too
        found["search"]["seconds"] = round(time.perf_counter() - start, 2)
    return path, found


def _search_samples(budget_feeds: list[Feeds]) -> list[Feeds]:
    """The budget's search samples (not those it holds back to confirm on), at most ``SCORE_SAMPLES``."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.accuracy_budget.search import held_back_count

    return budget_feeds[:len(budget_feeds) - held_back_count(len(budget_feeds))][:SCORE_SAMPLES]


def search_alpha(measured: AlphaMeasurement, build: Build, samples: list[Feeds], tolerance: Tolerance, work_dir: Path,
                 *, scored_on: str = "calibration",
                 detections: Mapping[str, Any] | None = None) -> tuple[Path, SmoothQuantRecord]:
    """The float model of the candidate (no smoothing, or an alpha of ``GRID``) whose quantized model ``build``
    makes is closest to float32 on ``samples`` under ``tolerance``, and what smoothing did with the trials."""
    if not measured.readers:
        return measured.path, SmoothQuantRecord(
            alpha=None, smoothed_tensors=0,
            note="no MatMul/Gemm with a constant 2-D weight reads a float activation: nothing to search")
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.accuracy_budget.evaluate import error_ratio, ort_runner, worst_of

    start = time.perf_counter()
    reference = ort_runner(measured.path, [samples])[0]
    trials: list[AlphaTrial] = []
    best: tuple[float, Path, SmoothQuantRecord | None] | None = None
    for alpha in (None, *GRID):
        path, done = (measured.path, None) if alpha is None else smoothed_with(
            measured, alpha, work_dir / f"smoothed-alpha{alpha}.onnx")
        quantized = work_dir / "smooth-search.onnx"
        save_onnx(build(path), quantized)
        comparison = worst_of(reference, ort_runner(quantized, [samples])[0], tolerance, detections)
        remove_saved(quantized)
        ratio, worst = error_ratio(comparison, tolerance), comparison.worst()
        trials.append(AlphaTrial(alpha=alpha, error_ratio=_rounded(ratio, 4), cosine=_rounded(worst["cosine"], 6),
                                 snr_db=_rounded(worst["snr_db"], 2)))
        if best is None or ratio < best[0]:
            if best is not None and best[1] != measured.path:
                remove_saved(best[1])
            best = (ratio, path, done)
        elif path != measured.path:
            remove_saved(path)
    assert best is not None
    _, path, done = best
    search = AlphaSearch(grid=list(GRID), scored_on=scored_on, samples=len(samples),
                         tolerance=tolerance.model_dump(exclude_none=True), trials=trials,
                         chosen=done["alpha"] if done else None, seconds=round(time.perf_counter() - start, 2))
    log.info("smooth_quant auto: alpha %s chosen (%s)", search["chosen"], trials)
    if done is None:
        return path, SmoothQuantRecord(
            alpha=None, samples=measured.samples, smoothed_tensors=0, search=search,
            note="no alpha of the grid came closer to float32 than no smoothing: not smoothed")
    return path, {**done, "search": search}


def _ptq_build(config: PtqConfig, op_types: list[str], excluded: list[str], feeds: Callable[[], Any],
               ctx: StageContext) -> Build:
    """The fully quantized model of a float model as ptq builds it: calibrated (shared with the build that
    follows), ranges fixed, Q/DQ placed for the config's runtime."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize._common import openvino_runs, resolve_reduce_range
    from qdeploy.stages.quantize.ptq._ptq import EVERY_SIGNED, StaticBuilder, calibrate
    from qdeploy.stages.quantize.ptq._shared_ranges import RangeSettings, shared_calibration

    seven_bit = resolve_reduce_range(config, ctx.targets)[0]
    form = "weights" if seven_bit == "choose" else seven_bit  # the 7-bit choice is made once, after the search
    settings = RangeSettings(op_types=op_types, method=config.method, percentile=config.percentile)

    def build(path: Path) -> onnx.ModelProto:
        ranges, calibrated = shared_calibration(ctx.work_dir, path, feeds, settings, lambda: calibrate(
            path, op_types, feeds, ctx.work_dir, config.method, config.percentile))
        builder = StaticBuilder(path, ranges, excluded, per_channel=config.per_channel,
                                activation_type=config.activation_type, weight_type=config.weight_type,
                                symmetric_activations=config.symmetric_activations,
                                symmetric_weights=config.symmetric_weights, op_types=op_types, seven_bit=form,
                                runtime=config.runtime,  # the alpha is judged before the sign choice
                                signed_int8=EVERY_SIGNED if config.signed_choice() == "symmetric"
                                and form != "activations" else 0.0,
                                openvino_runs=openvino_runs(ctx.variant, ctx.targets),
                                channel_peaks=calibrated.channel_peaks, nonfinite=calibrated.nonfinite)
        return builder([])  # every node it quantizes quantized: the alpha is judged before any budget

    return build


def _rounded(value: float | None, digits: int) -> float | None:
    """JSON-safe: an infinite ratio (a candidate that fails without one, e.g. NaN outputs) reads as null."""
    return None if value is None or not math.isfinite(value) else round(float(value), digits)
