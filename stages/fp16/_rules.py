"""What must stay float32, read from the ONNX operator schemas at the model's opset.

A node input whose type constraint has no tensor(float16) (Resize scales,
QuantizeLinear scale below opset 19, NonMaxSuppression boxes) stays float32: it
gets a float32 copy or a Cast.  A node with such an output (Range, DequantizeLinear
below opset 19) stays float32 as a whole.  Attributes that fix an output's type
(Cast `to`, the `dtype` of RandomNormalLike/EyeLike/...) are rewritten when the
node is converted, so its output is float16 like its declared type.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qdeploy.stages.fp16._graph import FLOAT, FLOAT16, walk_nodes

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

DTYPE_ATTRIBUTES = {
    "Cast": "to", "EyeLike": "dtype", "RandomNormalLike": "dtype", "RandomUniformLike": "dtype",
    "RandomNormal": "dtype", "RandomUniform": "dtype", "Bernoulli": "dtype",
}
"""Op type -> the attribute that sets its output element type."""
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class Float32Needs:
    """Nodes that stay float32 entirely (with why) and inputs that stay float32 on converted nodes."""

    nodes: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, set[int]] = field(default_factory=dict)
    input_reasons: dict[str, str] = field(default_factory=dict)


def float32_needs(model: onnx.ModelProto, types: dict[str, int]) -> Float32Needs:
    """Schema-driven float32 requirements of every node of every graph."""
    opsets = {entry.domain: entry.version for entry in model.opset_import}
    needs = Float32Needs()
    for node, _ in walk_nodes(model.graph):
        version = opsets.get(node.domain, opsets.get("ai.onnx" if node.domain == "" else node.domain))
        if version is None:
            continue
        allows = _float16_allowed(node.op_type, node.domain, version)
        if allows is None:
            continue
        inputs_ok, outputs_ok = allows
        bad_out = [name for index, name in enumerate(node.output)
                   if name and types.get(name) == FLOAT and not _slot(outputs_ok, index)]
        if bad_out:
            needs.nodes[node.name] = (f"{node.op_type} (opset {version}) has no float16 type for output "
                                      f"'{bad_out[0]}'")
            continue
        bad_in = {index for index, name in enumerate(node.input)
                  if name and types.get(name) == FLOAT and not _slot(inputs_ok, index)}
        if bad_in:
            needs.inputs[node.name] = bad_in
            needs.input_reasons[node.name] = (f"{node.name} ({node.op_type}, opset {version}): inputs "
                                              f"{sorted(node.input[i] for i in bad_in)} stay float32")
    return needs


def _slot(allowed: tuple[bool, ...], index: int) -> bool:
    """Whether the formal parameter at an actual index takes float16 (the last one repeats if variadic)."""
    if not allowed:
        return True
    return allowed[min(index, len(allowed) - 1)]


@functools.cache
def _float16_allowed(op_type: str, domain: str, version: int) -> tuple[tuple[bool, ...], tuple[bool, ...]] | None:
    """Per formal input and output: does it accept float16 where it accepts float? None if no schema.

    onnx's schemas first; ONNX Runtime's registered schemas for its own domains (com.microsoft's quantized
    ops such as DynamicQuantizeLSTM take tensor(float) only).
    """
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op_type, version, "" if domain in _DEFAULT_DOMAINS else domain)
    except Exception:  # not an onnx op at this version: ONNX Runtime may register it
        schema = _onnxruntime_schema(op_type, domain, version)
    if schema is None:
        return None
    constraints = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def takes_float16(type_str: str) -> bool:
        allowed = constraints.get(type_str, {type_str})
        return "tensor(float)" not in allowed or "tensor(float16)" in allowed

    return (tuple(takes_float16(_type_str(p)) for p in schema.inputs),
            tuple(takes_float16(_type_str(p)) for p in schema.outputs))


def _type_str(param: Any) -> str:
    """A formal parameter's type string (onnx.defs spells it type_str, ONNX Runtime typeStr)."""
    return getattr(param, "type_str", None) or param.typeStr


def _onnxruntime_schema(op_type: str, domain: str, version: int) -> Any:
    """The newest schema ONNX Runtime registers for the op at or below the domain's opset version, or None."""
    versions = _onnxruntime_schemas().get(("" if domain in _DEFAULT_DOMAINS else domain, op_type), [])
    fitting = [schema for since, schema in versions if since <= version]
    return fitting[-1] if fitting else None


@functools.cache
def _onnxruntime_schemas() -> dict[tuple[str, str], list[tuple[int, Any]]]:
    """(domain, op type) -> [(since_version, schema)] ascending, from ONNX Runtime's registry; {} without it."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

        schemas = ort_state.get_all_operator_schema()
    except Exception as exc:  # an ONNX Runtime build without the schema API: onnx's schemas only
        log.debug("ONNX Runtime's operator schemas are unavailable: %s", exc)
        return {}
    table: dict[tuple[str, str], list[tuple[int, Any]]] = {}
    for schema in schemas:
        table.setdefault((schema.domain, schema.name), []).append((schema.since_version, schema))
    return {key: sorted(entries, key=lambda entry: entry[0]) for key, entries in table.items()}


def fix_output_type_attributes(node: onnx.NodeProto, to_float16: Callable[[np.ndarray], np.ndarray]) -> bool:
    """Make attributes that fix a converted node's float32 output type say float16; True if one changed.

    Call it only for converted nodes whose first output was float32; `to_float16` clamps like the converter.
    Edits the protobuf node in place: it is one step of ``_repair``'s protobuf pass (why protobuf: ``_graph``).
    """
    from onnx import helper, numpy_helper

    attr_name = DTYPE_ATTRIBUTES.get(node.op_type)
    if attr_name is not None:
        for attr in node.attribute:
            if attr.name == attr_name and attr.i == FLOAT:
                attr.i = FLOAT16
                return True
        return False
    if node.op_type == "ConstantOfShape" and not any(attr.name == "value" for attr in node.attribute):
        import numpy as np

        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(np.zeros(1, np.float16))))
        return True
    if node.op_type == "Constant":
        return _constant_floats_to_tensor(node, to_float16)
    return False


def _constant_floats_to_tensor(node: onnx.NodeProto, to_float16: Callable[[np.ndarray], np.ndarray]) -> bool:
    """Constant(value_float[s]=...) becomes Constant(value=<float16 tensor>); the converter misses these."""
    import numpy as np
    from onnx import helper, numpy_helper

    for index, attr in enumerate(node.attribute):
        if attr.name in ("value_float", "value_floats"):
            values = np.float32(attr.f) if attr.name == "value_float" else np.array(attr.floats, np.float32)
            del node.attribute[index]
            tensor = numpy_helper.from_array(to_float16(np.asarray(values)))
            node.attribute.append(helper.make_attribute("value", tensor))
            return True
    return False
