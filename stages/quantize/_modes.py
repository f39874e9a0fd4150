"""The quantize stage's modes, run by ``stages/quantize/__init__.py``: post-training (ptq, dynamic) and lowering."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, partial
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.context import StageResult
from qdeploy.core.errors import StageError
from qdeploy.graph.external_data import PROTOBUF_SAFE_BYTES
from qdeploy.graph.names import name_nodes_uniquely
from qdeploy.graph.order import sort_topologically
from qdeploy.stages.quantize._common import (
    SevenBit,
    check_runs,
    nothing_quantized,
    openvino_only,
    openvino_runs,
    quantized_node_counts,
    resolve_reduce_range,
    save_stage_model,
    saved_path,
)
from qdeploy.stages.quantize.config import (
    STAGE,
    CalibrationRef,
    DynamicConfig,
    LowerConfig,
    NncfPtqConfig,
    PtqConfig,
    WeightOnlyConfig,
)
from qdeploy.stages.quantize.findings import (
    BudgetFindings,
    CalibrationNotes,
    ConvGemmRecord,
    DynamicFindings,
    Int8Findings,
    LowerFindings,
    PtqFindings,
    ReduceRangeRecord,
    SevenBitComparison,
    SignedActivationsRecord,
    WeightOnlyFindings,
)
from qdeploy.stages.quantize.ptq._amx_convs import amx_gemm_wanted, route_convs_to_gemm
from qdeploy.stages.quantize.ptq._prepare import (
    MIN_OPSET,
    count_quantized_nodes,
    drop_unused_opsets,
    excluded_nodes,
    give_back,
    prepare,
)
from qdeploy.stages.quantize.ptq._unshare import unshare_qdq_parameters
from qdeploy.stages.quantize.ptq._verify import compute_nodes, int8_kernels
from qdeploy.targets.int8_path import CPU_TARGETS, SEVEN_BIT_KEY, int8_path, weights_beyond_seven_bits

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.context import Artifact, StageContext
    from qdeploy.stages.quantize.ptq._prepare import Prepared

log = logging.getLogger(__name__)

VERIFY_SAMPLES = 8
"""Samples the lowered model is verified on when the recipe names no calibration data."""

Integer = PtqConfig | DynamicConfig
"""The modes qdeploy builds with ONNX Runtime's quantizer (engine qdeploy)."""


@dataclass(frozen=True)
class _Built:
    """A mode's model builder, the operand it puts on 7 bits, and what building found (for the report only)."""

    build: Any
    seven_bit: SevenBit
    op_types: list[str]
    reduce_range: ReduceRangeRecord
    """The 7-bit choice: the setting, the operand, why (ptq: and what comparing both forms measured)."""
    calibration: CalibrationNotes | None = None
    """ptq: what calibration did."""
    signed: SignedActivationsRecord | None = None
    """ptq: how activations that can be negative are quantized, and why."""


