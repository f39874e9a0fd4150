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

from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from pipeline import registry
from pipeline.tolerance import StrictModel
from stages.benchmark import BenchmarkConfig
from stages.export import ExportConfig
from stages.validate import ValidateConfig

EXPORTED = "exported"
"""Name of the implicit variant that is the exported model as it is (the default reference)."""


_IMAGE_FIELDS = ("input", "resize", "layout", "color", "scale", "mean", "std")
MAX_SAMPLES = 1_000_000
"""Most samples a dataset may name: calibration and validation read them all, one by one."""
MAX_IMAGE_SIDE = 65_535
MAX_GATE_BATCH = 65_536
ONCE_PER_VARIANT = {"fp16": "converted to float16", "quantize": "quantized"}
"""Stages that refuse their own output: a second one in a chain can only fail."""


class DatasetSpec(StrictModel):
    """A named dataset for calibration or validation."""

    reader: Literal["random", "npy", "images"] = Field(
        description="'random' (seeded, shaped from the model), 'npy' (a folder of .npy/.npz) or 'images' (a "
                    "folder of images, preprocessed as declared below)."
    )
    path: str | None = Field(default=None, description="Folder of samples (npy, images), relative to the recipe "
                                                       "file.")
    samples: int | None = Field(default=None, ge=1, le=MAX_SAMPLES, description="How many samples to read or generate.")
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of random data.")
    input: str | None = Field(default=None, description="Model input the images feed (images); the model's only "
                                                        "input when absent.")
    resize: list[int] | None = Field(default=None, description="[height, width] images are resized to (bilinear; "
                                                               "images); the input's own size when absent.")
    layout: Literal["NCHW", "NHWC"] = Field(default="NCHW", description="Layout of the image tensor (images).")
    color: Literal["RGB", "BGR", "GRAY"] = Field(default="RGB", description="Channel order, or one gray channel "
                                                                            "(images).")
    scale: float = Field(default=1.0 / 255.0, gt=0.0, allow_inf_nan=False,
                         description="Factor on 0..255 pixel values before mean and std (images; float inputs).")
    mean: list[float] = Field(default_factory=lambda: [0.0], description="Subtracted per channel after scale "
                                                                         "(images; one value or one per channel).")
    std: list[float] = Field(default_factory=lambda: [1.0], description="Divisor per channel after mean (images; "
                                                                        "one value or one per channel).")

    @model_validator(mode="after")
    def _path_when_needed(self) -> DatasetSpec:
        if self.reader in ("npy", "images") and not self.path:
            raise ValueError(f"reader '{self.reader}' needs a 'path' to a folder of samples")
        if self.reader == "random" and self.path:
            raise ValueError("reader 'random' takes no 'path'")
        if self.reader != "images":
            defaults = DatasetSpec.model_fields
            set_here = [name for name in _IMAGE_FIELDS if getattr(self, name) != (
                defaults[name].default_factory() if defaults[name].default_factory else defaults[name].default)]
            if set_here:
                raise ValueError(f"{set_here} apply to reader 'images' only")
        return self

    @model_validator(mode="after")
    def _image_preprocessing(self) -> DatasetSpec:
        if self.resize is not None and (len(self.resize) != 2 or min(self.resize) < 1
                                        or max(self.resize) > MAX_IMAGE_SIDE):
            raise ValueError(f"resize is [height, width], two positive integers up to {MAX_IMAGE_SIDE}")
        channels = 1 if self.color == "GRAY" else 3
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, channels):
                raise ValueError(f"{name} needs 1 or {channels} values for color {self.color}, got {len(values)}")
        if not all(math.isfinite(value) for value in (*self.mean, *self.std)):
            raise ValueError("mean and std values must be finite numbers")
        if any(value <= 0 for value in self.std):
            raise ValueError("std values must be positive")
        return self


GateMetric = Literal[
    "speedup", "latency_ms", "throughput_per_s", "size_bytes",
    "cosine", "snr_db", "max_abs_err", "mean_abs_err", "top1_agreement", "task_metric",
]


class GateSpec(StrictModel):
    """An acceptance goal; a missed one makes `qdeploy run` exit 1."""

    variant: str = Field(description="Variant the gate applies to.")
    target: str = Field(description="Target the gate applies to.")
    metric: GateMetric = Field(description="Measured quantity.")  # type: ignore[valid-type]
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
    ort_optimized: bool = Field(
        default=False, description="Also put an ORT_ENABLE_EXTENDED-optimized model in ort:* packages (kept only "
                                   "when it passes the package check; ALL-level files are CPU-specific, never "
                                   "written).")
    check_samples: int = Field(default=4, ge=1, le=64,
                               description="Validation samples (with the reference's outputs) each package's "
                                           "check.py runs; at most 16 MiB in all, else the package is unchecked.")


class ReportSpec(StrictModel):
    """Which report files to write, and what the verdict may overlook."""

    formats: list[Literal["json", "md", "html"]] = Field(default=["json", "md", "html"], description="Report formats.")
    allow_unmeasured: list[Literal["validate", "benchmark"]] = Field(
        default=[], description="Measurements that may error (or be missing) without failing the run: the report "
                                "still lists them under 'unmeasured'. By default a validation or benchmark row the "
                                "recipe asked for that could not be measured makes the run fail (exit 1); "
                                "unavailable targets never do.")
    packages: PackagesSpec = Field(default_factory=PackagesSpec, description="Deployable packages (OUT/packages/).")


class VariantStep(StrictModel):
    """One transform stage of a variant, with its validated config."""

    stage: str
    config: dict[str, Any] = Field(default_factory=dict)


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
    validated = info.config_class().model_validate(config)
    return VariantStep(stage=name, config=validated.model_dump(mode="json"))


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

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    _source: Path | None = PrivateAttr(default=None)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", value):
            raise ValueError("name may hold letters, digits, '_', '.', '-' and must start with a letter or digit")
        return value

    @field_validator("variants", mode="before")
    @classmethod
    def _steps(cls, value: Any) -> Any:
        if not isinstance(value, dict) or not value:
            raise ValueError("variants must be a non-empty mapping of name -> list of stages")
        parsed = {}
        for name, steps in value.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(name)):
                raise ValueError(f"variant name '{name}' may hold letters, digits, '_', '.', '-'")
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
        from pipeline.targets import KNOWN_TARGETS

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
            if gate.variant not in known_variants:
                raise ValueError(f"gates[{index}] names variant '{gate.variant}'; defined: {sorted(self.variants)}")
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
