"""The accuracy budget on a detector's matched boxes: its error ratio, its margin, and pooling over samples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qdeploy.core.tolerance import Tolerance
from qdeploy.stages.accuracy_budget.evaluate import error_ratio, tightened_match, worst_of

SPEC = {"boxes": "boxes", "scores": "scores", "iou_min": 0.5, "match_min": 0.7, "score_threshold": 0.0}


def _sample(boxes: list[list[float]]) -> dict[str, np.ndarray]:
    return {"boxes": np.array(boxes, np.float32).reshape(-1, 4),
            "scores": np.linspace(0.9, 0.5, len(boxes), dtype=np.float32)}


REFERENCE = [_sample([[0, 0, 10, 10], [20, 20, 30, 30]]), _sample([[0, 0, 10, 10], [20, 20, 30, 30]])]
ONE_MISSED = [_sample([[0, 0, 10, 10], [20, 20, 30, 30]]), _sample([[0, 0, 10, 10]])]  # 3 of 4 matched


def test_the_error_ratio_is_the_unmatched_share_over_the_allowed_one() -> None:
    comparison = worst_of(REFERENCE, ONE_MISSED, Tolerance(cosine_min=0.99), SPEC)
    assert comparison.passed  # pooled: 3 of 4 (0.75 >= 0.7); the second sample alone holds 1 of 2
    assert error_ratio(comparison, Tolerance(cosine_min=0.99)) == pytest.approx(0.25 / 0.3)
    stricter = worst_of(REFERENCE, ONE_MISSED, Tolerance(), {**SPEC, "match_min": 0.9})
    assert not stricter.passed and error_ratio(stricter, Tolerance()) == pytest.approx(0.25 / 0.1)


def test_the_search_margin_tightens_the_match_too() -> None:
    assert tightened_match(SPEC, 0.5)["match_min"] == pytest.approx(0.85)  # half of the 0.3 allowed unmatched
    assert tightened_match(SPEC, 1.0) is SPEC and tightened_match(None, 0.5) is None
    held = worst_of(REFERENCE, ONE_MISSED, Tolerance(), tightened_match(SPEC, 0.5))
    assert not held.passed and math.isfinite(error_ratio(held, Tolerance()))
