"""The ``simplify`` stage: shape inference, constant folding and onnxoptimizer passes, to a fixed point.

The algorithm is onnx-simplifier's: infer shapes, fold what is constant
(``stages.folding``), run onnxoptimizer's fuse and eliminate passes, and repeat
until the graph stops changing.  Then the simplified model is compared with the
original on seeded random inputs in ONNX Runtime; a disagreement fails the
stage, so the runner keeps the unsimplified model.

Deliberate limits of this version: subgraphs (If/Loop/Scan bodies) are not
simplified; a simplified model above 1.8 GB is not checked, because a
ModelProto that large cannot be serialised for ONNX Runtime (folding still
works, in pieces small enough for it).
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pipeline.context import Artifact, StageContext, StageResult
from pipeline.errors import StageError

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from stages.folding import FoldReport

log = logging.getLogger(__name__)

STAGE = "simplify"
# Deployment defaults: every pass keeps the model's interface and its numerics (up to float reassociation).
DEFAULT_PASSES = (
    "eliminate_identity",
    "eliminate_nop_transpose",
    "eliminate_nop_pad",
    "eliminate_nop_dropout",
    "eliminate_nop_cast",
    "eliminate_nop_reshape",
    "eliminate_shape_gather",  # Shape -> Gather of dimensions that are static even when others are not
    "eliminate_slice_after_shape",
    "eliminate_shape_op",
    "fuse_consecutive_transposes",
    "fuse_bn_into_conv",
    "fuse_pad_into_conv",
    "fuse_add_bias_into_conv",
    "fuse_matmul_add_bias_into_gemm",
    "extract_constant_to_initializer",
    "eliminate_common_subexpression",
    "eliminate_deadend",
    "eliminate_unused_initializer",
    "eliminate_duplicate_initializer",
)
# onnxoptimizer passes that change a model's inputs/outputs or split it: never part of a simplification.
INTERFACE_PASSES = frozenset({"rename_input_output", "rewrite_input_dtype", "split_init", "split_predict"})
LARGE_MODEL_BYTES = int(1.8 * 2**30)
"""Above this, ONNX Runtime cannot take the model as one serialised ModelProto."""
INFER_BY_PATH_BYTES = int(1.5 * 2**30)
"""Above this, shape inference goes through a file."""


class SimplifyConfig(BaseModel):
    """Settings of the simplify stage."""

    model_config = ConfigDict(extra="forbid")

    check_n: int = Field(default=3, ge=0, description="Seeded random inputs on which the simplified model must "
                         "agree with the original in ONNX Runtime; 0 disables the check.")
    check_atol: float = Field(default=1e-4, ge=0.0, description="Absolute part of the check's elementwise "
                              "limit atol + rtol * |original| on float outputs.")
    check_rtol: float = Field(default=1e-3, ge=0.0, description="Relative part of the check's elementwise limit; "
                              "fusing BatchNormalization reassociates float32 arithmetic.")
    skip_fuse_bn: bool = Field(default=False, description="Keep BatchNormalization nodes apart from Conv.")
    skipped_passes: list[str] = Field(default_factory=list, description="onnxoptimizer passes to leave out of "
                                      "the default list.")
    extra_passes: list[str] = Field(default_factory=list, description="onnxoptimizer passes to run besides the "
                                    "default list.")
    fold_size_limit_mb: float = Field(default=16.0, gt=0.0, description="Largest tensor (MiB) that constant "
                                      "folding may add; larger ones (Tile, Expand, ConstantOfShape) stay computed.")
    max_iterations: int = Field(default=10, ge=1, description="Most rounds of inference, folding and passes "
                                "before stopping short of a fixed point.")
    fold_constants: bool = Field(default=True, description="Evaluate constant subgraphs into initializers; "
                                 "Constant nodes become initializers either way. Off, BatchNormalization is not "
                                 "fused (the fused weights need folding).")

    @field_validator("skipped_passes", "extra_passes")
    @classmethod
    def _known_passes(cls, names: list[str], info: ValidationInfo) -> list[str]:
        import onnxoptimizer

        available = set(onnxoptimizer.get_available_passes())
        unknown = [name for name in names if name not in available]
        if unknown:
            raise ValueError(f"unknown onnxoptimizer pass(es) {unknown} in '{info.field_name}'; onnxoptimizer "
                             f"{onnxoptimizer.__version__} has: {', '.join(sorted(available))}")
        return names

    @model_validator(mode="after")
    def _consistent_passes(self) -> SimplifyConfig:
        both = sorted(set(self.skipped_passes) & set(self.extra_passes))
        if both:
            raise ValueError(f"passes {both} are in both 'skipped_passes' and 'extra_passes'")
        if (self.skip_fuse_bn or not self.fold_constants) and "fuse_bn_into_conv" in self.extra_passes:
            raise ValueError("'extra_passes' asks for fuse_bn_into_conv, but 'skip_fuse_bn' is true or "
                             "'fold_constants' is false (the fused weights need folding)")
        interface = sorted(INTERFACE_PASSES & set(self.extra_passes))
        if interface:
            raise ValueError(f"passes {interface} change the model's inputs or outputs; simplify cannot run them")
        return self

    def passes(self) -> list[str]:
        """The onnxoptimizer passes this config runs, in order."""
        # fuse_bn_into_conv leaves the fused weights as a constant subgraph that only folding turns into tensors.
        no_bn = self.skip_fuse_bn or not self.fold_constants
        skipped = set(self.skipped_passes) | ({"fuse_bn_into_conv"} if no_bn else set())
        chosen = [name for name in DEFAULT_PASSES if name not in skipped]
        return chosen + [name for name in self.extra_passes if name not in chosen]

    @property
    def fold_limit_bytes(self) -> int:
        return int(self.fold_size_limit_mb * 2**20)


@dataclass
class _Progress:
    """What the simplification loop did, gathered over its iterations."""

    iterations: int = 0
    folded_tensors: int = 0
    folded_nodes: int = 0
    constants_converted: int = 0
    skipped: dict[str, dict[str, Any]] = field(default_factory=dict)
    failed_ops: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)

    def add_fold(self, report: FoldReport) -> None:
        self.folded_tensors += report.folded_tensors
        self.folded_nodes += report.folded_nodes
        self.constants_converted += report.constants_converted
        self.skipped.update((entry["tensor"], entry) for entry in report.skipped)
        self.failed_ops.update(report.failed_ops)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def run(artifact: Artifact, config: SimplifyConfig, ctx: StageContext) -> StageResult:
    """Simplify ``artifact``'s model; check it against the original; report what changed."""
    from stages.folding import constants_to_initializers, has_subgraph, sync_legacy_inputs

    model = artifact.load()
    before = _fingerprint(model)
    nodes_before = _op_counts(model)
    interface = _io_names(model)
    progress = _Progress()
    subgraph_ops = sorted({node.op_type for node in model.graph.node if has_subgraph(node)})
    if subgraph_ops:
        progress.note(f"subgraphs left unsimplified (in {', '.join(subgraph_ops)} nodes)")
    model = _simplify(model, config, ctx.work_dir, progress)
    progress.constants_converted += constants_to_initializers(model.graph)
    sync_legacy_inputs(model, drop_unused="eliminate_unused_initializer" in config.passes())
    _prune_value_info(model)
    if _io_names(model) != interface:
        raise StageError(STAGE, ctx.variant, f"simplification changed the model's inputs/outputs from "
                         f"{interface} to {_io_names(model)}")
    if model_bytes(model) > LARGE_MODEL_BYTES:
        check: dict[str, Any] = {"skipped": "the simplified model is above 1.8 GB: it cannot be serialised for "
                                 "ONNX Runtime; this version does not check it"}
    elif config.check_n == 0:
        check = {"skipped": "check_n is 0"}
    else:
        check = check_equivalence(artifact.path, model, config, ctx)
    findings = _findings(nodes_before, model, config, progress, check)
    log.info("simplify: %d -> %d nodes in %d iteration(s); %d tensor(s) folded", findings["node_count_before"],
             findings["node_count_after"], progress.iterations, progress.folded_tensors)
    return StageResult(model=model, changed=_fingerprint(model) != before, findings=findings)