def post_training(artifact: Artifact, config: Integer, ctx: StageContext) -> StageResult:
    """ptq or dynamic: prepare, calibrate (ptq), build, meet the budget when one is set, verify kernels."""
    ctx.on_progress("preparing the float model")
    prepared = prepare(artifact.path, ctx.work_dir)
    excluded, unknown = excluded_nodes(prepared, config.exclude_nodes, config.exclude_patterns,
                                       config.exclude_op_types)
    if unknown:
        some = sorted(prepared.nodes)[:20]
        raise StageError(STAGE, ctx.variant, f"exclude_nodes names {unknown} that are not in the model; "
                                             f"some of its nodes: {some}")
    if config.per_channel and prepared.opset < MIN_OPSET:
        raise StageError(STAGE, ctx.variant, f"per-channel weights need opset {MIN_OPSET}; the model's opset "
                                             f"{prepared.opset}: set model.opset: {MIN_OPSET} in the "
                                             "recipe or per_channel: false")
    budget_feeds = _budget_feeds(artifact, config, ctx) if config.tolerance is not None else []
    unseen = _unseen_by_calibration(config, len(budget_feeds))
    float_path, smoothed = prepared.path, None
    if isinstance(config, PtqConfig) and config.smooth_quant is not None:
        # lazy: pulls onnxruntime (import cost)
        from qdeploy.stages.quantize.ptq._smooth_search import smoothed_for_ptq

        ctx.on_progress("smoothing activations (SmoothQuant)")  # auto: searched before the budget ranks nodes
        float_path, smoothed = smoothed_for_ptq(prepared.path, _calibration_feeds(artifact, config, ctx, unseen),
                                                config, _op_types(config, ctx), set(excluded), ctx, budget_feeds)
    built = _builder(artifact, float_path, excluded, config, ctx, skip=unseen)
    budget = None
    if config.tolerance is not None:
        model, kept, budget = _with_budget(float_path, built.build, config, ctx, budget_feeds, unseen)
    else:
        ctx.on_progress("writing the quantized model")
        model, kept = built.build([]), []
    if not kept and compute_nodes(model) and not count_quantized_nodes(model):  # ml-ops-only models: _verify warns
        raise StageError(STAGE, ctx.variant, nothing_quantized(config, prepared.nodes, built.op_types))
    give_back(model, prepared.undone)
    drop_unused_opsets(model)
    gemm = _route_convs(model, config, ctx) if isinstance(config, PtqConfig) else None
    found = partial(_post_training_findings, config, prepared, built, smooth_quant=smoothed, budget=budget,
                    excluded=sorted({*excluded, *kept}), **({"ort_conv_gemm": gemm} if gemm else {}))
    return _checked(model, built.seven_bit, found, config, ctx)


def _route_convs(model: onnx.ModelProto, config: PtqConfig, ctx: StageContext) -> ConvGemmRecord | None:
    """ONNX Runtime's graph on an AMX CPU: deep int8 convolutions to its AMX GEMM (``ptq._amx_convs``)."""
    if not amx_gemm_wanted(config.runtime, ctx.targets):
        return None
    if not (routed := route_convs_to_gemm(model)):
        return None
    log.info("variant %s: %d int8 convolutions routed to ONNX Runtime's AMX GEMM", ctx.variant, len(routed))
    return {"convs": len(routed), "names": routed[:20],
            "why": "AMX-INT8 CPU: ONNX Runtime runs int8 convolutions with weight zero point 0 on its symmetric "
                   "kernel (no AMX) and others on its AMX GEMM, 1.2-2x faster for deep reductions; zero point -1 "
                   "with every weight one lower dequantizes to the same values"}


def _post_training_findings(config: Integer, prepared: Prepared, built: _Built,
                            **fields: Any) -> PtqFindings | DynamicFindings:
    """ptq's or dynamic's findings: what preparing, calibrating and building found, the settings, and ``fields``
    (the smoothing, the budget, the exclusions and the int8 counts)."""
    settings = {"activation_type": config.activation_type if isinstance(config, PtqConfig) else "uint8 (dynamic)",
                "weight_type": config.weight_type, "per_channel": config.per_channel,
                "symmetric": {"activations": isinstance(config, PtqConfig) and config.symmetric_activations,
                              "weights": config.symmetric_weights},
                "op_types": built.op_types, "reduce_range": built.reduce_range}
    if built.calibration is None:
        return DynamicFindings(**dict(prepared.findings), **settings, **fields)
    return PtqFindings(**dict(prepared.findings), **dict(built.calibration), **settings, **fields,
                       signed_activations={**built.signed, **built.build.uint8_notes()})  # after its builds


