"""What the export stage normalises in every model it takes in, before anything else reads it: one opset import per
domain, and model-local functions expanded into their nodes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from qdeploy.core.errors import ModelError

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.export.findings import ExportRecord

__all__ = ["inline_functions", "merge_opset_imports"]

log = logging.getLogger(__name__)


def merge_opset_imports(model: onnx.ModelProto, findings: ExportRecord) -> None:
    """One import per domain ('ai.onnx' is the default domain ''): skl2onnx lists ('', 17) twice for a tree
    ensemble, which ONNX Runtime runs and its quantizer refuses ("Failed to find proper ai.onnx domain").  The
    same version twice is merged; two versions of one domain are ambiguous and refused."""
    versions: dict[str, list[int]] = {}
    for entry in model.opset_import:
        versions.setdefault(entry.domain if entry.domain != "ai.onnx" else "", []).append(entry.version)
    repeated = {domain: found for domain, found in versions.items() if len(found) > 1}
    if not repeated:
        return
    clashing = {domain or "ai.onnx": sorted(set(found)) for domain, found in repeated.items() if len(set(found)) > 1}
    if clashing:
        raise ModelError(f"the model imports a domain at several versions ({clashing}): an ONNX model names each "
                         "domain once; keep the version its nodes were written for and run again")
    from onnx import helper

    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(domain, found[0]) for domain, found in versions.items())
    findings["opset_imports_merged"] = [f"{domain or 'ai.onnx'} {found[0]} listed {len(found)} times"
                                        for domain, found in repeated.items()]
    log.info("opset imports merged: %s", "; ".join(findings["opset_imports_merged"]))


def inline_functions(model: onnx.ModelProto, findings: ExportRecord) -> onnx.ModelProto:
    """Model-local functions (torch's ``export_modules_as_functions``, onnxscript's) expanded into their nodes, as
    ONNX Runtime does when it loads the model: OpenVINO's frontend has no conversion for them ("No conversion rule
    found for operations: __main__.Block"), and fp16 and int8 would not reach the ops inside.  Exact; a model the
    inliner cannot expand keeps its functions (logged)."""
    if not model.functions:
        return model
    import onnx.inliner

    names = [f"{function.domain}.{function.name}" for function in model.functions]
    try:
        inlined = onnx.inliner.inline_local_functions(model)
    except Exception as exc:  # the runtimes still read the functions; only the later stages see less
        log.warning("local functions %s not inlined: %s", names, exc)
        return model
    findings["functions_inlined"] = names
    log.info("inlined %d local function(s): %s", len(names), ", ".join(names[:5]))
    return inlined
