"""The rewrite rules (contract in ``qdeploy.graph.rewrite_base``): fusions on by default, target rewrites on request.

Each rule is one function: it looks at its anchor node and what surrounds it,
returns None when the pattern is not there, a reason when it is there but
cannot be rewritten safely, or the ``Replacement``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from qdeploy.graph.rewrite_base import FLOAT_TYPES, GraphView, Replacement, rewrite

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["ConvParts", "fuse_conv_batchnorm", "fuse_conv_scale_bias", "fuse_convtranspose_batchnorm",
           "fuse_convtranspose_scale_bias", "fuse_reshape_chain", "gelu_to_erf", "hardswish_to_hardsigmoid",
           "layernorm_to_primitives", "prelu_to_relu"]



# ---------------------------------------------------------------------------------------------------------------
# Helpers shared by the rules


def _node(view: GraphView, op: str, inputs: list[str], outputs: list[str], base: str, **attrs: Any) -> onnx.NodeProto:
    from onnx import helper

    return helper.make_node(op, inputs, outputs, name=view.fresh(base), **attrs)


def _tensor(view: GraphView, array: np.ndarray, base: str) -> onnx.TensorProto:
    from onnx import numpy_helper

    return numpy_helper.from_array(array, view.fresh(base))


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            value = helper.get_attribute_value(attr)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _float_dtype(view: GraphView, name: str) -> np.dtype | None:
    """The numpy dtype of a float initializer, or None."""
    from onnx import helper

    elem = view.constant_type(name)
    return helper.tensor_dtype_to_np_dtype(elem) if elem in FLOAT_TYPES else None


# ---------------------------------------------------------------------------------------------------------------
# Default simplifications: fold per-channel affine ops into the Conv that feeds them


ConvParts = tuple["np.ndarray", "np.ndarray | None", int]
"""(weight, bias or None, output-channel axis of the weight) of a conv with constant weights."""


def _conv_parts(view: GraphView, conv: onnx.NodeProto) -> ConvParts | str:
    """(weight, bias or None, output-channel axis of the weight) of a Conv/ConvTranspose with constant weights."""
    if len(conv.input) < 2 or _float_dtype(view, conv.input[1]) is None:
        return "the weight is not a float initializer"
    weight = view.constant(conv.input[1])
    bias = None
    if len(conv.input) > 2 and conv.input[2]:
        if _float_dtype(view, conv.input[2]) is None:
            return "the bias is not a float initializer"
        bias = view.constant(conv.input[2])
    if conv.op_type == "ConvTranspose" and _attr(conv, "group", 1) != 1:
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


def _fused_conv(view: GraphView, conv: onnx.NodeProto, after: onnx.NodeProto, scale: np.ndarray,
                shift: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, axis: int) -> Replacement:
    """Conv with weight*scale and bias*scale+shift, producing ``after``'s output."""
    import numpy as np

    # A float32 product rounded once equals the float64 product rounded to float32: no need for float64 here.
    scale = scale.astype(weight.dtype)
    shape = [1] * weight.ndim
    shape[axis] = -1
    new_weight = weight * scale.reshape(shape)
    new_bias = (np.zeros_like(scale) if bias is None else bias * scale) + shift.astype(weight.dtype)
    w_init = _tensor(view, new_weight, f"{conv.input[1]}_fused")
    b_init = _tensor(view, new_bias, f"{conv.name or conv.output[0]}_bias_fused")
    fused = _copy_node(conv)
    del fused.input[:]
    fused.input.extend([conv.input[0], w_init.name, b_init.name])
    del fused.output[:]
    fused.output.append(after.output[0])
    return Replacement(remove=[conv, after], add=[fused], initializers=[w_init, b_init])


def _copy_node(node: onnx.NodeProto) -> onnx.NodeProto:
    import onnx

    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    return copy


def _conv_and_next(view: GraphView, conv: onnx.NodeProto,
                   ops: tuple[str, ...]) -> tuple[onnx.NodeProto, ConvParts] | str | None:
    """(the single consumer of the conv's output when it is one of ``ops``, the conv's constant parts) or None/why."""
    after = view.sole_consumer(conv.output[0])
    if after is None or after.op_type not in ops or after.domain not in ("", "ai.onnx"):
        return None
    parts = _conv_parts(view, conv)
    if isinstance(parts, str):
        return parts
    return after, parts


