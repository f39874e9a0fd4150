"""The calibration side of ``mode: weight_only``: Hessians of MatMul inputs, and the plan they give.

``method: gptq`` and ``ratio`` below 1 read calibration data: the float model runs on it once in ONNX Runtime
with the targeted MatMuls' inputs as extra outputs, and each input's ``H = X^T X / rows`` is accumulated
(float64, K x K per distinct input: MatMuls that share an input, such as q/k/v projections, share it).

``ratio`` (NNCF's name and meaning): the share of the int4 MatMul weights, counted in weights, that stays int4;
the most sensitive ones become int8 until the int4 share is at most ``ratio``.  Sensitivity is measured on the
calibration inputs (``_weight_only_gptq.int4_output_error``): the output error int4 adds over int8; MatMuls are
ranked by it per weight (the error that int8 saves per weight it costs: the greedy order of that knapsack).
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
from qdeploy.stages.quantize.weight_only._gptq import int4_output_error

if TYPE_CHECKING:
    from qdeploy.core.context import StageContext
    from qdeploy.stages.quantize.config import WeightOnlyConfig

__all__ = ["CALIBRATION_SAMPLES", "SENSITIVITY", "Target", "activation_hessians", "calibration_feeds", "data_findings",
           "matmul_block", "needs_data", "plan"]

CALIBRATION_SAMPLES = 32
SENSITIVITY = ("int4 output error over int8 on calibration inputs, trace(D4' H D4) - trace(D8' H D8) with "
               "H = X'X/rows; int8 first for the largest per weight")
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
                        ) -> tuple[dict[str, np.ndarray], int]:
    """``X^T X / rows`` of each named float tensor over ``feeds``, and how many samples were read.  ``model`` is
    the graph without its weights; ONNX Runtime reads them from the files beside ``source``."""
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
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    wanted = {value.name for value in session.get_inputs()}
    sums: dict[str, np.ndarray] = {}
    rows: dict[str, int] = dict.fromkeys(names, 0)
    samples = 0
    for feed in feeds:
        values = session.run(names, {key: value for key, value in feed.items() if key in wanted})
        for name, value in zip(names, values, strict=True):
            flat = np.asarray(value, np.float64).reshape(-1, value.shape[-1])
            if name in sums:
                sums[name] += flat.T @ flat  # in place: one K x K array per input, never two
            else:
                sums[name] = flat.T @ flat
            rows[name] += flat.shape[0]
        samples += 1
    if not samples:
        raise ValueError("the calibration data has no samples: method gptq and ratio below 1 need some")
    for name, total in sums.items():
        total /= max(rows[name], 1)
    return sums, samples


def matmul_block(shape: tuple[int, ...], config: WeightOnlyConfig) -> int:
    """The block the MatMul weight will be written in (``_weight_blocks``): its int4 error is scored in it."""
    return block_for("matmul", list(shape), config).size or config.group_size


def plan(targets: list[Target], config: WeightOnlyConfig, array_of: Callable[[str], np.ndarray],
         hessians: dict[str, np.ndarray], report: _Report) -> list[Target]:
    """Targets with their Hessian attached (MatMuls, for gptq) and the ratio's int8 choice made; the report
    records the sensitivity of every candidate and which stayed int8."""
    planned = [dataclasses.replace(found, hessian=hessians.get(found.node.input[0]))  # type: ignore[type-var]
               if found.kind == "matmul" and (config.method == "gptq" or config.scale_estimation or config.awq)
               else found
               for found in targets]
    if config.ratio >= 1:
        return planned
    candidates = [found for found in planned if found.kind == "matmul" and found.bits == 4 and not found.fixed]
    sizes = {found.node.name: int(np.prod(array_of(found.weight).shape)) for found in candidates}
    scores = {found.node.name: int4_output_error(array_of(found.weight), hessians[found.node.input[0]],
                                                 matmul_block(array_of(found.weight).shape, config),
                                                 config.symmetric_weights)
              for found in candidates}
    total, int4 = sum(sizes.values()), sum(sizes.values())
    to_int8 = set()
    for name in sorted(scores, key=lambda node: (-scores[node] / sizes[node], node)):  # most error per weight
        if not total or int4 / total <= config.ratio:
            break
        to_int8.add(name)
        int4 -= sizes[name]
    report.mixed = MixedPrecision(ratio=config.ratio, int4_share=round(int4 / total, 4) if total else 1.0,
                                  sensitivity=SENSITIVITY, kept_int8=sorted(to_int8),
                                  scores={name: float(f"{scores[name]:.4g}") for name in sorted(scores)})
    return [dataclasses.replace(found, bits=8) if found.node.name in to_int8 else found  # type: ignore[type-var]
            for found in planned]


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