def _checked(model: onnx.ModelProto, seven_bit: SevenBit, findings: Callable[..., Int8Findings],
             config: Integer | NncfPtqConfig, ctx: StageContext) -> StageResult:
    """The quantized model marked with its 7-bit operand, saved, loaded in ONNX Runtime, its int8 kernels counted
    per target; what any ptq or dynamic build (qdeploy's or NNCF's) ends with.  ``findings`` takes the counts."""
    name_nodes_uniquely(model)  # the quantizer derives node names from the model's: no two alike, none empty
    sort_topologically(model.graph)  # ORT's quantizer ignores subgraphs' reads (mk8dx: OpenVINO could not read it)
    _mark_seven_bit(model, seven_bit)
    output = save_stage_model(model, ctx.work_dir / "quantized.onnx")
    check_runs(output, config, ctx)
    path, warning = int8_saturation(model, ctx.targets, weights_from_model=False,
                                    activations_seven_bit=seven_bit == "activations")
    ctx.on_progress("counting int8 kernels")
    kernels = int8_kernels(output, model, list(config.verify_targets), ctx.work_dir)
    return StageResult(model=model, changed=True, path=saved_path(model, output),
                       findings=findings(quantized_nodes=quantized_node_counts(model),
                                         compute_nodes=compute_nodes(model), build_cpu_int8_path=path,
                                         int8_saturation_warning=warning, int8_kernels=kernels))


def int8_saturation(model: onnx.ModelProto, targets: tuple[str, ...], *, weights_from_model: bool,
               activations_seven_bit: bool = False) -> tuple[str, str | None]:
    """The build CPU's int8 path, and a warning when full-range int8 weights meet CPU targets that may saturate
    (None when they do not).

    ``weights_from_model``: the int8 weights were fixed by the model (lowered QAT), so qdeploy must not change them.
    ``activations_seven_bit``: activations are on 7 bits, which keeps full-range weights exact.
    """
    path = int8_path()
    wide = weights_beyond_seven_bits(model)
    cpu_targets = [target for target in targets if target in CPU_TARGETS] or ([] if targets else ["CPU targets"])
    warning = None
    if wide and cpu_targets and not activations_seven_bit:
        warning = (
            f"{len(wide)} int8 weight tensors use the full 8-bit range (e.g. {', '.join(wide[:3])}): on x86 CPUs "
            f"without VNNI (AVX2, AVX512 without VNNI) the int8 kernels of {', '.join(cpu_targets)} sum "
            "uint8 x int8 pairs into a saturating int16 and may clip; exact on VNNI CPUs. "
            + ("Their values come from the model (quantization-aware training) and are kept as they are; validate "
               "on the deployment CPU, or retrain with 7-bit weights" if weights_from_model
               else "Set quantize.reduce_range: true (or auto) for 7-bit weights"))
    return path.kind, warning


def _calibration_feeds(artifact: Artifact, config: PtqConfig, ctx: StageContext,
                       skip: frozenset[int]) -> Callable[[], Any]:
    """A fresh iterator over the calibration samples (those whose positions are not in ``skip``) per call."""
    calibration = config.calibration or CalibrationRef()

    def feeds() -> Any:
        samples = ctx.samples(calibration.data, artifact.path, calibration.samples + len(skip))
        return islice((sample for index, sample in enumerate(samples) if index not in skip), calibration.samples)

    return feeds