@rewrite("fuse_conv_scale_bias", anchor="Conv", default=True, computes_constants=True,
         description="Fold Mul/Div/Add/Sub by a per-channel or scalar constant after a Conv into its weights.")
def fuse_conv_scale_bias(view: GraphView, conv: onnx.NodeProto) -> Replacement | str | None:
    return _fuse_affine(view, conv)


@rewrite("fuse_convtranspose_scale_bias", anchor="ConvTranspose", default=True, computes_constants=True,
         description="Fold Mul/Div/Add/Sub by a per-channel or scalar constant after a ConvTranspose into it.")
def fuse_convtranspose_scale_bias(view: GraphView, conv: onnx.NodeProto) -> Replacement | str | None:
    return _fuse_affine(view, conv)


def _fuse_affine(view: GraphView, conv: onnx.NodeProto) -> Replacement | str | None:
    import numpy as np

    found = _conv_and_next(view, conv, ("Mul", "Div", "Add", "Sub"))
    if not isinstance(found, tuple):
        return found
    after, (weight, bias, axis) = found
    other = [name for name in after.input if name != conv.output[0]]
    if len(other) != 1 or (after.op_type in ("Div", "Sub") and after.input[0] != conv.output[0]):
        return None  # x*x, or c/x, c-x: not affine in the conv's output
    value = view.constant(other[0])
    if value is None or view.constant_type(other[0]) != view.constant_type(conv.input[1]):
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
    return _fused_conv(view, conv, after, scale, shift, weight, bias, axis)


@rewrite("fuse_conv_batchnorm", anchor="Conv", default=True, computes_constants=True,
         description="Fold an inference BatchNormalization after a Conv into its weights (skip_fuse_bn keeps it).")
def fuse_conv_batchnorm(view: GraphView, conv: onnx.NodeProto) -> Replacement | str | None:
    return _fuse_batchnorm(view, conv)


@rewrite("fuse_convtranspose_batchnorm", anchor="ConvTranspose", default=True, computes_constants=True,
         description="Fold an inference BatchNormalization after a ConvTranspose into its weights.")
def fuse_convtranspose_batchnorm(view: GraphView, conv: onnx.NodeProto) -> Replacement | str | None:
    return _fuse_batchnorm(view, conv)


def _fuse_batchnorm(view: GraphView, conv: onnx.NodeProto) -> Replacement | str | None:
    import numpy as np

    found = _conv_and_next(view, conv, ("BatchNormalization",))
    if not isinstance(found, tuple):
        return found
    bn, (weight, bias, axis) = found
    if (len(bn.output) > 1 and any(bn.output[1:])) or _attr(bn, "training_mode", 0):
        return "BatchNormalization in training mode"
    params = [view.constant(name) for name in bn.input[1:5]]
    if len(params) != 4 or any(value is None for value in params):
        return "BatchNormalization parameters are not initializers"
    gamma, beta, mean, var = (np.asarray(value, np.float64).reshape(-1) for value in params)  # type: ignore[arg-type]
    if gamma.shape != (weight.shape[axis],):
        return f"BatchNormalization has {gamma.shape[0]} channels, the conv {weight.shape[axis]}"
    scale = gamma / np.sqrt(var + float(_attr(bn, "epsilon", 1e-5)))
    return _fused_conv(view, conv, bn, scale, beta - mean * scale, weight, bias, axis)


_SHAPE_ONLY = ("Reshape", "Squeeze", "Unsqueeze", "Flatten")


@rewrite("fuse_reshape_chain", anchor=_SHAPE_ONLY, default=True,
         description="Two consecutive Reshape/Squeeze/Unsqueeze/Flatten with a static final shape -> one Reshape.")
