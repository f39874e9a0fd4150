"""The calibration side of ``mode: weight_only``: Hessians of MatMul inputs, and the plan they give.

``method: gptq`` and ``ratio`` below 1 read calibration data: the float model runs on it once in ONNX Runtime
with the targeted MatMuls' inputs as extra outputs, and each input's ``H = X^T X / rows`` is accumulated
(float32, K x K per distinct input: MatMuls that share an input, such as q/k/v projections, share it).

The same pass records, per input, the largest per-channel variance over the rows of one sample, averaged over
the samples (NNCF's ``max_activation_variance`` statistic).

``ratio`` (NNCF's name and meaning): the share of the int4 MatMul weights, counted in weights, that stays int4;
the most sensitive ones become int8 until the int4 share is at most ``ratio``.  ``ratio_sensitivity`` says how
sensitivity is measured on the calibration inputs:

- ``max_variance`` (the default, NNCF's data-aware default): the input's max variance divided by the largest
  per-output-channel mean squared int8 error of the weight, ranked as a whole.  On SmolLM2-135M at ratio 0.8 it
  keeps most k/v/q projections of every layer int8 and cuts the KL that ``output_error`` leaves by a third
  (docs/measurements/2026-12-02-smollm2-ratio.md);
- ``output_error``: the MatMul's own output error that int4 adds over int8 (``_gptq.int4_output_error``), ranked
  per weight (the error that int8 saves per weight it costs: the greedy order of that knapsack).  It measures each
  layer's error where it is made, not what it does to the model's output: it favours the late layers' MLP and
  output projections, whose inputs are largest.

Embeddings and the LM head follow their own settings and are not part of the ratio.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np
import onnx
from onnx import TensorProto, helper

from qdeploy.stages.quantize.findings import AwqSearch, MixedPrecision, WeightOnlyCalibration, WeightOnlyDataFields
from qdeploy.stages.quantize.weight_only._blocks import block_for
from qdeploy.stages.quantize.weight_only._gptq import int4_output_error, rtn_dequantized
from qdeploy.stages.quantize.weight_only._stats_cache import InputStatistics

if TYPE_CHECKING:
    from qdeploy.core.context import StageContext
    from qdeploy.stages.quantize.config import WeightOnlyConfig

__all__ = ["CALIBRATION_SAMPLES", "SENSITIVITY", "Target", "activation_hessians", "calibration_feeds", "data_findings",
           "matmul_block", "needs_data", "plan"]

CALIBRATION_SAMPLES = 32
SENSITIVITY = {
    "max_variance": ("max over channels of the input's variance along a sample's rows (mean over samples), divided "
                     "by the largest per-channel mean squared int8 error of the weight; int8 first for the largest "
                     "(NNCF's max_activation_variance)"),
    "output_error": ("int4 output error over int8 on calibration inputs, trace(D4' H D4) - trace(D8' H D8) with "
                     "H = X'X/rows; int8 first for the largest per weight"),
}
"""What ``ratio`` ranks by, as the findings say it."""


class _Planned(Protocol):
    """What ``plan`` and ``_awq`` read of ``_build._Target`` (a protocol: that module imports this one)."""

    @property
    def node(self) -> onnx.NodeProto: ...
    @property
    def weight(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def bits(self) -> int: ...
    @property
    def fixed(self) -> bool: ...
    @property
    def transposed_from(self) -> str | None: ...


class _Report(Protocol):
    calibration_samples: int
    statistics_reused: bool
    mixed: MixedPrecision | None
    awq: dict[str, AwqSearch]


Target = TypeVar("Target", bound=_Planned)


def needs_data(config: WeightOnlyConfig) -> bool:
    return config.method == "gptq" or config.ratio < 1 or config.scale_estimation or config.awq


def calibration_feeds(config: WeightOnlyConfig, source: Path, ctx: StageContext) -> Iterable[dict] | None:
    """The recipe's calibration data (seeded random data when it names none), or None when nothing reads it."""
    if not needs_data(config):
        return None
    dataset = config.calibration.data if config.calibration else None
    limit = config.calibration.samples if config.calibration else CALIBRATION_SAMPLES
    return ctx.samples(dataset, source, limit)


