"""The validate stage: every artifact on every target against the float32 reference.

Reference outputs come from the reference variant (or ``validate.reference_model``)
run on ``ort:cpu``; every (variant, target) pair is run on the same inputs and
compared with them.  Running (qdeploy.targets) and comparing (qdeploy.core.compare)
stay apart; a failing pair is localized to its first diverging node
(qdeploy.stages.validate._localize); the reference's own disagreement across targets is the
noise floor (qdeploy.stages.validate._floor); the user's task metric lives in
qdeploy.stages.validate._task.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.calibration.readers import model_inputs
from qdeploy.core.compare import compare_outputs
from qdeploy.core.detections import DETECTION_KEYS, output_of
from qdeploy.core.errors import ModelError, QdeployInputError, RecipeError, TargetUnavailable
from qdeploy.core.lm_metrics import metric_direction
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.rows import ValidationMetrics, ValidationRow, ValidationStatus
from qdeploy.core.tolerance import DEFAULT_TOLERANCES, Tolerance
from qdeploy.graph.measured_integers import measured_integers
from qdeploy.stages.validate._arbiter import Float64Reference, arbitrate
from qdeploy.stages.validate._batches import BatchedFeeds, reference_batches, run_feeds, wanted_batch_sizes
from qdeploy.stages.validate._common import Feeds, Outcome, Outputs, feed_caster, worst_samples
from qdeploy.stages.validate._floor import flag_unattainable, keep_floor_outputs, noise_floor_summary
from qdeploy.stages.validate._layers_error import NodeErrorRecord, OutputExposure, layer_errors
from qdeploy.stages.validate._localize import Localizer, scale_free
from qdeploy.stages.validate._localize_fused import describe_layer, refine
from qdeploy.stages.validate._precision import (
    PINNED_F32_NOTE,
    default_attempt_hint,
    device_default_basis,
    with_pinned_fallback,
)
from qdeploy.stages.validate._reference import ReferenceMissing, reference_source, unvarying_outputs
from qdeploy.stages.validate._task import check_metric, evaluate, load_metric, read_labels
from qdeploy.stages.validate._tolerance import (
    BF16_BASIS,
    DECLARED_BASIS,
    measured_integer_limits,
    row_basis,
    tolerance_precision,
)
from qdeploy.stages.validate._unreadable import condense_unreadable, unreadable_targets
from qdeploy.stages.validate.config import RANDOM_DATA_WARNING, REFERENCE_MODEL_ROW, REFERENCE_TARGET, ValidateConfig
from qdeploy.targets import TRUE_FP16_TARGET, TargetFellBack, get_target, true_fp16_check
from qdeploy.targets.base import ExecutionInfoDict
from qdeploy.targets.int8_path import int8_path, saturation_note, saturation_risk

if TYPE_CHECKING:
    from qdeploy.core.context import Artifact, StageContext


__all__ = [
    "BF16_BASIS",
    "DECLARED_BASIS",
    "REFERENCE_TARGET",
    "NodeErrorRecord",
    "OutputExposure",
    "ValidateConfig",
    "check_config",
    "check_metric",
    "check_output_names",
    "device_default_basis",
    "evaluate",
    "feed_caster",
    "layer_errors",
    "load_metric",
    "measured_integer_limits",
    "noise_floor_summary",
    "output_tolerances",
    "read_labels",
    "reference_source",
    "row_basis",
    "run",
    "tolerance_for",
    "tolerance_precision",
    "unreadable_targets",
    "worst_samples",
]

log = logging.getLogger(__name__)



def tolerance_for(config: ValidateConfig, precision: str, declared: Tolerance | None = None) -> Tolerance:
    """The variant's declared tolerance (its stage's accuracy budget), else the recipe's validate.tolerance, else
    the default of the artifact's precision."""
    return declared or config.tolerance or DEFAULT_TOLERANCES[precision]


def output_tolerances(config: ValidateConfig, precision: str,
                      declared: Tolerance | None = None) -> dict[str, Tolerance]:
    """Per-output limits: each entry of validate.outputs laid over the base tolerance, field by field."""
    base = tolerance_for(config, precision, declared)
    return {name: base.model_copy(update={key: getattr(override, key) for key in override.model_fields_set})
            for name, override in config.outputs.items()}


