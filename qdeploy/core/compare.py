"""Comparing a candidate's outputs with a reference's, apart from running them.

``compare_outputs(reference, candidate, tolerance)`` takes two lists of
per-sample output dicts (same samples, same order) and returns a
``OutputComparison`` that knows whether it passed and why not.

Metric definitions (all in float64, over every sample of an output concatenated):

- ``max_abs_err``, ``mean_abs_err``: of ``|cand - ref|``.
- ``max_rel_err``: largest ``|cand - ref| / |ref|`` over elements with
  ``|ref| > 1e-6 * max|ref|``; elements near zero are left to the absolute error.
- ``cosine``: of the flattened tensors; two all-zero tensors give 1.0, zero
  against non-zero gives 0.0.
- ``snr_db``: ``10*log10(sum(ref^2) / sum(err^2))``, clamped to
  [-SNR_CAP_DB, SNR_CAP_DB]: an exact match reports 200.0, never inf, so every
  number is JSON-safe.
- ``within_tol``: share of elements with ``|cand - ref| <= atol + rtol*|ref|``,
  using the tolerance's atol/rtol (a missing one counts as 0); when the
  tolerance sets neither, numpy.isclose's defaults (atol 1e-8, rtol 1e-5).
  For integer and bool outputs: share of exactly equal elements.
- ``top1_agreement`` / ``top5_agreement``: only for outputs that look like class
  scores: float, rank >= 2, last dimension C >= 2 (C >= 5 for top-5), and every
  dimension between the first and the last equal to 1 (``[N, C]``,
  ``[N, 1, 1, C]``).  Rows are ``reshape(-1, C)``.  Top-1: share of rows whose
  argmax agrees; top-5: share of rows whose reference argmax is among the
  candidate's five highest scores.  Dense maps (``[1, 3, 8, 8]``) get None.
- Per-token scores: a float output of rank 3 whose name ends with ``logits``
  (``[N, S, V]``, a language model's) gets ``top1_agreement`` per token
  position (rows ``reshape(-1, V)``) and ``kl``: the mean over token rows of
  KL(softmax(ref) || softmax(cand)) over V, in nats, from log-softmax in
  float64 (``qdeploy.core.lm_metrics``); no top-5.
- ``nonfinite``: NaN/Inf count in the candidate.  Metrics are computed over the
  positions (for ``kl``, the token rows) finite in both.  Every metric is
  accumulated one sample at a time: the samples are never concatenated.

Tolerances may differ per output: ``compare_outputs(..., per_output={name: Tolerance})``
uses the mapping's entry for an output it names and ``tolerance`` for the others; each
output's metrics carry the limits they were held to (``tolerance``) and whether they held
(``passed``).

A detector's outputs named by ``detections`` (``validate.detections`` as a dict:
``qdeploy.core.detections``) are compared as detections instead: one entry named after
the boxes output holds the match's ``detections`` metrics (recall, precision, mean IoU)
and the outputs it reads get no elementwise metrics.

Failures regardless of tolerance: a missing output, a shape or dtype-kind
(float / integer / bool) mismatch, NaN/Inf in the candidate or the reference,
differing sample counts.  Integer and bool outputs must match exactly (an integer
output the tolerance's ``integer_values`` names is compared as a float one); the
tolerance applies to float outputs: ``cosine_min``, ``snr_db_min``, ``atol``
alone (a limit on max_abs_err), ``rtol`` (with atol, default 0: every element
within ``atol + rtol*|ref|``), ``top1_agreement_min`` (on outputs that have a
top-1 agreement), ``kl_max`` (on per-token scores).  A top-1 or KL limit no
output can be held to is a note ("not checked"), not a failure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import numpy as np

from qdeploy.core.detections import consumed_outputs, match_detections, output_of
from qdeploy.core.lm_metrics import is_token_scores, kl_sum, top1_matches
from qdeploy.core.output_parts import SNR_CAP_DB, small_part_note, snr_db

if TYPE_CHECKING:
    from qdeploy.core.tolerance import Tolerance

__all__ = ["SNR_CAP_DB", "OutputComparison", "OutputComparisonDict", "OutputMetrics", "OutputMetricsDict",
           "as_array", "as_arrays", "compare_outputs"]

_ISCLOSE_ATOL, _ISCLOSE_RTOL = 1e-8, 1e-5
_REL_FLOOR = 1e-6
_MAX_FIELDS = ("max_abs_err", "mean_abs_err", "max_rel_err", "kl")
_MIN_FIELDS = ("cosine", "snr_db", "within_tol", "top1_agreement", "top5_agreement")


class OutputMetricsDict(TypedDict):
    """``OutputMetrics.to_dict()``: one output's metrics as validation rows write them (``outputs``)."""

    name: str
    max_abs_err: float | None
    mean_abs_err: float | None
    max_rel_err: float | None
    cosine: float | None
    snr_db: float | None
    within_tol: float | None
    top1_agreement: float | None
    top5_agreement: float | None
    kl: float | None
    nonfinite: int
    shape_mismatch: str | None
    passed: bool
    tolerance: dict[str, Any] | None
    detections: NotRequired[dict[str, Any]]