def _simplify(model: onnx.ModelProto, config: SimplifyConfig, work_dir: Path, progress: _Progress) -> onnx.ModelProto:
    """Shape inference, folding and passes, repeated until the graph stops changing."""
    from stages.folding import constants_to_initializers, fold_constants, sync_legacy_inputs

    passes = config.passes()
    for iteration in range(1, config.max_iterations + 1):
        progress.iterations = iteration
        start = _fingerprint(model)
        model = infer_shapes(model, work_dir, progress)
        if config.fold_constants:
            progress.add_fold(fold_constants(model, limit_bytes=config.fold_limit_bytes))
        else:
            progress.constants_converted += constants_to_initializers(model.graph)
        if passes:
            model = _optimize(model, passes, progress)
        sync_legacy_inputs(model, drop_unused="eliminate_unused_initializer" in passes)
        if _fingerprint(model) == start:
            return model
    progress.note(f"stopped after max_iterations={config.max_iterations} before reaching a fixed point")
    return model


def infer_shapes(model: onnx.ModelProto, work_dir: Path, progress: _Progress) -> onnx.ModelProto:
    """ONNX shape inference (strict off); through a file for large models; the model unchanged on failure."""
    import onnx

    _prune_value_info(model)
    if model_bytes(model) > INFER_BY_PATH_BYTES:
        return _infer_shapes_by_path(model, work_dir, progress)
    for data_prop in (True, False):
        try:
            return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=data_prop)
        except Exception as exc:  # inference is best effort; folding works with what it knows
            failure = exc
    progress.note(f"shape inference failed: {_short(failure)}")
    return model


