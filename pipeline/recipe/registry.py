"""The one registry of qdeploy's stages.

Grep this file to find every stage.  The registry holds each stage's module, its settings model, and functions of
a validated config (the datasets it names, whether it reads the run's default dataset), never names to look up.
A stage module imports its heavy libraries inside its functions, so importing the stages here stays cheap
(importing a stage's config module imports its package anyway).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from qdeploy.core.stage_config import StageConfig
from qdeploy.stages import benchmark, export, fp16, quantize, simplify, validate
from qdeploy.stages.benchmark.config import BenchmarkConfig
from qdeploy.stages.export.config import ExportConfig
from qdeploy.stages.fp16.config import Fp16Config, reads_default_dataset
from qdeploy.stages.quantize.config import DynamicConfig, LowerConfig, NncfPtqConfig, PtqConfig, QuantizeConfig
from qdeploy.stages.simplify.config import SimplifyConfig
from qdeploy.stages.validate.config import ValidateConfig

__all__ = ["VARIANT_STAGES", "StageInfo", "StageKind", "all_stages", "export_libraries", "stage", "transform_stage"]

StageKind = Literal["transform", "evaluation"]


def _names_none(config: Any) -> list[str]:
    return []


def _reads_none(config: Any) -> bool:
    return False


def _fp16_datasets(config: Fp16Config) -> list[str]:
    data = config.calibration.data if config.calibration is not None else None
    return [data] if data is not None else []


def _quantize_datasets(config: StageConfig) -> list[str]:
    """The calibration and budget datasets of the modes that have them (weight_only has neither)."""
    names = []
    if isinstance(config, PtqConfig | NncfPtqConfig | LowerConfig) and config.calibration is not None:
        names.append(config.calibration.data)
    if isinstance(config, PtqConfig | DynamicConfig):
        names.append(config.budget.data)
    return [name for name in names if name is not None]


def _quantize_host_facts(config: StageConfig) -> dict[str, Any]:
    """ptq for ONNX Runtime routes int8 convolutions to its AMX GEMM on AMX CPUs (``ptq._amx_convs``)."""
    return quantize.host_facts(config.runtime) if isinstance(config, PtqConfig) else {}


@dataclass(frozen=True)
class StageInfo:
    """What the runner needs to know of a stage."""

    name: str
    kind: StageKind
    module: ModuleType
    """The stage's package; its ``run`` is looked up when the stage runs (a test may replace it)."""
    config: type[StageConfig] | type[QuantizeConfig]
    """The stage's settings: ``config.model_validate(settings)`` gives the validated model the stage takes, whose
    declarations (``qdeploy.core.stage_config``) tell the pipeline what it needs to know of them."""
    libraries: tuple[str, ...] = ()
    """Distributions whose versions enter the stage's cache key."""
    datasets_used: Callable[[Any], list[str]] = _names_none
    """Dataset names of the recipe that a validated config of this stage refers to."""
    uses_targets: bool = False
    """The artifact depends on the recipe's targets (they enter the cache key and the stage's context)."""
    true_fp16_checked: bool = False
    """Validation also runs this stage's artifacts on reference:cpu (true float16) where the recipe has no GPU: with
    ``uses_targets``, that check counts among the targets the stage is given (``Recipe.validated_targets``)."""
    reads_default_dataset: Callable[[Any], bool] = _reads_none
    """(validated config) -> whether the stage then reads the run's default dataset (validate.data), which then
    enters its cache key."""
    host_facts: Callable[[Any], dict[str, Any]] = lambda config: {}
    """(validated config) -> facts of the build machine the artifact depends on; they enter its cache key."""
    modes: tuple[tuple[str, type[StageConfig]], ...] = ()
    """(label, model) of each mode, for a stage whose settings are one model per mode (the reference lists each)."""

    def function(self) -> Callable[..., Any]:
        """The stage's ``run``."""
        run: Callable[..., Any] = self.module.run
        return run


_STAGES: dict[str, StageInfo] = {
    info.name: info
    for info in (
        StageInfo("export", "transform", export, ExportConfig, libraries=("onnx",)),
        StageInfo("simplify", "transform", simplify, SimplifyConfig,
                  libraries=("onnx", "onnxruntime", "onnxoptimizer")),
        StageInfo("fp16", "transform", fp16, Fp16Config,
                  libraries=("onnx", "onnxruntime", "onnxconverter-common"),
                  datasets_used=_fp16_datasets, reads_default_dataset=reads_default_dataset,
                  uses_targets=True, true_fp16_checked=True),  # the budget's artifact is confirmed on each target
        StageInfo("quantize", "transform", quantize, QuantizeConfig,
                  libraries=("onnx", "onnxruntime", "onnx-ir", "openvino"),
                  datasets_used=_quantize_datasets, uses_targets=True, host_facts=_quantize_host_facts,
                  modes=tuple((mode.label, mode) for mode in QuantizeConfig.members)),
        StageInfo("validate", "evaluation", validate, ValidateConfig),
        StageInfo("benchmark", "evaluation", benchmark, BenchmarkConfig),
    )
}

# Stages a recipe may name inside a variant; export is the implicit root.
VARIANT_STAGES = ("simplify", "fp16", "quantize")


def export_libraries(config: ExportConfig) -> tuple[str, ...]:
    """Distributions whose versions enter the export's cache key for this model source: the export stage's own,
    torch for a torch source, and transformers, torch and gguf for a causal_lm one (transformers reads the
    checkpoint, gguf dequantizes a .gguf, torch traces it); one not installed enters as 'absent'."""
    libraries = _STAGES["export"].libraries
    if config.causal_lm is not None:
        return (*libraries, "transformers", "torch", "gguf")
    if config.torch is not None:
        return (*libraries, "torch")
    return libraries


def stage(name: str) -> StageInfo:
    """The registered stage of that name; ValueError naming the known ones otherwise."""
    try:
        return _STAGES[name]
    except KeyError:
        raise ValueError(f"unknown stage '{name}'; known stages: {', '.join(sorted(_STAGES))}") from None


def transform_stage(name: str) -> StageInfo:
    """A stage that may appear in a variant's chain."""
    if name not in VARIANT_STAGES:
        raise ValueError(f"unknown stage '{name}' in a variant; variant stages are: {', '.join(VARIANT_STAGES)}")
    return _STAGES[name]


def all_stages() -> list[StageInfo]:
    return list(_STAGES.values())