class OutputComparisonDict(TypedDict):
    """``OutputComparison.to_dict()``."""

    passed: bool
    reasons: list[str]
    notes: list[str]
    worst: dict[str, float | None]
    outputs: list[OutputMetricsDict]


@dataclass
class OutputMetrics:
    """Agreement of one output; metrics are None when they could not be computed (shape_mismatch set)."""

    name: str
    max_abs_err: float | None = None
    mean_abs_err: float | None = None
    max_rel_err: float | None = None
    cosine: float | None = None
    snr_db: float | None = None
    within_tol: float | None = None
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    kl: float | None = None
    """Mean KL(softmax(ref) || softmax(candidate)) per token of ``[N, S, V]`` logits; None for other outputs."""
    nonfinite: int = 0
    shape_mismatch: str | None = None
    passed: bool = True
    tolerance: dict[str, Any] | None = None
    """The limits this output was held to (unset limits left out)."""
    detections: dict[str, Any] | None = None
    """A detection match's counts, recall, precision and mean IoU (``qdeploy.core.detections``); None elsewhere."""

    def to_dict(self) -> OutputMetricsDict:
        record = OutputMetricsDict(**asdict(self))
        if record["detections"] is None:
            del record["detections"]  # only a detector's boxes have one: every other record keeps its keys
        return record


@dataclass
class OutputComparison:
    """Every output's metrics, whether the tolerance held, why not, and remarks that do not fail it."""

    outputs: list[OutputMetrics]
    passed: bool
    reasons: list[str]
    notes: list[str] = field(default_factory=list)

    def worst(self) -> dict[str, float | None]:
        """Worst value over outputs: max of errors and kl (present only when an output has one), min of
        cosine/snr/within_tol/top-k, sum of nonfinite."""
        worst: dict[str, float | None] = {}
        for key in (*_MAX_FIELDS, *_MIN_FIELDS):
            values = [getattr(out, key) for out in self.outputs if getattr(out, key) is not None]
            worst[key] = (max(values) if key in _MAX_FIELDS else min(values)) if values else None
        if worst["kl"] is None:
            del worst["kl"]  # only language-model logits have one: every other record keeps its keys
        matches = [min(out.detections["recall"], out.detections["precision"]) for out in self.outputs
                   if out.detections]
        if matches:
            worst["detections_matched"] = min(matches)
        worst["nonfinite"] = sum(out.nonfinite for out in self.outputs)
        return worst

    def to_dict(self) -> OutputComparisonDict:
        return {
            "passed": self.passed,
            "reasons": list(self.reasons),
            "notes": list(self.notes),
            "worst": self.worst(),
            "outputs": [out.to_dict() for out in self.outputs],
        }


