"""The ``text`` reader: a UTF-8 text file cut into windows of token ids that feed a causal language model.

``{reader: text, path: corpus.txt, window: 128, part: [0.0, 0.5], samples: 16, tokenizer: tokenizer.json}``: the
file is tokenized whole, cut into non-overlapping windows of ``window`` tokens (a last partial window is
dropped), and ``part`` picks a fraction range of those windows, so that two datasets over one file (parts
``[0, 0.5]`` and ``[0.5, 1]``) calibrate and validate on different text.  Each sample feeds

- ``input_ids`` ``[1, window]``, ``attention_mask`` ones, ``position_ids`` ``0..window-1``;
- every ``past_*`` input (``past_key_values.{i}.key/.value``) an empty cache: its past-length axis 0, the other
  dimensions as the model declares them (a symbolic first axis is the batch, 1; heads and head_dim must be
  fixed, or set in ``model.inputs``).

Any other input is an error naming it.  The labels of a sample are its window's token ids (next-token targets of
the built-in ``perplexity`` metric).  The tokenizer (``tokenizer_for``) is a tokenizer.json (``tokenizers``), a
transformers folder or a .gguf file (transformers, ``pip install "qdeploy[llm]"``).  A dataset without one reads
with the model's when the recipe's model is a ``model.causal_lm`` checkpoint: the pipeline (which knows the model;
this layer does not) names the checkpoint in the specs the stages see; with neither it is a RecipeError.  A
tokenizer is loaded once per process, however many datasets share it.  Which windows a dataset read is logged,
and ``TextWindows.describe`` says it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import sys
import tempfile
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from qdeploy.calibration.readers import check_sample_fits, inputs_of
from qdeploy.core.errors import DataError, RecipeError, UserFileError
from qdeploy.core.fresh_python import FreshPythonError, call_in_fresh_python
from qdeploy.core.onnx_wire import load_model
from qdeploy.core.userfiles import check_regular_file

if TYPE_CHECKING:
    from qdeploy.calibration.spec import DatasetSpec

__all__ = ["MAX_TEXT_BYTES", "TextWindows", "Tokenizer", "load_tokenizer", "missing_tokenizer", "text_feeds",
           "text_labels", "text_samples", "token_windows", "tokenizer_for"]

log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 256 * 1024 * 1024
"""Largest text file the reader tokenizes (it is read whole)."""
_FILLED = ("input_ids", "attention_mask", "position_ids")
_LLM_EXTRA = 'pip install "qdeploy[llm]"'


class Tokenizer(Protocol):
    """What the reader needs of a tokenizer: token ids of a text, without special tokens."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True, eq=False)
class _Fast:
    """A ``tokenizers.Tokenizer`` (tokenizer.json)."""

    inner: Any

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False).ids)


@dataclass(frozen=True, eq=False)
class _Transformers:
    """A transformers tokenizer (a folder, or a .gguf file's)."""

    inner: Any

    def encode(self, text: str) -> list[int]:
        # verbose=False: the whole file is longer than model_max_length, which is fine for windows cut afterwards
        return list(self.inner(text, add_special_tokens=False, verbose=False)["input_ids"])


def load_tokenizer(path: Path, field: str = "tokenizer") -> Tokenizer:
    """A tokenizer from a tokenizer.json file, a transformers folder, or a .gguf file (its embedded vocabulary)."""
    if path.is_dir():
        return _Transformers(_auto_tokenizer(field, str(path)))
    if not path.is_file():
        raise RecipeError(f"tokenizer '{path}' does not exist: name a tokenizer.json file, a transformers folder "
                          "or a .gguf file", field=field)
    if path.suffix == ".gguf":
        return _gguf_tokenizer(path, field)
    if path.suffix == ".json":
        from tokenizers import Tokenizer as FastTokenizer  # lazy: only text datasets need it

        try:
            return _Fast(FastTokenizer.from_file(str(path)))
        except Exception as exc:  # the library says what is wrong with the file
            raise RecipeError(f"{path} is not a readable tokenizer.json: {exc}", field=field) from None
    raise RecipeError(f"tokenizer '{path}' is neither a tokenizer.json, a .gguf file nor a transformers folder",
                      field=field)


