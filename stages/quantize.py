"""The quantize stage: ONNX Runtime static QDQ quantization (ptq) or dynamic quantization.

``ptq`` calibrates activation ranges on a recipe dataset (or seeded random data),
streamed in small chunks so that memory stays bounded, and writes a QDQ model
(QuantizeLinear/DequantizeLinear pairs around the quantized ops) that ONNX
Runtime fuses into int8 kernels.  ``dynamic`` quantizes weights only; activations
are quantized at run time (DynamicQuantizeLinear + MatMulInteger/ConvInteger).

A model that is already quantized is refused rather than quantized twice.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.context import Artifact, StageContext, StageResult
from pipeline.errors import QdeployError, StageError

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

STAGE = "quantize"
CALIBRATION_CHUNK = 8
"""Samples per calibration pass: ranges are merged between passes, so memory holds at most this many."""
QUANTIZED_OP_TYPES = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention", "DynamicQuantizeLSTM",
})
_FLOAT_TYPES = (1, 10, 11, 16)  # onnx float, float16, double, bfloat16
_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "entropy": "Entropy"}
_TYPES = {"uint8": "QUInt8", "int8": "QInt8"}


class CalibrationRef(BaseModel):
    """Which data a stage calibrates on: a dataset of the recipe, or seeded random data."""

    model_config = ConfigDict(extra="forbid")

    data: str | None = Field(default=None, description="Dataset name from the recipe's 'data'; seeded random data "
                                                       "shaped from the model when absent.")
    samples: int = Field(default=32, ge=1, description="How many samples to calibrate on at most.")


class QuantizeConfig(BaseModel):
    """Settings of the quantize stage."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["ptq", "dynamic"] = Field(
        default="ptq", description="'ptq': static QDQ with calibrated activation ranges; 'dynamic': weights "
                                   "quantized ahead, activations at run time.")
    calibration: CalibrationRef | None = Field(
        default=None, description="Calibration data of ptq; seeded random data (32 samples) when absent.")
    method: Literal["minmax", "percentile", "entropy"] = Field(
        default="minmax", description="How activation ranges are estimated from the calibration data (ptq).")
    per_channel: bool = Field(default=True, description="Quantize weights per output channel.")
    activation_type: Literal["uint8", "int8"] = Field(
        default="uint8", description="Activation type of ptq; uint8 with int8 weights is what ORT fuses on x86.")
    weight_type: Literal["int8", "uint8"] = Field(default="int8", description="Weight type.")
    op_types: list[str] | None = Field(
        default=None, description="Op types to quantize; ONNX Runtime's default set when absent.")
    exclude_nodes: list[str] = Field(default_factory=list, description="Node names to leave in float.")
    exclude_op_types: list[str] = Field(default_factory=list, description="Op types whose nodes stay in float.")

    @model_validator(mode="after")
    def _consistent(self) -> QuantizeConfig:
        if self.activation_type == "int8" and self.weight_type == "uint8":
            raise ValueError("activation_type int8 with weight_type uint8 is not supported by ONNX Runtime; "
                             "use uint8 activations with int8 weights (x86) or int8 for both")
        if self.mode == "dynamic":
            # compared with the defaults, not model_fields_set: a dumped config is validated again by the runner
            explicit = [name for name in ("calibration", "method", "activation_type")
                        if getattr(self, name) != type(self).model_fields[name].default]
            if explicit:
                raise ValueError(f"mode 'dynamic' quantizes activations at run time; remove {explicit} "
                                 "or use mode 'ptq'")
        if self.op_types is not None:
            overlap = sorted(set(self.op_types) & set(self.exclude_op_types))
            if overlap:
                raise ValueError(f"op types {overlap} are both in op_types and exclude_op_types")
            if not self.op_types:
                raise ValueError("op_types is empty: name op types to quantize, or leave it out for ORT's default")
        return self