def compare_outputs(reference: Sequence[Mapping[str, np.ndarray]], candidate: Sequence[Mapping[str, np.ndarray]],
                    tolerance: Tolerance, per_output: Mapping[str, Tolerance] | None = None,
                    detections: Mapping[str, Any] | None = None) -> OutputComparison:
    """Compare per-sample outputs of a candidate with a reference's under a tolerance (per output if given), a
    detector's outputs by matching its boxes when ``detections`` names them.  Each sample's arrays are read as they
    are compared: samples that load from disk (``output_store``) are never all in memory at once."""
    per_output = per_output or {}
    reasons: list[str] = []
    notes: list[str] = []
    if len(reference) != len(candidate):
        reasons.append(f"reference has {len(reference)} samples, candidate {len(candidate)}")
    count = min(len(reference), len(candidate))
    if count == 0:
        reasons.append("no samples to compare")
    matched = consumed_outputs(detections)
    names = [name for name in dict.fromkeys(name for sample in reference[:count] for name in sample)
             if name not in matched]
    outputs = []
    if detections and count:
        outputs.append(_match(detections, reference[:count], candidate[:count], reasons))
    for name in names:
        refs, cands = _Column(reference[:count], name), _Column(candidate[:count], name)
        limits = per_output.get(name, tolerance)
        metrics, output_reasons = _compare_output(name, refs, cands, limits)
        metrics.passed = not output_reasons
        metrics.tolerance = limits.model_dump(exclude_none=True)
        outputs.append(metrics)
        reasons.extend(output_reasons)
    notes.extend(_unchecked(outputs, tolerance, per_output))
    notes.extend(note for name in names if (note := small_part_note(
        name, _Column(reference[:count], name), _Column(candidate[:count], name), per_output.get(name, tolerance))))
    return OutputComparison(outputs=outputs, passed=not reasons, reasons=reasons, notes=notes)


def _match(spec: Mapping[str, Any], reference: Sequence[Mapping[str, np.ndarray]],
           candidate: Sequence[Mapping[str, np.ndarray]], reasons: list[str]) -> OutputMetrics:
    """The detection match as one entry named after the boxes output; its broken limits join ``reasons``."""
    name = output_of(spec["boxes"])
    found, broken = match_detections(spec, reference, candidate)
    reasons.extend(f"detections '{name}': {problem}" for problem in broken)
    limits = dict(spec)  # nulls included (a null score_threshold keeps every row): the package check reads it
    return OutputMetrics(name=name, nonfinite=found.get("nonfinite", 0), passed=not broken, tolerance=limits,
                         detections=found or None, shape_mismatch=broken[0] if not found else None)


_CHECKED_ON = {"top1_agreement_min": ("top1_agreement", "class scores ([N, C] floats)"),
               "kl_max": ("kl", "per-token scores ([N, S, V] floats named ...logits)")}
"""Limits that apply to some outputs only: the metric each reads, and the outputs that have it."""


def _unchecked(outputs: list[OutputMetrics], tolerance: Tolerance, per_output: Mapping[str, Tolerance]) -> list[str]:
    """Notes on top-1 and KL limits that no output could be held to (no output has that metric)."""
    notes = []
    for limit_name, (metric, kind) in _CHECKED_ON.items():
        limit = getattr(tolerance, limit_name)
        if limit is not None and outputs and all(getattr(out, metric) is None for out in outputs):
            notes.append(f"{limit_name} {limit:g} set but no output looks like {kind}; not checked")
        for out in outputs:
            own = getattr(per_output[out.name], limit_name) if out.name in per_output else None
            if own is not None and getattr(out, metric) is None:
                notes.append(f"{limit_name} {own:g} set for output '{out.name}', which does not look like {kind}; "
                             "not checked")
    return notes


def as_array(value: Any) -> np.ndarray:
    """A runtime's output as an array the comparison reads.  ONNX Runtime hands back a sequence of maps (scikit-
    learn's ZipMap probabilities, one ``{class: probability}`` per row) as Python dicts: as numbers, one column
    per class in sorted class order, when every map has the same numeric classes; strings as a string array
    (compared exactly); anything else as it is."""
    array = np.asarray(value)
    if array.dtype != object or not array.size:
        return array
    items = array.reshape(-1).tolist()
    if all(isinstance(item, str) for item in items):
        return array.astype(str)
    if not all(isinstance(item, dict) for item in items):
        return array
    keys = sorted(items[0])
    if any(sorted(item) != keys for item in items) or not all(
            isinstance(number, int | float | np.number) for item in items for number in item.values()):
        return array
    return np.array([[item[key] for key in keys] for item in items], np.float64).reshape(*array.shape, len(keys))


def as_arrays(names: Sequence[str], values: Sequence[Any]) -> dict[str, np.ndarray]:
    """A session's outputs by name, each through :func:`as_array`."""
    return {name: as_array(value) for name, value in zip(names, values, strict=True)}


