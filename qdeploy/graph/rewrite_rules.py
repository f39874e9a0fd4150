"""The rewrite rules (contract in ``qdeploy.graph.rewrite_base``): fusions on by default, target rewrites on request.

Each rule is one function: it looks at its anchor node and what surrounds it,
returns None when the pattern is not there, a reason when it is there but
cannot be rewritten safely, or the ``Replacement``.  Rules read and build
through ``qdeploy.graph.edit.GraphEditor`` (onnx-ir nodes and values).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from qdeploy.graph.edit import AI_ONNX_DOMAINS, attribute
from qdeploy.graph.rewrite_base import FLOAT_TYPES, Replacement, rewrite

if TYPE_CHECKING:
    import numpy as np
    import onnx_ir as ir

    from qdeploy.graph.edit import GraphEditor

__all__ = ["ConvParts", "batchnorm_folded", "drop_empty_concat_inputs", "fuse_conv_batchnorm", "fuse_conv_scale_bias",
           "fuse_convtranspose_batchnorm", "fuse_convtranspose_scale_bias", "fuse_reshape_chain", "gelu_to_erf",
           "hardswish_to_hardsigmoid", "layernorm_to_primitives", "prelu_to_relu"]


# ---------------------------------------------------------------------------------------------------------------
# Helpers shared by the rules


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _float_dtype(edit: GraphEditor, value: ir.Value | None) -> np.dtype | None:
    """The numpy dtype of a float initializer, or None."""
    from onnx import helper

    elem = edit.weight_type(value)
    return helper.tensor_dtype_to_np_dtype(elem) if elem in FLOAT_TYPES else None


def _base(node: ir.Node) -> str:
    return node.name or node.outputs[0].name or node.op_type


def _out(node: ir.Node) -> ir.Value:
    return node.outputs[0]


# ---------------------------------------------------------------------------------------------------------------
# Default simplifications: fold per-channel affine ops into the Conv that feeds them


ConvParts = tuple["np.ndarray", "np.ndarray | None", int]
"""(weight, bias or None, output-channel axis of the weight) of a conv with constant weights."""


def _conv_parts(edit: GraphEditor, conv: ir.Node) -> ConvParts | str:
    """(weight, bias or None, output-channel axis of the weight) of a Conv/ConvTranspose with constant weights."""
    if _float_dtype(edit, _input(conv, 1)) is None:
        return "the weight is not a float initializer"
    weight = edit.weight(conv.inputs[1])
    bias = None
    if _input(conv, 2) is not None:
        if _float_dtype(edit, conv.inputs[2]) is None:
            return "the bias is not a float initializer"
        bias = edit.weight(conv.inputs[2])
    if conv.op_type == "ConvTranspose" and attribute(conv, "group", 1) != 1:
        return "grouped ConvTranspose is not fused"
    assert weight is not None
    return weight, bias, 0 if conv.op_type == "Conv" else 1


def _channel_vector(value: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``value`` as one number per output channel when it broadcasts along axis 1 only; None otherwise."""
    import numpy as np

    if value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(dim != 1 for axis, dim in enumerate(shape) if axis != 1):
        return None
    if shape[1] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float64)


def _affine_conv(edit: GraphEditor, conv: ir.Node, after: ir.Node, scale: np.ndarray,
                 shift: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, axis: int) -> Replacement:
    """Conv with weight*scale and bias*scale+shift, producing ``after``'s output."""
    import numpy as np

    # A float32 product rounded once equals the float64 product rounded to float32: no need for float64 here.
    scale = scale.astype(weight.dtype)
    new_bias = (np.zeros_like(scale) if bias is None else bias * scale) + shift.astype(weight.dtype)
    return _fused_conv(edit, conv, after, weight * scale.reshape(_axis_shape(weight, axis)), new_bias)


def _axis_shape(weight: np.ndarray, axis: int) -> list[int]:
    """The shape that broadcasts a per-channel vector along ``axis`` of ``weight``."""
    shape = [1] * weight.ndim
    shape[axis] = -1
    return shape