def _builder(artifact: Artifact, prepared: Path, excluded: list[str], config: Integer,
             ctx: StageContext, skip: frozenset[int] = frozenset()) -> _Built:
    """The model builder of the mode (calibrating first for ptq, on the calibration samples whose positions
    are not in ``skip``) and what it found."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.ptq._ptq import DynamicBuilder, StaticBuilder, calibrate
    from qdeploy.stages.quantize.ptq._shared_ranges import RangeSettings, shared_calibration

    op_types = _op_types(config, ctx)
    seven_bit, why = resolve_reduce_range(config, ctx.targets)
    if isinstance(config, DynamicConfig):
        return _Built(DynamicBuilder(prepared, excluded, ctx.work_dir, per_channel=config.per_channel,
                                     weight_type=config.weight_type, op_types=op_types,
                                     reduce_range=seven_bit == "weights"),
                      seven_bit, op_types, _reduce_range_finding(config, seven_bit, why))
    calibration = config.calibration or CalibrationRef()
    ctx.on_progress(f"calibrating ({config.method})")
    feeds = _calibration_feeds(artifact, config, ctx, skip)
    # per_runtime's builds of one variant calibrate once (_shared_ranges): only their placement differs
    ranges, calibrated = shared_calibration(
        ctx.work_dir, prepared, feeds, RangeSettings(op_types=op_types, method=config.method,
                                                     percentile=config.percentile),
        lambda: calibrate(prepared, op_types, feeds, ctx.work_dir, config.method, config.percentile))
    if calibrated.samples == 0:
        raise StageError(STAGE, ctx.variant, f"calibration dataset '{calibration.data or 'random'}' yielded no samples")
    ctx.on_progress("quantizing")

    @cache  # one quantizer pass per (form, signed): the 7-bit and the signed choices share their builds
    def static(form: str, signed: float) -> StaticBuilder:
        return StaticBuilder(prepared, ranges, excluded, per_channel=config.per_channel,
                             activation_type=config.activation_type, weight_type=config.weight_type,
                             symmetric_activations=config.symmetric_activations,
                             symmetric_weights=config.symmetric_weights, op_types=op_types, seven_bit=form,
                             runtime=config.runtime, signed_int8=signed, channel_peaks=calibrated.channel_peaks,
                             openvino_runs=openvino_runs(ctx.variant, ctx.targets), nonfinite=calibrated.nonfinite)

    def samples() -> list[dict[str, Any]]:
        # lazy: pulls onnxruntime (import cost)
        from qdeploy.stages.quantize.ptq._seven_bit import CHOICE_SAMPLES

        return list(ctx.samples(calibration.data, artifact.path, min(calibration.samples, CHOICE_SAMPLES)))

    compared: SevenBitComparison | None = None  # the report's record of the 7-bit choice
    # signed activations on int8 beside 7-bit unsigned ones only where nothing but OpenVINO runs the graph
    signed_beside_seven_bit = openvino_only(ctx.variant, ctx.targets)
    if seven_bit == "choose":
        # lazy: pulls onnxruntime (import cost)
        from qdeploy.stages.quantize.ptq._seven_bit import MARGIN_DB, OPENVINO_MARGIN_DB, choose_seven_bit

        ctx.on_progress("comparing 7-bit weights with 7-bit activations")
        # both as they would ship: OpenVINO's with its centred signed activations on int8 already
        first_signed = _first_signed(config)
        builders = {"weights": static("weights", first_signed),
                    "activations": static("activations", first_signed if signed_beside_seven_bit else 0.0)}
        # where 7-bit activations would keep every signed one uint8, they must pay for OpenVINO's slower kernels
        margin = MARGIN_DB if config.signed_choice() == "asymmetric" or signed_beside_seven_bit \
            else OPENVINO_MARGIN_DB
        chosen, compared = choose_seven_bit(builders, prepared, samples(), ctx.work_dir, margin)
        seven_bit = "activations" if chosen == "activations" else "weights"
    build, signed = _signed_activations(config, seven_bit == "activations", signed_beside_seven_bit,  # builds lazily
                                        partial(static, seven_bit, 0.0), ranges, partial(static, seven_bit),
                                        lambda candidates: _measure_signed(ctx, candidates, prepared, samples()))
    notes = CalibrationNotes(method=config.method,
                             percentile=config.percentile if config.method == "percentile" else None,
                             calibration_data=calibration.data or "random", calibration_samples=calibrated.samples,
                             calibrated_tensors=calibrated.tensors, ranges_clipped=calibrated.clipped,
                             calibration_skipped=sorted(skip) or None, float_concats=build.float_concats or None,
                             per_channel_depthwise=build.per_channel_depthwise or None,
                             shape_computed=build.shape_computed or None, nonfinite_float=build.nonfinite or None)
    reduce_range = _reduce_range_finding(config, seven_bit, why)
    if compared is not None:
        reduce_range.update(compared)
    return _Built(build, seven_bit, op_types, reduce_range, notes, signed)


def _first_signed(config: PtqConfig) -> float:
    """The signed activations ``signed_activations`` puts on int8 before measuring any (``_ptq.signed_int8_overrides``'s
    bound)."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.ptq._ptq import CENTRED, EVERY_SIGNED

    return {"asymmetric": 0.0, "measure": CENTRED, "symmetric": EVERY_SIGNED}[config.signed_choice()]


