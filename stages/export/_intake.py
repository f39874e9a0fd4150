"""What the export stage normalises in every model it takes in, before anything else reads it: one opset import per
domain, weights no longer listed as graph inputs, sparse weights dense, and model-local functions expanded into
their nodes."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from qdeploy.core.errors import ModelError
from qdeploy.graph.names import rename_generated_tensors
from qdeploy.graph.utils import walk_graphs

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.export.findings import ExportRecord

__all__ = ["densify_sparse", "initializers_out_of_inputs", "inline_functions", "merge_opset_imports",
           "raise_ir_version", "rename_runtime_names"]

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


MIN_IR_WITHOUT_WEIGHT_INPUTS = 4
"""IR version 3 requires every initializer to be listed among the graph's inputs; from 4 on it is optional."""


def initializers_out_of_inputs(model: onnx.ModelProto, declared: set[str], findings: ExportRecord) -> None:
    """Weights no longer listed as graph inputs, unless the recipe declares them as inputs to feed, and the IR
    version at least what the model's opsets need and 4.

    IR 3 files (Caffe2's, the ONNX model zoo's oldest, PyTorch 0.3's) and PyTorch's ``keep_initializers_as_inputs``
    list every initializer as an input as well: ONNX Runtime then treats the weights as overridable, float16
    conversion writes them as float16 while the inputs stay float32 (the checker refuses the model), and tools that
    lift constants into an IR 3 model list them as inputs too (int8's calibration then asked for them to be fed).
    The values are the same; only a caller who fed other weights would see a difference, and nothing in a
    deployment does.  ONNX Runtime's ``remove_initializer_from_input.py`` does the same."""
    weights = {init.name: init for init in model.graph.initializer}
    listed = [value.name for value in model.graph.input if value.name in weights and value.name not in declared
              and _declares(value, weights[value.name])]
    if listed:
        kept = [value for value in model.graph.input if value.name not in set(listed)]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        findings["weight_inputs_removed"] = len(listed)
        log.info("%d weights were also listed as graph inputs: no longer (e.g. %s)", len(listed), ", ".join(listed[:3]))
    raise_ir_version(model, findings)


def _declares(value: onnx.ValueInfoProto, weight: onnx.TensorProto) -> bool:
    """Whether an input entry agrees with the initializer of its name: an entry that contradicts it (another type
    or shape) is a broken model ONNX Runtime refuses, and dropping the entry would hide that."""
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or tensor.elem_type not in (0, weight.data_type):
        return False
    if not tensor.HasField("shape"):
        return True
    dims = tensor.shape.dim
    return len(dims) == len(weight.dims) and all(
        not dim.HasField("dim_value") or dim.dim_value == size for dim, size in zip(dims, weight.dims, strict=True))


def raise_ir_version(model: onnx.ModelProto, findings: ExportRecord) -> None:
    """The IR version at least 4 and what the model's opsets need: the version converter keeps a file's IR version
    (opset 13 at IR 3), and below 4 the graph editor lists every constant it lifts as a graph input."""
    from onnx import helper

    needed = max(MIN_IR_WITHOUT_WEIGHT_INPUTS, helper.find_min_ir_version_for(model.opset_import, ignore_unknown=True))
    if model.ir_version < needed:
        first = findings.get("ir_version_raised", str(model.ir_version)).split(" -> ")[0]
        findings["ir_version_raised"] = f"{first} -> {needed}"
        model.ir_version = needed


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


def densify_sparse(model: onnx.ModelProto, findings: ExportRecord) -> None:
    """Sparse weights (``sparse_initializer``, a Constant's ``sparse_value``) written out dense, in every graph:
    ONNX Runtime reads them, but shape inference types them as sparse tensors (the float16 checker refused the
    model), ONNX Runtime's quantizer sees no initializer ("Graph is not a DAG") and NNCF no input.  Exact; the
    file grows by the zeros."""
    from onnx import AttributeProto, helper

    names: list[str] = []
    for graph in walk_graphs(model.graph):
        for sparse in graph.sparse_initializer:
            graph.initializer.append(_dense(sparse))
            names.append(sparse.values.name)
        del graph.sparse_initializer[:]
        for node in graph.node:
            for index, attribute in enumerate(node.attribute):
                if node.op_type == "Constant" and attribute.type == AttributeProto.SPARSE_TENSOR:
                    node.attribute[index].CopyFrom(helper.make_attribute("value", _dense(attribute.sparse_tensor)))
                    names.append(node.output[0])
    if names:
        findings["sparse_weights_densified"] = names
        log.info("%d sparse weights written out dense (e.g. %s)", len(names), ", ".join(names[:3]))


def _dense(sparse: onnx.SparseTensorProto) -> onnx.TensorProto:
    """A sparse tensor's dense form: indices either linear ([NNZ]) or coordinates ([NNZ, rank])."""
    import numpy as np
    from onnx import numpy_helper

    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64) if sparse.indices.dims else np.zeros(0, np.int64)
    dense = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 2:
        dense[tuple(indices.T)] = values
    else:
        dense.reshape(-1)[indices] = values
    return numpy_helper.from_array(dense, sparse.values.name)


def rename_runtime_names(model: onnx.ModelProto, findings: ExportRecord) -> None:
    """Tensors named as ONNX Runtime's passes name theirs, in a model it optimized and saved, renamed
    (``rename_generated_tensors``): ONNX Runtime could not load such a model again."""
    renamed = rename_generated_tensors(model.graph)
    if renamed:
        findings["runtime_names_renamed"] = renamed
        log.info("%d tensors named as ONNX Runtime's optimizer names its own renamed (suffix __pre)", renamed)
