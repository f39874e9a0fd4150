"""onnx's strict type and shape inference on a model, the part of ``full_check`` that ONNX Runtime enforces too.

onnx's checker alone passes graphs that ONNX Runtime refuses to load: a float16 input into a Conv whose weights
are float, an output declared int64 that its node makes float, a Conv rewired to a weight of the wrong rank.
Strict inference finds them.  It runs on a light copy (large weights are never copied, external data is never
read), so models of any size, and the check without the external data, get it too.  What ONNX Runtime forgives
is left out: declared intermediate shapes (value_info, which exporters leave stale) and the graph outputs'
declared sizes; their element types stay.  A node of a domain onnx does not know (com.microsoft, a custom
fake-quant op) is skipped by onnx's inference; an error attributed to one is not a reason to refuse.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from qdeploy.core.errors import ModelError
from qdeploy.graph.external_data import STREAM_ABOVE_BYTES, needs_external_data
from qdeploy.graph.light import light_copy
from qdeploy.graph.utils import default_opset, model_bytes
from qdeploy.graph.widen import holds_half
from qdeploy.targets.base import short_message
from qdeploy.targets.ort_probe import load_error

if TYPE_CHECKING:
    import onnx

__all__ = ["ONNX_DOMAINS", "check_inferred_types", "check_loads_in_onnxruntime"]

log = logging.getLogger(__name__)

ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})
"""Domains whose ops onnx's inference knows: only their nodes' errors are trusted."""
_ENTRY = re.compile(r"\(op_type:(?P<op>[^,]*), node name: (?P<node>[^)]*)\): (?P<detail>.*)")
_ELEM_TYPES = re.compile(r"Inferred elem type differs from existing elem type: \((\d+)\) vs \((\d+)\)")


def check_inferred_types(model: onnx.ModelProto) -> None:
    """ModelError naming the node (and the value) where strict inference finds a type or shape ONNX Runtime
    would refuse; nothing when inference is clean or its complaint concerns an op it does not know."""
    import onnx

    try:
        onnx.shape_inference.infer_shapes(_types_only(model), check_type=True, strict_mode=True, data_prop=False)
    except onnx.shape_inference.InferenceError as exc:
        message = _explain(model, str(exc))
        if message is None:
            return
        refusal = _runtime_refusal(model)
        if refusal is None:  # onnx's inference is stricter than the runtime that will run the model
            log.warning("onnx's strict shape inference objects (%s), but ONNX Runtime loads the model; not refused",
                        message)
            return
        raise ModelError(f"the model is not a valid ONNX graph: {message}; ONNX Runtime refuses it too "
                         f"({refusal}): re-export the model or fix the node") from None
    except Exception as exc:  # an extra check: a graph onnx cannot even serialise is the checker's and runtime's
        log.debug("strict shape inference could not run: %s: %s", type(exc).__name__, exc)


def check_loads_in_onnxruntime(model: onnx.ModelProto) -> None:
    """ModelError when ONNX Runtime's CPU provider refuses to load the model: the run's float32 reference runs
    there, so `check` and the export stage refuse it as bad input (exit 2) instead of a run failing later.  Found
    by the fuzz campaign: initializers whose dims do not match their data, unknown tensor types, an input that
    redeclares a weight with another shape; onnx's checker passes all of them."""
    refusal = _runtime_refusal(model)
    if refusal is not None and not refusal.startswith(_NOT_TRIED):
        raise ModelError(f"ONNX Runtime cannot load the model: {refusal}; {_what_to_do(refusal, model)}")
    if refusal is None and holds_half(model):  # float16 graphs are where its optimizers crash it (ort_probe)
        crash = load_error(model)
        if crash is not None:
            raise ModelError(f"ONNX Runtime cannot load the model with its default session options: {crash}; "
                             "deploy it on another runtime, or give the float32 model and let the fp16 stage "
                             "convert it (it keeps float32 the nodes ONNX Runtime needs)")


_NO_KERNEL = re.compile(r"Could not find an implementation for (?P<op>\w+)\((?P<version>\d+)\)")
CONVERT_TO_OPSET = 13
"""What an old model is pointed to: ONNX Runtime implements every op there, and int8's per-channel Q/DQ needs it."""


def _what_to_do(refusal: str, model: onnx.ModelProto) -> str:
    """An op version ONNX Runtime dropped (PyTorch 0.3's opset-6 AveragePool, BatchNormalization) is mended by
    onnx's version converter, which the recipe's ``model.opset`` runs; anything else needs the model changed."""
    found = _NO_KERNEL.search(refusal)
    if found is None or default_opset(model) >= CONVERT_TO_OPSET:
        return "re-export the model or fix it"
    return (f"ONNX Runtime no longer implements {found['op']} as defined at opset {found['version']} (the model "
            f"imports opset {default_opset(model)}): set `model.opset: {CONVERT_TO_OPSET}` in the recipe to convert "
            "the model with onnx's version converter, or re-export it at a newer opset")