def _signed_activations(config: PtqConfig, seven_bit: bool, openvino_only: bool, unsigned: Callable[[], Any],
                        ranges: dict[str, tuple[float, float]], signed: Callable[[float], Any],
                        measure: Callable[[dict[str, Any]], tuple[str, SignedActivationsRecord]],
                        ) -> tuple[Any, SignedActivationsRecord]:
    """The builder to use (``unsigned()``'s, or one that ``signed(most_lopsided)`` makes:
    ``_ptq.signed_int8_overrides``) and the report's record of the choice (``stages/quantize/ptq/_signed.py``)."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.ptq._ptq import CENTRED, EVERY_SIGNED
    from qdeploy.stages.quantize.ptq._signed import lopsided

    choice, setting = config.signed_choice(), config.signed_activations
    if choice == "asymmetric":
        why = ("symmetric_activations: every activation is symmetric" if config.symmetric_activations else
               "set in the recipe" if setting == "asymmetric" else
               "auto: asymmetric for ONNX Runtime, whose x86 int8 kernels take uint8 activations")
        return unsigned(), SignedActivationsRecord(setting=setting, symmetric="none", why=why)
    if seven_bit and not openvino_only:  # ONNX Runtime's int8 kernels without VNNI shift int8 to uint8: saturating
        return unsigned(), SignedActivationsRecord(setting=setting, symmetric="none",
                                                   why="7-bit activations (reduce_range) stay unsigned where "
                                                       "ONNX Runtime or an unknown target may run the graph")
    only = " (beside 7-bit activations: convolution inputs only)" if seven_bit else ""
    if choice == "symmetric":
        return signed(EVERY_SIGNED), SignedActivationsRecord(setting=setting, symmetric="all",
                                                             why=f"set in the recipe{only}")
    centred = signed(CENTRED)
    negative = {name: ranges[name] for name in centred.quantized_tensors() & centred.signable
                if ranges.get(name, (0.0, 0.0))[0] < 0}
    if not negative:
        return centred, SignedActivationsRecord(setting=setting, symmetric="none", why=(
            "no convolution input it quantizes (beside 7-bit activations, the only int8 ones) is ever negative"
            if seven_bit else "no activation it quantizes is ever negative"))
    if not lopsided(negative, CENTRED):
        why = f"auto: every activation that can be negative is centred on zero{only}"
        return centred, SignedActivationsRecord(setting=setting, symmetric="all", why=why)
    candidates = {"all": signed(EVERY_SIGNED), "centred": centred}
    chosen, record = measure(candidates)
    return candidates[chosen], SignedActivationsRecord(**{**record, "why": record["why"] + only})


def _measure_signed(ctx: StageContext, candidates: dict[str, Any], prepared: Path,
                    samples: list[dict[str, Any]]) -> tuple[str, SignedActivationsRecord]:
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.ptq._signed import choose_signed

    ctx.on_progress("comparing int8 with uint8 for lopsided signed activations")
    return choose_signed(candidates, prepared, samples, ctx.work_dir)


def _mark_seven_bit(model: onnx.ModelProto, seven_bit: str) -> None:
    """Say in the model which operand is on 7 bits, so validation on any machine knows it cannot saturate."""
    entry = next((prop for prop in model.metadata_props if prop.key == SEVEN_BIT_KEY), None)
    if entry is None:
        entry = model.metadata_props.add()
        entry.key = SEVEN_BIT_KEY
    entry.value = seven_bit


def _reduce_range_finding(config: Integer, seven_bit: str, why: str) -> ReduceRangeRecord:
    """What the sidecar says of the 7-bit choice: the setting, the operand on 7 bits, and why."""
    return ReduceRangeRecord(setting=config.reduce_range, seven_bit=seven_bit, why=why)


def _op_types(config: Integer, ctx: StageContext | None = None) -> list[str]:
    """Op types to quantize: the config's, or the op set's (dynamic: ORT's integer ops that the stage's targets
    read), minus excluded types."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.ptq._ptq import default_op_types

    op_set = config.op_set if isinstance(config, PtqConfig) else "balanced"
    chosen = config.op_types if config.op_types is not None else default_op_types(
        config.mode, config.weight_type, op_set, openvino=ctx is not None and openvino_runs(ctx.variant, ctx.targets))
    return [op for op in chosen if op not in config.exclude_op_types]


