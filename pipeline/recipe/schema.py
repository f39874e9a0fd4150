"""Pydantic models of a recipe.

Field names here are a contract with users' recipe files: add fields, never
rename them.  Rules that tie fields together live in validators so that a bad
recipe fails when it is loaded, not in the middle of a run.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from qdeploy.calibration import data_context
from qdeploy.calibration.spec import DatasetSpec
from qdeploy.core.context import StageContext
from qdeploy.core.runtimes import (
    RUNTIMES,
    artifact_of,
    built_for,
    is_device_default,
    is_setting_row,
    runtime_of_target,
    runtime_of_variant,
    setting_of,
    split_name,
)
from qdeploy.core.stage_config import StageConfig, variant_tolerance
from qdeploy.core.tolerance import StrictModel, Tolerance
from qdeploy.pipeline.recipe import registry
from qdeploy.pipeline.recipe.text_data import with_model_tokenizer
from qdeploy.stages.benchmark.config import BenchmarkConfig
from qdeploy.stages.export.config import ExportConfig
from qdeploy.stages.validate.config import ValidateConfig
from qdeploy.targets import KNOWN_TARGETS, TRUE_FP16_TARGET, true_fp16_check

__all__ = [
    "EXPORTED",
    "MAX_GATE_BATCH",
    "ONCE_PER_VARIANT",
    "SAFE_NAME",
    "GateMetric",
    "GateSpec",
    "Recipe",
    "ReportSpec",
    "StepError",
    "VariantStep",
]

EXPORTED = "exported"
"""Name of the implicit variant that is the exported model as it is (the default reference)."""


MAX_GATE_BATCH = 65_536
ONCE_PER_VARIANT = {"fp16": "converted to float16", "quantize": "quantized"}
"""Stages that refuse their own output: a second one in a chain can only fail."""


GateMetric = Literal[
    "speedup", "latency_ms", "throughput_per_s", "inferences_per_s", "size_bytes",
    "cosine", "snr_db", "max_abs_err", "mean_abs_err", "top1_agreement", "kl", "task_metric", "detections_matched",
    "decode_tokens_per_s", "decode_speedup",
]
"""What a gate may hold; kl (per-token KL divergence from the reference's logits) is lower-is-better, like the
errors: gate it with 'max'.  task_metric is the validate.metric's value, perplexity (lower is better) or
log_likelihood included.  decode_tokens_per_s (gate with 'min') and decode_speedup (the reference's decode ms per
token over the variant's on the same target; 'min') read a language model's decode record (KV cache); a gate on
them fails where the row has none.  detections_matched ('min') is the lower of recall and precision of the boxes
matched by validate.detections."""


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
"""A recipe's name: it names the run's folder (runs/<name>), so never a path."""


class GateSpec(StrictModel):
    """An acceptance goal; a missed one makes `qdeploy run` exit 1."""

    variant: str = Field(description="Variant the gate applies to; on openvino targets '<variant>@f32' (a "
                                     "weight-only artifact with float32 activations) or '<reference>@default' (the "
                                     "reference at the device's default precision) names that row.")
    target: str = Field(description="Target the gate applies to.")
    metric: GateMetric = Field(description="Measured quantity; kl, the errors, latency_ms and size_bytes are "
                                           "lower-is-better (gate them with max); decode_tokens_per_s and "
                                           "decode_speedup (against the reference on the same target) are a "
                                           "language model's decode speed with its KV cache (gate them with min).")  # type: ignore[valid-type]
    min: float | None = Field(default=None, description="Lowest accepted value.")
    max: float | None = Field(default=None, description="Highest accepted value.")
    batch_size: int = Field(default=1, ge=1, le=MAX_GATE_BATCH, description="Batch size of latency gates.")

    @model_validator(mode="after")
    def _has_bound(self) -> GateSpec:
        if self.min is None and self.max is None:
            raise ValueError("a gate needs 'min' or 'max'")
        if any(bound is not None and math.isnan(bound) for bound in (self.min, self.max)):
            raise ValueError("a gate's 'min' and 'max' are numbers, not NaN (a NaN bound could never fail)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}: no value could pass; swap them")
        return self


class PackagesSpec(StrictModel):
    """Deployable packages a run writes to OUT/packages/ (docs/packages.md)."""

    enabled: bool = Field(default=True, description="Write a package per target for the artifact to ship there.")
    which: Literal["verdict", "passed"] = Field(
        default="verdict", description="verdict: per target, the artifact the verdict ships there; passed: every "
                                       "artifact that passed validation on the target.")
    ort_optimized: bool = Field(
        default=False, description="Also put an ORT_ENABLE_EXTENDED-optimized model in ort:* packages (kept only "
                                   "when it passes the package check; ALL-level files are CPU-specific, never "
                                   "written).")
    check_samples: int | None = Field(
        default=None, ge=1, description="Validation samples (with the reference's outputs) each package's check.py "
                                        "runs: by default all that validation compared, so a package is held to "
                                        "its limits on the samples it passed them on (a subset's metrics can fall "
                                        "below the whole set's). As many as fit in 16 MiB; when not even one "
                                        "does, the package is unchecked.")


class ReportSpec(StrictModel):
    """Which report files to write, and what the verdict may overlook."""

    formats: list[Literal["json", "md", "html"]] = Field(default=["json", "md", "html"], description="Report formats.")
    allow_unmeasured: list[Literal["validate", "benchmark"]] = Field(
        default=[], description="Measurements that may error (or be missing) without failing the run: the report "
                                "still lists them under 'unmeasured'. By default a validation or benchmark row the "
                                "recipe asked for that could not be measured makes the run fail (exit 1); "
                                "unavailable targets never do.")
    packages: PackagesSpec = Field(default_factory=PackagesSpec, description="Deployable packages (OUT/packages/).")
    layers: Literal["auto", "off", "full"] = Field(
        default="auto", description="Per-layer facts (time, precision that ran, error, decisions) from a profiling "
                                    "pass after the benchmark: 'auto' profiles what the verdict ships on each target "
                                    "and every pair whose validation failed, and keeps the top rows; 'full' profiles "
                                    "every pair and keeps every row; 'off' skips the pass (docs/report.md).")
    tie_break: Literal["fidelity", "size"] = Field(
        default="fidelity", description="Which of the artifacts the benchmark cannot tell apart the verdict ships: "
                                        "'fidelity' (the default) the one closest to the reference, the reference "
                                        "first; 'size' the smallest. The ship line says which rule decided.")


class VariantStep(StrictModel):
    """One transform stage of a variant, with its config parsed once into the stage's model."""

    stage: str
    config: StageConfig

    @field_serializer("config")
    def _dumped(self, config: StageConfig) -> dict[str, Any]:
        """The config as its stage's model dumps it: what cache keys, the plan and the recipe's fingerprint hash
        (the same bytes as when steps held that dump)."""
        return config.model_dump(mode="json")


class StepError(ValueError):
    """A bad step inside a variant; carries where it is so the loader can point at its line."""

    def __init__(self, variant: str, index: int, loc: tuple[str | int, ...], message: str) -> None:
        self.variant = variant
        self.index = index
        self.loc = loc
        self.message = message
        super().__init__(f"variants.{variant}[{index}]: {message}")


def _parse_step(raw: Any) -> VariantStep:
    if isinstance(raw, VariantStep):
        return raw
    if isinstance(raw, str):
        name, config = raw, {}
    elif isinstance(raw, dict) and len(raw) == 1:
        name, config = next(iter(raw.items()))
        config = {} if config is None else config
        if not isinstance(config, dict):
            raise ValueError(f"config of stage '{name}' must be a mapping, got {type(config).__name__}")
    else:
        raise ValueError("a step is a stage name or a one-key mapping {stage: config}")
    info = registry.transform_stage(name)
    return VariantStep(stage=name, config=info.config.model_validate(config))


def _parse_variant(name: str, steps: list[Any]) -> list[VariantStep]:
    parsed = _parse_steps(name, steps)
    for stage, verb in ONCE_PER_VARIANT.items():
        where = [index for index, step in enumerate(parsed) if step.stage == stage]
        if len(where) > 1:
            raise StepError(name, where[1], (), f"stage '{stage}' appears twice in variant '{name}' (steps "
                                                f"{where[0] + 1} and {where[1] + 1}): a model is {verb} once; "
                                                "remove one, or make another variant")
    return parsed


def _parse_steps(name: str, steps: list[Any]) -> list[VariantStep]:
    parsed = []
    for index, raw in enumerate(steps):
        try:
            parsed.append(_parse_step(raw))
        except ValidationError as exc:
            error = exc.errors()[0]
            stage = next(iter(raw)) if isinstance(raw, dict) else str(raw)
            loc = (stage, *error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            if error["type"] == "extra_forbidden":
                message = f"unknown field '{error['loc'][-1]}' of stage '{stage}'"
            raise StepError(name, index, loc, message) from None
        except ValueError as exc:
            raise StepError(name, index, (), str(exc)) from None
    return parsed


_VARIANT_NAME = rf"[A-Za-z0-9][A-Za-z0-9_.-]*(@({'|'.join(RUNTIMES)}))?"


def _split_per_runtime(variants: dict[str, list[VariantStep]], targets: list[str],
                       reference: str | None) -> tuple[dict[str, list[VariantStep]], dict[str, list[str]]]:
    """Variants with a ``per_runtime`` step become one variant per runtime among ``targets``
    (``int8`` -> ``int8@ort``, ``int8@openvino``).  ``true``: that step's config specialised by its stage for the
    runtime, for each runtime targeted.  ``auto``: only where the targets hold more than one runtime, the config
    left as written (``qdeploy.pipeline.run.per_runtime`` specialises it when the build finds that the placements
    differ), never for ``reference`` (it runs on every target) nor a variant already built for one runtime.
    Returns the new variants and what each split variant became."""
    runtimes = [runtime for runtime in RUNTIMES if any(runtime_of_target(t) == runtime for t in targets)]
    result: dict[str, list[VariantStep]] = {}
    split: dict[str, list[str]] = {}
    for name, steps in variants.items():
        where = [index for index, step in enumerate(steps) if step.config.per_runtime_build() == "always"]
        auto = not where and len(runtimes) > 1 and name != reference and not runtime_of_variant(name) \
            and any(step.config.per_runtime_build() == "auto" for step in steps)
        if not where and not auto:
            result[name] = _for_openvino_only(steps, runtimes) if not runtime_of_variant(name) else steps
            continue
        if runtime_of_variant(name):
            raise ValueError(f"variant '{name}' is already built for one runtime; per_runtime splits a variant "
                             "per runtime: remove it, or the '@' suffix")
        if not runtimes:
            raise ValueError(f"variant '{name}' has per_runtime, but the recipe's targets {targets} hold no "
                             f"{' or '.join(RUNTIMES)} target to build for")
        split[name] = []
        for runtime in runtimes:
            specialised = [_for_runtime(step, runtime) if index in where else step
                           for index, step in enumerate(steps)]
            result[split_name(name, runtime)] = specialised
            split[name].append(split_name(name, runtime))
    clashes = sorted(made for names in split.values() for made in names if made in variants)
    if clashes:
        raise ValueError(f"variants {clashes} are both written in the recipe and made by per_runtime; rename one")
    return result, split


def _for_runtime(step: VariantStep, runtime: str) -> VariantStep:
    return VariantStep(stage=step.stage, config=step.config.for_runtime(runtime))


def _for_openvino_only(steps: list[VariantStep], runtimes: list[str]) -> list[VariantStep]:
    """Where OpenVINO is the targets' only runtime, the ``per_runtime: auto`` steps shaped for it, the variant's
    name kept.  They took ONNX Runtime's placement, the one graph for both: captcha-whisperer's CRNN ran 8% slower
    than NNCF's graph on OpenVINO with it (355 QuantizeLinear), 5% faster with OpenVINO's (103)."""
    if runtimes != ["openvino"]:
        return steps
    return [_for_runtime(step, "openvino") if step.config.per_runtime_build() == "auto" else step
            for step in steps]


def _gates_on_builds(gates: list[GateSpec], split: dict[str, list[str]]) -> list[GateSpec]:
    """Gates naming a split variant, pointed at its build for the gate's target (``int8`` on openvino:cpu ->
    ``int8@openvino``): the recipe's names keep working when per_runtime splits them."""
    pointed = []
    for index, gate in enumerate(gates):
        named, setting = artifact_of(gate.variant), setting_of(gate.variant)  # 'int4@f32': int4's f32 row
        if named in split:
            build = [made for made in split[named] if built_for(made, gate.target)]
            if not build:
                raise ValueError(f"gates[{index}] names variant '{named}', which per_runtime splits into "
                                 f"{split[named]}, none of which runs on {gate.target}")
            gate = gate.model_copy(update={"variant": f"{build[0]}@{setting}" if setting else build[0]})
        pointed.append(gate)
    return pointed


def _name_task_metrics(variants: dict[str, list[VariantStep]], metric: str | None) -> None:
    """A budget's task-metric tolerance that names no metric gets validate.metric (the issue's "the recipe's
    validate.metric, or its own"), so the stage, its cache key and the plan all see the one it uses."""
    for variant, steps in variants.items():
        for index, step in enumerate(steps):
            budget = step.config.task_budget()
            if budget is None or budget.metric is not None:
                continue
            if metric is None:
                raise StepError(variant, index, (step.stage, "tolerance", "metric"),
                                f"{step.stage} tolerance names no metric and validate.metric is not set: name one "
                                "('metrics.py:accuracy') here or in validate.metric")
            steps[index] = VariantStep(stage=step.stage, config=step.config.with_task_metric(metric))


class Recipe(StrictModel):
    """A whole qdeploy recipe."""

    name: str = Field(description="Name of the recipe; the default output folder is runs/<name>/.")
    model: ExportConfig = Field(description="Where the model comes from and how it is exported.")
    data: dict[str, DatasetSpec] = Field(default_factory=dict, description="Named datasets.")
    variants: dict[str, list[VariantStep]] = Field(description="Variant name -> chain of transform stages.")
    targets: list[str] = Field(default=["ort:cpu"], description="Targets as runtime:device.")
    validate_: ValidateConfig = Field(default_factory=ValidateConfig, alias="validate",
                                      description="Validation against the reference (see `validate`).")
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig, description="Latency measurement settings.")
    gates: list[GateSpec] = Field(default_factory=list, description="Acceptance goals; a missed one exits 1.")
    report: ReportSpec = Field(default_factory=ReportSpec, description="Report formats to write.")

    # frozen: what a run decides (per_runtime's builds, say) goes to its own state and results, never onto its recipe
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    _source: Path | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not SAFE_NAME.fullmatch(value):
            raise ValueError("name may hold letters, digits, '_', '.', '-' and must start with a letter or digit")
        return value

    @field_validator("variants", mode="before")
    @classmethod
    def _steps(cls, value: Any) -> Any:
        if not isinstance(value, dict) or not value:
            raise ValueError("variants must be a non-empty mapping of name -> list of stages")
        parsed = {}
        for name, steps in value.items():
            if not re.fullmatch(_VARIANT_NAME, str(name)):
                raise ValueError(f"variant name '{name}' may hold letters, digits, '_', '.', '-', and end in "
                                 f"'@<runtime>' ({', '.join(RUNTIMES)}) for a variant built for one runtime")
            if name == EXPORTED:
                raise ValueError(f"variant name '{EXPORTED}' is reserved for the exported model itself")
            if steps is None:
                steps = []
            if not isinstance(steps, list):
                raise ValueError(f"variant '{name}' must be a list of stages")
            parsed[name] = _parse_variant(str(name), steps)
        return parsed

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, targets: list[str]) -> list[str]:
        for target in targets:
            if target not in KNOWN_TARGETS:
                close = difflib.get_close_matches(target, KNOWN_TARGETS, n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise ValueError(f"unknown target '{target}'; {hint}known targets: {', '.join(KNOWN_TARGETS)}")
        if len(set(targets)) != len(targets):
            raise ValueError(f"targets repeat: {targets}")
        return targets

    @model_validator(mode="after")
    def _cross_references(self) -> Recipe:
        variants, split = _split_per_runtime(self.variants, self.targets, self.validate_.reference)
        self.__dict__.update(variants=variants, gates=_gates_on_builds(self.gates, split))  # completed, then frozen
        self._check_runtime_variants(split)
        _name_task_metrics(self.variants, self.validate_.metric)
        if self.validate_.data is not None and self.validate_.data not in self.data:
            raise ValueError(f"validate.data names dataset '{self.validate_.data}'; defined: {sorted(self.data)}")
        if self.benchmark.data is not None and self.benchmark.data not in self.data:
            raise ValueError(f"benchmark.data names dataset '{self.benchmark.data}'; defined: {sorted(self.data)}")
        known_variants = [*self.variants, EXPORTED]
        if self.validate_.reference is not None and self.validate_.reference not in known_variants:
            raise ValueError(
                f"validate.reference names variant '{self.validate_.reference}'; defined: {sorted(known_variants)}"
            )
        for index, gate in enumerate(self.gates):
            if artifact_of(gate.variant) not in known_variants:  # 'int4@f32', 'exported@default': a setting's row
                raise ValueError(f"gates[{index}] names variant '{gate.variant}'; defined: {sorted(self.variants)}"
                                 " (a row of OpenVINO's precision settings is '<variant>@f32' or "
                                 "'<reference>@default')")
            if is_device_default(gate.variant) and artifact_of(gate.variant) != self.reference_variant:
                raise ValueError(f"gates[{index}] names '{gate.variant}': only the reference runs at the device's "
                                 f"default precision as a row of its own ('{self.reference_variant}@default')")
            if gate.target not in self.targets:
                raise ValueError(f"gates[{index}] names target '{gate.target}'; recipe targets: {self.targets}")
        for variant, steps in self.variants.items():
            for step in steps:
                for dataset in registry.transform_stage(step.stage).datasets_used(step.config):
                    if dataset not in self.data:
                        raise ValueError(
                            f"variant '{variant}' stage '{step.stage}' uses dataset '{dataset}'; "
                            f"defined: {sorted(self.data)}"
                        )
        return self

    def _check_runtime_variants(self, split: dict[str, list[str]]) -> None:
        """Names that point at a split variant, or pair a runtime's variant with another runtime's target."""
        for variant in self.variants:
            runtime = runtime_of_variant(variant)
            if runtime and not any(runtime_of_target(target) == runtime for target in self.targets):
                raise ValueError(f"variant '{variant}' is built for {runtime}, but the recipe's targets "
                                 f"{self.targets} hold no {runtime} target: add one (e.g. {runtime}:cpu)")
        if self.validate_.reference and runtime_of_variant(self.validate_.reference):
            raise ValueError(f"validate.reference names '{self.validate_.reference}', built for one runtime; the "
                             "reference must run on every target")
        if self.validate_.reference in split:
            raise ValueError(f"validate.reference names '{self.validate_.reference}', which per_runtime splits "
                             f"into {split[self.validate_.reference]}; the reference must run on every target")
        for index, gate in enumerate(self.gates):
            if is_setting_row(gate.variant) and not built_for(gate.variant, gate.target):
                raise ValueError(f"gates[{index}]: '{gate.variant}' is a row of OpenVINO's precision settings "
                                 f"(INFERENCE_PRECISION_HINT); {gate.target} has none: name an openvino target")
            if not built_for(gate.variant, gate.target):
                raise ValueError(f"gates[{index}]: variant '{gate.variant}' is built for "
                                 f"{runtime_of_variant(gate.variant)} and never runs on {gate.target}")

    @property
    def reference_variant(self) -> str:
        """The variant whose ort:cpu outputs every other pair is compared with."""
        return self.validate_.reference or EXPORTED

    @property
    def source(self) -> Path | None:
        """The recipe file this recipe was loaded from, if any."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """Folder that relative paths in the recipe are resolved against."""
        return self._source.parent if self._source else Path.cwd()

    def resolve(self, relative: str) -> Path:
        """A recipe path made absolute against the recipe's folder."""
        path = Path(relative).expanduser()
        if path.is_absolute():
            return path
        try:
            return (self.base_dir / path).resolve()
        except (RuntimeError, OSError):  # a symlink loop: left for the file checks to name
            return Path(os.path.abspath(self.base_dir / path))

    def declared_tolerances(self) -> dict[str, Tolerance]:
        """Variant -> the tolerance its last step with an accuracy budget (quantize or fp16 ``tolerance``) was
        built to: what validation holds that variant to."""
        return {variant: declared for variant, steps in self.variants.items()
                if (declared := variant_tolerance(step.config for step in steps)) is not None}

    def input_ranges(self) -> dict[str, tuple[float | None, float | None]]:
        """Input name -> (low, high) declared in model.inputs for seeded random values."""
        return {spec.name: (spec.low, spec.high) for spec in self.model.inputs
                if spec.low is not None or spec.high is not None}

    def validated_targets(self, *, true_fp16: bool = False) -> tuple[str, ...]:
        """The recipe's targets, and with ``true_fp16`` reference:cpu where validation checks fp16 artifacts
        there too (``qdeploy.targets.true_fp16_check``): where an fp16 budget's promise is confirmed."""
        targets = tuple(self.targets)
        if true_fp16 and true_fp16_check(targets, self.validate_.fp16_reference):
            return (*targets, TRUE_FP16_TARGET)
        return targets

    def stage_context(self, variant: str, work_dir: Path, targets: tuple[str, ...] | None = None,
                      **fields: Any) -> StageContext:
        """What a stage may see of this recipe: datasets (a text dataset without a tokenizer given the model's,
        ``text_data``), paths, targets (default: the recipe's), the reference; ``fields``: the other
        ``StageContext`` fields (progress)."""
        datasets = with_model_tokenizer(self.data, self.model, self.resolve)  # text data: the model's tokenizer
        return data_context(variant, work_dir, datasets=datasets, resolve=self.resolve,
                            input_ranges=self.input_ranges(), frozen=self.model.frozen_values(self.resolve),
                            targets=tuple(self.targets) if targets is None else targets,
                            default_dataset=self.validate_.data, reference_variant=self.reference_variant,
                            batch_sizes=tuple(self.benchmark.batch_sizes) if self.benchmark.enabled else (),
                            detections=self.validate_.detection_spec(),
                            **fields)
