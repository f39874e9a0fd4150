"""compare_outputs: metrics, class-score detection and the reasons a comparison fails."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qdeploy.core.compare import SNR_CAP_DB, compare_outputs
from qdeploy.core.tolerance import Tolerance

RNG = np.random.default_rng(1)


def _samples(name: str, arrays: list[np.ndarray]) -> list[dict[str, np.ndarray]]:
    return [{name: array} for array in arrays]


def test_identical_outputs_pass_with_perfect_metrics() -> None:
    ref = _samples("logits", [RNG.standard_normal((2, 10)).astype(np.float32) for _ in range(3)])
    result = compare_outputs(ref, [dict(s) for s in ref], Tolerance(cosine_min=0.9999, snr_db_min=60, atol=0.0))
    assert result.passed and result.reasons == []
    metrics = result.outputs[0]
    assert metrics.name == "logits"
    assert metrics.cosine == 1.0
    assert metrics.snr_db == SNR_CAP_DB
    assert metrics.max_abs_err == 0.0 and metrics.within_tol == 1.0 and metrics.nonfinite == 0
    assert metrics.top1_agreement == 1.0 and metrics.top5_agreement == 1.0
    assert json.loads(json.dumps(result.to_dict(), allow_nan=False))["passed"] is True


def test_nan_in_candidate_fails_whatever_the_tolerance() -> None:
    ref = _samples("logits", [np.ones((1, 4), np.float32), np.ones((1, 4), np.float32)])
    cand = _samples("logits", [np.ones((1, 4), np.float32), np.array([[1, np.nan, 1, np.inf]], np.float32)])
    result = compare_outputs(ref, cand, Tolerance())
    assert not result.passed
    assert result.outputs[0].nonfinite == 2
    assert result.reasons == ["output 'logits': candidate holds 2 NaN/Inf values"]
    assert result.outputs[0].max_abs_err == 0.0  # metrics use the positions finite in both
    json.dumps(result.to_dict(), allow_nan=False)


def test_top1_and_top5_agreement_on_class_scores() -> None:
    ref = np.tile(np.arange(10, dtype=np.float32), (8, 1))  # every row: class 9 wins, class 8 second
    cand = ref.copy()
    cand[0, 8], cand[1, 8] = 20.0, 20.0  # argmax flips to 8; 9 still in top 5
    cand[2, 9] = -1.0  # class 9 drops to the bottom: out of the top 5 as well
    result = compare_outputs([{"scores": ref}], [{"scores": cand}], Tolerance(top1_agreement_min=0.9))
    metrics = result.outputs[0]
    assert metrics.top1_agreement == pytest.approx(5 / 8)
    assert metrics.top5_agreement == pytest.approx(7 / 8)
    assert "output 'scores': top1_agreement 0.625 < top1_agreement_min 0.9" in result.reasons
    assert not result.passed


def test_top1_counts_rows_of_squeezed_class_axes() -> None:
    ref = RNG.standard_normal((2, 1, 1, 6))
    result = compare_outputs([{"p": ref}], [{"p": -ref}], Tolerance())
    assert result.outputs[0].top1_agreement == 0.0
    assert result.outputs[0].top5_agreement is not None


def test_top1_over_samples_whose_class_count_differs() -> None:
    """A decoder's attention weights over its input ([1, L], L per sample): each sample has its own class count
    (this raised "cannot reshape array of size 9 into shape (10)" inside the quantize stage)."""
    refs = [{"attention": np.arange(n, dtype=np.float32)[None]} for n in (10, 9, 4)]  # the last index wins
    cands = [{"attention": sample["attention"].copy()} for sample in refs]
    cands[1]["attention"][0, 0] = 99.0  # the second sample's argmax moves
    metrics = compare_outputs(refs, cands, Tolerance()).outputs[0]
    assert metrics.top1_agreement == pytest.approx(2 / 3)
    assert metrics.top5_agreement is None  # one sample has fewer than 5 classes


def test_no_topk_on_a_dense_map() -> None:
    ref = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    result = compare_outputs([{"map": ref}], [{"map": ref + 0.01}], Tolerance(top1_agreement_min=0.99))
    metrics = result.outputs[0]
    assert metrics.top1_agreement is None and metrics.top5_agreement is None
    assert result.passed
    assert any("no output looks like class scores" in note for note in result.notes)


def test_cosine_min_violation_names_limit_value_and_output() -> None:
    ref = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    cand = np.array([[1.0, 2.0, 3.0, -1.0]], np.float32)
    expected = float(np.dot(ref.ravel(), cand.ravel()) / (np.linalg.norm(ref) * np.linalg.norm(cand)))
    result = compare_outputs([{"y": ref}], [{"y": cand}], Tolerance(cosine_min=0.99))
    assert result.outputs[0].cosine == pytest.approx(expected)
    assert result.reasons == [f"output 'y': cosine {expected:.4g} < cosine_min 0.99"]
    assert not result.passed


def test_snr_matches_its_definition_and_limit() -> None:
    ref = np.array([3.0, 4.0])
    cand = np.array([3.1, 3.9])
    expected = 10 * math.log10(25.0 / 0.02)
    result = compare_outputs([{"y": ref}], [{"y": cand}], Tolerance(snr_db_min=40))
    assert result.outputs[0].snr_db == pytest.approx(expected)
    assert len(result.reasons) == 1 and result.reasons[0].startswith("output 'y': snr_db 30.9")


@pytest.mark.parametrize(("tolerance", "passed", "within"), [
    (Tolerance(atol=0.1), False, 0.5),               # atol alone: max_abs_err 0.5 > 0.1
    (Tolerance(atol=0.6), True, 1.0),
    (Tolerance(atol=0.1, rtol=0.01), True, 1.0),     # limits 0.11 and 1.1
    (Tolerance(atol=0.01, rtol=0.004), False, 0.0),  # limits 0.014 and 0.41
    (Tolerance(atol=0.06, rtol=0.004), False, 0.5),  # limits 0.064 and 0.46: 0.5 is outside
])
def test_atol_rtol_elementwise(tolerance: Tolerance, passed: bool, within: float) -> None:
    ref = np.array([1.0, 100.0], np.float32)
    cand = np.array([1.05, 100.5], np.float32)
    result = compare_outputs([{"y": ref}], [{"y": cand}], tolerance)
    assert result.passed is passed
    assert result.outputs[0].within_tol == pytest.approx(within)
    if not passed:
        assert result.reasons[0].startswith("output 'y': ")


def test_rtol_reason_counts_the_elements_outside() -> None:
    ref = np.array([1.0, 100.0, 10.0, 10.0])
    cand = np.array([1.05, 100.5, 10.0, 10.0])
    result = compare_outputs([{"y": ref}], [{"y": cand}], Tolerance(atol=0.01, rtol=0.004))
    assert result.reasons[0].startswith("output 'y': 2 of 4 elements (50.00%) outside atol 0.01 + rtol 0.004*|ref|")
    assert result.outputs[0].max_rel_err == pytest.approx(0.05, rel=1e-6)


def test_shape_dtype_and_missing_outputs_fail_by_name() -> None:
    ref = [{"a": np.zeros((1, 4)), "b": np.zeros((2,)), "c": np.zeros((3,), np.int64)}]
    cand = [{"a": np.zeros((1, 5)), "c": np.zeros((3,), np.float32)}]
    result = compare_outputs(ref, cand, Tolerance())
    assert not result.passed
    by_name = {out.name: out for out in result.outputs}
    assert "reference [1, 4] vs candidate [1, 5]" in by_name["a"].shape_mismatch
    assert "missing from the candidate" in by_name["b"].shape_mismatch
    assert "dtype mismatch" in by_name["c"].shape_mismatch
    assert [reason.split(":")[0] for reason in result.reasons] == ["output 'a'", "output 'b'", "output 'c'"]
    assert result.worst()["max_abs_err"] is None


def test_integer_outputs_must_match_exactly() -> None:
    ref = np.array([1, 2, 3, 4], np.int64)
    cand = np.array([1, 2, 3, 5], np.int32)
    result = compare_outputs([{"ids": ref}], [{"ids": cand}], Tolerance(atol=10.0, cosine_min=0.5))
    assert result.outputs[0].within_tol == 0.75
    assert result.reasons == ["output 'ids': 1 of 4 integer/bool elements differ (mismatch share 0.25); "
                              "they must match exactly"]
    assert compare_outputs([{"ids": ref}], [{"ids": ref.copy()}], Tolerance()).passed


def test_an_integer_output_may_differ_up_to_its_mismatch_max() -> None:
    """Class labels or the boxes an in-graph NMS keeps: a recipe may allow a share of them to differ."""
    ref = np.arange(100, dtype=np.int64)
    cand = ref.copy()
    cand[:3] += 1
    assert compare_outputs([{"label": ref}], [{"label": cand}], Tolerance(mismatch_max=0.03)).passed
    result = compare_outputs([{"label": ref}], [{"label": cand}], Tolerance(mismatch_max=0.02))
    assert result.reasons == ["output 'label': 3 of 100 integer/bool elements differ (mismatch share 0.03 > "
                              "mismatch_max 0.02)"]
    floats = [{"y": np.ones(4, np.float32)}], [{"y": np.full(4, 2.0, np.float32)}]
    assert not compare_outputs(*floats, Tolerance(mismatch_max=1.0, atol=0.5)).passed  # float outputs ignore it


def test_cosine_of_zero_tensors() -> None:
    zeros = np.zeros((2, 3))
    assert compare_outputs([{"y": zeros}], [{"y": zeros}], Tolerance()).outputs[0].cosine == 1.0
    result = compare_outputs([{"y": zeros}], [{"y": np.ones((2, 3))}], Tolerance())
    assert result.outputs[0].cosine == 0.0
    assert result.outputs[0].snr_db == -SNR_CAP_DB


def test_metrics_span_all_samples_and_worst_aggregates_outputs() -> None:
    ref = _samples("y", [np.zeros(2), np.ones(2)])
    cand = _samples("y", [np.zeros(2), np.array([1.0, 1.5])])
    for r, c, value in zip(ref, cand, (1.0, 2.0), strict=True):
        r["w"], c["w"] = np.full(2, value), np.full(2, value + 0.1)
    result = compare_outputs(ref, cand, Tolerance())
    y = result.outputs[0]
    assert y.max_abs_err == 0.5 and y.mean_abs_err == pytest.approx(0.125)
    worst = result.worst()
    assert worst["max_abs_err"] == 0.5
    assert worst["mean_abs_err"] == pytest.approx(0.125)
    assert worst["cosine"] == pytest.approx(min(y.cosine, result.outputs[1].cosine))
    assert worst["top1_agreement"] is None and worst["nonfinite"] == 0


def test_differing_sample_counts_fail() -> None:
    ref = _samples("y", [np.zeros(2), np.zeros(2)])
    result = compare_outputs(ref, ref[:1], Tolerance())
    assert not result.passed
    assert result.reasons == ["reference has 2 samples, candidate 1"]


def test_per_output_tolerances_apply_by_name_and_are_recorded() -> None:
    ref = [{"boxes": np.array([10.0, 20.0, 30.0]), "scores": np.array([[0.1, 0.9]])}]
    cand = [{"boxes": np.array([10.4, 20.0, 30.0]), "scores": np.array([[0.1, 0.9]])}]
    tight = Tolerance(atol=0.01)
    result = compare_outputs(ref, cand, tight)
    assert not result.passed and result.reasons == ["output 'boxes': max_abs_err 0.4 > atol 0.01"]
    result = compare_outputs(ref, cand, tight, per_output={"boxes": Tolerance(atol=0.5)})
    assert result.passed
    by_name = {out.name: out for out in result.outputs}
    assert by_name["boxes"].tolerance == {"atol": 0.5} and by_name["scores"].tolerance == {"atol": 0.01}
    assert by_name["boxes"].passed and by_name["scores"].passed
    failing = compare_outputs(ref, cand, Tolerance(), per_output={"boxes": Tolerance(atol=0.1)})
    assert [out.passed for out in failing.outputs] == [False, True]


def test_top1_limit_on_an_output_without_class_scores_is_noted() -> None:
    ref = [{"boxes": np.ones((1, 4, 4)), "scores": np.array([[0.1, 0.9]])}]
    result = compare_outputs(ref, ref, Tolerance(), per_output={"boxes": Tolerance(top1_agreement_min=0.9)})
    assert result.passed
    assert result.notes == ["top1_agreement_min 0.9 set for output 'boxes', which does not look like class "
                            "scores ([N, C] floats); not checked"]


def test_scikit_learns_outputs_are_compared_as_numbers_and_labels() -> None:
    """ZipMap's probabilities come back from ONNX Runtime as one dict per row, string class labels as Python
    strings: compared class by class (sorted) and exactly.  Before: 'cannot compare non-numeric (object) values'."""
    from qdeploy.core.compare import as_array

    maps = [{1: 0.25, 0: 0.75}, {0: 0.5, 1: 0.5}]
    assert as_array(maps).tolist() == [[0.75, 0.25], [0.5, 0.5]]
    labels = np.asarray(["cat", "dog"], dtype=object)
    reference = [{"p": maps, "label": labels}]
    close = [{"p": [{0: 0.7501, 1: 0.2499}, {0: 0.5, 1: 0.5}], "label": np.asarray(["cat", "dog"], dtype=object)}]
    result = compare_outputs(reference, close, Tolerance(cosine_min=0.999))
    assert result.passed, result.reasons
    wrong = [{"p": [{0: 0.25, 1: 0.75}, {0: 0.5, 1: 0.5}], "label": np.asarray(["dog", "dog"], dtype=object)}]
    result = compare_outputs(reference, wrong, Tolerance(cosine_min=0.999))
    assert any("output 'p': cosine" in reason for reason in result.reasons)
    assert "output 'label': 1 of 2 strings differ; they must match exactly" in result.reasons
    assert as_array([{0: 1.0}, {1: 1.0}]).dtype == object  # classes that differ per row: not made into numbers