def _gguf_tokenizer(path: Path, field: str) -> Tokenizer:
    """A .gguf file's tokenizer.  Reading it takes transformers, which imports torch: 0.35 GB the process would
    keep to its end.  Unless torch is loaded here already, a fresh interpreter converts it to a tokenizer.json (the
    same ids: transformers' fast tokenizer is that tokenizer) and exits; the tokenizers library reads the file."""
    if "torch" in sys.modules:
        return _Transformers(_auto_tokenizer(field, str(path.parent), gguf_file=path.name))
    from tokenizers import Tokenizer as FastTokenizer  # lazy: only text datasets need it

    with tempfile.TemporaryDirectory(prefix="qdeploy-tokenizer-") as folder:
        saved = Path(folder) / "tokenizer.json"
        try:
            error = call_in_fresh_python(__name__, "save_gguf_tokenizer",
                                         {"path": str(path), "field": field, "saved": str(saved)})["error"]
        except FreshPythonError as exc:
            raise RecipeError(f"cannot read the tokenizer of {path.name}: {exc}", field=field) from None
        if error is not None:
            raise RecipeError(error, field=field)
        return _Fast(FastTokenizer.from_file(str(saved)))


def save_gguf_tokenizer(payload: dict[str, str]) -> dict[str, str | None]:
    """In the child: the .gguf's tokenizer saved as a tokenizer.json; the error's message, or None."""
    gguf = Path(payload["path"])
    try:
        tokenizer = _auto_tokenizer(payload["field"], str(gguf.parent), gguf_file=gguf.name)
        if not getattr(tokenizer, "is_fast", False):
            return {"error": f"the tokenizer of {gguf.name} is not a fast (tokenizers) one; name a tokenizer.json "
                             "instead"}
        tokenizer.backend_tokenizer.save(payload["saved"])
    except RecipeError as exc:
        return {"error": exc.detail}
    return {"error": None}


