"""Which torch.onnx exporter writes a torch model: ``model.torch.exporter`` auto, torchscript or dynamo.

``auto`` (the default) follows what the installed torch recommends: the exporter its own ``torch.onnx.export``
defaults to (the torch.export-based "dynamo" one from torch 2.9, which deprecates the TorchScript one with a
warning on every call).  Where dynamo cannot export the model (data-dependent control flow, an op it has no
translation for, an opset it cannot convert to) or onnxscript is missing, the TorchScript exporter writes it and
the export's findings say why (``exporter_fallback``), with a log warning.

Python warnings raised while exporting never reach the terminal: the TorchScript tracer's (a tensor turned into a
Python bool, int or list: a decision frozen on the example input) become the findings' ``trace_warnings`` and one log
warning, since the ONNX model may compute other inputs wrongly; the libraries' deprecation notes go to the debug log.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import logging
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.calibration.readers import InputInfo, random_samples
from qdeploy.core.errors import ModelError, StageError
from qdeploy.stages.export.config import DEFAULT_TORCH_OPSET, DYNAMO_OPSET

if TYPE_CHECKING:
    import numpy as np

    from qdeploy.stages.export.config import InputSpec
    from qdeploy.stages.export.findings import ExporterChoice

__all__ = ["EXAMPLE_SIZES", "example_inputs", "export_with_torch", "recommended_exporter"]

log = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

_QUIET_LOGGERS = ("torch.onnx", "torch._dynamo", "torch.export", "onnxscript")
"""What dynamo logs while it works (opset notes, skipped torchvision ops): qdeploy reports the outcome itself."""
MAX_TRACE_WARNINGS = 10
"""Distinct tracer warnings the findings keep (the log line counts them all)."""


def recommended_exporter(torch: Any) -> tuple[str, str]:
    """(the exporter ``auto`` picks, why it is not the one torch recommends: '' when it is)."""
    try:
        default = inspect.signature(torch.onnx.export).parameters["dynamo"].default
    except (KeyError, TypeError, ValueError):
        return "torchscript", ""  # a torch without the dynamo switch: TorchScript is all it has
    if default is not True:
        return "torchscript", ""  # this torch still recommends TorchScript
    if importlib.util.find_spec("onnxscript") is None:
        return "torchscript", (f"torch {torch.__version__} recommends the dynamo exporter, which needs onnxscript: "
                               "pip install 'qdeploy[torch]'")
    return "dynamo", ""


def export_with_torch(torch: Any, module: Any, example: tuple[Any, ...], path: Path, *, names: list[str],
                      opset: int | None, dynamic_axes: dict[str, dict[int, str]] | None, exporter: str,
                      variant: str) -> ExporterChoice:
    """Write ``path`` with the configured exporter; the findings: which exporter wrote it, and for ``auto``
    why it is not the one torch recommends.  ``opset`` None: each exporter's own (DEFAULT_TORCH_OPSET,
    DYNAMO_OPSET)."""
    if exporter == "dynamo" and importlib.util.find_spec("onnxscript") is None:
        raise ModelError("model.torch.exporter 'dynamo' needs onnxscript: pip install 'qdeploy[torch]' "
                         "(or pip install onnxscript), or use the 'torchscript' exporter")
    arguments = {"names": names, "opset": opset, "dynamic_axes": dynamic_axes}
    if exporter != "auto":
        return {"exporter": exporter, **_export(torch, exporter, module, example, path, **arguments, variant=variant)}
    chosen, why = recommended_exporter(torch)
    if chosen == "dynamo":
        try:
            traced = _call(torch, "dynamo", module, example, path, **arguments)
            _check_opset(path, opset or DYNAMO_OPSET)
            return {"exporter": "dynamo", "exporter_setting": "auto", **traced}
        except Exception as exc:
            why = f"the dynamo exporter (torch {torch.__version__}'s default) cannot export this model: {_why(exc)}"
            _remove_export(path)
    if not why:
        traced = _export(torch, "torchscript", module, example, path, **arguments, variant=variant)
        return {"exporter": "torchscript", "exporter_setting": "auto", **traced}
    log.warning("model.torch.exporter auto: %s; exporting with the TorchScript exporter instead", why)
    traced = _export(torch, "torchscript", module, example, path, **arguments, variant=variant)
    return {"exporter": "torchscript", "exporter_setting": "auto",
            "exporter_fallback": f"{why}; exported with the TorchScript exporter", **traced}


def _export(torch: Any, exporter: str, module: Any, example: tuple[Any, ...], path: Path, *, names: list[str],
            opset: int | None, dynamic_axes: dict[str, dict[int, str]] | None, variant: str) -> ExporterChoice:
    try:
        return _call(torch, exporter, module, example, path, names=names, opset=opset, dynamic_axes=dynamic_axes)
    except Exception as exc:
        raise StageError("export", variant, f"torch.onnx.export failed: {type(exc).__name__}: {exc}") from None


def _call(torch: Any, exporter: str, module: Any, example: tuple[Any, ...], path: Path, *, names: list[str],
          opset: int | None, dynamic_axes: dict[str, dict[int, str]] | None) -> ExporterChoice:
    """Export; the tracer's warnings as findings (``trace_warnings``) when it raised any."""
    dynamo = exporter == "dynamo"
    with _quiet() if dynamo else contextlib.nullcontext(), warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always")
        # Not under no_grad: there, nn.TransformerEncoderLayer takes a fused fast path no exporter knows.
        torch.onnx.export(module, example, str(path), input_names=names,
                          opset_version=opset or (DYNAMO_OPSET if dynamo else DEFAULT_TORCH_OPSET),
                          dynamic_axes=dynamic_axes, dynamo=dynamo, **({"verbose": False} if dynamo else {}))
    return _trace_findings(raised)


