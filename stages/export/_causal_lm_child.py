"""A large causal language model's export in a child process, so that PyTorch never enters the run's own.

Importing torch and transformers costs the process about 0.33 GB that it keeps to its end (their modules and
libraries), on top of every later step's peak: 15% of SmolLM2-135M's whole-run budget (4x its 539 MB).  A
child started with ``spawn`` loads the checkpoint, exports, checks against PyTorch, writes the checked model
beside the stage's other files and exits, handing all of that back; the run reads the ONNX file.  Small
checkpoints (the tests' seeded decoders) export in the run's process, where the child's start would cost more
than it saves.

A failure in the child comes back as the same kind of error it was (a bad input stays exit 2), with its message.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.errors import QdeployInputError, StageError
from qdeploy.core.fresh_python import FreshPythonError, call_in_fresh_python
from qdeploy.graph.external_data import remove_saved, save_onnx
from qdeploy.stages.export._causal_lm_source import export_causal_lm, resolve_checkpoint
from qdeploy.stages.export._model import load_onnx
from qdeploy.stages.export.config import ExportConfig

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.context import StageContext
    from qdeploy.stages.export.findings import ExportRecord

__all__ = ["CHILD_ABOVE_BYTES", "child_export", "export_causal_lm_here_or_apart", "export_in_child", "wants_child"]

CHILD_ABOVE_BYTES = 64 * 2**20
"""Checkpoints at least this large export in a child process."""
_RESULT = "causal_lm_checked.onnx"


def export_causal_lm_here_or_apart(config: ExportConfig, ctx: StageContext) -> tuple[onnx.ModelProto, ExportRecord]:
    """The causal LM export: in a child process for a large checkpoint, in this one for a small one."""
    assert config.causal_lm is not None
    checkpoint = resolve_checkpoint(config.causal_lm, ctx.resolve)
    if wants_child(checkpoint.path):
        model, findings = export_in_child(config, ctx, checkpoint.path)
        findings["causal_lm"]["checkpoint"] = checkpoint.label  # as the recipe names it, not the resolved path
        return model, findings
    return export_causal_lm(config, ctx)


def wants_child(checkpoint: Path) -> bool:
    files = [checkpoint] if checkpoint.is_file() else [path for path in checkpoint.rglob("*") if path.is_file()]
    return sum(path.stat().st_size for path in files) >= CHILD_ABOVE_BYTES


def export_in_child(config: ExportConfig, ctx: StageContext, checkpoint: Path) -> tuple[onnx.ModelProto,
                                                                                          ExportRecord]:
    """``export_causal_lm`` run in a fresh interpreter; the checked model read back from the file it wrote."""
    source = config.causal_lm
    assert source is not None
    # the checkpoint as found here: the child resolves nothing (neither the recipe's folder nor a package)
    resolved = config.model_copy(update={"causal_lm": source.model_copy(
        update={"path": str(checkpoint), "package": None, "file": None})})
    ctx.on_progress(f"exporting {checkpoint.name} in a child process (load, export, check against PyTorch)")
    payload = {"config": resolved.model_dump(mode="json", by_alias=True), "work_dir": str(ctx.work_dir),
               "variant": ctx.variant}
    try:
        outcome = call_in_fresh_python(__name__, "child_export", payload)
    except FreshPythonError as exc:  # killed (most often by the kernel, out of memory) or crashed
        raise StageError("export", ctx.variant, f"{exc} (out of memory?)") from None
    if outcome["error"] is not None:
        kind, message = outcome["error"]
        raise (QdeployInputError(message) if kind == "input" else StageError("export", ctx.variant, message))
    path = ctx.work_dir / _RESULT
    model = load_onnx(path)
    remove_saved(path)
    return model, outcome["findings"]


def child_export(payload: dict[str, Any]) -> dict[str, Any]:
    """In the child: the export, the checked model saved to the work folder, and its findings (or the error)."""
    work_dir = Path(payload["work_dir"])
    ctx = types.SimpleNamespace(resolve=Path, on_progress=lambda message: None, work_dir=work_dir,
                                variant=payload["variant"])
    try:
        model, findings = export_causal_lm(ExportConfig.model_validate(payload["config"]), ctx)  # type: ignore[arg-type]
        save_onnx(model, work_dir / _RESULT)
    except QdeployInputError as exc:
        return {"error": ("input", str(exc)), "findings": None}
    except StageError as exc:
        return {"error": ("stage", exc.reason), "findings": None}
    except Exception as exc:  # the stage's failure, said in the run's process
        return {"error": ("stage", f"{type(exc).__name__}: {exc}"), "findings": None}
    return {"error": None, "findings": dict(findings)}