class _Column(Sequence[Any]):
    """One output across samples, each sample's array fetched when it is reached (None where it is missing)."""

    def __init__(self, samples: Sequence[Mapping[str, np.ndarray]], name: str) -> None:
        self._samples, self._name = samples, name

    def __len__(self) -> int:
        return len(self._samples)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return _Column(self._samples[index], self._name)
        sample = self._samples[index]
        return as_array(sample[self._name]) if self._name in sample else None


def _kind(array: np.ndarray) -> str:
    if array.dtype.kind == "f":
        return "float"
    if array.dtype.kind in "iu":
        return "integer"
    if array.dtype.kind == "b":
        return "bool"
    if array.dtype.kind in "US":
        return "string"
    return f"non-numeric ({array.dtype})"


_DATA_DEPENDENT_HINT = ("; a length that depends on the data (detections after an in-graph NonMaxSuppression) is "
                        "compared by matching boxes with validate.detections")


def _structure_mismatch(refs: Sequence[np.ndarray | None], cands: Sequence[np.ndarray | None]) -> str | None:
    """Why the output cannot be compared elementwise, or None."""
    for index, (ref, cand) in enumerate(zip(refs, cands, strict=True)):
        if ref is None:
            return f"missing from the reference in sample {index}"
        if cand is None:
            return f"missing from the candidate in sample {index}"
        if ref.shape != cand.shape:
            hint = _DATA_DEPENDENT_HINT if ref.ndim == cand.ndim else ""
            return (f"shape mismatch in sample {index}: reference {list(ref.shape)} vs candidate {list(cand.shape)}"
                    f"{hint}")
        if _kind(ref) != _kind(cand):
            return f"dtype mismatch: reference {ref.dtype} ({_kind(ref)}) vs candidate {cand.dtype} ({_kind(cand)})"
        if _kind(ref).startswith("non-numeric"):
            return f"cannot compare {_kind(ref)} values"
    return None


def _compare_output(name: str, refs: Sequence[Any], cands: Sequence[Any],
                    tolerance: Tolerance) -> tuple[OutputMetrics, list[str]]:
    """``refs`` and ``cands``: the output's array per sample (None where a sample lacks it)."""
    mismatch = _structure_mismatch(refs, cands)
    if mismatch is not None:
        return OutputMetrics(name=name, shape_mismatch=mismatch), [f"output '{name}': {mismatch}"]
    first = refs[0]  # none is missing past the structure check
    if _kind(first) == "string":  # class labels: equal or not
        same = [np.asarray(ref) == np.asarray(cand) for ref, cand in zip(refs, cands, strict=True)]
        size = sum(match.size for match in same)
        equal = sum(int(match.sum()) for match in same)
        metrics = OutputMetrics(name=name, within_tol=equal / size if size else 1.0)
        return metrics, [f"output '{name}': {size - equal} of {size} strings differ; they must match exactly"
                         ] if equal < size else []
    exact = _kind(first) != "float" and not (_kind(first) == "integer" and name in (tolerance.integer_values or ()))
    metrics = OutputMetrics(name=name)
    ref_nonfinite, size = _elementwise(metrics, refs, cands, tolerance, exact=exact)
    if _kind(first) == "float":
        if is_token_scores(name, first.shape, first.dtype):
            _token_scores(metrics, refs, cands)
        else:
            _topk(metrics, refs, cands)
    reasons = []
    if metrics.nonfinite:
        reasons.append(f"output '{name}': candidate holds {metrics.nonfinite} NaN/Inf values")
    if ref_nonfinite:
        reasons.append(f"output '{name}': reference holds {ref_nonfinite} NaN/Inf values; cannot validate against it")
    reasons.extend(_limit_reasons(metrics, tolerance, exact=exact, size=size))
    return metrics, reasons


def _flat(array: np.ndarray) -> np.ndarray:
    return array.reshape(-1).astype(np.float64)


