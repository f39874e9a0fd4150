"""The fp16 stage: convert a float32 model to float16 with onnxconverter-common, deliberately.

What it does beyond calling the converter:
- runs ONNX shape/type inference first (the converter's Cast insertion depends on it);
- picks the clamping limits on purpose (float16's own range by default, not the
  converter's ±1e4) and counts what is clamped per initializer instead of warning per value;
- optionally runs the float32 model on calibration data and keeps in float32 every node
  whose activations would overflow float16 (activation-aware blocking);
- restores float32 graph outputs that the converter turns to float16 when the node
  producing them is blocked, despite ``keep_io_types``;
- checks the result with onnx.checker and an ONNX Runtime session.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipeline.context import Artifact, StageContext, StageResult
from pipeline.errors import StageError
from stages.quantize import CalibrationRef, name_unnamed_nodes

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

STAGE = "fp16"
FLOAT16_MAX = 65504.0
MAX_LISTED_INITIALIZERS = 50
FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto element types


class Fp16Config(BaseModel):
    """Settings of the fp16 stage."""

    model_config = ConfigDict(extra="forbid")

    keep_io_types: bool = Field(default=True, description="Keep float32 graph inputs and outputs (Casts inside).")
    min_positive_val: float = Field(
        default=5.96e-08, description="Nonzero constants smaller in magnitude are raised to this (float16's "
                                      "smallest subnormal by default).")
    max_finite_val: float = Field(
        default=FLOAT16_MAX, description="Constants larger in magnitude are clamped to this (float16's largest "
                                         "finite value by default; onnxconverter-common's own default is 1e4).")
    op_block_list: list[str] | None = Field(
        default=None, description="Op types kept in float32; onnxconverter-common's default list when absent.")
    node_block_list: list[str] = Field(default_factory=list, description="Node names kept in float32.")
    calibration: CalibrationRef | None = Field(
        default=None, description="Data for activation-aware blocking: nodes whose float32 activations exceed "
                                  "max_finite_val * safety_margin stay in float32. No analysis when absent.")
    safety_margin: float = Field(
        default=0.5, gt=0.0, le=1.0, description="Fraction of max_finite_val above which an activation counts as "
                                                 "overflowing (calibration data rarely holds the worst case).")

    @model_validator(mode="after")
    def _limits(self) -> Fp16Config:
        if not 0.0 < self.min_positive_val < self.max_finite_val <= FLOAT16_MAX:
            raise ValueError(f"need 0 < min_positive_val < max_finite_val <= {FLOAT16_MAX}; got "
                             f"min_positive_val={self.min_positive_val}, max_finite_val={self.max_finite_val}")
        return self


def run(artifact: Artifact, config: Fp16Config, ctx: StageContext) -> StageResult:
    """Convert the artifact's model to float16; returns the converted model and what was done."""
    model = _with_types(artifact.load(), ctx)
    name_unnamed_nodes(model)
    _check_node_names(model, config.node_block_list, ctx)
    op_block = effective_op_block_list(config.op_block_list)
    kept = _activation_blocking(artifact, model, config, ctx) if config.calibration else []
    node_block = sorted(set(config.node_block_list) | {entry["node"] for entry in kept})
    clamp = count_clamping(model, config.min_positive_val, config.max_finite_val, op_block, node_block)
    casts_before = sum(node.op_type == "Cast" for node in model.graph.node)
    outputs_before = {value.name: value.type.tensor_type.elem_type for value in model.graph.output}
    converted = _convert(model, config, op_block, node_block, ctx)
    restored = _restore_output_types(converted, outputs_before) if config.keep_io_types else []
    checker = _check(converted, ctx)
    findings: dict[str, Any] = {
        "clamp": clamp,
        "keep_io_types": config.keep_io_types,
        "op_block_list": op_block,
        "node_block_list": node_block,
        "kept_in_fp32": kept,
        "cast_nodes_added": sum(node.op_type == "Cast" for node in converted.graph.node) - casts_before,
        "checker": checker,
    }
    if restored:
        findings["outputs_restored_to_float32"] = restored
    return StageResult(model=converted, changed=True, findings=findings)


def effective_op_block_list(op_block_list: list[str] | None) -> list[str]:
    """The op types kept in float32: the config's list, or onnxconverter-common's default."""
    if op_block_list is not None:
        return list(op_block_list)
    from onnxconverter_common.float16 import DEFAULT_OP_BLOCK_LIST

    return list(DEFAULT_OP_BLOCK_LIST)


