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

import multiprocessing
import types
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.errors import QdeployInputError, StageError
from qdeploy.graph.external_data import remove_saved, save_onnx
from qdeploy.stages.export._causal_lm_source import export_causal_lm, resolve_checkpoint
from qdeploy.stages.export._model import load_onnx
from qdeploy.stages.export.config import ExportConfig

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.context import StageContext
    from qdeploy.stages.export.findings import ExportRecord

__all__ = ["CHILD_ABOVE_BYTES", "export_causal_lm_here_or_apart", "export_in_child", "wants_child"]

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
    """``export_causal_lm`` run in a spawned child; the checked model read back from the file it wrote."""
    source = config.causal_lm
    assert source is not None
    resolved = config.model_copy(update={"causal_lm": source.model_copy(update={"path": str(checkpoint)})}) \
        if source.path is not None else config  # the child resolves nothing against the recipe
    ctx.on_progress(f"exporting {checkpoint.name} in a child process (load, export, check against PyTorch)")
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            outcome = pool.submit(_child, resolved.model_dump(mode="json", by_alias=True), str(ctx.work_dir),
                                  ctx.variant).result()
    except BrokenProcessPool as exc:  # killed: most often by the kernel, out of memory
        raise StageError("export", ctx.variant, f"the export's child process died ({exc}); out of memory?") from None
    if outcome["error"] is not None:
        kind, message = outcome["error"]
        raise (QdeployInputError(message) if kind == "input" else StageError("export", ctx.variant, message))
    path = ctx.work_dir / _RESULT
    model = load_onnx(path)
    remove_saved(path)
    return model, outcome["findings"]


def _child(config: dict[str, Any], work_dir: str, variant: str) -> dict[str, Any]:
    """In the child: the export, the checked model saved to ``work_dir``, and its findings (or the error)."""
    ctx = types.SimpleNamespace(resolve=Path, on_progress=lambda message: None, work_dir=Path(work_dir),
                                variant=variant)
    try:
        model, findings = export_causal_lm(ExportConfig.model_validate(config), ctx)  # type: ignore[arg-type]
        save_onnx(model, Path(work_dir) / _RESULT)
    except QdeployInputError as exc:
        return {"error": ("input", str(exc)), "findings": None}
    except StageError as exc:
        return {"error": ("stage", exc.reason), "findings": None}
    except Exception as exc:  # the stage's failure, said in the run's process
        return {"error": ("stage", f"{type(exc).__name__}: {exc}"), "findings": None}
    return {"error": None, "findings": dict(findings)}
