"""Data: the recipe's datasets (``spec``), their readers (npy folders, image folders, text files cut into token
windows, seeded random data), batches, and the activation statistics calibration gathers from them.

For scripts (a benchmark's prompts): ``token_windows(path, load_tokenizer(tokenizer_path), window, part)`` gives
the windows of token ids a ``text`` dataset reads."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from qdeploy.calibration.samples import iter_samples
from qdeploy.calibration.spec import DatasetSpec
from qdeploy.calibration.text import TextWindows, Tokenizer, load_tokenizer, text_feeds, token_windows, tokenizer_for
from qdeploy.core.context import InputRanges, StageContext

__all__ = ["DatasetSpec", "TextWindows", "Tokenizer", "data_context", "iter_samples", "load_tokenizer", "text_feeds",
           "token_windows", "tokenizer_for"]


def data_context(variant: str, work_dir: Path, *, datasets: Mapping[str, DatasetSpec] | None = None,
                 resolve: Any = Path, input_ranges: InputRanges | None = None,
                 frozen: Mapping[str, np.ndarray] | None = None, **fields: Any) -> StageContext:
    """A stage context that reads datasets with qdeploy's readers (what ``Recipe.stage_context`` builds from a
    recipe; tests and scripts build one directly).  ``frozen``: inputs the recipe froze (model.inputs[].value) and
    their values: a sample may hold them only at that value.  ``fields``: the other ``StageContext`` fields."""
    reader = partial(iter_samples, frozen=dict(frozen)) if frozen else iter_samples
    return StageContext(variant=variant, work_dir=work_dir, datasets=dict(datasets or {}), resolver=resolve,
                        input_ranges=dict(input_ranges or {}), sample_reader=reader, **fields)
