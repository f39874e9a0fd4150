"""Node names: unique and non-empty in a graph and every graph nested in it (If/Loop/Scan bodies).

ONNX allows nodes without names, and converters and hand-built models often leave them empty or repeat them.
ONNX Runtime refuses a graph with two nodes of one name, and qdeploy finds nodes by name (keep-float lists,
block lists, budgets, localisation, reports).  So the export stage names every node once
(``name_nodes_uniquely``), and every pass that adds a node takes its name from a ``NodeNames`` that knows
every name in use: a name derived from an empty one (``"" + "_Q"``) can no longer repeat.

Only node names are read, never a tensor: cheap on a 2 GB model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qdeploy.graph.utils import GRAPH_OPS, ONNX_SPEC_DOMAINS, fresh_name, subgraphs

if TYPE_CHECKING:
    import onnx

__all__ = ["OPTIMIZER_SUFFIX", "ORT_INLINED", "NodeNames", "NodeNaming", "all_nodes", "name_nodes_uniquely",
           "node_names", "rename_generated_tensors", "rename_optimizer_tensors", "rename_ort_inlined",
           "rename_quantizer_derived", "tensor_names", "unique_node_name"]

EXAMPLES = 5
"""How many renamings a ``NodeNaming`` lists (the count covers all)."""
ORT_INLINED = "_inlfunc_"
"""What ONNX Runtime's function inlining puts in the names of the nodes and tensors it writes (a HardSwish at opset
14, which its CPU provider has no kernel for, becomes ``HardSigmoid -> _inlfunc_HardSwish_HS_X -> Mul``)."""


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of the graphs nested in it, outer graph first, in order."""
    for node in graph.node:
        yield node
        if node.op_type in GRAPH_OPS or node.domain not in ONNX_SPEC_DOMAINS:  # the cheap test of subgraphs()
            for sub in subgraphs(node):
                yield from all_nodes(sub)


def node_names(graph: onnx.GraphProto) -> set[str]:
    """The non-empty node names of ``graph`` and its nested graphs."""
    return {node.name for node in all_nodes(graph) if node.name}


class NodeNames:
    """The node names in use (nested graphs included); ``fresh`` hands out new ones that repeat none of them."""

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self.taken = {name for name in taken if name}

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> NodeNames:
        return cls(node_names(graph))

    def fresh(self, base: str, op_type: str = "node") -> str:
        """``base`` (or ``op_type`` when ``base`` is empty), suffixed ``_2``, ``_3``... until unused; now taken."""
        return fresh_name(base or op_type or "node", self.taken)

    def derived(self, node_name: str, suffix: str, op_type: str = "node") -> str:
        """A new node's name from the node it replaces or serves: ``<name><suffix>``, or ``<op_type><suffix>``
        when that node has no name (``"" + "_Q"`` would repeat for every nameless node)."""
        return self.fresh(f"{node_name or op_type or 'node'}{suffix}")

    def __contains__(self, name: object) -> bool:
        return name in self.taken


def unique_node_name(graph: onnx.GraphProto, base: str, op_type: str = "node") -> str:
    """One new node name for ``graph`` (walks its names: for several, keep one ``NodeNames``)."""
    return NodeNames.of(graph).fresh(base, op_type)


@dataclass
class NodeNaming:
    """What ``name_nodes_uniquely`` changed: nodes that had no name, nodes whose name an earlier node had."""

    unnamed: int = 0
    duplicates: int = 0
    examples: list[str] = field(default_factory=list)
    """A few of the renamings, ``'old' (Op) -> new``."""

    @property
    def changed(self) -> int:
        return self.unnamed + self.duplicates

    def summary(self) -> dict[str, object]:
        """The report's form (the export stage's finding ``node_names``)."""
        return {"unnamed_named": self.unnamed, "duplicates_renamed": self.duplicates, "examples": self.examples}


def name_nodes_uniquely(model_or_graph: onnx.ModelProto | onnx.GraphProto) -> NodeNaming:
    """Give every node of the graph and its nested graphs a non-empty name that no other node has.

    The first node holding a name keeps it; a later one holding it again becomes ``<name>_2``...; a node without
    a name becomes ``<op type>_<first output>`` (stable across runs, readable in a report).  Names in use anywhere
    are reserved before any is given, so a new name never takes one a later node already has.
    """
    graph = model_or_graph.graph if hasattr(model_or_graph, "graph") else model_or_graph
    nodes = list(all_nodes(graph))
    naming = NodeNaming()
    names = NodeNames(node.name for node in nodes)
    if len(names.taken) == len(nodes):  # the common case, every stage after export: all named, none twice
        return naming
    seen: set[str] = set()
    for node in nodes:
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        old = node.name
        if old:
            naming.duplicates += 1
            node.name = names.fresh(old)
        else:
            naming.unnamed += 1
            first = node.output[0] if len(node.output) and node.output[0] else ""
            node.name = names.fresh(f"{node.op_type}_{first}" if first else node.op_type, node.op_type)
        seen.add(node.name)
        if len(naming.examples) < EXAMPLES:
            naming.examples.append(f"{old!r} ({node.op_type}) -> {node.name}")
    return naming