def _budget_data(config: Integer) -> str | None:
    calibration = config.calibration if isinstance(config, PtqConfig) else None
    return config.budget.data or (calibration.data if calibration else None)


def _budget_shares_calibration(config: Integer) -> bool:
    """Whether the budget measures on the data that ptq calibrates on."""
    if not isinstance(config, PtqConfig):
        return False
    return _budget_data(config) == (config.calibration or CalibrationRef()).data


def _budget_feeds(artifact: Artifact, config: Integer, ctx: StageContext) -> list[Any]:
    dataset = _budget_data(config)
    feeds = list(ctx.samples(dataset, artifact.path, config.budget.samples))
    if not feeds:
        raise StageError(STAGE, ctx.variant, f"budget dataset '{dataset or 'random'}' yielded no samples")
    return feeds


def _unseen_by_calibration(config: Integer, budget_samples: int) -> frozenset[int]:
    """Positions of the budget's held-back samples in the calibration data, when both read the same dataset.

    The held-back samples confirm that the budget holds on data the search never saw; calibration must not see
    them either, or their error is as optimistic as the search samples' (ranges fitted to them) and the margin
    to unseen data is never measured."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.accuracy_budget.search import held_back_count

    if not _budget_shares_calibration(config) or budget_samples == 0:
        return frozenset()
    return frozenset(range(budget_samples - held_back_count(budget_samples), budget_samples))


def _with_budget(prepared: Path, build: Any, config: Integer, ctx: StageContext, feeds: list[Any],
                 unseen: frozenset[int]) -> tuple[onnx.ModelProto, list[str], BudgetFindings]:
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.accuracy_budget import targets as budget_targets
    from qdeploy.stages.accuracy_budget.search import meet_budget
    from qdeploy.stages.quantize.budget._options import budget_options
    from qdeploy.stages.quantize.budget._shadow import shadow_signal

    assert config.tolerance is not None
    runtime = config.runtime if isinstance(config, PtqConfig) else None
    result = meet_budget(build, shadow_signal(prepared, ctx.work_dir), prepared, feeds, config.tolerance,
                         ctx.work_dir, max_float_nodes=config.budget.max_float_nodes, on_progress=ctx.on_progress,
                         targets=budget_targets.plan_targets(ctx.targets, runtime), detections=ctx.detections,
                         **budget_options(config, ctx, prepared, _budget_data(config), len(feeds), runtime))
    found = result.findings.model_copy(update={
        "data": _budget_data(config) or "random",
        "held_back_unseen_by_calibration": bool(unseen) or not _budget_shares_calibration(config)})
    return result.model, result.kept, found


def nncf_ptq(artifact: Artifact, config: NncfPtqConfig, ctx: StageContext) -> StageResult:
    """engine nncf: NNCF builds the QDQ model (``_nncf.py``); the same checks and counts as qdeploy's own."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.ptq._nncf import quantize_with_nncf

    return _checked(*quantize_with_nncf(artifact, config, ctx), config, ctx)


