"""ONNX Runtime's quantizers fail on models they were not tested on with bare messages from deep inside
(numpy's "truth value of an array ... is ambiguous", a KeyError naming a tensor).  Their calls run inside
``ort_quantizer_step``: a failure becomes a ``QuantizerFailure`` that says which step of which tool failed,
on which node or tensor, and what the user can do; the stage turns it into its error.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from types import TracebackType

_CONTEXT_NAMES = ("node", "bias_name", "weight_name", "tensor_name", "input_name")
"""Locals of ORT's quantization frames that say what the quantizer was working on."""


class QuantizerFailure(RuntimeError):
    """A third-party quantization step failed on this model (not a bad recipe, not a qdeploy bug)."""


@contextlib.contextmanager
def ort_quantizer_step(step: str) -> Iterator[None]:
    """Run ``step`` (e.g. "ONNX Runtime's QDQ quantizer"); any exception it raises becomes a QuantizerFailure."""
    try:
        yield
    except QuantizerFailure:
        raise
    except Exception as exc:
        where = _working_on(exc.__traceback__)
        function = _innermost_function(exc.__traceback__)
        raise QuantizerFailure(
            f"{step} failed{where} in {function}: {type(exc).__name__}: {exc}. Keep that node float "
            "(exclude_nodes or exclude_op_types in the quantize stage) or quantize with mode dynamic; "
            "please report the model") from exc


def _frames(tb: TracebackType | None) -> list[tuple[str, dict[str, object]]]:
    """(module file, locals) of the onnxruntime.quantization frames of a traceback, innermost first."""
    found = []
    for frame, _ in traceback.walk_tb(tb):
        if "onnxruntime" in frame.f_code.co_filename and "quantization" in frame.f_code.co_filename:
            found.append((frame.f_code.co_name, dict(frame.f_locals)))
    return found[::-1]


def _working_on(tb: TracebackType | None) -> str:
    """' on node X' / ' on tensor Y' from the innermost ORT frame that names one; '' when none does."""
    for _, local in _frames(tb):
        for key in _CONTEXT_NAMES:
            value = local.get(key)
            name = getattr(value, "name", value) if key == "node" else value
            if isinstance(name, str) and name:
                kind = "node" if key == "node" else key.split("_")[0]
                return f" on {kind} '{name}'"
    return ""


def _innermost_function(tb: TracebackType | None) -> str:
    frames = _frames(tb)
    return f"onnxruntime.quantization ({frames[0][0]})" if frames else "its own code"