def rename_ort_inlined(graph: onnx.GraphProto) -> int:
    """Rename the nodes and tensors ONNX Runtime's inlining named (``ORT_INLINED``) in a model it optimized and
    saved, in ``graph`` and its nested graphs: when such a model reaches ONNX Runtime again with a function op put
    back (a HardSwish recomposed from one of the pairs), the inliner writes the first name it wrote before, and the
    session refuses the model ("Duplicate definition of name (_inlfunc_HardSwish_HS_X)", PP-OCRv5 det).  The new
    names say ``_inlined_`` instead; the count of renamed tensors."""
    nodes = list(all_nodes(graph))
    values = {name for node in nodes for name in (*node.input, *node.output) if name}
    interface = {value.name for value in (*graph.input, *graph.output)}  # the model's own names stay
    renamed = {}
    for name in sorted(name for name in values - interface if ORT_INLINED in name):
        renamed[name] = fresh_name(name.replace(ORT_INLINED, "_inlined_"), values)
    taken = {node.name for node in nodes}
    for node in nodes:
        if ORT_INLINED in node.name:
            node.name = fresh_name(node.name.replace(ORT_INLINED, "_inlined_"), taken)
    _rename_tensors(graph, nodes, renamed)
    return len(renamed)


OPTIMIZER_SUFFIX = "__pre"
"""What :func:`rename_optimizer_tensors` appends: no name ONNX Runtime generates from its own base names ends so."""


def rename_optimizer_tensors(graph: onnx.GraphProto, before: set[str]) -> int:
    """Rename the tensors ONNX Runtime's optimizer named in a model it optimized and saved (every tensor of ``graph``
    and its nested graphs not in ``before``, the names of the model it was given): when the saved model reaches
    ONNX Runtime again, a pass generates its names from the same bases (``gemm_input_shape``, then
    ``gemm_input_shape_token_0``...) and may take one a saved initializer holds: a Wav2Vec2's int8 model failed to
    load at every optimization level ("AddInitializedOrtValue Attempt to replace the existing tensor": the second
    MatMulAddFusion, after ConstantSharing had merged the first one's shape initializers).  The new names end in
    ``OPTIMIZER_SUFFIX``; the count of renamed tensors."""
    nodes = list(all_nodes(graph))
    values = {name for node in nodes for name in (*node.input, *node.output) if name}
    values |= {init.name for init in graph.initializer}
    renamed = {name: fresh_name(f"{name}{OPTIMIZER_SUFFIX}", values)
               for name in sorted(values - _interfaces(graph) - before)}
    _rename_tensors(graph, nodes, renamed)
    return len(renamed)


_GENERATED = re.compile(r"^(?P<base>.+?)_token_\d+")
"""How ONNX Runtime's graph names a tensor a pass adds, after the first of its base (``gemm_input_shape_token_6``,
``gemm_output_reshape_token_5_new_shape``)."""
GENERATED_BASES = frozenset({"gemm_input_shape", "gemm_output_shape", "gemm_input_reshape", "gemm_output_reshape"})
"""Bases MatMulAddFusion names its tensors from: present without a ``_token_`` sibling when it fused once."""


def rename_generated_tensors(graph: onnx.GraphProto) -> int:
    """Rename, in a model that arrives saved by ONNX Runtime's optimizer (by its transformer optimizer, or a
    session's ``optimized_model_filepath``), the tensors named as its passes name theirs: a base
    (``GENERATED_BASES``, or any a ``_token_<n>`` name starts with), alone or followed by ``_`` and more.  Loading
    the model again, its passes generate the same names and may fail ("AddInitializedOrtValue Attempt to replace
    the existing tensor": a one-layer BERT fused by ONNX Runtime's transformer optimizer could not be loaded at
    all).  The new names end in ``OPTIMIZER_SUFFIX``; the count of renamed tensors."""
    nodes = list(all_nodes(graph))
    values = {name for node in nodes for name in (*node.input, *node.output) if name}
    values |= {init.name for init in graph.initializer}
    values = {name for name in values if isinstance(name, str)}  # bytes: a damaged file, refused later with why
    bases = {found["base"] for found in map(_GENERATED.match, values) if found} | GENERATED_BASES
    generated = {name for name in values - _interfaces(graph)
                 if any(name == base or name.startswith(f"{base}_") for base in bases)}
    renamed = {name: fresh_name(f"{name}{OPTIMIZER_SUFFIX}", values) for name in sorted(generated)}
    _rename_tensors(graph, nodes, renamed)
    return len(renamed)


