"""Language-model metrics: per-token scores of ``[N, S, V]`` logits, and the built-in task metrics.

- ``is_token_scores(name, shape, dtype)``: a float output of rank 3 whose name ends with ``logits`` holds one
  distribution over the vocabulary per token position (causal LMs as optimum exports them).
- ``kl_sum(reference, candidate)``: the sum over token rows of KL(softmax(ref) || softmax(cand)) and the row
  count, computed with log-softmax in float64, a bounded chunk of rows at a time (logits of one 128-token window
  of a 49k vocabulary are 25 MB; a whole dataset's never exists at once).
- ``top1_matches(reference, candidate)``: how many token rows agree on their argmax, and how many rows.
- ``token_log_likelihood(logits, labels)``: the summed log-probability of ``labels[:, 1:]`` under
  ``logits[:, :-1]`` (next-token targets) and the token count; negative labels (padding, -100) are skipped.
- ``BUILTIN_METRICS``: task metrics a recipe names without a file (``validate: {metric: perplexity}``), each
  with its direction: ``perplexity`` (lower is better) and ``log_likelihood`` (higher is better).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

__all__ = ["BUILTIN_METRICS", "LOGITS_SUFFIX", "BuiltinMetric", "Direction", "builtin_metric", "is_token_scores",
           "kl_sum", "logits_of", "metric_direction", "token_log_likelihood", "top1_matches"]

LOGITS_SUFFIX = "logits"
_CHUNK_ELEMENTS = 1 << 22
"""Elements of one chunk of rows turned to float64 at once (32 MB): bounds the memory of every metric here."""

Direction = Literal["higher", "lower"]


def is_token_scores(name: str, shape: Sequence[int], dtype: np.dtype) -> bool:
    """Whether an output holds per-token class scores: ``[N, S, V]`` floats named ``...logits``, V >= 2."""
    return name.endswith(LOGITS_SUFFIX) and len(shape) == 3 and shape[-1] >= 2 and np.dtype(dtype).kind == "f"


def _row_chunks(*arrays: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """The arrays as rows over their last axis, in float64 chunks of at most ``_CHUNK_ELEMENTS`` elements."""
    width = arrays[0].shape[-1]
    rows = [np.asarray(array).reshape(-1, width) for array in arrays]
    step = max(1, _CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, rows[0].shape[0], step):
        yield tuple(part[start:start + step].astype(np.float64) for part in rows)


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis, shifted by the row maximum so exp never overflows."""
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def kl_sum(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, int]:
    """Sum over token rows of KL(softmax(reference) || softmax(candidate)) and the number of rows summed: rows
    where either holds NaN/Inf are left out (the comparison fails on those by itself)."""
    total, count = 0.0, 0
    for ref, cand in _row_chunks(reference, candidate):
        finite = np.isfinite(ref).all(axis=1) & np.isfinite(cand).all(axis=1)
        if not finite.any():
            continue
        log_p, log_q = _log_softmax(ref[finite]), _log_softmax(cand[finite])
        # p * (log p - log q); exp(log_p) is 0 where the reference gives a token no mass, and 0 * x is 0 there
        per_row = np.sum(np.exp(log_p) * (log_p - log_q), axis=1)
        total += float(np.maximum(per_row, 0.0).sum())  # KL >= 0; rounding may dip a hair below
        count += int(finite.sum())
    return total, count


def top1_matches(reference: np.ndarray, candidate: np.ndarray) -> tuple[int, int]:
    """Token rows whose argmax agrees, and the number of rows (no float64 copy: argmax needs none)."""
    width = reference.shape[-1]
    ref, cand = reference.reshape(-1, width), candidate.reshape(-1, width)
    return int(np.count_nonzero(np.argmax(ref, axis=1) == np.argmax(cand, axis=1))), int(ref.shape[0])


