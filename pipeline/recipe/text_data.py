"""The tokenizer of a recipe's ``text`` datasets: the dataset's own (``data.<name>.tokenizer``), or else the model's
when the model is a ``model.causal_lm`` checkpoint.

The readers (``qdeploy.calibration``) sit below the stages and cannot ask the export for its checkpoint; the
pipeline knows both, so it gives the stages specs whose ``tokenizer`` names the checkpoint (its folder, or its
.gguf file).  A path travels where a function would not (a sweep's worker processes), and the readers load each
tokenizer path once per process.  The recipe keeps its datasets as written: the report, the cache keys and
``qdeploy check`` see the user's spec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from qdeploy.calibration.spec import DatasetSpec
from qdeploy.calibration.text import missing_tokenizer
from qdeploy.core.context import StageContext
from qdeploy.stages.export import ExportConfig, source_files

__all__ = ["causal_lm_checkpoint", "check_text_tokenizers", "needs_model_tokenizer", "with_model_tokenizer"]


def needs_model_tokenizer(spec: DatasetSpec) -> bool:
    """A text dataset that names no tokenizer of its own."""
    return spec.reader == "text" and spec.tokenizer is None


def causal_lm_checkpoint(model: ExportConfig, resolve: Callable[[str], Path]) -> Path | None:
    """Where the causal_lm checkpoint is, its .gguf file or its folder (transformers reads the model's tokenizer
    from either); None for another source.  RecipeError naming the field when the checkpoint is not there."""
    if model.causal_lm is None:
        return None
    files = source_files(model, StageContext(variant="export", work_dir=Path("."), resolver=resolve))
    if len(files) == 1 and files[0].suffix.lower() == ".gguf":
        return files[0]  # a .gguf checkpoint is that one file; a folder's files all sit in the folder
    return files[0].parent if files else resolve(model.causal_lm.path or "")


def with_model_tokenizer(data: Mapping[str, DatasetSpec], model: ExportConfig,
                         resolve: Callable[[str], Path]) -> dict[str, DatasetSpec]:
    """The datasets as the stages read them: each text dataset without a tokenizer given the model's (by its
    absolute path), when the model has one; the others as they are."""
    datasets = dict(data)
    if model.causal_lm is None or not any(needs_model_tokenizer(spec) for spec in datasets.values()):
        return datasets
    path = causal_lm_checkpoint(model, resolve)
    return {name: spec.model_copy(update={"tokenizer": str(path)}) if needs_model_tokenizer(spec) else spec
            for name, spec in datasets.items()}


def check_text_tokenizers(data: Mapping[str, DatasetSpec], model: ExportConfig, names: Iterable[str]) -> None:
    """RecipeError naming ``data.<name>.tokenizer`` for a text dataset the run reads that has no tokenizer while
    the model has none to lend it (no causal_lm source); nothing is loaded."""
    if model.causal_lm is not None:
        return
    for name in names:
        if name in data and needs_model_tokenizer(data[name]):
            raise missing_tokenizer(name)
