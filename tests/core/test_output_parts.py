"""A detector's small class scores beside its large boxes: the whole-output metrics pass, the note says what
they cannot see (YOLOv8n's head, whose scores int8 rounded to 0 or 1.24 while its output read cosine 0.996)."""

from __future__ import annotations

import numpy as np

from qdeploy.core.compare import compare_outputs
from qdeploy.core.output_parts import small_part_note
from qdeploy.core.tolerance import Tolerance

INT8 = Tolerance(cosine_min=0.98, snr_db_min=15.0)


def _detections(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    boxes = rng.uniform(0.0, 320.0, (1, 4, 200))
    scores = rng.uniform(0.0, 1.0, (1, 80, 200)) ** 4  # mostly near 0, a few confident
    return np.concatenate([boxes, scores], axis=1).astype(np.float32)


def _pair(score_step: float) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    refs = [{"output0": _detections(seed)} for seed in range(3)]
    cands = []
    for sample in refs:
        out = sample["output0"].copy()
        out[:, :4] += np.random.default_rng(7).normal(0.0, 0.5, out[:, :4].shape).astype(np.float32)
        out[:, 4:] = np.round(out[:, 4:] / score_step) * score_step
        cands.append({"output0": out})
    return refs, cands


def test_scores_rounded_away_beside_boxes_pass_the_whole_output_and_are_noted() -> None:
    refs, cands = _pair(score_step=1.24)
    comparison = compare_outputs(refs, cands, INT8)
    assert comparison.passed and comparison.worst()["cosine"] > 0.99  # what the whole output hides
    note = next(note for note in comparison.notes if "output0" in note)
    assert "80 of 84 slices along axis 1 (indices 4-83)" in note and "under snr_db_min 15" in note


def test_scores_that_keep_their_precision_give_no_note() -> None:
    refs, cands = _pair(score_step=1e-3)
    assert compare_outputs(refs, cands, INT8).notes == []


def test_a_small_part_is_not_noted_where_the_whole_output_fails_or_no_snr_limit_is_set() -> None:
    refs, cands = _pair(score_step=1.24)
    column = [sample["output0"] for sample in refs], [sample["output0"] for sample in cands]
    assert small_part_note("output0", *column, Tolerance(cosine_min=0.98)) is None  # no SNR limit to hold it to
    assert small_part_note("output0", *column, Tolerance(snr_db_min=80.0)) is None  # the whole already fails


def test_outputs_of_one_scale_give_no_note() -> None:
    rng = np.random.default_rng(0)
    refs = [{"logits": rng.normal(size=(2, 10)).astype(np.float32)}]
    cands = [{"logits": refs[0]["logits"] + rng.normal(0.0, 0.3, (2, 10)).astype(np.float32)}]
    assert compare_outputs(refs, cands, INT8).notes == []


def test_rare_classes_of_a_softmax_and_a_quiet_background_are_no_part() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(0.0, 1.0, (4, 100))
    logits[:, 0::7] += 12.0  # every seventh class is likely: the others' probabilities are tiny and scattered
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    rounded = np.round(probabilities / 0.02) * 0.02
    assert compare_outputs([{"p": probabilities}], [{"p": rounded}], INT8).notes == []
    score_map = np.full((1, 1, 32, 32), 1e-4)
    score_map[..., :8, :] = 0.9  # text in the top rows, background below: rows are places, not parts
    noisy = score_map + 0.01
    assert compare_outputs([{"map": score_map}], [{"map": noisy}], INT8).notes == []


def test_per_token_logits_are_not_searched_for_parts() -> None:
    refs, cands = _pair(score_step=1.24)
    column = [sample["output0"] for sample in refs], [sample["output0"] for sample in cands]
    assert small_part_note("output0", *column, INT8) is not None
    assert small_part_note("logits", *column, INT8) is None  # [N, S, V] logits: positions, not parts