def check_output_names(config: ValidateConfig, model_path: Path) -> None:
    """RecipeError (exit 2) naming the field where validate.outputs or validate.detections names an output the
    exported model does not have: a per-output limit on a misspelt name would hold nothing, and a detection match
    would fail every row after every variant was built."""
    named = [(f"validate.outputs.{name}", name) for name in config.outputs]
    if config.detections is not None:
        named += [(f"validate.detections.{key}", output_of(value)) for key in DETECTION_KEYS
                  if (value := getattr(config.detections, key))]
    if not named:
        return  # nothing to check: a large model's file is not read for it
    outputs = [value.name for value in load_model(model_path, load_external_data=False).graph.output]
    for where, name in named:
        if name not in outputs:
            raise RecipeError(f"the model has no output '{name}'; its outputs: {', '.join(outputs)}", field=where)


def check_config(config: ValidateConfig, resolve: Callable[[str], Path]) -> None:
    """What can be checked before any model is built: the files the section names (no user code is run)."""
    if config.reference_model is not None:
        path = resolve(config.reference_model)
        if not path.is_file():
            raise RecipeError(f"file '{config.reference_model}' does not exist (resolved to {path})",
                              field="validate.reference_model")
    if config.metric is not None:
        check_metric(config.metric, resolve)


@dataclass
class _Task:
    function: Callable[..., Any]
    spec: str
    labels: list[np.ndarray] | None
    reference_value: float | None
    warning: str


@dataclass
class _Run:
    """What every pair of one validate run shares."""

    config: ValidateConfig
    feeds: Feeds
    reference_path: Path
    reference_outputs: Outputs
    reference_execution: ExecutionInfoDict
    warnings: list[str]
    task: _Task | None
    localizer: Localizer | None
    batches: BatchedFeeds = field(default_factory=BatchedFeeds)
    """Feeds stacked to the benchmark's batch sizes, after the samples in ``feeds`` (``_batches``)."""
    declared: dict[str, Tolerance] = field(default_factory=dict)
    """Variant -> the tolerance its recipe steps declared (a quantize or fp16 accuracy budget)."""
    spill_dir: Path | None = None
    """Where outputs past ``KEEP_IN_MEMORY_BYTES`` wait on disk (``qdeploy.core.output_store``)."""
    float64: Float64Reference | None = None
    """The reference evaluated in float64, for the float32 rows that fail (``_arbiter``)."""
    reference_label: str = "the reference"

    @property
    def base_samples(self) -> int:
        return len(self.feeds) - len(self.batches.feeds)


def run(artifacts: dict[str, Artifact], targets: list[str], config: ValidateConfig,
        ctx: StageContext, declared: dict[str, Tolerance] | None = None) -> list[ValidationRow]:
    """Validation results, one per (variant, target), in the report's contract.

    ``declared``: variant -> the tolerance its own steps were built to (an accuracy budget); that variant is
    held to it, as the recipe asked, rather than to validate.tolerance or its precision's default."""
    try:
        return _validate_all(artifacts, targets, config, ctx, declared)
    except FileNotFoundError as exc:  # the cache (or the run folder) was deleted while the run used it
        raise _vanished(exc, artifacts) from None


def _vanished(exc: FileNotFoundError, artifacts: dict[str, Artifact]) -> Exception:
    """A clear input error (exit 2) for a model file deleted during validation; any other missing file stays what
    it is (a bug of qdeploy's own)."""
    gone = Path(str(exc.filename)) if exc.filename else None
    # an artifact's own file, or any file once the artifacts themselves are gone (the whole cache deleted)
    deleted = gone is not None and not gone.exists() and any(
        gone.parent == artifact.path.parent or not artifact.path.exists() for artifact in artifacts.values())
    if not deleted:
        return exc
    return QdeployInputError(f"{gone} was deleted while the run used it: its folder ({gone.parent}) was removed or "
                             "cleaned during the run (a cache shared with another job, a cleanup?); run again, and "
                             "keep the cache folder while a run uses it")


def _require(path: Path) -> None:
    """An artifact must still be there: a runtime would report a deleted file as some unreadable model instead."""
    import errno
    import os

    if not path.exists():
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))