def _infer_shapes_by_path(model: onnx.ModelProto, work_dir: Path, progress: _Progress) -> onnx.ModelProto:
    import onnx

    work_dir.mkdir(parents=True, exist_ok=True)
    source, target, data = (work_dir / name for name in ("infer_in.onnx", "infer_out.onnx", "infer_in.data"))
    # Saving with external data moves the tensors' bytes out of ``model``: it is reloaded in both outcomes.
    onnx.save(model, str(source), save_as_external_data=True, location=data.name)
    try:
        onnx.shape_inference.infer_shapes_path(str(source), str(target), strict_mode=False, data_prop=True)
        return onnx.load(str(target))
    except Exception as exc:  # inference is best effort
        progress.note(f"shape inference failed: {_short(exc)}")
        return onnx.load(str(source))
    finally:
        for path in (source, target, data):
            path.unlink(missing_ok=True)


def _optimize(model: onnx.ModelProto, passes: list[str], progress: _Progress) -> onnx.ModelProto:
    """onnxoptimizer's passes to a fixed point; the input model when they fail or touch the interface."""
    import onnxoptimizer

    try:
        optimized = onnxoptimizer.optimize(model, passes, fixed_point=True)
    except Exception as exc:  # a crash of the optimizer must not lose the folding done so far
        progress.note(f"onnxoptimizer failed, its passes were not applied: {_short(exc)}")
        return model
    if _io_names(optimized) != _io_names(model):
        progress.note("onnxoptimizer changed the model's inputs/outputs; its result was discarded")
        return model
    return optimized


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


