"""A named dataset of a recipe (its ``data`` section): what the readers read and the stages measure on."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from qdeploy.core.tolerance import StrictModel

__all__ = ["MAX_IMAGE_SIDE", "MAX_SAMPLES", "MAX_WINDOW", "DatasetSpec"]

_IMAGE_FIELDS = ("input", "resize", "layout", "color", "scale", "mean", "std")
_TEXT_FIELDS = ("window", "part", "tokenizer")
MAX_WINDOW = 1 << 20
MAX_SAMPLES = 1_000_000
"""Most samples a dataset may name: calibration and validation read them all, one by one."""
MAX_IMAGE_SIDE = 65_535


class DatasetSpec(StrictModel):
    """A named dataset for calibration or validation."""

    reader: Literal["random", "npy", "images", "text"] = Field(
        description="'random' (seeded, shaped from the model), 'npy' (a folder of .npy/.npz), 'images' (a "
                    "folder of images, preprocessed as declared below) or 'text' (a UTF-8 text file cut into "
                    "windows of token ids for a causal language model; labels: the windows' token ids)."
    )
    path: str | None = Field(default=None, description="Folder of samples (npy, images), or the text file (text), "
                                                       "relative to the recipe file.")
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
    window: int = Field(default=128, ge=2, le=MAX_WINDOW,
                        description="Tokens per sample (text): the file is cut into non-overlapping windows of this "
                                    "many tokens, each one sample of input_ids [1, window] with an empty past cache.")
    part: list[float] = Field(default_factory=lambda: [0.0, 1.0],
                              description="[start, end] fraction of the file's windows this dataset reads (text): "
                                          "two datasets over one file with parts [0, 0.5] and [0.5, 1] calibrate and "
                                          "validate on different windows.")
    tokenizer: str | None = Field(default=None,
                                  description="Tokenizer (text): a tokenizer.json file, a transformers folder or a "
                                              ".gguf file, relative to the recipe; the model.causal_lm "
                                              "checkpoint's own when absent (required otherwise).")

    @model_validator(mode="after")
    def _path_when_needed(self) -> DatasetSpec:
        if self.reader in ("npy", "images") and not self.path:
            raise ValueError(f"reader '{self.reader}' needs a 'path' to a folder of samples")
        if self.reader == "text" and not self.path:
            raise ValueError("reader 'text' needs a 'path' to a UTF-8 text file")
        if self.reader != "text":
            set_here = [name for name in _TEXT_FIELDS if name in self.model_fields_set]
            if set_here:
                raise ValueError(f"{set_here} apply to reader 'text' only")
        elif len(self.part) != 2 or not 0.0 <= self.part[0] < self.part[1] <= 1.0:
            raise ValueError(f"part {self.part} must be [start, end] with 0 <= start < end <= 1 (fractions of the "
                             "text's windows)")
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