def _validate_all(artifacts: dict[str, Artifact], targets: list[str], config: ValidateConfig, ctx: StageContext,
                  declared: dict[str, Tolerance] | None) -> list[ValidationRow]:
    try:
        source = reference_source(artifacts, config, ctx)
    except ReferenceMissing as exc:
        return [_result(name, target, "error", str(exc)) for name in artifacts for target in targets]
    feeds = list(ctx.samples(config.data, source.feed_model, limit=config.samples))
    try:
        ctx.on_progress(f"reference {source.label} on {REFERENCE_TARGET}")
        reference_outputs, execution = _run_model(REFERENCE_TARGET, source.path, feeds, pin_f32=True,
                                                  spill_dir=ctx.work_dir)
    except Exception as exc:  # the reference failing makes every comparison impossible
        reason = f"reference {source.label} failed on {REFERENCE_TARGET}: {exc}"
        return [_result(name, target, "error", reason) for name in artifacts for target in targets]
    source.check_outputs(reference_outputs, config)
    batches = reference_batches(feeds, source.feed_model, source.path, wanted_batch_sizes(ctx),
                                lambda path, more: _run_model(REFERENCE_TARGET, path, more, pin_f32=True)[0])
    warnings = [RANDOM_DATA_WARNING] if _is_random(config, ctx) else []
    logs = not ctx.targets or ctx.targets[0] in targets  # said once: a scheduler may validate targets in groups
    for warning in unvarying_outputs(reference_outputs, source.label):
        log.log(logging.WARNING if logs else logging.DEBUG, "%s", warning)
        warnings.append(warning)
    shared = _Run(config, feeds + batches.feeds, source.path, reference_outputs + batches.outputs, execution,
                  warnings + batches.warnings, _task_metric(config, ctx, source, reference_outputs),
                  _localizer(config, source.path), batches, dict(declared or {}), ctx.work_dir,
                  Float64Reference(source.path, feeds), source.label)
    outcomes = []
    largest = max((artifact.size_bytes for artifact in artifacts.values()), default=0)
    for name, artifact in artifacts.items():
        for target in targets:
            ctx.on_progress(f"validate {name} on {target}")
            floor = name == source.variant and target != REFERENCE_TARGET
            outcome = _validate_pair(shared, name, artifact.path, artifact.precision, target, floor=floor,
                                     device_default=artifact.at_device_default, pinned_f32=artifact.pinned_f32)
            outcomes.append(keep_floor_outputs(outcome, largest))
    if source.variant is None:  # reference_model: its own rows on the other targets measure the floor
        for target in targets:
            if target != REFERENCE_TARGET:
                ctx.on_progress(f"validate {REFERENCE_MODEL_ROW} on {target}")
                outcome = _validate_pair(shared, REFERENCE_MODEL_ROW, source.path, "fp32", target, floor=True)
                outcomes.append(keep_floor_outputs(outcome, largest))
    outcomes += _true_fp16_checks(shared, artifacts, targets, ctx, largest)
    flag_unattainable(outcomes, shared.reference_outputs, source.label)
    return condense_unreadable([outcome.row for outcome in outcomes])


def _true_fp16_checks(shared: _Run, artifacts: dict[str, Artifact], targets: list[str], ctx: StageContext,
                      largest_model_bytes: int) -> list[Outcome]:
    """fp16 artifacts on reference:cpu, where float16 arithmetic really happens, when no GPU would show it."""
    fp16 = {name: artifact for name, artifact in artifacts.items() if artifact.precision == "fp16"}
    recipe_targets = ctx.targets
    # a scheduler may validate the targets in groups: the group holding the recipe's first target owns these rows
    owner = recipe_targets[0] in targets if recipe_targets else True
    if not fp16 or not owner or not true_fp16_check(recipe_targets, shared.config.fp16_reference):
        return []
    count = min(shared.config.fp16_reference_samples, shared.base_samples)
    capped = dataclasses.replace(shared, feeds=shared.feeds[:count], reference_outputs=shared.reference_outputs[:count],
                                 batches=BatchedFeeds())
    outcomes = []
    for name, artifact in fp16.items():
        ctx.on_progress(f"validate {name} on {TRUE_FP16_TARGET} (true float16 arithmetic)")
        outcome = _validate_pair(capped, name, artifact.path, artifact.precision, TRUE_FP16_TARGET)
        outcome.row = outcome.row.replace(
            added="fp16 true-precision check: no GPU target of the recipe is available here", noise_floor=False)
        outcomes.append(keep_floor_outputs(outcome, largest_model_bytes))
    return outcomes