def run(artifact: Artifact, config: QuantizeConfig, ctx: StageContext) -> StageResult:
    """Quantize the artifact's model; returns the quantized model and what was done."""
    import onnx

    already = count_quantized_nodes(artifact.load(load_external_data=False))
    if already:
        raise StageError(STAGE, ctx.variant, f"model is already quantized ({already} QDQ nodes); "
                                             "remove the quantize stage or use mode lower")
    prepared, preprocess = _preprocess(artifact.path, ctx.work_dir)
    excluded = _excluded_nodes(artifact, prepared, config, ctx)
    output = ctx.work_dir / "quantized.onnx"
    findings: dict[str, Any] = {"mode": config.mode, "preprocess": preprocess}
    if config.mode == "ptq":
        findings.update(_quantize_static(artifact.path, prepared, output, config, excluded, ctx))
    else:
        _quantize_dynamic(prepared, output, config, excluded, ctx)
    _check_runs(output, config, ctx)
    model = onnx.load(str(output))
    findings.update({
        "quantized_nodes": quantized_node_counts(model),
        "excluded": excluded,
        "activation_type": config.activation_type if config.mode == "ptq" else "uint8 (dynamic)",
        "weight_type": config.weight_type,
        "per_channel": config.per_channel,
    })
    return StageResult(model=model, changed=True, findings=findings)


def count_quantized_nodes(model: onnx.ModelProto) -> int:
    """How many nodes of the main graph are quantization ops (Q/DQ, QLinear*, *Integer)."""
    return sum(1 for node in model.graph.node
               if node.op_type in QUANTIZED_OP_TYPES or node.op_type.startswith("QLinear"))


def quantized_node_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Per op type, the nodes that run quantized: integer ops, or nodes fed by a DequantizeLinear whose
    constant inputs are not left in float (an excluded Conv fed by a quantized activation does not count)."""
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    float_constants = {init.name for init in model.graph.initializer if init.data_type in _FLOAT_TYPES}
    float_constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    counts: Counter[str] = Counter()
    for node in model.graph.node:
        if node.op_type in {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}:
            continue
        fed = any(name in dequantized for name in node.input)
        if node.op_type in QUANTIZED_OP_TYPES or (fed and not float_constants & set(node.input)):
            counts[node.op_type] += 1
    return dict(sorted(counts.items()))


def _preprocess(source: Path, work_dir: Path) -> tuple[Path, str]:
    """ORT's quantization pre-processing (shape inference, basic fusions); onnx shape inference if it fails."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    target = work_dir / "preprocessed.onnx"
    try:
        quant_pre_process(str(source), str(target))
        how = "quant_pre_process"
    except Exception as exc:  # ORT's symbolic shape inference fails on some graphs; plain inference still helps
        log.warning("quant_pre_process failed (%s); using onnx shape inference only", exc)
        onnx.shape_inference.infer_shapes_path(str(source), str(target))
        how = f"onnx shape inference (quant_pre_process failed: {type(exc).__name__}: {exc})"
    model = onnx.load(str(target))
    if name_unnamed_nodes(model):
        onnx.save(model, str(target))
    return target, how


def name_unnamed_nodes(model: onnx.ModelProto) -> int:
    """Give every unnamed node a unique name (op type and index) so it can be excluded; returns how many."""
    taken = {node.name for node in model.graph.node if node.name}
    named = 0
    for index, node in enumerate(model.graph.node):
        if not node.name:
            candidate = f"{node.op_type}_{index}"
            while candidate in taken:
                candidate += "_"
            node.name = candidate
            taken.add(candidate)
            named += 1
    return named


def _excluded_nodes(artifact: Artifact, prepared: Path, config: QuantizeConfig, ctx: StageContext) -> list[str]:
    """Node names to leave in float: the config's names plus every node of the excluded op types."""
    import onnx

    nodes = onnx.load(str(prepared), load_external_data=False).graph.node
    present = {node.name for node in nodes}
    original = {node.name for node in artifact.load(load_external_data=False).graph.node}
    unknown = [name for name in config.exclude_nodes if name not in present and name not in original]
    if unknown:
        raise StageError(STAGE, ctx.variant, f"exclude_nodes names {unknown} that are not in the model; "
                                             f"some of its nodes: {sorted(present)[:20]}")
    folded = [name for name in config.exclude_nodes if name not in present]
    if folded:
        log.warning("exclude_nodes %s were fused away by pre-processing", folded)
    by_type = [node.name for node in nodes if node.op_type in set(config.exclude_op_types)]
    return sorted((set(config.exclude_nodes) & present) | set(by_type))


