"""The last word before a transform stage's artifact is stored: it loads, and it keeps the interface.

Every transform stage checks its own work its own way (simplify compares
outputs, fp16 emulates float16, quantize verifies its lowering).  Whatever a
stage did, the runner calls ``guard_artifact`` on its result before storing it:

- the new model must load in ONNX Runtime's CPU provider whenever its input
  model does (a model ONNX Runtime cannot load is never published), and in every
  other runtime the recipe targets (OpenVINO: ``guard_runtimes``, in a child process, where a crash of its CPU
  plugin fails the artifact, not the run);
- every graph (If/Loop/Scan bodies included) must be in topological order with
  every name in scope; an order problem alone is repaired here;
- its inputs and outputs must keep the input model's names and types, kinds
  included (a ``seq(tensor(float))`` input that lost its type is refused); only
  fp16 may turn float32 inputs/outputs into float16 (``keep_io_types: false``);
- when the stage's own comparison did not run (its findings' ``unchecked()``
  gives the reason, or the input model does not load in ONNX Runtime), the
  result says ``checked: false`` and why: "unchecked" is never reported as a pass.

A failure is a ``StageError`` naming the stage and the reason; the runner records
it as that variant's failure.  Models above 1.8 GB are loaded from a file with
external data instead of from bytes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from qdeploy.core.errors import ModelError, StageError
from qdeploy.core.runtimes import built_for
from qdeploy.core.values import one_line
from qdeploy.graph.external_data import check_saved_model
from qdeploy.graph.order import scope_problems, sort_topologically
from qdeploy.graph.utils import model_bytes
from qdeploy.pipeline.run.guard_runtimes import check_other_runtimes, targets_other_runtimes
from qdeploy.pipeline.run.large_results import resave_graph
from qdeploy.targets.onnxruntime import SessionInterface

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.context import Artifact, StageContext, StageResult

__all__ = ["PRECISION_CHANGES", "SERIALISE_LIMIT", "GuardRecordDict", "guard_artifact"]

log = logging.getLogger(__name__)

SERIALISE_LIMIT = int(1.8 * 2**30)
"""Above this the model goes to ONNX Runtime through a file (protobuf cannot serialise 2 GB)."""
PRECISION_CHANGES = {"fp16": {("tensor(float)", "tensor(float16)")}}
"""Stage -> (input model's type, new model's type) pairs that stage may introduce on graph inputs/outputs."""


class GuardRecordDict(TypedDict, total=False):
    """What the guard verified (the findings' ``guard``; empty for the export): nodes put back in order, where
    the model loads (ONNX Runtime, then ``other_runtimes``: runtime -> what loading found), and whether the
    stage's own comparison ran (``checked``; ``unchecked``: why not)."""

    reordered: str
    loads: str
    other_runtimes: dict[str, str]
    checked: bool
    unchecked: str


def guard_artifact(parent: Artifact | None, result: StageResult, stage: str, ctx: StageContext) -> GuardRecordDict:
    """StageError unless ``result.model`` may be published; what was verified (also added to the findings)."""
    if parent is None:  # export: nothing to compare against; it must load where it can
        _check_saved(result, stage, ctx.variant)
        return {}
    verdict = _graph_order(result.model, stage, ctx.variant)
    if verdict:
        resave_graph(result)
    reference, reference_error = _session_of_path(parent.path)
    reference = _interface_only(reference)  # one session in memory at a time: large models hold their weights
    candidate, candidate_error = (_session_of_path(result.path) if result.path is not None
                                  else _session_of_model(result.model, ctx.work_dir))
    if reference is None:
        verdict["loads"] = f"not checked: the input model does not load in ONNX Runtime either ({reference_error})"
    elif candidate is None:
        raise StageError(stage, ctx.variant, f"the new model does not load in ONNX Runtime while its input model "
                                             f"does: {candidate_error}")
    else:
        _same_interface(reference, candidate, stage, ctx.variant)
        verdict["loads"] = "onnxruntime CPUExecutionProvider, with the input model's input and output types"
    candidate = None  # one runtime's copy of the model in memory at a time
    verdict.update(_other_runtimes(parent, result, stage, ctx))
    unchecked = _unchecked_reason(result, reference_error)
    verdict["checked"] = unchecked is None
    if unchecked is not None:
        verdict["unchecked"] = unchecked
        log.warning("%s of %s is unchecked: %s", stage, ctx.variant, unchecked)
    result.guard = verdict
    return verdict


def _other_runtimes(parent: Artifact, result: StageResult, stage: str, ctx: StageContext) -> GuardRecordDict:
    """Loads on the other runtimes the variant is built for (``guard_runtimes``), from a file: the stage's, or a
    copy saved here.  ``int8@ort`` meets only ONNX Runtime's targets: OpenVINO's compile failing on it (its LPT on
    caustic-nmr's graph) is not the variant's fault, and ``int8@openvino`` is checked there instead."""
    targets = [target for target in ctx.targets if built_for(ctx.variant, target)]
    if not targets_other_runtimes(targets):
        return {}
    path = result.path if result.path is not None else Path(_saved(result.model, ctx.work_dir))
    found = check_other_runtimes(parent.path, path, targets, stage, ctx.variant)
    return {"other_runtimes": found} if found else {}


def _graph_order(model: onnx.ModelProto, stage: str, variant: str) -> GuardRecordDict:
    """Every graph topologically sorted and in scope; a pure order problem is repaired (tools that sort the main
    graph ignore what If/Loop bodies read from it), anything else is a StageError."""
    if not scope_problems(model.graph):
        return {}
    sort_topologically(model.graph)
    problems = scope_problems(model.graph)
    if problems:
        raise StageError(stage, variant, f"the new model is not a valid graph: {'; '.join(problems)}")
    log.info("%s of %s: nodes put back in topological order", stage, variant)
    return {"reordered": "nodes were out of topological order (subgraph reads included); put back in order"}


def _unchecked_reason(result: StageResult, reference_error: str | None) -> str | None:
    """Why the stage's own comparison did not run, or None when it ran (or the stage has none to run)."""
    unchecked = result.unchecked()
    if unchecked is None and reference_error is not None:
        return f"the input model does not load in ONNX Runtime: {reference_error}"
    return unchecked


def _same_interface(reference: Any, candidate: Any, stage: str, variant: str) -> None:
    allowed = PRECISION_CHANGES.get(stage, set())
    for kind in ("inputs", "outputs"):
        want = [(value.name, value.type) for value in getattr(reference, f"get_{kind}")()]
        got = [(value.name, value.type) for value in getattr(candidate, f"get_{kind}")()]
        if [name for name, _ in want] != [name for name, _ in got]:
            raise StageError(stage, variant, f"the new model's {kind} {[n for n, _ in got]} are not the input "
                                             f"model's {[n for n, _ in want]}")
        changed = [f"'{name}': {old} -> {new}" for (name, old), (_, new) in zip(want, got, strict=True)
                   if old != new and (old, new) not in allowed]
        if changed:
            raise StageError(stage, variant, f"the new model changed the types of its {kind}: {', '.join(changed)}")


def _check_saved(result: StageResult, stage: str, variant: str) -> None:
    """A large export skipped onnx's in-memory checker (protobuf's 2 GB limit): check its saved file instead."""
    if result.path is not None:
        try:
            check_saved_model(result.path)
        except ModelError as exc:
            raise StageError(stage, variant, str(exc)) from None


def _interface_only(session: Any) -> SessionInterface | None:
    return None if session is None else SessionInterface(session)


def _session_of_path(path: Path) -> tuple[Any, str | None]:
    try:
        return _session(str(path)), None
    except Exception as exc:  # custom ops, a runtime too old: reported, not raised
        return None, one_line(exc, 400)


def _session_of_model(model: onnx.ModelProto, work_dir: Path) -> tuple[Any, str | None]:
    try:
        if model_bytes(model) <= SERIALISE_LIMIT:
            return _session(model.SerializeToString()), None
        return _session(_saved(model, work_dir)), None
    except Exception as exc:
        return None, one_line(exc, 400)


def _saved(model: onnx.ModelProto, work_dir: Path) -> str:
    """A copy of a large model in ``work_dir`` with external data (``model`` itself is left as it is)."""
    import onnx

    work_dir.mkdir(parents=True, exist_ok=True)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    path = work_dir / "guard.onnx"
    onnx.save(copy, str(path), save_as_external_data=True, location="guard.onnx.data")
    return str(path)


def _session(model: str | bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # loading is the question
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