def _is_random(config: ValidateConfig, ctx: StageContext) -> bool:
    return config.data is None or ctx.datasets[config.data].reader == "random"


def _task_metric(config: ValidateConfig, ctx: StageContext, source: Any, reference_outputs: Outputs) -> _Task | None:
    """The user's metric, loaded, with the labels and its value on the reference outputs."""
    if config.metric is None:
        return None

    function = load_metric(config.metric, ctx.resolve, seconds=config.metric_timeout_seconds)
    names = [info.name for info in model_inputs(source.feed_model)]
    labels = read_labels(ctx.datasets, ctx.resolve, config.data, names, config.samples)
    warning = "" if labels is not None else f"validate.metric '{config.metric}' called with labels=None: " \
                                            "the dataset holds no 'label' arrays (nor is it a text dataset)"
    if labels is not None and len(labels) != len(reference_outputs):
        labels, warning = None, f"{len(labels)} labels for {len(reference_outputs)} samples; labels=None given"
    value, failure = evaluate(function, config.metric, reference_outputs, labels)
    if failure:
        log.error("%s (on the reference outputs)", failure)
    return _Task(function, config.metric, labels, value, "; ".join(filter(None, (warning, failure))))


def _localizer(config: ValidateConfig, reference_path: Path) -> Localizer | None:
    if not config.localize:
        return None

    return Localizer(reference_path, REFERENCE_TARGET)


def _validate_pair(shared: _Run, name: str, path: Path, precision: str, target: str, *, floor: bool = False,
                   device_default: bool = False, pinned_f32: bool = False) -> Outcome:
    """One row: the artifact at the target's default precision, and where a reduced default misses its tolerance,
    pinned precisions that may hold (``_precision``); a row that still fails is localized.  ``device_default``: a
    float32 artifact run at the device default too (the reference's ``fp32@default`` row), never pinned;
    ``pinned_f32``: a weight-only artifact's ``@f32`` row, pinned to f32 as its deployment setting; ``floor``: the
    reference itself on another target (its noise floor).  A float32 row that fails is arbitrated in float64
    (``_arbiter``)."""
    _require(path)
    if pinned_f32:
        hint, why = "f32", ""
        outcome = _compare_pair(shared, name, path, precision, target, hint, pinned=True)
        outcome.row = outcome.row.replace(deploy_precision=hint, warnings=[*outcome.row.warnings, PINNED_F32_NOTE])
    else:
        hint, why = default_attempt_hint(target, precision, device_default=device_default)
        outcome = _compare_pair(shared, name, path, precision, target, hint, pinned=False,
                                device_default=device_default)
        outcome = with_pinned_fallback(outcome, target, precision, lambda pinned: _compare_pair(
            shared, name, path, precision, target, pinned, pinned=True))
    if why and outcome.row.measured:  # where the default's facts came from, on whichever attempt the row keeps
        outcome.row = outcome.row.replace(warnings=[*outcome.row.warnings, why])
    outcome.row = outcome.row.replace(noise_floor=floor)
    if (not device_default and shared.float64 is not None
            and tolerance_precision(precision, path)[0] == "fp32"):  # a graph of integer ops rounds apart anyway
        outcome = arbitrate(outcome, shared.float64, shared.reference_outputs, shared.reference_label)
    row = outcome.row
    failing = [out for out in row.outputs or [] if not out.get("passed") and out.get("shape_mismatch") is None]
    if row.status == "failed" and shared.localizer is not None and failing and outcome.outputs is not None:
        limits = outcome.per_output.get(failing[0]["name"], outcome.tolerance)
        assert limits is not None
        outcome.row = _add_divergence(shared, row, path, target, precision, outcome.outputs, limits)
    return outcome


