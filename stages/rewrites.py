"""Named graph rewrites that the simplify stage applies, selectable in the recipe (`simplify: {rewrites: [...]}`).

A rewrite is one small function registered with ``@rewrite``: given the graph
and a node of its anchor op type, it returns ``None`` (no match), a string
(matched but refused: the reason, reported in the findings) or a
``Replacement`` (nodes to remove, nodes and initializers that take their
place; the last new node produces the removed nodes' output names, so
consumers and graph outputs are untouched).  Two kinds exist:

- simplifications on by default (fusing per-channel scales, shifts and
  BatchNormalization into the Conv before them);
- target-friendly rewrites chosen by the recipe: PReLU to a Relu-based form,
  and decompositions of ops a target lacks into ops it has, as an exporter's
  op mapper does (HardSwish, Gelu, LayerNormalization).

Rewrites edit the top-level graph through ``GraphView`` (producers, consumers,
constants, fresh names), never by protobuf index.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)

_FLOAT_TYPES = frozenset({1, 10, 11})  # float, float16, double: numpy computes them exactly as stored


@dataclass
class Replacement:
    """What a matched rewrite puts in place of ``remove``."""

    remove: list[onnx.NodeProto]
    add: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)


RewriteFn = Callable[["GraphView", "onnx.NodeProto"], "Replacement | str | None"]


@dataclass(frozen=True)
class Rewrite:
    """A registered rewrite: its name (the recipe's word for it), the op it starts from, what it does."""

    name: str
    anchor: str
    description: str
    default: bool
    computes_constants: bool
    """It computes new weights (a kind of folding): off when simplify's fold_constants is false."""
    fn: RewriteFn


_REGISTRY: dict[str, Rewrite] = {}


def rewrite(name: str, *, anchor: str, description: str, default: bool = False,
            computes_constants: bool = False) -> Callable[[RewriteFn], RewriteFn]:
    """Register ``fn`` as the rewrite ``name``, tried on every node of op type ``anchor``."""

    def register(fn: RewriteFn) -> RewriteFn:
        if name in _REGISTRY:
            raise ValueError(f"rewrite '{name}' is registered twice")
        _REGISTRY[name] = Rewrite(name, anchor, description, default, computes_constants, fn)
        return fn

    return register


def available() -> dict[str, Rewrite]:
    """Every registered rewrite by name."""
    _load_rules()
    return dict(_REGISTRY)


def default_names() -> list[str]:
    return [name for name, rule in available().items() if rule.default]


def _load_rules() -> None:
    """The rules live in this module; importing a rule module elsewhere would register it here too."""


class GraphView:
    """An index over a graph's top level: producers, consumers, constants; edits through ``apply``."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.graph = model.graph
        self.opset = next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)
        overridable = {value.name for value in self.graph.input} if model.ir_version >= 4 else set()
        self.initializers = {init.name: init for init in self.graph.initializer if init.name not in overridable}
        self.outputs = {value.name for value in self.graph.output}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        self._names: set[str] = set()
        self._reindex()

    def _reindex(self) -> None:
        from stages.folding import subgraph_references

        self.producer.clear()
        self.consumers.clear()
        for node in self.graph.node:
            self.producer.update((name, node) for name in node.output if name)
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self._outer_reads = subgraph_references(self.graph)
        self._names = set(self.producer) | set(self.consumers) | set(self.initializers) | self.outputs | {
            value.name for value in self.graph.input}

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a non-overridable initializer; None for anything computed or fed."""
        from onnx import numpy_helper

        init = self.initializers.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def constant_type(self, name: str) -> int | None:
        init = self.initializers.get(name)
        return None if init is None else init.data_type

    def sole_consumer(self, name: str) -> onnx.NodeProto | None:
        """The one node reading ``name``, when nothing else (graph output, subgraph) reads it."""
        readers = self.consumers.get(name, [])
        if len(readers) != 1 or name in self.outputs or name in self._outer_reads:
            return None
        return readers[0]

    def fresh(self, base: str) -> str:
        """A tensor or node name not used anywhere in the graph."""
        candidate, index = base, 0
        while candidate in self._names:
            index += 1
            candidate = f"{base}_{index}"
        self._names.add(candidate)
        return candidate

    def apply(self, replacements: list[Replacement]) -> None:
        """Remove the replaced nodes and insert their replacements where the first removed node stood."""
        if not replacements:
            return
        removed = {id(node): index for index, repl in enumerate(replacements) for node in repl.remove}
        inserted: set[int] = set()
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.node:
            index = removed.get(id(node))
            if index is None:
                nodes.append(node)
            elif index not in inserted:
                inserted.add(index)
                nodes.extend(replacements[index].add)
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        for repl in replacements:
            self.graph.initializer.extend(repl.initializers)
            self.initializers.update((init.name, init) for init in repl.initializers)
        self._reindex()
        self._drop_unread({name for repl in replacements for node in repl.remove for name in node.input})

    def _drop_unread(self, candidates: set[str]) -> None:
        """Initializers that only the replaced nodes read (old weights) go with them."""
        from stages.folding import delete_where

        inputs = {value.name for value in self.graph.input}
        unread = {name for name in candidates if name in self.initializers and name not in self.consumers
                  and name not in self.outputs and name not in self._outer_reads and name not in inputs}
        if not unread:
            return
        delete_where(self.graph.initializer, lambda init: init.name in unread)
        for name in unread:
            del self.initializers[name]


@dataclass
class RewriteReport:
    """Per rewrite: how many matches it rewrote, and the reasons it refused others."""

    applied: Counter[str] = field(default_factory=Counter)
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    """rewrite -> node name -> reason (the first few of each rewrite)."""

    def as_findings(self) -> dict[str, Any]:
        return {"applied": dict(self.applied), "refused": self.refused}


MAX_REFUSALS_REPORTED = 20


def apply_rewrites(model: onnx.ModelProto, names: list[str], report: RewriteReport) -> int:
    """Apply the named rewrites, in their order for each node, until none matches; returns how many matched."""
    rules = available()
    by_anchor: dict[str, list[Rewrite]] = {}
    for name in names:
        by_anchor.setdefault(rules[name].anchor, []).append(rules[name])
    if not by_anchor or not any(node.op_type in by_anchor for node in model.graph.node):
        return 0
    view = GraphView(model)
    total = 0
    for _ in range(len(model.graph.node) + 1):  # every round rewrites at least one node
        count = _apply_round(view, by_anchor, report)
        total += count
        if count == 0:
            break
    return total


def _apply_round(view: GraphView, by_anchor: dict[str, list[Rewrite]], report: RewriteReport) -> int:
    replacements: list[Replacement] = []
    claimed: set[int] = set()
    for node in list(view.graph.node):
        if node.op_type not in by_anchor or node.domain not in ("", "ai.onnx") or id(node) in claimed:
            continue
        for rule in by_anchor[node.op_type]:
            outcome = rule.fn(view, node)
            if isinstance(outcome, str):
                refusals = report.refused.setdefault(rule.name, {})
                if len(refusals) < MAX_REFUSALS_REPORTED:
                    refusals[node.name or node.output[0]] = outcome
                continue
            if outcome is None or any(id(old) in claimed for old in outcome.remove):
                continue
            claimed.update(id(old) for old in outcome.remove)
            replacements.append(outcome)
            report.applied[rule.name] += 1
            break
    view.apply(replacements)
    return len(replacements)


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
    return helper.tensor_dtype_to_np_dtype(elem) if elem in _FLOAT_TYPES else None


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
    graph = view.graph
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.name == name and value.type.tensor_type.elem_type:
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
    graph = view.graph
    for value in (*graph.input, *graph.value_info, *graph.output):
        if value.name == name and value.type.tensor_type.HasField("shape"):
            return len(value.type.tensor_type.shape.dim)
    init = view.initializers.get(name)
    return None if init is None else len(init.dims)
