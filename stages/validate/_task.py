"""The task metric of the validate stage: ``validate: {metric: "file.py:function"}``, or a built-in one
(``validate: {metric: perplexity}``, ``qdeploy.core.lm_metrics.BUILTIN_METRICS``).

The function is called as ``function(outputs, labels) -> float``:

- ``outputs``: output name -> one array, the samples concatenated along the
  first (batch) axis; an output whose samples differ in shape beyond that axis
  is given as a list of per-sample arrays instead.
- ``labels``: the dataset's labels stacked the same way, or None when the
  dataset has none (random data, .npy samples).  Labels are read from .npz
  samples of an ``npy`` dataset: the array under the key ``label`` (or
  ``labels``) beside the input arrays, in the same file order as the inputs;
  a ``text`` dataset's labels are each window's token ids.

A built-in metric is computed from each sample's ``logits`` and its labels one
sample at a time (the logits are never stacked), and says which way is better:
``perplexity`` is lower-is-better, ``log_likelihood`` higher-is-better.

It is called once on the reference outputs and once per (variant, target);
its value is reported as ``metrics.task_metric`` (and the reference's as
``task_metric_reference``) and can be gated like any metric.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.calibration.readers import is_npy_sample, sample_limit
from qdeploy.calibration.text import text_labels
from qdeploy.core.arrayfiles import load_npz
from qdeploy.core.errors import DataError, RecipeError
from qdeploy.core.lm_metrics import BuiltinMetric, builtin_metric
from qdeploy.core.usercode import DEFAULT_METRIC_SECONDS, UserCodeError, UserFunction, import_user_module
from qdeploy.core.userfiles import files_in_folder

if TYPE_CHECKING:
    from qdeploy.core.context import DatasetInfo

log = logging.getLogger(__name__)

LABEL_KEYS = ("label", "labels")
_FIELD = "validate.metric"

TaskMetric = Callable[[dict[str, np.ndarray], Any], Any]
"""A user's metric: (outputs by name, the labels) -> the value."""


def check_metric(spec: str, resolve: Callable[[str], Path], field: str = _FIELD) -> None:
    """Without running user code: the file exists and defines the function (for a module: it can be found);
    ``field``: the recipe field that names it (a budget's tolerance.metric names one too); a built-in metric
    needs nothing."""
    if builtin_metric(spec) is not None:
        return
    module_part, function = spec.rsplit(":", 1)
    if not module_part.endswith(".py"):
        if importlib.util.find_spec(module_part.split(".")[0]) is None:
            raise RecipeError(f"module '{module_part}' cannot be found on the Python path", field=field)
        return
    path = resolve(module_part)
    if not path.is_file():
        raise RecipeError(f"file '{module_part}' does not exist (resolved to {path})", field=field)
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        raise RecipeError(f"{path} cannot be parsed: {exc}", field=field) from None
    except (RecursionError, MemoryError):  # an expression too deep or too long for Python's own parser
        raise RecipeError(f"{path} cannot be parsed: an expression is nested too deeply (or is too long) for "
                          "Python's parser; split it into smaller statements", field=field) from None
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
    defined |= {target.id for node in tree.body if isinstance(node, ast.Assign)
                for target in node.targets if isinstance(target, ast.Name)}
    if function not in defined:
        raise RecipeError(f"{path} defines no function '{function}'; it defines {sorted(defined)}", field=field)


def load_metric(spec: str, resolve: Callable[[str], Path], field: str = _FIELD,
                seconds: float | None = None) -> TaskMetric:
    """Import the user's function ('file.py:function' relative to the recipe, or 'package.module:function'); it is
    called through ``qdeploy.core.usercode`` with a deadline of ``seconds`` per call (default
    ``DEFAULT_METRIC_SECONDS``).  A built-in metric's name gives qdeploy's own (no user code, no deadline)."""
    builtin = builtin_metric(spec)
    if builtin is not None:
        return builtin
    check_metric(spec, resolve, field)
    module_part, function = spec.rsplit(":", 1)

    try:
        path = resolve(module_part) if module_part.endswith(".py") else None
        module = import_user_module(module_part, path, label="metric")
    except Exception as exc:
        raise RecipeError(f"cannot import '{module_part}': {type(exc).__name__}: {exc}", field=field) from None
    found = getattr(module, function, None)
    if not callable(found):
        raise RecipeError(f"'{module_part}' has no callable '{function}'", field=field)
    return UserFunction(found, spec, seconds=seconds or DEFAULT_METRIC_SECONDS)