def _compare_pair(shared: _Run, name: str, path: Path, precision: str, target: str, hint: str | None, *,
                  pinned: bool, device_default: bool = False) -> Outcome:
    """The artifact run on the target with INFERENCE_PRECISION_HINT ``hint`` (OpenVINO; None: the device default,
    f32 for float32 artifacts) and compared with the reference.  ``pinned``: the hint is a deployment setting."""
    available, reason = get_target(target).availability()
    if not available:
        return Outcome(_result(name, target, "unavailable", reason, shared.warnings))
    # float32 artifacts run in float32 (but the device-default row); reduced ones as the device would run them
    pin_f32 = precision == "fp32" and not device_default
    try:
        if path == shared.reference_path and target == REFERENCE_TARGET:
            outputs, executed = shared.reference_outputs, shared.reference_execution  # the same run
        else:
            outputs, executed = _run_model(target, path, shared.feeds, pin_f32=pin_f32 or hint == "f32",
                                           batches=shared.batches, precision=hint, spill_dir=shared.spill_dir)
    except TargetFellBack as exc:  # the target exists but ran elsewhere: a failure of that target
        return Outcome(_result(name, target, "failed", str(exc), shared.warnings))
    except TargetUnavailable as exc:
        return Outcome(_result(name, target, "unavailable", str(exc), shared.warnings))
    except ModelError as exc:  # the runtime cannot read or compile this artifact: it cannot be deployed there
        row = _result(name, target, "failed", f"{target} cannot run this artifact: {exc}", shared.warnings)
        return Outcome(row.replace(unreadable=True))  # _unreadable keeps the mark where the original fails too
    except Exception as exc:
        log.debug("validation of %s on %s failed", name, target, exc_info=True)
        return Outcome(_result(name, target, "error", f"{type(exc).__name__}: {exc}", shared.warnings))
    declared = shared.declared.get(name)
    basis, held = row_basis(precision, path, target, executed, declared=declared is not None,
                            recipe_tolerance=shared.config.tolerance is not None, device_default=device_default)
    tolerance = tolerance_for(shared.config, basis, declared)
    notes = [*shared.warnings, *_execution_warnings(executed, precision), *([held] if held else [])]
    tolerance, per_output, integer_notes = measured_integer_limits(
        tolerance, output_tolerances(shared.config, basis, declared), measured_integers(path))
    notes += integer_notes
    detections = shared.config.detection_spec()
    comparison = compare_outputs(shared.reference_outputs, outputs, tolerance, per_output, detections)
    row = _result(name, target, "passed" if comparison.passed else "failed", "; ".join(comparison.reasons),
                  [*notes, *comparison.notes])
    row = row.replace(
        metrics=ValidationMetrics(**comparison.worst()),
        outputs=[output.to_dict() for output in comparison.outputs],
        tolerance=tolerance.model_dump(exclude_none=True),
        tolerance_basis=held or None,
        precision=precision,
        effective_precision=effective_precision(precision, executed),
        execution=executed,
        samples=shared.base_samples,
        batch_sizes_validated=shared.batches.sizes,
        **_hint_field(target, "f32" if pin_f32 else hint if pinned else None),
    )
    row = _add_task_metric(shared, row, outputs[:shared.base_samples])
    if not comparison.passed and precision == "int8":
        row = _add_saturation_reason(row, path, target)
    return Outcome(row, outputs, tolerance, per_output, detections)


def _hint_field(target: str, hint: str | None) -> dict[str, str | None]:
    """OpenVINO rows say which INFERENCE_PRECISION_HINT their numbers ran with (None: the device default)."""
    return {"precision_hint": hint} if target.startswith("openvino:") else {}


def _run_model(target: str, path: Path, feeds: Feeds, *, pin_f32: bool, batches: BatchedFeeds | None = None,
               precision: str | None = None, spill_dir: Path | None = None) -> tuple[Outputs, ExecutionInfoDict]:
    """Outputs and what ran; ``precision`` (OpenVINO only) pins INFERENCE_PRECISION_HINT, winning over pin_f32."""
    caster = feed_caster(path)
    pinned = {"precision": precision} if precision is not None else {}
    with get_target(target).load(path, pin_f32=pin_f32, **pinned) as session:
        outputs = run_feeds(session, [caster(feed) for feed in feeds], batches, spill_dir)
        return outputs, session.executed.to_dict()


def _add_saturation_reason(row: ValidationRow, path: Path, target: str) -> ValidationRow:
    """On a CPU without VNNI, a diverging int8 artifact with full-range operands may be saturating: say so."""
    import onnx


    note = saturation_note(int8_path(), target, saturation_risk(onnx.load(str(path), load_external_data=False)))
    return row.replace(reason=f"{row.reason}; {note}") if note else row