def _trace_findings(raised: list[warnings.WarningMessage]) -> ExporterChoice:
    """The tracer's warnings, 'file:line: first line' each, once; every other warning to the debug log."""
    traced: dict[str, None] = {}
    for caught in raised:
        text = str(caught.message).strip()
        first_line = text.splitlines()[0].split(". ")[0] if text else ""  # the tracer's first sentence says it
        where = f"{Path(caught.filename).name}:{caught.lineno}"
        if caught.category.__name__ == "TracerWarning":
            traced[f"{where}: {first_line}"] = None
        else:
            log.debug("while exporting: %s (%s, %s)", first_line, caught.category.__name__, where)
    if not traced:
        return {}
    found = list(traced)
    log.warning("the TorchScript trace turned %d tensor value(s) of the forward into Python constants on the "
                "example input (first: %s): the ONNX model may compute inputs of other shapes or values wrongly; "
                "validate it on such data (findings trace_warnings)", len(found), found[0])
    return {"trace_warnings": found[:MAX_TRACE_WARNINGS]}


def _check_opset(path: Path, opset: int) -> None:
    """dynamo writes opset 18 and converts down; where the conversion fails it keeps 18 with a log line only."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    written = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), None)
    if written != opset:
        raise ModelError(f"it wrote opset {written}, not the requested {opset} (its version conversion failed)")


def _remove_export(path: Path) -> None:
    """A failed dynamo attempt's files (the model and its external data beside it)."""
    for leftover in (path, path.with_name(f"{path.name}.data")):
        leftover.unlink(missing_ok=True)


def _why(exc: BaseException) -> str:
    """'Type: first line' of the error, of its cause where it has one (torch wraps the real reason), uncoloured."""
    cause = exc.__cause__ or exc
    text = _ANSI.sub("", str(cause)).strip()
    return f"{type(cause).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


EXAMPLE_SIZES = (2, 32)
"""Sizes of a named dimension in the example a torch export traces: the first axis (the batch), any other.  Never
1: torch.export specializes a dimension whose example size is 0 or 1 to that size (a GRU tagger's output came out
[1, 1, 5] for a 'seq' input, and ONNX Runtime crashed on its float16 copy)."""


def example_inputs(inputs: list[InputSpec]) -> dict[str, np.ndarray]:
    """Seeded example inputs from the recipe's specs; a named dimension takes ``EXAMPLE_SIZES``."""
    import numpy as np

    def size(axis: int, dim: int | str) -> int:
        return dim if isinstance(dim, int) else EXAMPLE_SIZES[0 if axis == 0 else 1]

    infos = [InputInfo(spec.name, tuple(size(axis, dim) for axis, dim in enumerate(spec.shape or ())),
                       np.dtype(spec.dtype)) for spec in inputs]
    ranges = {spec.name: (spec.low, spec.high) for spec in inputs}
    return next(random_samples(infos, 1, seed=0, ranges=ranges))