def _elementwise(metrics: OutputMetrics, refs: Sequence[np.ndarray], cands: Sequence[np.ndarray],
                 tolerance: Tolerance, *, exact: bool) -> tuple[int, int]:
    """Fill the error, cosine, SNR and within-tolerance metrics and ``nonfinite``, one sample at a time in float64
    (the samples of a language model's logits together are hundreds of MB: they are never concatenated); returns
    the reference's NaN/Inf count and the count of positions finite in both, which the metrics cover."""
    peak, ref_nonfinite, nonfinite = 0.0, 0, 0
    for ref_array, cand_array in zip(refs, cands, strict=True):  # first pass: the largest |ref|, for max_rel_err
        ref, cand = _flat(ref_array), _flat(cand_array)
        ref_ok, cand_ok = np.isfinite(ref), np.isfinite(cand)
        ref_nonfinite += int(np.count_nonzero(~ref_ok))
        nonfinite += int(np.count_nonzero(~cand_ok))
        kept = np.abs(ref[ref_ok & cand_ok])
        peak = max(peak, float(kept.max()) if kept.size else 0.0)
    metrics.nonfinite = nonfinite
    atol, rtol = _atol_rtol(tolerance)
    size, max_err, sum_err, max_rel, within = 0, 0.0, 0.0, 0.0, 0
    dot, ref_sq, cand_sq, err_sq = 0.0, 0.0, 0.0, 0.0
    for ref_array, cand_array in zip(refs, cands, strict=True):
        ref, cand = _flat(ref_array), _flat(cand_array)
        finite = np.isfinite(ref) & np.isfinite(cand)
        ref, cand = ref[finite], cand[finite]
        if not ref.size:
            continue
        err, abs_ref = np.abs(cand - ref), np.abs(ref)
        size += ref.size
        max_err, sum_err = max(max_err, float(err.max())), sum_err + float(err.sum())
        significant = abs_ref > _REL_FLOOR * peak
        if significant.any():
            max_rel = max(max_rel, float((err[significant] / abs_ref[significant]).max()))
        dot, ref_sq = dot + float(np.dot(ref, cand)), ref_sq + float(np.dot(ref, ref))
        cand_sq, err_sq = cand_sq + float(np.dot(cand, cand)), err_sq + float(np.dot(err, err))
        within += int(np.count_nonzero(err == 0)) if exact else int(np.count_nonzero(err <= atol + rtol * abs_ref))
    metrics.max_abs_err, metrics.max_rel_err = max_err, max_rel
    metrics.mean_abs_err = sum_err / size if size else 0.0
    metrics.cosine = _cosine(dot, math.sqrt(ref_sq), math.sqrt(cand_sq))
    metrics.snr_db = snr_db(ref_sq, err_sq)
    metrics.within_tol = within / size if size else 1.0
    return ref_nonfinite, size


def _atol_rtol(tolerance: Tolerance) -> tuple[float, float]:
    if tolerance.atol is None and tolerance.rtol is None:
        return _ISCLOSE_ATOL, _ISCLOSE_RTOL
    return tolerance.atol or 0.0, tolerance.rtol or 0.0


def _cosine(dot: float, ref_norm: float, cand_norm: float) -> float:
    if ref_norm == 0.0 and cand_norm == 0.0:
        return 1.0
    if ref_norm == 0.0 or cand_norm == 0.0:
        return 0.0
    return float(np.clip(dot / (ref_norm * cand_norm), -1.0, 1.0))


def _class_count(shape: tuple[int, ...]) -> int | None:
    """The class count C when a shape looks like class scores ([N, C], [N, 1, .., 1, C]), else None."""
    if len(shape) < 2 or shape[-1] < 2 or any(dim != 1 for dim in shape[1:-1]):
        return None
    return shape[-1]


def _token_scores(metrics: OutputMetrics, refs: Sequence[np.ndarray], cands: Sequence[np.ndarray]) -> None:
    """Top-1 agreement per token position and the mean KL per token of ``[N, S, V]`` logits, sample by sample."""
    agree, rows, kl_total, kl_rows = 0, 0, 0.0, 0
    for ref, cand in zip(refs, cands, strict=True):
        matched, count = top1_matches(ref, cand)
        agree, rows = agree + matched, rows + count
        total, summed = kl_sum(ref, cand)
        kl_total, kl_rows = kl_total + total, kl_rows + summed
    metrics.top1_agreement = agree / rows if rows else None
    metrics.kl = kl_total / kl_rows if kl_rows else None


