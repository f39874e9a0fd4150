"""The guard's second question: does every runtime the recipe targets load the new model, not ONNX Runtime only?

Runtimes disagree on what they read: OpenVINO refuses a ``GatherBlockQuantized`` (or other blocked weights) whose
quantized axis is not a multiple of its block, which ONNX Runtime pads and runs.  Loading in ONNX Runtime alone
published such artifacts, and they failed only at validation.  When the recipe targets OpenVINO (any
``openvino:*`` target), ``check_other_runtimes`` reads the new model with OpenVINO's ``Core.read_model`` and
compiles it on the CPU plugin (the device every OpenVINO install has: a missing GPU is not the model's fault), in
a child process (``qdeploy.targets.openvino_probe``: the plugin has crashed the process on some graphs).  A
model OpenVINO cannot load while its input model loads is a ``StageError`` naming the runtime and the node; where
the input model does not load either, the verdict says "not checked" and why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from qdeploy.core.errors import StageError
from qdeploy.core.runtimes import runtime_of_target
from qdeploy.core.values import one_line
from qdeploy.targets.openvino_probe import openvino_failure

__all__ = ["check_other_runtimes", "openvino_problem", "targets_other_runtimes"]

log = logging.getLogger(__name__)

_OV_NODE = re.compile(r"<Node\(([^)]*)\): ([^>]*)>")
"""How OpenVINO's ONNX frontend names the node it failed on: ``<Node(GatherBlockQuantized): h>`` (its first
output)."""
_OV_FAILED_OPS = re.compile(r"Conversion is failed for: ([^\n]+)")
_NOISE = re.compile(r"(Exception from|[Cc]heck '[^']*' failed at|failed at) \S+\.(?:cpp|hpp|h|cc):\d+:\s*")


def targets_other_runtimes(targets: Sequence[str]) -> bool:
    """Whether ``targets`` hold a runtime this module loads models in (OpenVINO)."""
    return any(runtime_of_target(target) == "openvino" for target in targets)


def check_other_runtimes(parent: Path, candidate: Path, targets: Sequence[str], stage: str,
                         variant: str) -> dict[str, str]:
    """What loading on the targeted runtimes other than ONNX Runtime found ({} when none is targeted);
    StageError when one cannot load ``candidate`` while it loads ``parent``."""
    if not targets_other_runtimes(targets):
        return {}
    openvino = [target for target in targets if runtime_of_target(target) == "openvino"]
    problem = openvino_problem(candidate)
    if problem is None:
        return {"openvino": "read and compiled by OpenVINO on CPU"}
    if problem.startswith("not checked"):
        return {"openvino": problem}
    before = openvino_problem(parent)
    if before is not None:
        return {"openvino": f"not checked: the input model does not load in OpenVINO either ({before})"}
    raise StageError(stage, variant, f"the new model does not load in OpenVINO, which the recipe targets "
                                     f"({', '.join(openvino)}){_failed_node(problem, candidate)}: {problem}; "
                                     "it is not published")


def openvino_problem(path: Path) -> str | None:
    """Why OpenVINO cannot read or compile the model at ``path`` on CPU; None when it can; "not checked: ..."
    when OpenVINO is not installed.  In a child process (``openvino_probe``): a crash of OpenVINO's CPU plugin
    fails the artifact instead of ending the run."""
    failure = openvino_failure(path)
    if failure is None:
        return None
    step, message = failure
    if step in ("not checked", "crash"):
        return message
    return f"OpenVINO cannot {step} it{' for CPU' if step == 'compile' else ''}: {_message(message)}"


def _message(error: str) -> str:
    text = _NOISE.sub("", error)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("Check 'false'")]
    return one_line(" ".join(lines), 600)


def _failed_node(problem: str, candidate: Path) -> str:
    """' at node 'embed_Q' (GatherBlockQuantized)' from OpenVINO's message, found in the graph by its output;
    the op types OpenVINO names when it names no node; '' when it names neither."""
    found = _OV_NODE.search(problem)
    if found is not None:
        op_type, output = found.group(1), found.group(2).strip()
        name = _producer(candidate, output)
        return f" at node '{name}' ({op_type})" if name else f" at the {op_type} node writing '{output}'"
    ops = _OV_FAILED_OPS.search(problem)
    return f" at its {ops.group(1).strip()} nodes" if ops else ""


def _producer(path: Path, output: str) -> str | None:
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # the message stays useful without the node's name
        return None
    return next((node.name for node in graph.node if output in node.output), None)