def fuse_reshape_chain(view: GraphView, node: onnx.NodeProto) -> Replacement | str | None:
    import numpy as np

    after = view.sole_consumer(node.output[0])
    if after is None or after.op_type not in _SHAPE_ONLY or after.domain not in ("", "ai.onnx") \
            or after.input[0] != node.output[0]:
        return None
    dims = _static_dims(view, after.output[0])
    if dims is None:
        return None  # the final shape is not known: the pair stays as it is
    base = after.name or after.output[0]
    shape = _tensor(view, np.array(dims, np.int64), f"{base}_shape")
    fused = _node(view, "Reshape", [node.input[0], shape.name], [after.output[0]], f"{base}_fused")
    return Replacement(remove=[node, after], add=[fused], initializers=[shape])


def _static_dims(view: GraphView, name: str) -> list[int] | None:
    value = view.value_info(name)
    if value is None or not value.type.tensor_type.HasField("shape"):
        return None
    dims = value.type.tensor_type.shape.dim
    return [dim.dim_value for dim in dims] if all(dim.HasField("dim_value") for dim in dims) else None


# ---------------------------------------------------------------------------------------------------------------
# Target-friendly rewrites, chosen in the recipe


@rewrite("prelu_to_relu", anchor="PRelu",
         description="PRelu(x, s) -> r + s*(x - r) with r = Relu(x): exact, for targets without PRelu.")
def prelu_to_relu(view: GraphView, node: onnx.NodeProto) -> Replacement | str | None:
    x, slope = node.input[0], node.input[1]
    base = node.name or node.output[0]
    relu, negative, scaled = (view.fresh(f"{base}_{part}") for part in ("relu", "neg_part", "scaled"))
    return Replacement(remove=[node], add=[
        _node(view, "Relu", [x], [relu], f"{base}_relu"),
        _node(view, "Sub", [x, relu], [negative], f"{base}_sub"),  # min(x, 0), exactly
        _node(view, "Mul", [negative, slope], [scaled], f"{base}_mul"),
        _node(view, "Add", [relu, scaled], [node.output[0]], f"{base}_add"),
    ])


@rewrite("hardswish_to_hardsigmoid", anchor="HardSwish",
         description="HardSwish(x) -> x * HardSigmoid(x, 1/6, 0.5), its definition, for runtimes before opset 14.")
def hardswish_to_hardsigmoid(view: GraphView, node: onnx.NodeProto) -> Replacement | str | None:
    base = node.name or node.output[0]
    gate = view.fresh(f"{base}_gate")
    return Replacement(remove=[node], add=[
        _node(view, "HardSigmoid", [node.input[0]], [gate], f"{base}_hardsigmoid", alpha=1.0 / 6, beta=0.5),
        _node(view, "Mul", [node.input[0], gate], [node.output[0]], f"{base}_mul"),
    ])


@rewrite("gelu_to_erf", anchor="Gelu",
         description="Gelu (opset 20) -> 0.5*x*(1+Erf(x/sqrt 2)), or its tanh form when approximate='tanh'.")
def gelu_to_erf(view: GraphView, node: onnx.NodeProto) -> Replacement | str | None:
    import numpy as np

    x, base = node.input[0], node.name or node.output[0]
    tensor_type = _value_type(view, x)
    if tensor_type not in (None, 1):
        return "only float32 Gelu is decomposed"
    consts = {key: _tensor(view, np.array(value, np.float32), f"{base}_{key}") for key, value in
              (("half", 0.5), ("one", 1.0), ("inv_sqrt2", 1 / math.sqrt(2.0)), ("k", math.sqrt(2 / math.pi)),
               ("cubic", 0.044715), ("three", 3.0))}
    name = {key: view.fresh(f"{base}_{key}") for key in ("scaled", "inner", "plus_one", "half_x", "cube", "cube_k",
                                                          "sum", "arg")}
    if _attr(node, "approximate", "none") == "tanh":
        nodes = [
            _node(view, "Pow", [x, consts["three"].name], [name["cube"]], f"{base}_pow"),
            _node(view, "Mul", [name["cube"], consts["cubic"].name], [name["cube_k"]], f"{base}_mul_cubic"),
            _node(view, "Add", [x, name["cube_k"]], [name["sum"]], f"{base}_add_cubic"),
            _node(view, "Mul", [name["sum"], consts["k"].name], [name["arg"]], f"{base}_mul_k"),
            _node(view, "Tanh", [name["arg"]], [name["inner"]], f"{base}_tanh"),
        ]
    else:
        nodes = [
            _node(view, "Mul", [x, consts["inv_sqrt2"].name], [name["scaled"]], f"{base}_scale"),
            _node(view, "Erf", [name["scaled"]], [name["inner"]], f"{base}_erf"),
        ]
    nodes += [
        _node(view, "Add", [name["inner"], consts["one"].name], [name["plus_one"]], f"{base}_add_one"),
        _node(view, "Mul", [x, consts["half"].name], [name["half_x"]], f"{base}_half"),
        _node(view, "Mul", [name["half_x"], name["plus_one"]], [node.output[0]], f"{base}_mul"),
    ]
    used = {value for added in nodes for value in added.input}
    return Replacement(remove=[node], add=nodes, initializers=[t for t in consts.values() if t.name in used])