def _fused_conv(edit: GraphEditor, conv: ir.Node, after: ir.Node, new_weight: np.ndarray,
                new_bias: np.ndarray) -> Replacement:
    """The conv with ``new_weight`` and ``new_bias``, producing ``after``'s output."""
    import onnx_ir as ir

    w_init = edit.initializer(f"{conv.inputs[1].name}_fused", new_weight)
    b_init = edit.initializer(f"{_base(conv)}_bias_fused", new_bias)
    attributes = [ir.Attr(attr.name, attr.type, attr.value) for attr in conv.attributes.values()]
    fused = ir.Node(conv.domain, conv.op_type, [conv.inputs[0], w_init, b_init], attributes,
                    name=conv.name)  # the conv keeps its name: it is the same layer
    fused.outputs[0].name = edit.fresh_name(f"{_base(conv)}_fused_output")
    return Replacement(remove=[conv, after], add=[fused], replaces=_out(after))


def _conv_and_next(edit: GraphEditor, conv: ir.Node,
                   ops: tuple[str, ...]) -> tuple[ir.Node, ConvParts] | str | None:
    """(the single consumer of the conv's output when it is one of ``ops``, the conv's constant parts) or None/why."""
    after = edit.sole_consumer(_out(conv))
    if after is None or after.op_type not in ops or after.domain not in AI_ONNX_DOMAINS:
        return None
    parts = _conv_parts(edit, conv)
    if isinstance(parts, str):
        return parts
    return after, parts


@rewrite("fuse_conv_scale_bias", anchor="Conv", default=True, computes_constants=True,
         description="Fold Mul/Div/Add/Sub by a per-channel or scalar constant after a Conv into its weights.")
def fuse_conv_scale_bias(edit: GraphEditor, conv: ir.Node) -> Replacement | str | None:
    return _fuse_affine(edit, conv)


@rewrite("fuse_convtranspose_scale_bias", anchor="ConvTranspose", default=True, computes_constants=True,
         description="Fold Mul/Div/Add/Sub by a per-channel or scalar constant after a ConvTranspose into it.")
def fuse_convtranspose_scale_bias(edit: GraphEditor, conv: ir.Node) -> Replacement | str | None:
    return _fuse_affine(edit, conv)


def _fuse_affine(edit: GraphEditor, conv: ir.Node) -> Replacement | str | None:
    import numpy as np

    found = _conv_and_next(edit, conv, ("Mul", "Div", "Add", "Sub"))
    if not isinstance(found, tuple):
        return found
    after, (weight, bias, axis) = found
    conv_out = _out(conv)
    other = [value for value in after.inputs if value is not conv_out]
    if len(other) != 1 or (after.op_type in ("Div", "Sub") and after.inputs[0] is not conv_out):
        return None  # x*x, or c/x, c-x: not affine in the conv's output
    value = edit.weight(other[0])
    if value is None or edit.weight_type(other[0]) != edit.weight_type(conv.inputs[1]):
        return None
    channels = weight.shape[axis]
    vector = _channel_vector(value, channels, len(weight.shape))
    if vector is None:
        return f"{after.op_type} by a constant of shape {list(value.shape)} is not per output channel"
    if after.op_type == "Div" and not np.all(vector != 0):
        return "division by zero"
    ones, zeros = np.ones(channels), np.zeros(channels)
    scale, shift = {"Mul": (vector, zeros), "Div": (1.0 / np.where(vector == 0, 1, vector), zeros),
                    "Add": (ones, vector), "Sub": (ones, -vector)}[after.op_type]
    return _affine_conv(edit, conv, after, scale, shift, weight, bias, axis)


@rewrite("fuse_conv_batchnorm", anchor="Conv", default=True, computes_constants=True,
         description="Fold an inference BatchNormalization after a Conv into its weights (skip_fuse_bn keeps it).")
def fuse_conv_batchnorm(edit: GraphEditor, conv: ir.Node) -> Replacement | str | None:
    return _fuse_batchnorm(edit, conv)


@rewrite("fuse_convtranspose_batchnorm", anchor="ConvTranspose", default=True, computes_constants=True,
         description="Fold an inference BatchNormalization after a ConvTranspose into its weights.")
def fuse_convtranspose_batchnorm(edit: GraphEditor, conv: ir.Node) -> Replacement | str | None:
    return _fuse_batchnorm(edit, conv)


