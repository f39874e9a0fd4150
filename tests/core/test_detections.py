"""A detector's outputs matched by IoU (qdeploy.core.detections) and compared that way by compare_outputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from qdeploy.core.compare import compare_outputs
from qdeploy.core.detections import consumed_outputs, match_detections, parse_column
from qdeploy.core.tolerance import DEFAULT_TOLERANCES

SPEC: dict[str, Any] = {"boxes": "boxes", "scores": "scores", "labels": "labels", "iou_min": 0.5, "match_min": 0.9,
                        "score_threshold": 0.0}


def _image(boxes: list[list[float]], scores: list[float], labels: list[int]) -> dict[str, np.ndarray]:
    return {"boxes": np.array(boxes, np.float32).reshape(-1, 4), "scores": np.array(scores, np.float32),
            "labels": np.array(labels, np.int64)}


REFERENCE = _image([[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60], [70, 0, 80, 10]],
                   [0.9, 0.8, 0.6, 0.55], [1, 2, 1, 0])


def test_the_same_detections_in_another_order_all_match() -> None:
    order = [2, 0, 3, 1]
    shuffled = {name: value[order] for name, value in REFERENCE.items()}
    found, broken = match_detections(SPEC, [REFERENCE], [shuffled])
    assert broken == []
    assert found["matched"] == 4 and found["recall"] == found["precision"] == 1.0 and found["mean_iou"] == 1.0


def test_a_dropped_and_an_extra_box_lower_recall_and_precision() -> None:
    candidate = _image([[0, 0, 10, 11], [20, 20, 30, 30], [50, 50, 60, 60], [90, 90, 99, 99]],
                       [0.88, 0.81, 0.58, 0.52], [1, 2, 1, 2])
    found, broken = match_detections({**SPEC, "match_min": 0.8}, [REFERENCE], [candidate])
    assert (found["matched"], found["recall"], found["precision"]) == (3, 0.75, 0.75)
    assert found["max_score_diff"] == pytest.approx(0.02, abs=1e-6)
    assert len(broken) == 1 and "recall 0.75 and precision 0.75 < match_min 0.8" in broken[0]
    assert "3 matched of 4 reference and 4 candidate detections" in broken[0]


def test_a_box_matches_only_one_of_the_same_class() -> None:
    relabelled = {**REFERENCE, "labels": np.array([0, 2, 1, 0])}  # the first box changed class
    found, _ = match_detections(SPEC, [REFERENCE], [relabelled])
    assert found["matched"] == 3
    found, _ = match_detections({**SPEC, "labels": None}, [REFERENCE], [relabelled])
    assert found["matched"] == 4


def test_the_best_overlap_is_taken_first_by_the_highest_score() -> None:
    reference = _image([[0, 0, 10, 10], [4, 0, 14, 10]], [0.9, 0.8], [0, 0])
    candidate = _image([[4, 0, 14, 10], [0, 0, 10, 10]], [0.95, 0.7], [0, 0])
    found, _ = match_detections(SPEC, [reference], [candidate])
    assert found["matched"] == 2 and found["mean_iou"] == 1.0  # not the first reference box at IoU 0.43


def test_iou_below_the_limit_is_no_match() -> None:
    shifted = {**REFERENCE, "boxes": REFERENCE["boxes"] + np.array([5, 0, 5, 0], np.float32)}  # IoU 1/3
    found, broken = match_detections(SPEC, [REFERENCE], [shifted])
    assert found["matched"] == 0 and broken
    found, broken = match_detections({**SPEC, "iou_min": 0.3}, [REFERENCE], [shifted])
    assert found["matched"] == 4 and not broken


def test_packed_rows_of_a_batch_are_matched_per_image_and_padding_is_left_out() -> None:
    rows = np.concatenate([REFERENCE["boxes"], REFERENCE["scores"][:, None], REFERENCE["labels"][:, None]], 1)
    padded = np.concatenate([rows, np.zeros((2, 6), np.float32)])  # exporters pad to a fixed count with zeros
    batch = np.stack([padded, padded[::-1]])  # [2, 6, 6]: image 1 holds the same rows in reverse
    spec = {"boxes": "det[0:4]", "scores": "det[4]", "labels": "det[5]"}
    found, broken = match_detections(spec, [{"det": batch}], [{"det": batch[:, ::-1]}])
    assert broken == [] and (found["reference_detections"], found["matched"]) == (8, 8)
    other = batch.copy()
    other[1] = other[0]  # the second image's rows placed in the first image's order: still the same set
    assert match_detections(spec, [{"det": batch}], [{"det": other}])[0]["matched"] == 8
    moved = batch.copy()
    moved[1, :, :4] += 100.0  # the second image's boxes elsewhere: they do not match the first image's
    assert match_detections(spec, [{"det": batch}], [{"det": moved}])[0]["matched"] == 4


def test_box_formats_read_as_corners() -> None:
    corners = REFERENCE["boxes"]
    center = np.concatenate([(corners[:, :2] + corners[:, 2:]) / 2, corners[:, 2:] - corners[:, :2]], 1)
    corner_size = np.concatenate([corners[:, :2], corners[:, 2:] - corners[:, :2]], 1)
    for box_format, boxes in (("cxcywh", center), ("xywh", corner_size)):
        spec = {**SPEC, "box_format": box_format}
        found, _ = match_detections(spec, [{**REFERENCE, "boxes": boxes}], [{**REFERENCE, "boxes": boxes}])
        assert found["mean_iou"] == 1.0
        # read as corners, these widths and heights would not be the reference's boxes
        found, _ = match_detections(SPEC, [REFERENCE], [{**REFERENCE, "boxes": boxes}])
        assert found["matched"] < 4


def test_nan_in_the_candidate_fails_and_shapes_that_are_no_boxes_are_named() -> None:
    broken_boxes = {**REFERENCE, "boxes": REFERENCE["boxes"].copy()}
    broken_boxes["boxes"][0, 0] = np.nan
    found, broken = match_detections(SPEC, [REFERENCE], [broken_boxes])
    assert found["nonfinite"] == 1 and any("NaN/Inf" in reason for reason in broken)
    _, broken = match_detections({**SPEC, "boxes": "scores"}, [REFERENCE], [REFERENCE])
    assert "expected [N, 4] or [B, N, 4]" in broken[0]
    _, broken = match_detections({**SPEC, "scores": "missing"}, [REFERENCE], [REFERENCE])
    assert "output 'missing' is missing; the model's outputs: boxes, labels, scores" in broken[0]
    _, broken = match_detections({**SPEC, "boxes": "boxes[5:9]"}, [REFERENCE], [REFERENCE])
    assert "no such columns" in broken[0]


def test_a_score_limit_holds_matched_pairs() -> None:
    lower = {**REFERENCE, "scores": REFERENCE["scores"] - np.float32(0.05)}
    _, broken = match_detections({**SPEC, "score_atol": 0.01}, [REFERENCE], [lower])
    assert len(broken) == 1 and "score differs by 0.05" in broken[0]


def test_columns_parse() -> None:
    assert parse_column("det[0:4]") == ("det", slice(0, 4))
    assert parse_column("det[-1]") == ("det", -1)
    assert parse_column("output.0") == ("output.0", None)
    assert consumed_outputs({"boxes": "det[0:4]", "scores": "det[4]", "labels": None}) == {"det"}


def test_compare_outputs_matches_the_named_outputs_and_compares_the_others_elementwise() -> None:
    feature = np.linspace(0, 1, 8, dtype=np.float32)
    reference = [{**REFERENCE, "feature": feature}]
    candidate = [{**{name: value[:3] for name, value in REFERENCE.items()}, "feature": feature * 0.5}]
    comparison = compare_outputs(reference, candidate, DEFAULT_TOLERANCES["int8"], detections=SPEC)
    names = [output.name for output in comparison.outputs]
    assert names == ["boxes", "feature"]  # one entry for the match, named after the boxes
    boxes = comparison.outputs[0].to_dict()
    assert boxes["detections"]["recall"] == 0.75 and boxes["tolerance"]["match_min"] == 0.9
    assert "detections" not in comparison.outputs[1].to_dict()
    assert comparison.worst()["detections_matched"] == 0.75
    assert [reason.split(":")[0] for reason in comparison.reasons] == ["detections 'boxes'", "output 'feature'"]
    assert compare_outputs(reference, reference, DEFAULT_TOLERANCES["int8"], detections=SPEC).passed


def test_without_a_spec_a_length_that_moved_says_how_to_compare_it() -> None:
    candidate = [{name: value[:3] for name, value in REFERENCE.items()}]
    comparison = compare_outputs([REFERENCE], candidate, DEFAULT_TOLERANCES["int8"])
    assert not comparison.passed and "detections" not in comparison.worst()
    assert all("validate.detections" in reason for reason in comparison.reasons)