def _topk(metrics: OutputMetrics, refs: Sequence[np.ndarray], cands: Sequence[np.ndarray]) -> None:
    """Top-1 (and top-5 where every sample has 5 classes or more) agreement of class scores, sample by sample: a
    dynamic last axis (a decoder's attention over its input's length) gives each sample its own class count."""
    agree1 = agree5 = rows = 0
    five = True
    for ref, cand in zip(refs, cands, strict=True):
        classes = _class_count(ref.shape)
        if classes is None or cand.shape != ref.shape:
            return  # not class scores in every sample, or a shape the other metrics already refuse
        ref_rows, cand_rows = ref.reshape(-1, classes).astype(np.float64), cand.reshape(-1, classes).astype(np.float64)
        ref_top1 = np.argmax(ref_rows, axis=1)
        agree1 += int(np.sum(ref_top1 == np.argmax(cand_rows, axis=1)))
        rows += len(ref_rows)
        five = five and classes >= 5
        if five:
            cand_top5 = np.argpartition(-cand_rows, 4, axis=1)[:, :5]
            agree5 += int(np.sum(np.any(cand_top5 == ref_top1[:, None], axis=1)))
    if rows:
        metrics.top1_agreement = agree1 / rows
        metrics.top5_agreement = agree5 / rows if five else None


def _fmt(value: float, limit: float) -> str:
    """The measured value with enough digits to differ visibly from the limit it broke."""
    for digits in range(4, 18):
        text = f"{value:.{digits}g}"
        if float(text) != limit:
            return text
    return repr(value)


def _limit_reasons(m: OutputMetrics, tolerance: Tolerance, *, exact: bool, size: int) -> list[str]:
    """One reason per tolerance limit this output breaks."""
    where = f"output '{m.name}'"
    if exact:
        if m.within_tol is None or m.within_tol >= 1.0:
            return []
        differing = round((1.0 - m.within_tol) * size)
        share = differing / size if size else 1.0 - m.within_tol  # from counts: 1 - 0.98 is not 0.02
        if tolerance.mismatch_max is None:
            return [f"{where}: {differing} of {size} integer/bool elements differ "
                    f"(mismatch share {share:.4g}); they must match exactly"]
        if share > tolerance.mismatch_max:
            return [f"{where}: {differing} of {size} integer/bool elements differ "
                    f"(mismatch share {_fmt(share, tolerance.mismatch_max)} > mismatch_max {tolerance.mismatch_max:g})"]
        return []
    reasons = []
    if tolerance.cosine_min is not None and m.cosine is not None and m.cosine < tolerance.cosine_min:
        reasons.append(f"{where}: cosine {_fmt(m.cosine, tolerance.cosine_min)} < cosine_min {tolerance.cosine_min:g}")
    if tolerance.snr_db_min is not None and m.snr_db is not None and m.snr_db < tolerance.snr_db_min:
        reasons.append(f"{where}: snr_db {_fmt(m.snr_db, tolerance.snr_db_min)} < snr_db_min {tolerance.snr_db_min:g}")
    if tolerance.rtol is None and tolerance.atol is not None and m.max_abs_err is not None \
            and m.max_abs_err > tolerance.atol:
        reasons.append(f"{where}: max_abs_err {_fmt(m.max_abs_err, tolerance.atol)} > atol {tolerance.atol:g}")
    if tolerance.rtol is not None and m.within_tol is not None and m.within_tol < 1.0:
        outside = round((1.0 - m.within_tol) * size)
        reasons.append(f"{where}: {outside} of {size} elements ({1.0 - m.within_tol:.2%}) outside "
                       f"atol {tolerance.atol or 0.0:g} + rtol {tolerance.rtol:g}*|ref| "
                       f"(max_abs_err {m.max_abs_err:.4g}, max_rel_err {m.max_rel_err:.4g})")
    if tolerance.top1_agreement_min is not None and m.top1_agreement is not None \
            and m.top1_agreement < tolerance.top1_agreement_min:
        reasons.append(f"{where}: top1_agreement {_fmt(m.top1_agreement, tolerance.top1_agreement_min)} < "
                       f"top1_agreement_min {tolerance.top1_agreement_min:g}")
    if tolerance.kl_max is not None and m.kl is not None and m.kl > tolerance.kl_max:
        reasons.append(f"{where}: kl {_fmt(m.kl, tolerance.kl_max)} > kl_max {tolerance.kl_max:g} (mean KL "
                       "divergence per token)")
    return reasons