def check_equivalence(original: Path, model: onnx.ModelProto, config: SimplifyConfig,
                      ctx: StageContext) -> dict[str, Any]:
    """Run original and simplified models on seeded random feeds; StageError when they disagree."""
    from calibration.readers import model_inputs, random_samples

    try:
        reference = _session(str(original))
    except Exception as exc:  # custom ops or a runtime too old: nothing to compare against
        return {"skipped": f"the original model does not run in ONNX Runtime (custom ops?): {_short(exc)}"}
    try:
        candidate = _session(model.SerializeToString())
    except Exception as exc:
        raise StageError(STAGE, ctx.variant, f"the simplified model does not load in ONNX Runtime "
                         f"while the original does: {_short(exc)}") from exc
    feeds_iter = random_samples(model_inputs(original), config.check_n, seed=0, ranges=_input_ranges(ctx))
    worst = 0.0
    for index, feeds in enumerate(feeds_iter):
        try:
            expected = _outputs(reference, feeds)
        except Exception as exc:  # random feeds may be invalid for this model (e.g. token ids)
            return {"skipped": f"the original model fails on random inputs: {_short(exc)}"}
        try:
            actual = _outputs(candidate, feeds)
        except Exception as exc:
            raise StageError(STAGE, ctx.variant, f"the simplified model fails on random sample {index} "
                             f"where the original runs: {_short(exc)}") from exc
        comparison = compare_outputs(expected, actual, atol=config.check_atol, rtol=config.check_rtol)
        if not comparison.passed:
            raise StageError(STAGE, ctx.variant, f"simplified model disagrees with the original on random sample "
                             f"{index}: {comparison.reason}")
        worst = max(worst, comparison.max_abs_err)
    return {"samples": config.check_n, "max_abs_err": worst, "atol": config.check_atol, "rtol": config.check_rtol}


def _session(model: str | bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # Both models run exactly as written: the check judges our rewrite, not ONNX Runtime's.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _outputs(session: Any, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    names = [out.name for out in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _input_ranges(ctx: StageContext) -> dict[str, tuple[float | None, float | None]]:
    specs = getattr(getattr(ctx.recipe, "model", None), "inputs", None) or []
    return {spec.name: (spec.low, spec.high) for spec in specs}


def _findings(nodes_before: dict[str, int], model: onnx.ModelProto, config: SimplifyConfig, progress: _Progress,
              check: dict[str, Any]) -> dict[str, Any]:
    nodes_after = _op_counts(model)
    return {
        "nodes_before": nodes_before,
        "nodes_after": nodes_after,
        "node_count_before": sum(nodes_before.values()),
        "node_count_after": sum(nodes_after.values()),
        "folded_tensors": progress.folded_tensors,
        "folded_nodes": progress.folded_nodes,
        "constants_converted": progress.constants_converted,
        "fold_skipped": sorted(progress.skipped.values(), key=lambda entry: entry["tensor"]),
        "fold_failed_ops": sorted(progress.failed_ops),
        "passes": config.passes(),
        "iterations": progress.iterations,
        "check": check,
        "notes": list(progress.notes),
    }


def model_bytes(model: onnx.ModelProto) -> int:
    """Serialised size of the model, summed piecewise (a whole ModelProto above 2 GB cannot be measured)."""
    graph = model.graph
    return (sum(init.ByteSize() for init in graph.initializer) + sum(node.ByteSize() for node in graph.node)
            + sum(function.ByteSize() for function in model.functions))


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts = Counter(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
                     for node in model.graph.node)
    return dict(sorted(counts.items()))


def _io_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """The model's interface: inputs that are not initializers (IR < 4 lists those too), and outputs."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer} if model.ir_version < 4 else set()
    return ([value.name for value in graph.input if value.name not in initializers],
            [value.name for value in graph.output])


def _fingerprint(model: onnx.ModelProto) -> str:
    """Hash of the graph's structure: nodes, initializer names/types/shapes, inputs and outputs (not value_info)."""
    digest = hashlib.sha256()
    graph = model.graph
    for node in graph.node:
        digest.update(node.SerializeToString(deterministic=True))
    for init in graph.initializer:
        digest.update(f"{init.name}:{init.data_type}:{list(init.dims)};".encode())
    digest.update(repr(_io_names(model)).encode())
    return digest.hexdigest()


def _prune_value_info(model: onnx.ModelProto) -> None:
    """Drop top-level value_info of names no node produces any more (folded or removed)."""
    graph = model.graph
    produced = {name for node in graph.node for name in node.output}
    stale = [value for value in graph.value_info if value.name not in produced]
    for value in stale:
        graph.value_info.remove(value)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