def _value_type(view: GraphView, name: str) -> int | None:
    """Element type of a tensor when inference or the graph declares it."""
    value = view.value_info(name)
    if value is not None and value.type.tensor_type.elem_type:
        return value.type.tensor_type.elem_type
    return view.constant_type(name)


@rewrite("layernorm_to_primitives", anchor="LayerNormalization",
         description="LayerNormalization (opset 17) -> ReduceMean/Sub/Mul/Sqrt/Div/Mul/Add, for older runtimes.")
def layernorm_to_primitives(view: GraphView, node: onnx.NodeProto) -> Replacement | str | None:
    import numpy as np

    if len(node.output) > 1 and any(node.output[1:]):
        return "the Mean/InvStdDev outputs are used"
    if _value_type(view, node.input[0]) not in (None, 1):
        return "only float32 LayerNormalization is decomposed"
    rank = _rank(view, node.input[0])
    axis = int(_attr(node, "axis", -1))
    if axis < 0 and rank is None:
        return "the input's rank is unknown, so a negative axis cannot be expanded"
    axes = list(range(axis if axis >= 0 else axis + (rank or 0), rank)) if rank is not None else None
    if axes is None:
        return "the input's rank is unknown"
    base, x = node.name or node.output[0], node.input[0]
    eps = _tensor(view, np.array(float(_attr(node, "epsilon", 1e-5)), np.float32), f"{base}_eps")
    names = {key: view.fresh(f"{base}_{key}") for key in ("mean", "centred", "square", "var", "var_eps", "std",
                                                          "normed", "scaled")}
    inits = [eps]
    reduce_extra: dict[str, Any] = {}
    reduce_inputs: list[str] = []
    if view.opset >= 18:
        axes_init = _tensor(view, np.array(axes, np.int64), f"{base}_axes")
        inits.append(axes_init)
        reduce_inputs = [axes_init.name]
    else:
        reduce_extra = {"axes": axes}
    has_bias = len(node.input) > 2 and bool(node.input[2])
    nodes = [
        _node(view, "ReduceMean", [x, *reduce_inputs], [names["mean"]], f"{base}_mean", keepdims=1, **reduce_extra),
        _node(view, "Sub", [x, names["mean"]], [names["centred"]], f"{base}_sub"),
        _node(view, "Mul", [names["centred"], names["centred"]], [names["square"]], f"{base}_square"),
        _node(view, "ReduceMean", [names["square"], *reduce_inputs], [names["var"]], f"{base}_var", keepdims=1,
              **reduce_extra),
        _node(view, "Add", [names["var"], eps.name], [names["var_eps"]], f"{base}_add_eps"),
        _node(view, "Sqrt", [names["var_eps"]], [names["std"]], f"{base}_sqrt"),
        _node(view, "Div", [names["centred"], names["std"]], [names["normed"]], f"{base}_div"),
        _node(view, "Mul", [names["normed"], node.input[1]], [names["scaled"] if has_bias else node.output[0]],
              f"{base}_scale"),
    ]
    if has_bias:
        nodes.append(_node(view, "Add", [names["scaled"], node.input[2]], [node.output[0]], f"{base}_bias"))
    return Replacement(remove=[node], add=nodes, initializers=inits)


def _rank(view: GraphView, name: str) -> int | None:
    value = view.value_info(name)
    if value is not None and value.type.tensor_type.HasField("shape"):
        return len(value.type.tensor_type.shape.dim)
    init = view.initializers.get(name)
    return None if init is None else len(init.dims)