def read_labels(datasets: Mapping[str, DatasetInfo], resolve: Callable[[str], Path], dataset: str | None,
                input_names: list[str],
                limit: int | None) -> list[np.ndarray] | None:
    """Labels of the samples the readers yield, in the same order; None when the dataset has none.

    Mirrors qdeploy.calibration.readers.npy_samples' file order (sorted .npy/.npz names, the same limit).
    """
    spec = datasets.get(dataset) if dataset is not None else None
    if spec is not None and spec.reader == "text":  # next-token targets: the windows the reader feeds
        return text_labels(spec, resolve, limit, dataset or "")  # type: ignore[arg-type]
    if spec is None or spec.reader != "npy" or not spec.path:
        return None
    folder = resolve(spec.path)
    files = files_in_folder(folder, is_npy_sample, f"dataset '{dataset}'") if folder.is_dir() else []
    count = min(filter(None, (spec.samples, limit)), default=None)
    files = files[:count] if count else files
    labels = [_label_of(path, input_names) for path in files]
    if all(label is None for label in labels):
        return None
    missing = [path.name for path, label in zip(files, labels, strict=True) if label is None]
    if missing:
        raise DataError(f"dataset '{dataset}' ({folder}): some samples hold a label ({' or '.join(LABEL_KEYS)}) "
                        f"and {len(missing)} do not, e.g. {missing[0]}; label every sample or none")
    return [label for label in labels if label is not None]


def _label_of(path: Path, input_names: list[str]) -> np.ndarray | None:
    if path.suffix != ".npz":
        return None
    # the one checked loader (qdeploy.core.arrayfiles): every member's header is checked before anything is read
    arrays = load_npz(path, "sample", sample_limit(), keys=[key for key in LABEL_KEYS if key not in input_names])
    key = next((key for key in LABEL_KEYS if key in arrays), None)
    return np.asarray(arrays[key]) if key else None


def stack(arrays: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """Samples concatenated along the first axis; a list when their shapes differ beyond it."""
    arrays = [np.asarray(a) for a in arrays]
    if arrays and all(a.ndim >= 1 and a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        return np.concatenate(arrays, axis=0)
    if arrays and all(a.shape == arrays[0].shape for a in arrays):
        return np.stack(arrays)
    return arrays


def evaluate(function: TaskMetric, spec: str, outputs: Sequence[Mapping[str, np.ndarray]],
             labels: list[np.ndarray] | None, *, strict: bool = False) -> tuple[float | None, str]:
    """The metric's value, or None and a warning saying why (the function raised or returned no number).
    ``strict``: a metric that exited, was interrupted or did not return in time (``UserCodeError``) raises."""
    if isinstance(function, BuiltinMetric):  # per sample: the logits of every sample stacked could be GBs
        try:
            number = function.over_samples(outputs, labels)
        except ValueError as exc:
            return None, f"metric '{spec}' cannot be computed: {exc}"
        return (number, "") if math.isfinite(number) else (None, f"metric '{spec}' is {number}")
    names = list(dict.fromkeys(name for sample in outputs for name in sample))
    stacked = {name: stack([sample[name] for sample in outputs if name in sample]) for name in names}
    try:
        value = function(stacked, stack(labels) if labels is not None else None)
        number = float(value)
    except UserCodeError as exc:
        if strict:
            raise
        log.error("%s", exc)
        return None, f"validate.metric '{spec}' failed: {exc}"
    except Exception as exc:
        log.debug("validate.metric %s failed", spec, exc_info=True)
        return None, f"validate.metric '{spec}' failed: {type(exc).__name__}: {exc}"
    if not math.isfinite(number):
        return None, f"validate.metric '{spec}' returned {number}, not a finite number"
    return number, ""