def _fuse_batchnorm(edit: GraphEditor, conv: ir.Node) -> Replacement | str | None:
    import numpy as np

    found = _conv_and_next(edit, conv, ("BatchNormalization",))
    if not isinstance(found, tuple):
        return found
    bn, (weight, bias, axis) = found
    if any(out.name for out in bn.outputs[1:]) or attribute(bn, "training_mode", 0):
        return "BatchNormalization in training mode"
    params = [edit.weight(value) for value in bn.inputs[1:5]]
    if len(params) != 4 or any(value is None for value in params):
        return "BatchNormalization parameters are not initializers"
    gamma, beta, mean, var = (np.asarray(value).reshape(-1) for value in params)  # type: ignore[union-attr]
    if gamma.shape != (weight.shape[axis],):
        return f"BatchNormalization has {gamma.shape[0]} channels, the conv {weight.shape[axis]}"
    folded = batchnorm_folded(weight, bias, (gamma, beta, mean, var), float(attribute(bn, "epsilon", 1e-5)), axis)
    return _fused_conv(edit, conv, bn, *folded)


def batchnorm_folded(weight: np.ndarray, bias: np.ndarray | None, params: tuple[np.ndarray, ...], epsilon: float,
                     axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of a conv with the BatchNormalization after it folded in, rounded as ONNX Runtime rounds.

    ONNX Runtime fuses Conv+BatchNormalization when it loads a model (ConvBNFusion, every optimisation level from
    basic): each step in the weight's element type, float32 epsilon, in this order (onnxoptimizer's
    fuse_bn_into_conv, which onnxsim uses, computes the same).  Folding any other way (in float64, or
    ``beta - mean * scale`` with a conv bias) gives weights a rounding away from those ONNX Runtime runs the
    original with, and the simplified model differs from it where it need not differ at all.
    """
    import numpy as np

    gamma, beta, mean, var = params
    dtype = weight.dtype
    work = np.float64 if dtype == np.float64 else np.float32  # float16 steps: in float32, rounded after each

    def step(value: np.ndarray) -> np.ndarray:
        return np.asarray(value, dtype=work).astype(dtype).astype(work)

    def typed(value: np.ndarray) -> np.ndarray:
        return step(np.asarray(value).astype(dtype))

    scale = step(typed(gamma) / step(np.sqrt(step(typed(var) + work(np.float32(epsilon))))))
    new_weight = step(typed(weight) * scale.reshape(_axis_shape(weight, axis)))
    if bias is None:
        new_bias = step(typed(beta) - step(typed(mean) * scale))
    else:
        new_bias = step(step(step(typed(bias) - typed(mean)) * scale) + typed(beta))
    return new_weight.astype(dtype), new_bias.astype(dtype)


_SHAPE_ONLY = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")


@rewrite("fuse_reshape_chain", anchor=_SHAPE_ONLY, default=True,
         description="Two consecutive Reshape/Squeeze/Unsqueeze/Flatten with a static final shape -> one Reshape.")
def fuse_reshape_chain(edit: GraphEditor, node: ir.Node) -> Replacement | str | None:
    import numpy as np

    after = edit.sole_consumer(_out(node))
    if after is None or after.op_type not in _SHAPE_ONLY or after.domain not in AI_ONNX_DOMAINS \
            or after.inputs[0] is not _out(node):
        return None
    dims = _static_dims(_out(after))
    if dims is None:
        return None  # the final shape is not known: the pair stays as it is
    base = _base(after)
    shape = edit.initializer(f"{base}_shape", np.array(dims, np.int64))
    fused = edit.node("Reshape", [node.inputs[0], shape], f"{base}_fused")
    return Replacement(remove=[node, after], add=[fused], replaces=_out(after))


def _static_dims(value: ir.Value) -> list[int] | None:
    shape = value.shape
    if shape is None or not all(isinstance(dim, int) for dim in shape):
        return None
    return [int(dim) for dim in shape]


@rewrite("whole_window_average_pool", anchor="AveragePool", default=True,
         description="AveragePool whose window covers its whole (static) input, one output per channel, no pads "
                     "-> GlobalAveragePool.")
def whole_window_average_pool(edit: GraphEditor, node: ir.Node) -> Replacement | str | None:
    """transformers' EfficientNet pools with ``AvgPool2d(hidden_dim, ceil_mode=True)``: a 1280-wide window over a
    7x7 map.  ONNX Runtime computes it (the mean of the map), OpenVINO refuses to read the model (its AvgPool
    validation); GlobalAveragePool is the same mean, which both run."""
    dims = _static_dims(node.inputs[0]) if node.inputs and node.inputs[0] is not None else None
    kernel = list(attribute(node, "kernel_shape", []) or [])
    if dims is None or len(dims) < 3 or len(kernel) != len(dims) - 2:
        return None
    if str(attribute(node, "auto_pad", "NOTSET") or "NOTSET") != "NOTSET" \
            or any(attribute(node, "pads", []) or []) or any(d != 1 for d in attribute(node, "dilations", []) or []):
        return None
    strides = list(attribute(node, "strides", []) or [1] * len(kernel))
    rounding = math.ceil if attribute(node, "ceil_mode", 0) else math.floor
    spatial = dims[2:]
    if any(k < d for k, d in zip(kernel, spatial, strict=True)) or any(
            rounding((d - k) / s) + 1 != 1 for d, k, s in zip(spatial, kernel, strides, strict=True)):
        return None
    pooled = edit.node("GlobalAveragePool", [node.inputs[0]], f"{_base(node)}_global")
    return Replacement(remove=[node], add=[pooled], replaces=_out(node))


@rewrite("drop_empty_concat_inputs", anchor="Concat", default=True,
         description="Concat inputs of static length 0 along its axis are dropped (Identity when one input is "
                     "left): they add nothing, and quantizers and OpenVINO mishandle empty tensors.")
def drop_empty_concat_inputs(edit: GraphEditor, node: ir.Node) -> Replacement | str | None:
    """PyTorch models concatenate an empty ``ConstantOfShape`` (a padding of length 0, a first step's empty
    history): ONNX Runtime's QDQ quantizer quantizes the empty constant into a tensor OpenVINO reads as a scalar
    and cannot concatenate (brainmaze's spindle detector).  Dropping it is exact."""
    axis = attribute(node, "axis", None)
    if axis is None or any(value is None for value in node.inputs):
        return None
    kept = [value for value in node.inputs if not _empty_along(value, int(axis))]
    if len(kept) == len(node.inputs):
        return None
    if not kept:  # every input is empty: any of them is the result (the other dimensions agree)
        kept = [node.inputs[0]]
    base = _base(node)
    smaller = edit.node("Identity", kept, f"{base}_nonempty") if len(kept) == 1 else \
        edit.node("Concat", kept, f"{base}_nonempty", axis=int(axis))
    return Replacement(remove=[node], add=[smaller], replaces=_out(node))


def _empty_along(value: ir.Value, axis: int) -> bool:
    shape = value.shape
    if shape is None or not -len(shape) <= axis < len(shape):
        return False
    return isinstance(shape[axis], int) and shape[axis] == 0


# ---------------------------------------------------------------------------------------------------------------
# Target-friendly rewrites, chosen in the recipe


@rewrite("prelu_to_relu", anchor="PRelu",
         description="PRelu(x, s) -> r + s*(x - r) with r = Relu(x): exact, for targets without PRelu.")
def prelu_to_relu(edit: GraphEditor, node: ir.Node) -> Replacement | str | None:
    x, slope = node.inputs[0], node.inputs[1]
    base = _base(node)
    relu = edit.node("Relu", [x], f"{base}_relu")
    negative = edit.node("Sub", [x, _out(relu)], f"{base}_sub")  # min(x, 0), exactly
    scaled = edit.node("Mul", [_out(negative), slope], f"{base}_mul")
    total = edit.node("Add", [_out(relu), _out(scaled)], f"{base}_add")
    return Replacement(remove=[node], add=[relu, negative, scaled, total], replaces=_out(node))


@rewrite("hardswish_to_hardsigmoid", anchor="HardSwish",
         description="HardSwish(x) -> x * HardSigmoid(x, 1/6, 0.5), its definition, for runtimes before opset 14.")
def hardswish_to_hardsigmoid(edit: GraphEditor, node: ir.Node) -> Replacement | str | None:
    base = _base(node)
    gate = edit.node("HardSigmoid", [node.inputs[0]], f"{base}_hardsigmoid", alpha=1.0 / 6, beta=0.5)
    product = edit.node("Mul", [node.inputs[0], _out(gate)], f"{base}_mul")
    return Replacement(remove=[node], add=[gate, product], replaces=_out(node))


@rewrite("gelu_to_erf", anchor="Gelu",
         description="Gelu (opset 20) -> 0.5*x*(1+Erf(x/sqrt 2)), or its tanh form when approximate='tanh'.")
def gelu_to_erf(edit: GraphEditor, node: ir.Node) -> Replacement | str | None:
    import numpy as np

    x, base = node.inputs[0], _base(node)
    if _value_type(edit, x) not in (None, 1):
        return "only float32 Gelu is decomposed"

    def const(key: str, value: float) -> ir.Value:
        return edit.initializer(f"{base}_{key}", np.array(value, np.float32))

    if attribute(node, "approximate", "none") == "tanh":
        cube = edit.node("Pow", [x, const("three", 3.0)], f"{base}_pow")
        cube_k = edit.node("Mul", [_out(cube), const("cubic", 0.044715)], f"{base}_mul_cubic")
        total = edit.node("Add", [x, _out(cube_k)], f"{base}_add_cubic")
        arg = edit.node("Mul", [_out(total), const("k", math.sqrt(2 / math.pi))], f"{base}_mul_k")
        inner = edit.node("Tanh", [_out(arg)], f"{base}_tanh")
        nodes = [cube, cube_k, total, arg, inner]
    else:
        scaled = edit.node("Mul", [x, const("inv_sqrt2", 1 / math.sqrt(2.0))], f"{base}_scale")
        inner = edit.node("Erf", [_out(scaled)], f"{base}_erf")
        nodes = [scaled, inner]
    plus_one = edit.node("Add", [_out(inner), const("one", 1.0)], f"{base}_add_one")
    half_x = edit.node("Mul", [x, const("half", 0.5)], f"{base}_half")
    product = edit.node("Mul", [_out(half_x), _out(plus_one)], f"{base}_mul")
    return Replacement(remove=[node], add=[*nodes, plus_one, half_x, product], replaces=_out(node))


def _value_type(edit: GraphEditor, value: ir.Value) -> int | None:
    """Element type of a tensor when inference or the graph declares it."""
    if value.dtype is not None and int(value.dtype):
        return int(value.dtype)
    return edit.weight_type(value)


@rewrite("layernorm_to_primitives", anchor="LayerNormalization",
         description="LayerNormalization (opset 17) -> ReduceMean/Sub/Mul/Sqrt/Div/Mul/Add, for older runtimes.")
def layernorm_to_primitives(edit: GraphEditor, node: ir.Node) -> Replacement | str | None:
    import numpy as np

    if any(out.name for out in node.outputs[1:]):
        return "the Mean/InvStdDev outputs are used"
    x = node.inputs[0]
    if _value_type(edit, x) not in (None, 1):
        return "only float32 LayerNormalization is decomposed"
    rank = len(x.shape) if x.shape is not None else None
    axis = int(attribute(node, "axis", -1))
    if axis < 0 and rank is None:
        return "the input's rank is unknown, so a negative axis cannot be expanded"
    if rank is None:
        return "the input's rank is unknown"
    axes = list(range(axis if axis >= 0 else axis + rank, rank))
    base = _base(node)
    eps = edit.initializer(f"{base}_eps", np.array(float(attribute(node, "epsilon", 1e-5)), np.float32))
    reduce_extra: dict[str, list[int]] = {}
    reduce_inputs: list[ir.Value] = []
    if edit.opset >= 18:
        reduce_inputs = [edit.initializer(f"{base}_axes", np.array(axes, np.int64))]
    else:
        reduce_extra = {"axes": axes}
    mean = edit.node("ReduceMean", [x, *reduce_inputs], f"{base}_mean", keepdims=1, **reduce_extra)
    centred = edit.node("Sub", [x, _out(mean)], f"{base}_sub")
    square = edit.node("Mul", [_out(centred), _out(centred)], f"{base}_square")
    var = edit.node("ReduceMean", [_out(square), *reduce_inputs], f"{base}_var", keepdims=1, **reduce_extra)
    var_eps = edit.node("Add", [_out(var), eps], f"{base}_add_eps")
    std = edit.node("Sqrt", [_out(var_eps)], f"{base}_sqrt")
    normed = edit.node("Div", [_out(centred), _out(std)], f"{base}_div")
    scaled = edit.node("Mul", [_out(normed), node.inputs[1]], f"{base}_scale")
    nodes = [mean, centred, square, var, var_eps, std, normed, scaled]
    if _input(node, 2) is not None:
        nodes.append(edit.node("Add", [_out(scaled), node.inputs[2]], f"{base}_bias"))
    return Replacement(remove=[node], add=nodes, replaces=_out(node))