def token_log_likelihood(logits: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
    """Summed log-probability of the next tokens ``labels[:, 1:]`` under ``logits[:, :-1]``, and their count.
    ``logits`` is ``[N, S, V]`` (or ``[S, V]``), ``labels`` ``[N, S]`` (or ``[S]``) token ids; a negative label is
    padding and is skipped.  ValueError names a shape mismatch or a token id outside the vocabulary."""
    logits, labels = np.asarray(logits), np.asarray(labels)
    if logits.ndim == 2:
        logits = logits[np.newaxis]
    if labels.ndim == 1:
        labels = labels[np.newaxis]
    if logits.ndim != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"logits of shape {list(logits.shape)} need labels of shape {list(logits.shape[:2])} "
                         f"(token ids, one per position); got {list(labels.shape)}")
    if labels.dtype.kind not in "iu":
        raise ValueError(f"labels must be integer token ids, got {labels.dtype}")
    vocab = logits.shape[-1]
    targets = labels[:, 1:].reshape(-1)
    if targets.size and int(targets.max()) >= vocab:
        raise ValueError(f"label {int(targets.max())} is outside the vocabulary of the logits ({vocab} entries): "
                         "the tokenizer and the model do not match")
    total, count = 0.0, 0
    step = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    rows = logits[:, :-1].reshape(-1, vocab)
    for start in range(0, rows.shape[0], step):
        chosen = targets[start:start + step]
        keep = chosen >= 0
        if not keep.any():
            continue
        log_p = _log_softmax(rows[start:start + step][keep].astype(np.float64))
        total += float(log_p[np.arange(log_p.shape[0]), chosen[keep]].sum())
        count += int(keep.sum())
    return total, count


def logits_of(outputs: Mapping[str, Any]) -> tuple[str, Any]:
    """The output holding the logits: the one named ``logits``, else the only one whose name ends so."""
    if LOGITS_SUFFIX in outputs:
        return LOGITS_SUFFIX, outputs[LOGITS_SUFFIX]
    named = [name for name in outputs if name.endswith(LOGITS_SUFFIX)]
    if len(named) != 1:
        raise ValueError(f"a language-model metric reads the output named '{LOGITS_SUFFIX}' (or the only output "
                         f"whose name ends with it); the model's outputs are {sorted(outputs)}")
    return named[0], outputs[named[0]]


@dataclass(frozen=True)
class BuiltinMetric:
    """A task metric qdeploy ships, computed from the logits and the token-id labels of each sample.

    Callable as a user's metric is (``function(outputs, labels)`` on outputs stacked along the batch axis);
    ``over_samples`` computes the same from per-sample outputs without stacking them."""

    name: str
    direction: Direction
    description: str
    finish: Callable[[float, int], float]
    """(summed token log-probability, token count) -> the metric."""

    def __call__(self, outputs: Mapping[str, Any], labels: Any) -> float:
        _, logits = logits_of(outputs)
        if labels is None:
            raise ValueError(f"'{self.name}' needs token-id labels: read the data with reader 'text' (or give the "
                             "npz samples a 'label' array of token ids)")
        if isinstance(logits, list) or isinstance(labels, list):  # samples of differing lengths
            return self.over_samples([{LOGITS_SUFFIX: item} for item in logits], list(labels))
        return self.finish(*token_log_likelihood(logits, labels))

    def over_samples(self, outputs: Sequence[Mapping[str, np.ndarray]], labels: Sequence[np.ndarray] | None) -> float:
        """The metric over every sample's tokens, one sample at a time."""
        if labels is None:
            raise ValueError(f"'{self.name}' needs token-id labels: read the data with reader 'text' (or give the "
                             "npz samples a 'label' array of token ids)")
        if len(labels) != len(outputs):
            raise ValueError(f"{len(outputs)} samples and {len(labels)} labels; '{self.name}' needs one per sample")
        total, count = 0.0, 0
        for sample, label in zip(outputs, labels, strict=True):
            part, tokens = token_log_likelihood(logits_of(sample)[1], label)
            total, count = total + part, count + tokens
        return self.finish(total, count)


def _mean_log_prob(total: float, count: int) -> float:
    if count == 0:
        raise ValueError("no next-token targets: each sample needs at least two tokens")
    return total / count


def _perplexity(total: float, count: int) -> float:
    return math.exp(min(-_mean_log_prob(total, count), 700.0))  # exp(700) is near float64's end, not inf


BUILTIN_METRICS: dict[str, BuiltinMetric] = {
    "perplexity": BuiltinMetric("perplexity", "lower", "exp of the mean next-token negative log-likelihood",
                                _perplexity),
    "log_likelihood": BuiltinMetric("log_likelihood", "higher", "mean next-token log-probability",
                                    _mean_log_prob),
}
"""Task metrics named without a file: ``validate: {metric: perplexity}``."""


def builtin_metric(spec: str | None) -> BuiltinMetric | None:
    """The built-in metric a recipe's metric name means; None for a user's 'file.py:function'."""
    return BUILTIN_METRICS.get(spec) if spec is not None else None


def metric_direction(spec: str | None) -> Direction:
    """Which way a task metric is better: a built-in one says; a user's metric is taken as higher-is-better."""
    found = builtin_metric(spec)
    return found.direction if found is not None else "higher"
