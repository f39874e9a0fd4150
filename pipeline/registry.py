"""The one registry of qdeploy's stages.

Grep this file to find every stage.  Stage modules are imported only when a
stage's config is validated or the stage runs, so importing qdeploy stays
cheap; a stage module imports its heavy libraries inside its functions.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

__all__ = ["VARIANT_STAGES", "StageInfo", "StageKind", "all_stages", "stage", "transform_stage"]

StageKind = Literal["transform", "evaluation"]


@dataclass(frozen=True)
class StageInfo:
    """What the runner needs to know of a stage, without importing it."""

    name: str
    kind: StageKind
    module: str
    config: str
    entry: str = "run"
    libraries: tuple[str, ...] = ()
    """Distributions whose versions enter the stage's cache key."""
    dataset_fields: tuple[str, ...] = field(default=())
    """Dotted config paths that name datasets of the recipe (e.g. 'calibration.data')."""
    uses_targets: bool = False
    """The artifact depends on the recipe's targets (they enter the cache key and the stage's context)."""
    true_fp16_checked: bool = False
    """Validation also runs this stage's artifacts on reference:cpu (true float16) where the recipe has no GPU: with
    ``uses_targets``, that check counts among the targets the stage is given (``Recipe.validated_targets``)."""
    default_dataset_reader: str | None = None
    """Function of the stage module, (validated config) -> bool: whether the stage then reads the run's default
    dataset (validate.data), which then enters its cache key."""

    def load_module(self) -> Any:
        return importlib.import_module(self.module)

    def config_class(self) -> type[BaseModel]:
        """The stage's settings, from its leaf ``config`` module (the stage itself is not imported)."""
        return getattr(importlib.import_module(f"{self.module}.config"), self.config)

    def function(self) -> Callable[..., Any]:
        return getattr(self.load_module(), self.entry)

    def datasets_used(self, config: BaseModel) -> list[str]:
        """Dataset names that a validated config of this stage refers to (fields a mode lacks name none)."""
        names = []
        for dotted in self.dataset_fields:
            value: Any = config
            for key in dotted.split("."):
                value = getattr(value, key, None)
            if isinstance(value, str):
                names.append(value)
        return names

    def reads_default_dataset(self, config: BaseModel) -> bool:
        """Whether the stage, with this validated config, reads the run's default dataset."""
        if self.default_dataset_reader is None:
            return False
        return bool(getattr(self.load_module(), self.default_dataset_reader)(config))


_STAGES: dict[str, StageInfo] = {
    info.name: info
    for info in (
        StageInfo("export", "transform", "qdeploy.stages.export", "ExportConfig",
                  libraries=("onnx",)),
        StageInfo("simplify", "transform", "qdeploy.stages.simplify", "SimplifyConfig",
                  libraries=("onnx", "onnxruntime", "onnxoptimizer")),
        StageInfo("fp16", "transform", "qdeploy.stages.fp16", "Fp16Config",
                  libraries=("onnx", "onnxruntime", "onnxconverter-common"),
                  dataset_fields=("calibration.data",), default_dataset_reader="reads_default_dataset",
                  uses_targets=True, true_fp16_checked=True),  # the budget's artifact is confirmed on each target
        StageInfo("quantize", "transform", "qdeploy.stages.quantize", "QuantizeConfig",
                  libraries=("onnx", "onnxruntime", "onnx-ir", "openvino"),
                  dataset_fields=("calibration.data", "budget.data"), uses_targets=True),
        StageInfo("validate", "evaluation", "qdeploy.stages.validate", "ValidateConfig"),
        StageInfo("benchmark", "evaluation", "qdeploy.stages.benchmark", "BenchmarkConfig"),
    )
}

# Stages a recipe may name inside a variant; export is the implicit root.
VARIANT_STAGES = ("simplify", "fp16", "quantize")


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