_NOT_TRIED = "not tried"


def _runtime_refusal(model: onnx.ModelProto) -> str | None:
    """ONNX Runtime's own reason to refuse the model (None when it loads it): an inference complaint is only a
    refusal when the runtime agrees.  A model too large to hand over in memory, or with external data, cannot be
    tried here: the complaint stands (the export stage loads the saved file in ONNX Runtime anyway)."""
    if needs_external_data(model) or model_bytes(model) > STREAM_ABOVE_BYTES or _has_external_tensors(model):
        return f"{_NOT_TRIED}: the model is too large to load here"
    try:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 4
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except ImportError:
        return f"{_NOT_TRIED}: onnxruntime is not installed"
    except Exception as exc:  # the runtime's refusal is the point
        return short_message(exc)
    return None


def _has_external_tensors(model: onnx.ModelProto) -> bool:
    return any(init.data_location == 1 for init in model.graph.initializer)


def _types_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """A light copy for inference: no large weights, no declared intermediate shapes, outputs typed but unsized;
    initializers whose data lies in external files become typed inputs (their bytes are never read)."""
    copy = light_copy(model, value_info=False).model
    for value in copy.graph.output:
        if value.type.HasField("tensor_type"):
            value.type.tensor_type.ClearField("shape")
    _external_as_inputs(copy.graph)
    return copy


def _external_as_inputs(graph: onnx.GraphProto) -> None:
    """Inference may read a small initializer (a Reshape's shape); one in an external file cannot be read here."""
    from onnx import helper

    inputs = {value.name for value in graph.input}
    kept = []
    for init in graph.initializer:
        if init.data_location != 1:  # TensorProto.EXTERNAL
            kept.append(init)
            continue
        if init.name not in inputs:
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    if len(kept) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(kept)


def _explain(model: onnx.ModelProto, text: str) -> str | None:
    """The first error of onnx's message on a node of a known domain, with the node (and value) named; None when
    every error concerns a node onnx has no schema for, or none names a node."""
    entries = [match for match in map(_ENTRY.search, text.splitlines()) if match is not None]
    if not entries:  # no node to name: not this check's to judge (the checker and the runtime still are)
        log.warning("onnx's strict shape inference failed without naming a node; not refused: %s",
                    " ".join(text.split())[:300])
        return None
    for entry in entries:
        candidates = [node for node in model.graph.node
                      if node.name == entry["node"] and node.op_type == entry["op"]]
        if candidates and all(node.domain not in ONNX_DOMAINS for node in candidates):
            continue  # onnx's inference does not know this op: its complaint is not ONNX Runtime's
        node = candidates[0] if len(candidates) == 1 else None
        detail = re.sub(r"^\[\w+\]\s*", "", entry["detail"].strip())
        return f"{_node_label(entry['node'], entry['op'], node)}: {_name_types(detail, node, model)}"
    return None


def _node_label(name: str, op_type: str, node: onnx.NodeProto | None) -> str:
    if name:
        return f"node '{name}' ({op_type})"
    if node is not None and node.output:
        return f"the {op_type} node making '{node.output[0]}'"
    return f"a {op_type} node"


def _name_types(detail: str, node: onnx.NodeProto | None, model: onnx.ModelProto) -> str:
    """'(1) vs (7)' becomes which value is declared what and made what."""
    from onnx import TensorProto

    detail = detail.rstrip(". ")
    if node is not None and "inconsistent type" in detail:
        return f"{detail} (its inputs: {_input_types(node, model)})"
    found = _ELEM_TYPES.search(detail)
    if found is None or node is None:
        return detail
    made, declared = (TensorProto.DataType.Name(int(code)).lower() if int(code) in TensorProto.DataType.values()
                      else code for code in found.groups())
    outputs = {value.name for value in model.graph.output}
    named = [name for name in node.output if name in outputs] or list(node.output)
    value = f"'{named[0]}'" if named else "its output"
    return f"it makes {value} {made}, but the graph declares {value} {declared}"


def _input_types(node: onnx.NodeProto, model: onnx.ModelProto) -> str:
    """'x' float16, 'w' float: the declared types of a node's inputs that the graph declares (inputs, weights)."""
    from onnx import TensorProto

    declared = {value.name: value.type.tensor_type.elem_type for value in model.graph.input}
    declared |= {init.name: init.data_type for init in model.graph.initializer}
    declared |= {value.name: value.type.tensor_type.elem_type for value in model.graph.value_info}
    shown = [f"'{name}' {TensorProto.DataType.Name(declared[name]).lower()}" for name in node.input
             if declared.get(name) in TensorProto.DataType.values() and declared.get(name)]
    return ", ".join(shown) or "types not declared"