def activation_hessians(source: Path, model: onnx.ModelProto, names: list[str], feeds: Iterable[dict]
                        ) -> InputStatistics:
    """``X^T X / rows`` and the max variance of each named float tensor over ``feeds``, and how many samples were
    read.  ``model`` is the graph without its weights; ONNX Runtime reads them from the files beside ``source``.
    Accumulated in float32, as they are stored: one K x K array per input (float64 held twice as much, and
    GPTQ dampens by 1% of the diagonal, far above float32's rounding)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    known = {value.name for value in probe.graph.output}
    probe.graph.output.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
                              for name in names if name not in known)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(source.parent))
    # a statistics pass, not a deployment: no second, prepacked copy of every MatMul weight
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False  # a second block for every activation, from the second sample on
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    del probe
    wanted = {value.name for value in session.get_inputs()}
    statistics = InputStatistics({}, dict.fromkeys(names, 0.0), 0)
    rows: dict[str, int] = dict.fromkeys(names, 0)
    for feed in feeds:
        values = session.run(names, {key: value for key, value in feed.items() if key in wanted})
        for name, value in zip(names, values, strict=True):
            _accumulate(statistics, name, np.asarray(value, np.float32))
            rows[name] += int(np.prod(value.shape[:-1]))
        statistics.samples += 1
    if not statistics.samples:
        raise ValueError("the calibration data has no samples: method gptq and ratio below 1 need some")
    for name, total in statistics.hessians.items():
        total /= max(rows[name], 1)
        statistics.max_variance[name] /= statistics.samples
    return statistics


def _accumulate(statistics: InputStatistics, name: str, value: np.ndarray) -> None:
    """Add one sample's ``X^T X`` (in place: never a second K x K array) and its max variance over the rows."""
    flat = value.reshape(-1, value.shape[-1])
    if name in statistics.hessians:
        statistics.hessians[name] += flat.T @ flat
    else:
        statistics.hessians[name] = flat.T @ flat
    if value.ndim >= 2:  # NNCF's reduction: the variance along the sequence axis, its largest channel
        statistics.max_variance[name] += float(np.var(value, axis=-2, dtype=np.float64).max())


def matmul_block(shape: tuple[int, ...], config: WeightOnlyConfig) -> int:
    """The block the MatMul weight will be written in (``_weight_blocks``): its int4 error is scored in it."""
    return block_for("matmul", list(shape), config).size or config.group_size


def plan(targets: list[Target], config: WeightOnlyConfig, array_of: Callable[[str], np.ndarray],
         statistics: InputStatistics, report: _Report) -> list[Target]:
    """Targets with their Hessian attached (MatMuls, for gptq) and the ratio's int8 choice made; the report
    records the sensitivity of every candidate and which stayed int8."""
    hessians = statistics.hessians
    planned = [dataclasses.replace(found, hessian=hessians.get(found.node.input[0]))  # type: ignore[type-var]
               if found.kind == "matmul" and (config.method == "gptq" or config.scale_estimation or config.awq)
               else found
               for found in targets]
    if config.ratio >= 1:
        return planned
    candidates = [found for found in planned if found.kind == "matmul" and found.bits == 4 and not found.fixed]
    sizes = {found.node.name: int(np.prod(array_of(found.weight).shape)) for found in candidates}
    scores = {found.node.name: _sensitivity(found, config, array_of, statistics) for found in candidates}
    # output_error is a per-layer error in the layer's own units: ranked per weight it costs (a knapsack's greedy
    # order); max_variance is NNCF's score, ranked as a whole, as NNCF ranks it
    per_weight = config.ratio_sensitivity == "output_error"
    order = sorted(scores, key=lambda node: (-scores[node] / (sizes[node] if per_weight else 1), node))
    total, int4 = sum(sizes.values()), sum(sizes.values())
    to_int8 = set()
    for name in order:
        if not total or int4 / total <= config.ratio:
            break
        to_int8.add(name)
        int4 -= sizes[name]
    report.mixed = MixedPrecision(ratio=config.ratio, int4_share=round(int4 / total, 4) if total else 1.0,
                                  sensitivity=SENSITIVITY[config.ratio_sensitivity], kept_int8=sorted(to_int8),
                                  scores={name: float(f"{scores[name]:.4g}") for name in sorted(scores)})
    return [dataclasses.replace(found, bits=8) if found.node.name in to_int8 else found  # type: ignore[type-var]
            for found in planned]


def _sensitivity(found: _Planned, config: WeightOnlyConfig, array_of: Callable[[str], np.ndarray],
                 statistics: InputStatistics) -> float:
    weight, source = array_of(found.weight), found.node.input[0]
    block = matmul_block(weight.shape, config)
    if config.ratio_sensitivity == "output_error":
        return int4_output_error(weight, statistics.hessians[source], block, config.symmetric_weights)
    # NNCF's MaxVarianceCriterion: max input variance x the inverse of the int8 noise (the largest per-channel
    # mean squared error of the weight in int8, the form the MatMul takes when it is kept)
    delta = weight.astype(np.float32) - rtn_dequantized(weight, 8, block, config.symmetric_weights)
    noise = float(np.mean(np.square(delta, dtype=np.float64), axis=0).max())
    return statistics.max_variance[source] / (noise + float(np.finfo(np.float32).eps))


def data_findings(config: WeightOnlyConfig, report: _Report) -> WeightOnlyDataFields:
    """The weight_only findings' fields about the method and the data (``WeightOnlyFindings``)."""
    extra = WeightOnlyDataFields(method=config.method, scale_estimation=config.scale_estimation,
                                 zero_points=config.zero_points)
    if config.awq:
        extra["awq"] = dict(report.awq)
    if needs_data(config):
        extra["calibration"] = WeightOnlyCalibration(
            data=(config.calibration.data if config.calibration else None) or "random",
            samples=report.calibration_samples, statistics_reused=report.statistics_reused)
        extra["mixed"] = report.mixed
    return extra