def weight_only(artifact: Artifact, config: WeightOnlyConfig, ctx: StageContext) -> StageResult:
    """mode weight_only: block-quantized MatMul/Gather weights written file to file, loaded by ORT before use."""
    import onnx

    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.weight_only._build import quantize_file
    from qdeploy.stages.quantize.weight_only._data import calibration_feeds, data_findings

    ctx.on_progress(f"weight-only int{config.bits} {config.method} ({config.weight_format})")
    output = ctx.work_dir / "weight_only.onnx"
    report = quantize_file(artifact.path, output, config, calibration_feeds(config, artifact.path, ctx), ctx.cache_dir)
    if not report.quantized:
        kept = "; ".join(f"{node}: {why}" for node, why in list(report.kept_float.items())[:5])
        raise StageError(STAGE, ctx.variant, "mode weight_only found no MatMul with a constant 2-D float weight "
                                             "and no Gather of a constant 2-D float table to quantize"
                                             + (f" (kept float: {kept})" if kept else "")
                                             + "; it is meant for transformer and LLM weights: use ptq or dynamic "
                                               "for this model")
    check_runs(output, config, ctx)
    large = report.bytes_out >= PROTOBUF_SAFE_BYTES
    model = onnx.load(str(output), load_external_data=not large)
    bits: dict[str, int] = {}
    for entry in report.quantized.values():
        key = f"{entry['op']} int{entry['bits']}"
        bits[key] = bits.get(key, 0) + 1
    findings = WeightOnlyFindings(
        bits=config.bits, group_size=config.group_size, symmetric=config.symmetric_weights,
        weight_format=config.weight_format,
        accuracy_level=config.accuracy_level if config.weight_format == "matmulnbits" else None,
        quantized_weights=bits, kept_float=report.kept_float, blocks=report.blocks or None,
        bytes={"before": artifact.size_bytes, "after": report.bytes_out}, **data_findings(config, report))
    return StageResult(model=model, changed=True, findings=findings, path=output if large else None)


def lower(artifact: Artifact, config: LowerConfig, ctx: StageContext) -> StageResult:
    """mode lower: rewrite fake quantization into Q/DQ, verify it on data, count int8 kernels."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.lower import lower_model, verify_on_data
    from qdeploy.stages.quantize.ptq._concat_uint8 import moved_where_openvino_runs

    ctx.on_progress("lowering fake quantization")
    model = artifact.load()
    name_nodes_uniquely(model)  # the lowering's records and its new nodes' names derive from node names
    result = lower_model(model, ctx.variant)
    lowered = result.model
    note = "no fake quantization found; the model is unchanged" if not result.sites else None
    # as for ptq: OpenVINO rewrites a zero point shared by several dequantizations for all its readers
    unshared = unshare_qdq_parameters(lowered) if result.sites else None
    moved = moved_where_openvino_runs(lowered, ctx.variant, ctx.targets)  # exact: no int8 at a Concat for OpenVINO
    output = save_stage_model(lowered, ctx.work_dir / "lowered.onnx")
    check_runs(output, config, ctx)
    dataset = config.calibration.data if config.calibration else None
    limit = config.calibration.samples if config.calibration else VERIFY_SAMPLES
    ctx.on_progress("verifying the lowered model against the fake-quant reference")
    verification = verify_on_data(lowered, result.checks, ctx.samples(dataset, artifact.path, limit), ctx.work_dir,
                                  ctx.variant)
    path, warning = int8_saturation(lowered, ctx.targets, weights_from_model=True)
    findings = LowerFindings(**dict(result.findings), note=note, qdq_parameters_unshared=unshared,
                             verification={**verification, "data": dataset or "random"},
                             quantized_nodes=quantized_node_counts(lowered), build_cpu_int8_path=path,
                             int8_saturation_warning=warning, uint8_at_concats=moved,
                             int8_kernels=int8_kernels(output, lowered, list(config.verify_targets), ctx.work_dir))
    return StageResult(model=lowered, changed=result.sites > 0, findings=findings, path=saved_path(lowered, output))
