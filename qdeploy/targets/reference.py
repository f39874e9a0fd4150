"""``reference:cpu``: onnx's reference evaluator, the true-fp16 check where no GPU exists (slow, exact)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from qdeploy.core.compare import as_arrays
from qdeploy.core.errors import ModelError
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.utils import graph_inputs
from qdeploy.targets.base import ExecutionInfo, Session, TargetAdapter, check_feeds, not_here, short_message
from qdeploy.targets.evaluator import EvaluatorCannotRun, build_evaluator, run_evaluator

__all__ = ["ReferenceSession", "ReferenceTarget"]

log = logging.getLogger(__name__)

class ReferenceTarget(TargetAdapter):
    """onnx.reference.ReferenceEvaluator: every op in its declared precision; fidelity only."""

    runtime = "onnx-reference"
    benchmarkable = False

    def availability(self) -> tuple[bool, str]:
        try:
            import onnx.reference  # noqa: F401  (present or not is the answer)
        except ImportError as exc:
            return False, not_here(self.name, f"onnx.reference cannot be imported: {short_message(exc)}")
        return True, ""

    def load(self, model_path: Path, *, threads: int | None = None, pin_f32: bool = True) -> Session:
        self._require_available(model_path)

        try:
            model = load_model(model_path)
            evaluator = build_evaluator(model)
        except EvaluatorCannotRun:
            raise
        except Exception as exc:
            raise ModelError(f"{Path(model_path).name}: onnx.reference cannot load the model: "
                             f"{short_message(exc)}") from None
        return ReferenceSession(self.name, evaluator, model, threads)


class ReferenceSession(Session):
    """A ReferenceEvaluator; slow, exact to each op's declared precision."""

    def __init__(self, target: str, evaluator: Any, model: Any, threads: int | None) -> None:
        self.target = target
        self._evaluator = evaluator
        self.input_names = [value.name for value in graph_inputs(model.graph)]
        self.output_names = [value.name for value in model.graph.output]
        notes = ["every op computed in its declared precision by onnx.reference"]
        if threads:
            notes.append(f"threads={threads} ignored: onnx.reference runs single-threaded numpy")
        self.executed = ExecutionInfo(
            target=target, runtime="onnx-reference", device="CPU", providers=["ReferenceEvaluator"],
            precision="declared", node_counts={"ReferenceEvaluator": len(model.graph.node)}, notes=notes,
            op_types=dict(Counter(node.op_type for node in model.graph.node)),
        )

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        check_feeds(self.target, self.input_names, feeds)
        outputs = run_evaluator(self._evaluator, dict(feeds))
        return as_arrays(self.output_names, outputs)
