"""Typed stage findings serialise to the report's keys: keys a stage did not write stay out (issue 30)."""

from __future__ import annotations

import onnx
import pytest
from pydantic import ValidationError

from qdeploy.core.context import StageResult
from qdeploy.core.findings import Findings


class _Found(Findings):
    count: int
    worst: float | None
    budget: dict[str, int] | None = None

    def unchecked(self) -> str | None:
        return "no data" if self.worst is None else None


def test_a_default_none_key_stays_out_and_a_required_one_shows_null() -> None:
    assert _Found(count=1, worst=None).to_report() == {"count": 1, "worst": None}
    assert _Found(count=1, worst=0.5, budget=None).to_report() == {"count": 1, "worst": 0.5}
    assert _Found(count=1, worst=0.5, budget={"trials": 2}).to_report() == {"count": 1, "worst": 0.5,
                                                                            "budget": {"trials": 2}}


def test_an_undeclared_key_is_refused() -> None:
    with pytest.raises(ValidationError, match="extra"):
        _Found(count=1, worst=None, surprise=True)  # type: ignore[call-arg]


def test_the_result_reports_typed_findings_with_the_guard() -> None:
    model = onnx.ModelProto()
    typed = StageResult(model=model, findings=_Found(count=2, worst=None), guard={"checked": False})
    assert typed.report() == {"count": 2, "worst": None, "guard": {"checked": False}}
    assert typed.unchecked() == "no data"
    assert StageResult(model=model).report() == {} and StageResult(model=model).unchecked() is None