def _op_types(config: QuantizeConfig, mode: str) -> list[str] | None:
    """Op types to quantize: the config's, or ORT's default set minus the excluded types."""
    if config.op_types is not None:
        return [op for op in config.op_types if op not in config.exclude_op_types]
    if not config.exclude_op_types:
        return None
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

    default = set(QDQRegistry) | set(QLinearOpsRegistry) if mode == "ptq" else set(IntegerOpsRegistry)
    return sorted(default - set(config.exclude_op_types))


def _quantize_static(source: Path, prepared: Path, output: Path, config: QuantizeConfig, excluded: list[str],
                     ctx: StageContext) -> dict[str, Any]:
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    dataset = config.calibration.data if config.calibration else None
    limit = config.calibration.samples if config.calibration else CalibrationRef().samples
    total = sum(1 for _ in ctx.samples(dataset, source, limit))  # a counting pass: nothing is kept
    if total == 0:
        raise StageError(STAGE, ctx.variant, f"calibration dataset '{dataset or 'random'}' yielded no samples")
    stride = max(d for d in range(1, min(CALIBRATION_CHUNK, total) + 1) if total % d == 0)
    reader = _make_reader(ctx.samples(dataset, source, limit), total)
    extra: dict[str, Any] = {"ActivationSymmetric": False, "WeightSymmetric": True, "CalibStridedMinMax": stride}
    try:
        with _quiet():
            quantize_static(
                str(prepared), str(output), reader,
                quant_format=QuantFormat.QDQ,
                activation_type=getattr(QuantType, _TYPES[config.activation_type]),
                weight_type=getattr(QuantType, _TYPES[config.weight_type]),
                per_channel=config.per_channel,
                calibrate_method=getattr(CalibrationMethod, _METHODS[config.method]),
                nodes_to_exclude=excluded,
                op_types_to_quantize=_op_types(config, "ptq"),
                extra_options=extra,
            )
    except QdeployError:  # a dataset error raised while calibrating stays what it is
        raise
    except Exception as exc:
        raise StageError(STAGE, ctx.variant, f"ONNX Runtime static quantization failed: {exc}") from exc
    return {"method": config.method, "calibration_data": dataset or "random", "calibration_samples": reader.used}


def _quantize_dynamic(prepared: Path, output: Path, config: QuantizeConfig, excluded: list[str],
                      ctx: StageContext) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    try:
        with _quiet():
            quantize_dynamic(
                str(prepared), str(output),
                weight_type=getattr(QuantType, _TYPES[config.weight_type]),
                per_channel=config.per_channel,
                nodes_to_exclude=excluded,
                op_types_to_quantize=_op_types(config, "dynamic"),
            )
    except Exception as exc:
        raise StageError(STAGE, ctx.variant, f"ONNX Runtime dynamic quantization failed: {exc}") from exc


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """ORT's histogram calibrators print progress to stdout; keep it out of the user's terminal, in the log."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            yield
    finally:
        if captured.getvalue().strip():
            log.debug("onnxruntime.quantization: %s", captured.getvalue().strip())


def _make_reader(feeds: Iterator[dict[str, np.ndarray]], total: int) -> Any:
    """A CalibrationDataReader over a stream of feeds, in the ranges ORT's strided calibration asks for."""
    from onnxruntime.quantization import CalibrationDataReader

    class _StreamReader(CalibrationDataReader):
        def __init__(self) -> None:
            self.used = 0
            self._budget: int | None = None

        def __len__(self) -> int:
            return total

        def set_range(self, start_index: int, end_index: int) -> None:
            self._budget = end_index - start_index

        def get_next(self) -> dict[str, np.ndarray] | None:
            if self._budget is not None and self._budget <= 0:
                return None
            feed = next(feeds, None)
            if feed is None:
                return None
            self.used += 1
            if self._budget is not None:
                self._budget -= 1
            return feed

    return _StreamReader()


def _check_runs(output: Path, config: QuantizeConfig, ctx: StageContext) -> None:
    """The quantized model must load in ONNX Runtime's CPU provider."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(str(output), providers=["CPUExecutionProvider"])
    except Exception as exc:
        hint = ""
        if config.mode == "dynamic" and "ConvInteger" in str(exc):
            hint = "; this ONNX Runtime lacks a ConvInteger kernel for these types: try weight_type uint8 or " \
                   "op_types [MatMul, Gemm]"
        raise StageError(STAGE, ctx.variant, f"the quantized model does not load in ONNX Runtime: {exc}{hint}") from exc