def _auto_tokenizer(field: str, folder: str, **options: str) -> Any:
    try:
        from transformers import AutoTokenizer  # lazy: an optional dependency
    except ImportError:
        raise RecipeError(f"reading a tokenizer from a folder or a .gguf file needs transformers: {_LLM_EXTRA} "
                          "(or name a tokenizer.json, which the tokenizers library reads)", field=field) from None
    try:
        with _quiet():
            return AutoTokenizer.from_pretrained(folder, local_files_only=True, **options)
    except ImportError as exc:  # a .gguf needs the gguf package too
        raise RecipeError(f"cannot load the tokenizer of {folder}: {exc}; {_LLM_EXTRA}", field=field) from None
    except Exception as exc:
        raise RecipeError(f"cannot load the tokenizer of {folder} ({options or 'folder'}): {exc}",
                          field=field) from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bar nor warnings from transformers' readers (the GGUF reader's bar is a plain tqdm, which reads
    TQDM_DISABLE when a bar is made): the run has one progress display."""
    from transformers.utils import logging as transformers_logging

    saved, verbosity = os.environ.get("TQDM_DISABLE"), transformers_logging.get_verbosity()
    os.environ["TQDM_DISABLE"] = "1"
    transformers_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        transformers_logging.set_verbosity(verbosity)
        if saved is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = saved


def tokenizer_for(spec: DatasetSpec, resolve: Callable[[str], Path], dataset_name: str = "") -> Tokenizer:
    """The dataset's tokenizer: ``tokenizer`` resolved against the recipe (the pipeline sets it to the model's
    checkpoint for a ``model.causal_lm`` recipe whose text dataset names none); RecipeError without one."""
    if spec.tokenizer is None:
        raise missing_tokenizer(dataset_name)
    field = f"data.{dataset_name}.tokenizer" if dataset_name else "tokenizer"
    return _cached_tokenizer(resolve(spec.tokenizer).resolve(), field)


def missing_tokenizer(dataset_name: str = "") -> RecipeError:
    """The error for a text dataset that has no tokenizer, and a model that has none to lend it."""
    field = f"data.{dataset_name}.tokenizer" if dataset_name else "tokenizer"
    return RecipeError(f"reader 'text' needs a tokenizer: set {field} (a tokenizer.json file, a transformers folder "
                       "or a .gguf file, relative to the recipe), or use a model.causal_lm source, whose "
                       "checkpoint's tokenizer is the default", field=field)


_TOKENIZERS: OrderedDict[Path, Tokenizer] = OrderedDict()
"""Tokenizers loaded, by resolved path: loading a .gguf's vocabulary takes seconds, so each is loaded once per
process (per run), whichever dataset (and recipe field) asks for it first."""
_TOKENIZERS_KEPT = 4


def _cached_tokenizer(path: Path, field: str) -> Tokenizer:
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = load_tokenizer(path, field)  # a failure is not kept: the next asker hears it too
        while len(_TOKENIZERS) > _TOKENIZERS_KEPT:
            _TOKENIZERS.popitem(last=False)
    _TOKENIZERS.move_to_end(path)
    return _TOKENIZERS[path]


@dataclass(frozen=True)
class TextWindows:
    """The windows of token ids a text dataset reads: ``ids`` ``[count, window]``, windows ``first`` to
    ``first + count - 1`` of the ``total`` the file holds."""

    ids: np.ndarray
    first: int
    total: int
    tokens: int
    """Tokens of the whole file."""

    def describe(self) -> str:
        count, window = self.ids.shape
        if not count:
            return f"no window (the file holds {self.tokens} tokens, {self.total} windows of {window})"
        return (f"windows {self.first}..{self.first + count - 1} of {self.total} (tokens {self.first * window}.."
                f"{(self.first + count) * window - 1} of {self.tokens}, {window} per window)")


def token_windows(path: Path, tokenizer: Tokenizer, window: int, part: tuple[float, float] = (0.0, 1.0),
                  limit: int | None = None, label: str = "") -> TextWindows:
    """Non-overlapping windows of ``window`` token ids of a UTF-8 text file, those of the fraction range ``part``
    (at most ``limit`` of them, from the range's start).  DataError when the range holds none."""
    label = label or str(path)
    ids = _token_ids(_read_text(path, label), tokenizer)
    total = len(ids) // window
    first, last = math.floor(part[0] * total + 1e-9), math.floor(part[1] * total + 1e-9)
    count = last - first if limit is None else min(last - first, limit)
    if count <= 0:
        raise DataError(f"{label}: the text holds {len(ids)} tokens, {total} windows of {window}; part "
                        f"{list(part)} selects none: use a longer text, a smaller window or a wider part")
    chosen = np.asarray(ids[first * window:(first + count) * window], dtype=np.int64).reshape(count, window)
    return TextWindows(chosen, first, total, len(ids))


def _read_text(path: Path, label: str) -> str:
    try:
        check_regular_file(path, "text file")
    except UserFileError as exc:
        raise DataError(f"{label}: {exc.problem}; fix 'path' in the recipe") from None
    size = path.stat().st_size
    if size > MAX_TEXT_BYTES:
        raise DataError(f"{label}: {size / 1e6:.0f} MB of text; the reader tokenizes at most "
                        f"{MAX_TEXT_BYTES / 1e6:.0f} MB: cut the file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{label}: not UTF-8 text ({exc}); convert the file to UTF-8") from None


_IDS: OrderedDict[tuple[str, int], list[int]] = OrderedDict()
"""Token ids of the last texts tokenized, by (sha256 of the text, tokenizer): the labels and the feeds of one
dataset are read apart, and a text is known by its content, never by its file's name or mtime."""
_IDS_KEPT = 4


def _token_ids(text: str, tokenizer: Tokenizer) -> list[int]:
    key = (hashlib.sha256(text.encode()).hexdigest(), id(tokenizer))  # tokenizers are cached: ids stay theirs
    if key not in _IDS:
        _IDS[key] = list(tokenizer.encode(text))
        while len(_IDS) > _IDS_KEPT:
            _IDS.popitem(last=False)
    _IDS.move_to_end(key)
    return _IDS[key]


def _windows_of(spec: DatasetSpec, resolve: Callable[[str], Path], limit: int | None,
                dataset_name: str) -> TextWindows:
    path = resolve(spec.path or "")
    label = f"dataset '{dataset_name}' ({path})" if dataset_name else str(path)
    count = min(filter(None, (spec.samples, limit)), default=None)
    found = token_windows(path, tokenizer_for(spec, resolve, dataset_name), spec.window, tuple(spec.part), count,
                          label)
    log.info("%s: %s, part %s", label, found.describe(), spec.part)
    return found


def text_labels(spec: DatasetSpec, resolve: Callable[[str], Path], limit: int | None,
                dataset_name: str = "") -> list[np.ndarray]:
    """One label per sample the reader yields, in order: the window's token ids ``[1, window]``."""
    return [row[np.newaxis] for row in _windows_of(spec, resolve, limit, dataset_name).ids]


def text_samples(spec: DatasetSpec, model_path: Path, *, resolve: Callable[[str], Path], limit: int | None = None,
                 dataset_name: str = "") -> Iterator[dict[str, np.ndarray]]:
    """Feeds of a text dataset for the model at ``model_path`` (see the module's docstring)."""
    model = load_model(model_path, load_external_data=False)
    declared = {value.name: [dim.dim_param if dim.dim_param or not dim.dim_value else dim.dim_value
                             for dim in value.type.tensor_type.shape.dim] for value in model.graph.input}
    inputs = inputs_of(model)
    label = f"dataset '{dataset_name}'" if dataset_name else "text dataset"
    check_sample_fits(inputs, label)
    for ids in _windows_of(spec, resolve, limit, dataset_name).ids:
        yield text_feeds(ids, {info.name: (declared.get(info.name, []), info.dtype) for info in inputs}, label)


def text_feeds(ids: np.ndarray, inputs: dict[str, tuple[list[int | str], np.dtype]],
               label: str = "text dataset") -> dict[str, np.ndarray]:
    """One window's feeds: ``inputs`` maps each model input to its declared dims (ints, symbolic names or '')
    and dtype."""
    window = ids.shape[-1]
    feeds = {}
    for name, (dims, dtype) in inputs.items():
        if name in _FILLED:
            fixed = dims[1] if len(dims) == 2 else None
            if len(dims) != 2 or (isinstance(fixed, int) and fixed != window):
                raise DataError(f"{label}: model input '{name}' is declared {dims}; reader 'text' feeds it "
                                f"[1, {window}] (batch, window): set 'window' to the model's sequence length")
            value = {"input_ids": ids, "attention_mask": np.ones(window),
                     "position_ids": np.arange(window)}[name]
            feeds[name] = np.asarray(value).astype(dtype).reshape(1, window)
        elif name.startswith("past"):
            feeds[name] = np.zeros(_empty_cache_shape(name, dims, label), dtype=dtype)
        else:
            raise DataError(f"{label}: reader 'text' cannot fill model input '{name}' (it feeds input_ids, "
                            "attention_mask, position_ids and empty past_* caches): read an npy dataset whose "
                            f".npz samples hold '{name}', or freeze it (model.inputs[].value)")
    return feeds


def _empty_cache_shape(name: str, dims: list[int | str], label: str) -> tuple[int, ...]:
    """An empty past: the past-length axis 0, a symbolic first axis (batch) 1, fixed dims as declared."""
    shape = []
    for axis, dim in enumerate(dims):
        if isinstance(dim, int):
            shape.append(dim)
        elif "past" in dim or "seq" in dim:
            shape.append(0)
        elif axis == 0:
            shape.append(1)
        else:
            raise DataError(f"{label}: past input '{name}' has symbolic axis {axis} ('{dim or '?'}' in {dims}), "
                            "neither the batch nor the past length: reader 'text' cannot size its empty cache; fix "
                            f"it in model.inputs ({{name: {name}, shape: [...]}} with the model's heads and head_dim)")
    if 0 not in shape:
        raise DataError(f"{label}: past input '{name}' declared {dims} has no symbolic past-length axis (named "
                        "'past...' or '...sequence...'): reader 'text' feeds an empty cache, which needs one")
    return tuple(shape)