def _add_task_metric(shared: _Run, row: ValidationRow, outputs: Outputs) -> ValidationRow:
    if shared.task is None:
        return row

    value, failure = evaluate(shared.task.function, shared.task.spec, outputs, shared.task.labels)
    warnings = row.warnings + [w for w in (shared.task.warning, failure) if w and w not in row.warnings]
    return row.replace(metrics=row.metrics.replace(task_metric=value),
                       task_metric_reference=shared.task.reference_value, task_metric_name=shared.task.spec,
                       task_metric_direction=metric_direction(shared.task.spec), warnings=warnings)


def _add_divergence(shared: _Run, row: ValidationRow, path: Path, target: str, precision: str, outputs: Outputs,
                    limits: Tolerance) -> ValidationRow:
    """Name the first node whose output breaks the limits (cosine/SNR: scale-free on every tensor); where exposing
    the intermediates hides the error, or names a node that diverges on ort:cpu too, on prefixes compiled whole."""
    assert shared.localizer is not None
    indices = worst_samples(shared.reference_outputs, outputs, shared.config.localize_samples)
    tolerance = scale_free(limits, DEFAULT_TOLERANCES[precision])
    samples, pin_f32 = {i: shared.feeds[i] for i in indices}, precision == "fp32"
    try:
        located, why = shared.localizer.locate(path, target, samples, tolerance=tolerance, pin_f32=pin_f32)
        divergence, found, why = refine(shared.localizer, path, target, samples, located, why, tolerance=tolerance,
                                        pin_f32=pin_f32)
    except Exception as exc:  # localization is a diagnosis: its failure must not hide the row's verdict
        log.debug("localizing %s on %s failed", row.variant, target, exc_info=True)
        divergence, found, why = None, {}, f"{type(exc).__name__}: {exc}"
    if divergence is None:
        return row.replace(warnings=[*row.warnings, f"diverging node not located: {why}"])
    return row.replace(divergence={**divergence.to_dict(), "target": target, "samples": indices,
                                   "tolerance": tolerance.model_dump(exclude_none=True), **found},
                       reason=f"{row.reason}; {divergence.summary()}{describe_layer(found.get('fused_layer'))}")


def effective_precision(precision: str, executed: ExecutionInfoDict) -> str:
    """What really ran: OpenVINO's inference precision, ORT's kernel element types, or the declared types."""
    counts = ", ".join(f"{key} {value}" for key, value in sorted(executed.get("precisions", {}).items()))
    ran = executed.get("precision")
    if ran == "declared":
        return f"{precision} graph, every op in its declared precision ({executed.get('runtime')})"
    if ran:
        return f"{precision} graph, {ran} inference precision" + (f" (layers: {counts})" if counts else "")
    device = executed.get("device", "")
    text = f"{precision} graph on {device}" if device else precision
    return text + (f" (kernels: {counts})" if counts else "")


def _execution_warnings(executed: ExecutionInfoDict, precision: str) -> list[str]:
    """What ran differently from what the graph declares, or elsewhere than asked."""
    warnings = [note for note in executed.get("notes", []) if "kernels ran on CPUExecutionProvider" in note]
    unsupported = executed.get("unsupported_ops") or []
    if unsupported:
        warnings.append(f"query_model: {len(unsupported)} ops unsupported on {executed.get('device')}: "
                        f"{', '.join(unsupported[:5])}{' ...' if len(unsupported) > 5 else ''}")
    precisions = executed.get("precisions") or {}
    if precision == "fp16" and executed.get("runtime") == "onnxruntime" and precisions.get("FP32"):
        warnings.append(f"onnxruntime ran {precisions['FP32']} of {sum(precisions.values())} kernels of this fp16 "
                        f"graph in float32 on {executed.get('device')} (casts inserted where it has no fp16 kernel): "
                        "fp16 overflow and rounding are not exercised here; target reference:cpu checks them")
    return warnings


def _result(variant: str, target: str, status: ValidationStatus, reason: str,
            warnings: list[str] | None = None) -> ValidationRow:
    return ValidationRow(variant=variant, target=target, status=status, reason=reason, warnings=list(warnings or []))
