"""Language-model metrics: KL and per-token top-1 on [N, S, V] logits, kl_max, and the built-in task metrics."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qdeploy.core.compare import compare_outputs
from qdeploy.core.lm_metrics import BUILTIN_METRICS, kl_sum, metric_direction, token_log_likelihood
from qdeploy.core.tolerance import TaskTolerance, Tolerance


def _kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


def _softmax(row: list[float]) -> list[float]:
    exps = [math.exp(value) for value in row]
    return [value / sum(exps) for value in exps]


REF = np.array([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]], np.float32)  # [N=1, S=2, V=3]
CAND = np.array([[[1.0, 0.0, 0.0], [0.0, 0.0, 3.0]]], np.float32)


def test_kl_and_top1_per_token_match_a_hand_computation() -> None:
    result = compare_outputs([{"logits": REF}], [{"logits": CAND}], Tolerance())
    (logits,) = result.outputs
    expected = (_kl(_softmax([2, 0, 0]), _softmax([1, 0, 0])) + _kl(_softmax([0, 1, 0]), _softmax([0, 0, 3]))) / 2
    assert logits.kl == pytest.approx(expected, rel=1e-9)
    assert logits.top1_agreement == 0.5  # token 0 agrees, token 1 does not
    assert logits.top5_agreement is None
    assert result.worst()["kl"] == pytest.approx(expected)
    assert result.to_dict()["outputs"][0]["kl"] == pytest.approx(expected)


def test_kl_is_computed_sample_by_sample_over_every_token() -> None:
    rng = np.random.default_rng(0)
    refs = [rng.standard_normal((1, 5, 7)).astype(np.float32) for _ in range(3)]
    cands = [ref + 0.1 * rng.standard_normal(ref.shape).astype(np.float32) for ref in refs]
    total, rows = kl_sum(np.concatenate(refs), np.concatenate(cands))
    result = compare_outputs([{"lm_logits": r} for r in refs], [{"lm_logits": c} for c in cands], Tolerance())
    assert rows == 15 and result.outputs[0].kl == pytest.approx(total / rows)
    same = compare_outputs([{"logits": REF}], [{"logits": REF.copy()}], Tolerance(kl_max=0.0))
    assert same.passed and same.outputs[0].kl == 0.0


def test_kl_max_fails_beyond_the_limit_and_names_it() -> None:
    loose = compare_outputs([{"logits": REF}], [{"logits": CAND}], Tolerance(kl_max=10.0))
    assert loose.passed
    tight = compare_outputs([{"logits": REF}], [{"logits": CAND}], Tolerance(kl_max=0.01))
    assert not tight.passed and any("kl_max 0.01" in reason for reason in tight.reasons)


def test_nan_in_the_candidate_logits_never_passes() -> None:
    broken = CAND.copy()
    broken[0, 1, 2] = np.nan
    result = compare_outputs([{"logits": REF}], [{"logits": broken}], Tolerance(kl_max=100.0))
    assert not result.passed and any("NaN/Inf" in reason for reason in result.reasons)
    assert result.outputs[0].kl is not None and math.isfinite(result.outputs[0].kl)  # JSON-safe: finite rows only


def test_kl_max_without_token_scores_is_noted_not_checked() -> None:
    scores = np.array([[0.1, 0.9]], np.float32)
    result = compare_outputs([{"probs": scores}], [{"probs": scores}], Tolerance(kl_max=0.1))
    assert result.passed and result.outputs[0].kl is None
    assert any("kl_max 0.1 set but no output" in note and "not checked" in note for note in result.notes)
    assert "kl" not in result.worst()  # records of other models keep their keys
    per_output = compare_outputs([{"probs": scores}], [{"probs": scores}], Tolerance(),
                                 per_output={"probs": Tolerance(kl_max=0.1)})
    assert any("for output 'probs'" in note for note in per_output.notes)


def test_a_3d_output_not_named_logits_is_no_token_scores() -> None:
    hidden = np.ones((1, 2, 3), np.float32)
    result = compare_outputs([{"hidden": hidden}], [{"hidden": hidden}], Tolerance())
    assert result.outputs[0].kl is None and result.outputs[0].top1_agreement is None


def test_perplexity_of_uniform_logits_is_the_vocabulary_size() -> None:
    logits = np.zeros((2, 6, 11), np.float32)
    labels = np.arange(12).reshape(2, 6) % 11
    total, count = token_log_likelihood(logits, labels)
    assert count == 10 and total == pytest.approx(10 * -math.log(11))
    perplexity = BUILTIN_METRICS["perplexity"]
    assert perplexity({"logits": logits}, labels) == pytest.approx(11.0)
    samples = [{"logits": logits[i:i + 1]} for i in range(2)]
    assert perplexity.over_samples(samples, [labels[i:i + 1] for i in range(2)]) == pytest.approx(11.0)
    assert BUILTIN_METRICS["log_likelihood"]({"logits": logits}, labels) == pytest.approx(-math.log(11))


def test_next_token_targets_shift_by_one_and_skip_padding() -> None:
    logits = np.full((1, 3, 4), -10.0, np.float32)
    logits[0, 0, 2] = 10.0  # position 0 predicts token 2
    logits[0, 1, 3] = 10.0  # position 1 predicts token 3
    total, count = token_log_likelihood(logits, np.array([[0, 2, 3]]))
    assert count == 2 and total == pytest.approx(0.0, abs=1e-6)
    _, padded = token_log_likelihood(logits, np.array([[0, 2, -100]]))
    assert padded == 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        token_log_likelihood(logits, np.array([[0, 9, 1]]))


def test_directions_and_names() -> None:
    assert metric_direction("perplexity") == "lower"
    assert metric_direction("log_likelihood") == "higher"
    assert metric_direction("metrics.py:accuracy") == "higher"
    assert TaskTolerance(metric="perplexity", max_relative_drop=0.05).metric == "perplexity"
    with pytest.raises(ValueError, match="built-in metric"):
        TaskTolerance(metric="accuracy", max_drop=0.1)
