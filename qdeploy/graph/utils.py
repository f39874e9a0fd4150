"""Facts about ONNX graphs and cheap edits, shared by the simplify stage's modules.

Every helper here avoids what is slow on large models: serialising tensors
(``ByteSize`` copies them), comparing whole messages (``remove``) and
rebuilding repeated fields.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = [
    "GRAPH_OPS",
    "MOVEMENT_OPS",
    "ONNX_SPEC_DOMAINS",
    "attribute_key",
    "default_opset",
    "delete_indices",
    "delete_where",
    "element_bits",
    "fingerprint",
    "float32_chunks",
    "fresh_name",
    "graph_inputs",
    "graph_key",
    "has_subgraph",
    "io_names",
    "model_bytes",
    "moved_weights",
    "names_read",
    "node_attributes",
    "op_counts",
    "place_after_producers",
    "prune_unproduced_value_info",
    "prune_unused_value_info_recursive",
    "rename_uses",
    "subgraph_references",
    "subgraphs",
    "tensor_nbytes",
    "tensor_types",
    "walk_graphs",
]


_ELEMENT_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2}
_SUB_BYTE_BITS = {17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4}
"""float8 variants (stored one per int32 in protobuf, so measured, not counted, by ``tensor_nbytes``), int4/uint4
and float4: bits per element."""


def element_bits(data_type: int) -> int | None:
    """Bits per element of a numeric TensorProto type; None for strings and types this table does not know."""
    size = _ELEMENT_BYTES.get(data_type)
    return size * 8 if size is not None else _SUB_BYTE_BITS.get(data_type)


def node_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's attributes by name, as Python values (``helper.get_attribute_value``)."""
    from onnx import helper

    return {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
"""Bytes per element of the ONNX tensor types of fixed size."""


def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default (ai.onnx) domain; 0 when it imports none."""
    return next((entry.version for entry in model.opset_import if entry.domain in ("", "ai.onnx")), 0)


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """Bytes of a tensor's data, from its shape: without serialising it (``ByteSize`` copies megabytes)."""
    size = _ELEMENT_BYTES.get(tensor.data_type)
    if size is None or tensor.data_location == 1:  # strings, sub-byte types, external data: measured
        return tensor.ByteSize()
    for dim in tensor.dims:
        size *= dim
    return size


GRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
"""The standard ops with graph attributes; other standard ops have none, custom ones may."""
ONNX_SPEC_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
"""Domains of the ops the ONNX spec defines (ai.onnx and ai.onnx.ml): only GRAPH_OPS among them hold graphs."""


CHUNK_VALUES = 1 << 22
"""Values per piece that ``float32_chunks`` hands out (16 MB of float32)."""


def float32_chunks(tensor: onnx.TensorProto) -> Iterator[np.ndarray]:
    """A float32 tensor's values, flat, in pieces of at most ``CHUNK_VALUES``, so a scan of a large weight holds
    one copy of it, not the several that whole-array numpy expressions make.

    Each piece is a copy, not a view of the tensor's bytes: a caller's variable holding the last piece of one
    tensor would otherwise keep all its bytes alive while the next tensor's are read (two weights in memory).
    """
    import numpy as np
    from onnx import numpy_helper

    raw = tensor.raw_data
    values = np.frombuffer(raw, dtype="<f4") if raw else numpy_helper.to_array(tensor).reshape(-1)
    for start in range(0, values.size, CHUNK_VALUES):
        yield values[start:start + CHUNK_VALUES].copy()


def has_subgraph(node: onnx.NodeProto) -> bool:
    return bool(subgraphs(node))


MOVEMENT_OPS = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
"""Ops that rearrange their first input's values without changing any or their number."""


def moved_weights(graph: onnx.GraphProto) -> dict[str, str]:
    """Outputs of the graph's nodes that are a weight rearranged (a Transpose of an initializer, a Reshape of
    that...) -> the initializer whose values they hold.  Such a tensor is the same on every input: its values
    are the weight's, so no data tells more about them than the weight itself."""
    initializers = {tensor.name for tensor in graph.initializer}
    fixed = set(initializers) | {out for node in graph.node if node.op_type == "Constant" for out in node.output}
    source: dict[str, str] = {}
    for node in graph.node:
        if node.op_type not in MOVEMENT_OPS or not node.input or len(node.output) != 1:
            continue
        data, *rest = node.input
        origin = data if data in initializers else source.get(data)
        if origin is not None and all(name in fixed for name in rest if name):
            source[node.output[0]] = origin
            fixed.add(node.output[0])
    return source


def tensor_types(graph: onnx.GraphProto) -> dict[str, int]:
    """ONNX element type of every tensor of ``graph`` whose type is declared or inferred."""
    types = {value.name: value.type.tensor_type.elem_type for value in (*graph.input, *graph.value_info, *graph.output)
             if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type}
    types.update((init.name, init.data_type) for init in graph.initializer)
    return types


def node_readers(nodes: Iterable[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    """Tensor name -> the nodes that read it, in the order given (a node reading a name twice is listed twice)."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def place_after_producers(graph: onnx.GraphProto, readers: Mapping[str, list[onnx.NodeProto]]) -> None:
    """Add each tensor's ``readers`` (probe nodes) to ``graph`` right after the node that makes it (first, for a
    graph input or weight): in a session that runs nodes in the model's order, a probe then reads its tensor
    while it is fresh, and neither the tensor nor the probe's intermediates wait for the end of the graph."""
    made_here = {out for node in graph.node for out in node.output}
    ordered = [node for name, nodes in readers.items() if name not in made_here for node in nodes]
    for node in graph.node:
        ordered.append(node)
        ordered.extend(added for out in node.output if out in readers for added in readers[out])
    del graph.node[:]
    graph.node.extend(ordered)


def subgraph_references(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name read by the nodes of the subgraphs of ``graph``'s nodes (outer-scope uses included)."""
    names: set[str] = set()
    for node in graph.node:
        for sub in subgraphs(node):
            for inner in sub.node:
                names.update(inner.input)
            names.update(out.name for out in sub.output)
            names |= subgraph_references(sub)
    return names


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held by a node's attributes (called for every node, so the common case is cheap)."""
    if node.op_type not in GRAPH_OPS and node.domain in ONNX_SPEC_DOMAINS:
        return []
    graphs = []
    for attr in node.attribute:
        if attr.HasField("g"):
            graphs.append(attr.g)
        graphs.extend(attr.graphs)
    return graphs


def walk_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every graph nested in it, outer graphs first."""
    yield graph
    for node in graph.node:
        if node.op_type in GRAPH_OPS or node.domain not in ONNX_SPEC_DOMAINS:  # inline fast path of subgraphs()
            for sub in subgraphs(node):
                yield from walk_graphs(sub)


def rename_uses(graph: onnx.GraphProto, old: str, new: str, *, outputs: bool = True) -> None:
    """Every use of `old` as a node input (nested graphs included), and as a graph output, becomes `new`."""
    for inner in walk_graphs(graph):
        for node in inner.node:
            for index, name in enumerate(node.input):
                if name == old:
                    node.input[index] = new
    if outputs:
        for value in graph.output:
            if value.name == old:
                value.name = new


def delete_where(container: Any, doomed: Callable[[Any], bool]) -> int:
    """Delete the items of a repeated protobuf field for which ``doomed`` holds; how many.

    By index, from the end: neither rebuilding the list nor ``remove`` (which compares whole messages) copies
    any tensor.
    """
    return delete_indices(container, [index for index, item in enumerate(container) if doomed(item)])


def delete_indices(container: Any, indices: Iterable[int]) -> int:
    """Delete the items at ``indices`` of a repeated protobuf field; how many."""
    ordered = sorted(set(indices), reverse=True)
    for index in ordered:
        del container[index]
    return len(ordered)


def names_read(nodes: list[onnx.NodeProto], graph: onnx.GraphProto) -> set[str]:
    read = {name for node in nodes for name in node.input}
    read |= {out.name for out in graph.output}
    read |= subgraph_references(graph)
    return read


def fresh_name(base: str, taken: set[str], *, first: int = 2) -> str:
    """``base``, or ``base_2``, ``base_3``... (from ``base_<first>``): the first not in ``taken``, which then holds
    it (names of tensors, initializers or nodes that a pass adds must not collide with any the graph has)."""
    name, suffix = base, first - 1
    while name in taken:
        suffix += 1
        name = f"{base}_{suffix}"
    taken.add(name)
    return name


def model_bytes(model: onnx.ModelProto) -> int:
    """Serialised size of the model, summed piecewise (a whole ModelProto above 2 GB cannot be measured)."""
    graph = model.graph
    return (sum(tensor_nbytes(init) for init in graph.initializer)
            + sum(node.ByteSize() for node in graph.node if node.op_type != "Constant")
            + sum(tensor_nbytes(attr.t) for node in graph.node if node.op_type == "Constant" for attr in node.attribute)
            + sum(function.ByteSize() for function in model.functions))


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts = Counter(node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
                     for node in model.graph.node)
    return dict(sorted(counts.items()))


def graph_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller feeds: graph inputs that are not initializers (IR < 4 lists initializers as inputs)."""
    initializers = {init.name for init in graph.initializer}
    return [value for value in graph.input if value.name not in initializers]


def io_names(model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """The model's interface: inputs that are not initializers (IR < 4 lists those too), and outputs."""
    graph = model.graph
    initializers = {init.name for init in graph.initializer} if model.ir_version < 4 else set()
    return ([value.name for value in graph.input if value.name not in initializers],
            [value.name for value in graph.output])


def fingerprint(model: onnx.ModelProto) -> int:
    """Hash of the graph's structure (subgraphs included): nodes, initializer names/types/shapes, the interface."""
    graph = model.graph
    return hash((graph_key(graph), tuple((init.name, init.data_type, tuple(init.dims)) for init in graph.initializer),
                 repr(io_names(model))))


def graph_key(graph: onnx.GraphProto) -> tuple[Any, ...]:
    """Plain nodes by their bytes (cheap); Constant nodes and nodes with subgraphs by structure."""
    plain, special = [], []
    for index, node in enumerate(graph.node):
        if node.op_type == "Constant" or subgraphs(node):
            special.append((index, node.op_type, tuple(node.input), tuple(node.output),
                            tuple(attribute_key(attr) for attr in node.attribute)))
        else:
            plain.append(node.SerializeToString())
    return hash(b"\0".join(plain)), tuple(special)


def attribute_key(attr: onnx.AttributeProto) -> Any:
    """Cheap identity of an attribute: tensors by name/type/shape (their bytes only move), subgraphs by structure."""
    if attr.HasField("t"):
        return attr.name, attr.t.data_type, tuple(attr.t.dims)
    if attr.HasField("g"):
        return attr.name, graph_key(attr.g), tuple(init.name for init in attr.g.initializer)
    if len(attr.graphs):
        return attr.name, tuple((graph_key(g), tuple(i.name for i in g.initializer)) for g in attr.graphs)
    return attr.SerializeToString()


def prune_unproduced_value_info(model: onnx.ModelProto) -> None:
    """Drop the top-level graph's value_info of names no node produces (folded or removed nodes' outputs, and
    graph inputs and initializers, whose types are declared elsewhere).  Subgraphs are left alone.

    ``prune_unused_value_info_recursive`` keeps what a node reads too, and walks every subgraph.
    """
    graph = model.graph
    produced = {name for node in graph.node for name in node.output}
    delete_where(graph.value_info, lambda value: value.name not in produced)


def prune_unused_value_info_recursive(graph: onnx.GraphProto) -> None:
    """Drop value_info of names no node of its graph produces or reads, in ``graph`` and every graph below it.

    For a pass that renamed or removed tensors anywhere in the model (the fp16 repair): an entry a node still
    reads (a graph input's or an initializer's) stays.
    """
    used = {name for node in graph.node for name in (*node.output, *node.input) if name}
    delete_where(graph.value_info, lambda value: value.name not in used)
    for node in graph.node:
        for sub in subgraphs(node):
            prune_unused_value_info_recursive(sub)