def _with_types(model: onnx.ModelProto, ctx: StageContext) -> onnx.ModelProto:
    """The model after ONNX shape/type inference; float tensors left untyped are logged, not fatal (yet)."""
    import onnx

    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:  # inference is best effort here; the converter then sees fewer types
        log.warning("variant %s: shape inference failed before fp16 conversion: %s", ctx.variant, exc)
    typed = {value.name for value in (*model.graph.value_info, *model.graph.input, *model.graph.output)}
    typed |= {init.name for init in model.graph.initializer}
    untyped = [out for node in model.graph.node for out in node.output if out and out not in typed]
    if untyped:
        log.warning("variant %s: %d tensors have no inferred type (e.g. %s); Casts around blocked nodes may be "
                    "missing for them", ctx.variant, len(untyped), untyped[:5])
    return model


def _check_node_names(model: onnx.ModelProto, names: list[str], ctx: StageContext) -> None:
    present = {node.name for node in model.graph.node}
    unknown = [name for name in names if name not in present]
    if unknown:
        raise StageError(STAGE, ctx.variant, f"node_block_list names {unknown} that are not in the model; "
                                             f"some of its nodes: {sorted(present)[:20]}")


def count_clamping(model: onnx.ModelProto, min_positive_val: float, max_finite_val: float,
                   op_block: list[str], node_block: list[str]) -> dict[str, Any]:
    """What the converter will clamp in the float32 constants it converts, counted before conversion."""
    counts: dict[str, int] = {}
    worst = 0.0
    for name, array in _converted_constants(model, op_block, node_block):
        count, change = _clamped(array, min_positive_val, max_finite_val)
        if count:
            counts[name] = count
            worst = max(worst, change)
    listed = dict(sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:MAX_LISTED_INITIALIZERS])
    clamp: dict[str, Any] = {
        "min_positive_val": min_positive_val,
        "max_finite_val": max_finite_val,
        "clamped_values": sum(counts.values()),
        "initializers": listed,
        "max_relative_change": worst,
    }
    if len(counts) > len(listed):
        clamp["initializers_not_listed"] = len(counts) - len(listed)
    return clamp


def _converted_constants(model: onnx.ModelProto, op_block: list[str],
                         node_block: list[str]) -> list[tuple[str, np.ndarray]]:
    """Float32 initializers and Constant values of the main graph that the converter turns to float16."""
    from onnx import numpy_helper

    blocked = {node.name for node in model.graph.node if node.op_type in set(op_block) or node.name in set(node_block)}
    blocked_inputs = {name for node in model.graph.node if node.name in blocked for name in node.input}
    found = [(init.name, numpy_helper.to_array(init)) for init in model.graph.initializer
             if init.data_type == FLOAT and init.name not in blocked_inputs]
    for node in model.graph.node:
        if node.name in blocked:
            continue
        for attr in node.attribute:
            tensors = ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
            label = node.output[0] if node.op_type == "Constant" and node.output else f"{node.name}.{attr.name}"
            for index, tensor in enumerate(tensors):
                if tensor.data_type == FLOAT:
                    found.append((label if index == 0 else f"{label}[{index}]", numpy_helper.to_array(tensor)))
    return found


def _clamped(array: np.ndarray, min_positive_val: float, max_finite_val: float) -> tuple[int, float]:
    """How many values the converter changes by clamping, and the largest relative change among them."""
    import numpy as np

    magnitude = np.abs(array.astype(np.float64, copy=False)).ravel()
    big = magnitude[(magnitude > max_finite_val) & np.isfinite(magnitude)]
    tiny = magnitude[(magnitude > 0) & (magnitude < min_positive_val)]
    changes = [float(((big - max_finite_val) / big).max())] if big.size else []
    if tiny.size:
        changes.append(float(((min_positive_val - tiny) / tiny).max()))
    return int(big.size + tiny.size), max(changes, default=0.0)


def _activation_blocking(artifact: Artifact, model: onnx.ModelProto, config: Fp16Config,
                         ctx: StageContext) -> list[dict[str, Any]]:
    """Nodes whose float32 activations on the calibration data exceed max_finite_val * safety_margin."""
    assert config.calibration is not None
    feeds = ctx.samples(config.calibration.data, artifact.path, config.calibration.samples)
    abs_max = activation_abs_max(model, feeds, ctx.work_dir)
    limit = config.max_finite_val * config.safety_margin
    already = set(effective_op_block_list(config.op_block_list))
    kept = []
    for node in model.graph.node:
        if node.op_type in already or node.name in config.node_block_list:
            continue
        seen = [(abs_max[name], name) for name in (*node.input, *node.output) if name in abs_max]
        if seen and max(seen)[0] > limit:
            value, tensor = max(seen)
            kept.append({"node": node.name, "op_type": node.op_type, "tensor": tensor, "abs_max": value})
    if kept:
        log.info("variant %s: %d nodes stay in float32: activations above %g", ctx.variant, len(kept), limit)
    return kept