QUANTIZER_SUFFIX = "__model"
"""What :func:`rename_quantizer_derived` appends: no tail ONNX Runtime's quantizer derives names with ends so."""
_DERIVED_TAIL = re.compile(
    r"(?P<digits>\d*)(?P<words>(?:_(?:quantized|scale|zero_point|convert_clone|convert|QuantizeLinear_Input"
    r"|QuantizeLinear_Output|DequantizeLinear_Input|DequantizeLinear_Output|QuantizeLinear|DequantizeLinear|Cast))*)")
"""The tails ONNX Runtime's quantizer appends to a tensor's name to name what it adds: a shared bias's copy
(``bias`` + the next number), scale, zero point, quantized weight, the Q/DQ nodes' outputs, their chains."""


def rename_quantizer_derived(graph: onnx.GraphProto) -> int:
    """Rename the main graph's tensors whose names ONNX Runtime's quantizer would derive from another tensor's
    (``_DERIVED_TAIL``): it never checks that a name it derives is free, and a model that already holds one no
    longer loads ("Duplicate definition of name (conv1d_25;conv1d_252)": basic-pitch's tf2onnx graph has a
    Conv output named as its shared bias followed by ``2``, the name the quantizer gave the bias's copy).  A
    numbered tail counts only after a float initializer (only those are copied); the model's inputs and outputs
    keep their names.  The new names end in ``QUANTIZER_SUFFIX``; the count of renamed tensors."""
    nodes = list(all_nodes(graph))
    values = {name for node in graph.node for name in (*node.input, *node.output) if name}
    values |= {init.name for init in graph.initializer}
    floats = {init.name for init in graph.initializer if init.data_type in (1, 10, 11, 16)}
    derived = {name for name in values - _interfaces(graph) if _derived_from(name, values, floats)}
    taken = tensor_names(graph)
    renamed = {name: fresh_name(f"{name}{QUANTIZER_SUFFIX}", taken) for name in sorted(derived)}
    _rename_tensors(graph, nodes, renamed)
    return len(renamed)


def _derived_from(name: str, values: set[str], floats: set[str]) -> bool:
    """Whether ``name`` is another tensor's name followed by a tail the quantizer derives names with."""
    for cut in range(1, len(name)):
        if name[cut] != "_" and not name[cut].isdigit():  # a number may extend one: "conv1d_25" + "2"
            continue
        base = name[:cut]
        if base not in values:  # the cheap test first: most cuts name no tensor
            continue
        tail = _DERIVED_TAIL.fullmatch(name[cut:])
        if tail and (tail["words"] or base in floats):
            return True
    return False


def _interfaces(graph: onnx.GraphProto) -> set[str]:
    """Inputs and outputs of ``graph`` and of every graph nested in it: names the renaming leaves alone."""
    found = {value.name for value in (*graph.input, *graph.output)}
    for node in all_nodes(graph):
        if node.op_type in GRAPH_OPS or node.domain not in ONNX_SPEC_DOMAINS:
            for sub in subgraphs(node):
                found |= {value.name for value in (*sub.input, *sub.output)}
    return found


def tensor_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name of ``graph`` and its nested graphs: node inputs and outputs, initializers, the interface."""
    names = {name for node in all_nodes(graph) for name in (*node.input, *node.output) if name}
    return names | {init.name for init in graph.initializer} | _interfaces(graph)


def _rename_tensors(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], renamed: dict[str, str]) -> None:
    """Tensor names old -> new in the nodes' inputs and outputs, value_info and the initializers."""
    if not renamed:
        return
    for node in nodes:
        for field_ in (node.input, node.output):
            for index, name in enumerate(field_):
                if name in renamed:
                    field_[index] = renamed[name]
    for info in _value_infos(graph):
        if info.name in renamed:
            info.name = renamed[info.name]
    for initializer in graph.initializer:  # a constant ONNX Runtime folded (out of an inlined body too)
        if initializer.name in renamed:
            initializer.name = renamed[initializer.name]


def _value_infos(graph: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    yield from graph.value_info
    for node in graph.node:
        if node.op_type in GRAPH_OPS or node.domain not in ONNX_SPEC_DOMAINS:
            for sub in subgraphs(node):
                yield from _value_infos(sub)