def activation_abs_max(model: onnx.ModelProto, feeds: Any, work_dir: Path) -> dict[str, float]:
    """Largest |value| of every float32 tensor (graph inputs and node outputs) over the feeds, run in ORT."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {value.name for value in probe.graph.output}
    for value in model.graph.value_info:
        if value.type.tensor_type.elem_type == FLOAT and value.name not in outputs:
            probe.graph.output.append(value)
    path = work_dir / "fp16_probe.onnx"
    onnx.save(probe, str(path))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [out.name for out in session.get_outputs()]
    abs_max: dict[str, float] = {}
    for feed in feeds:
        arrays = list(zip(names, session.run(None, feed), strict=True)) + list(feed.items())
        for name, array in arrays:
            if array.size and np.issubdtype(array.dtype, np.floating):
                abs_max[name] = max(abs_max.get(name, 0.0), float(np.nanmax(np.abs(array))))
    return abs_max


def _convert(model: onnx.ModelProto, config: Fp16Config, op_block: list[str], node_block: list[str],
             ctx: StageContext) -> onnx.ModelProto:
    """onnxconverter-common's conversion, its per-value warnings captured and summarised in one log line."""
    from onnxconverter_common.float16 import convert_float_to_float16

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            converted = convert_float_to_float16(
                model, min_positive_val=config.min_positive_val, max_finite_val=config.max_finite_val,
                keep_io_types=config.keep_io_types, disable_shape_infer=True,
                op_block_list=op_block, node_block_list=node_block,
            )
        except Exception as exc:
            raise StageError(STAGE, ctx.variant, f"onnxconverter-common failed: {exc}") from exc
    if caught:
        log.debug("variant %s: onnxconverter-common warned %d times (clamping is counted in findings)",
                  ctx.variant, len(caught))
    return converted


def _restore_output_types(model: onnx.ModelProto, before: dict[str, int]) -> list[str]:
    """Give back float32 graph outputs that the converter turned to float16; returns their names."""
    from onnx import helper

    producers = {out: node for node in model.graph.node for out in node.output}
    restored = []
    for value in model.graph.output:
        tensor_type = value.type.tensor_type
        if before.get(value.name) != FLOAT or tensor_type.elem_type != FLOAT16:
            continue
        producer = producers.get(value.name)
        if producer is not None and producer.op_type == "Cast":
            for attr in producer.attribute:
                if attr.name == "to":
                    attr.i = FLOAT
        else:
            inner = f"{value.name}_fp16"
            for node in model.graph.node:
                node.output[:] = [inner if out == value.name else out for out in node.output]
                node.input[:] = [inner if name == value.name else name for name in node.input]
            model.graph.node.append(helper.make_node("Cast", [inner], [value.name], name=f"{inner}_to_fp32", to=FLOAT))
        tensor_type.elem_type = FLOAT
        restored.append(value.name)
    return restored


def _check(model: onnx.ModelProto, ctx: StageContext) -> str:
    """onnx.checker (full where shape inference allows) and an ORT CPU session; StageError if either fails."""
    import onnx
    import onnxruntime as ort

    how = "full"
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.shape_inference.InferenceError as exc:
        log.warning("variant %s: full check of the fp16 model failed in shape inference: %s", ctx.variant, exc)
        how = f"basic (full check failed: {exc})"
        _basic_check(model, ctx)
    except onnx.checker.ValidationError as exc:
        raise StageError(STAGE, ctx.variant, f"the fp16 model is not valid ONNX: {exc}") from exc
    path = ctx.work_dir / "fp16_check.onnx"
    onnx.save(model, str(path))
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise StageError(STAGE, ctx.variant, f"the fp16 model does not load in ONNX Runtime: {exc}") from exc
    return how


def _basic_check(model: onnx.ModelProto, ctx: StageContext) -> None:
    import onnx

    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise StageError(STAGE, ctx.variant, f"the fp16 model is not valid ONNX: {exc}") from exc
