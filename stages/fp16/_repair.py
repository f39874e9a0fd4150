"""Make a converted model's types agree with the precision plan, whatever the converter did.

onnxconverter-common converts constants and declared types; its Cast placement
depends on value_info, works per consumer and breaks on shared initializers,
subgraph references and attribute-typed outputs.  This pass derives every
tensor's precision from the plan (which nodes stay float32, which inputs stay
float32) and, for every node input, hands over the value in the precision that
input needs:

- the value is traced back through the converter's Casts to its source, so a
  float32 node reading a float32 producer reads it directly (a redundant
  Cast pair disappears) and every consumer shares one Cast per tensor;
- an initializer needed in both precisions gets one copy per precision;
- a Cast for a tensor is placed in the graph that owns the tensor, also when a
  subgraph (If/Loop/Scan) is the one that reads it;
- attributes that fix an output type (Cast `to`, `dtype`) follow the node.

Edits protobuf directly, in the converter's own output message, not through ``qdeploy.graph.edit``: it
visits every node of every graph and re-points its float inputs, with one name map across scopes, and puts
Casts and copies into the subgraph that owns a tensor.  Through an edit session every node it changed would be
written back, each subgraph it touches re-serialised whole with its node (costs in ``_graph``).  The order at the end is
``qdeploy.graph.order.sort_topologically`` (strict: a cycle here is a bug, not a model to report on).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qdeploy.graph.names import NodeNames, name_nodes_uniquely
from qdeploy.graph.order import sort_topologically
from qdeploy.graph.utils import prune_unused_value_info_recursive
from qdeploy.stages.fp16._graph import (
    FLOAT,
    FLOAT16,
    remove_dead_casts,
    remove_unused_initializers,
    rename_tensor,
    subgraphs,
    walk_graphs,
    walk_nodes,
)
from qdeploy.stages.fp16._rules import fix_output_type_attributes
from qdeploy.stages.fp16._types import all_types

if TYPE_CHECKING:
    import numpy as np
    import onnx

log = logging.getLogger(__name__)
FLOATS = (FLOAT, FLOAT16)
SUFFIX = {FLOAT: "fp32", FLOAT16: "fp16"}


@dataclass
class PrecisionPlan:
    """Which nodes run in float32 and which inputs of converted nodes stay float32."""

    float32_nodes: set[str]
    float32_inputs: dict[str, set[int]]
    keep_io_types: bool


@dataclass
class RepairReport:
    """What the repair changed; lands in the findings."""

    initializer_copies: dict[str, str] = field(default_factory=dict)
    """copy name -> source initializer name."""
    casts: int = 0
    attributes: list[str] = field(default_factory=list)
    constant_copies: dict[str, str] = field(default_factory=dict)
    """copy name -> source Constant output name."""
    outputs_retyped: list[str] = field(default_factory=list)
    casts_removed: int = 0


class TypeRepair:
    """One pass over a converted model; `original` is the typed float32 model it came from."""

    def __init__(self, original: onnx.ModelProto, plan: PrecisionPlan, to_float16: Callable[[np.ndarray], np.ndarray],
                 original_types: dict[str, int] | None = None) -> None:
        self.plan = plan
        self.to_float16 = to_float16
        self.original_types = original_types if original_types is not None else all_types(original)
        self.original_outputs = {node.name: list(node.output) for node, _ in walk_nodes(original.graph)}
        self.original_initializers = {init.name: init for graph in walk_graphs(original.graph)
                                      for init in graph.initializer}
        self.original_constants = {node.output[0]: node for node, _ in walk_nodes(original.graph)
                                   if node.op_type == "Constant" and node.output}
        self.original_shapes = {value.name: value.type.tensor_type.shape for graph in walk_graphs(original.graph)
                                for value in (*graph.input, *graph.value_info, *graph.output)
                                if value.type.tensor_type.HasField("shape")}
        self.renamed_from: dict[str, str] = {}
        """A tensor name the converter or this pass made -> the original name of the same value."""
        self.report = RepairReport()
        self.node_names = NodeNames()
        """Node names of the model being repaired: the Casts and Constants it adds repeat none."""
        self.types: dict[str, int] = {}
        self.owner: dict[str, onnx.GraphProto] = {}
        self.cast_source: dict[str, str] = {}
        self.casts: dict[tuple[str, int], str] = {}
        self.initializers: dict[str, onnx.GraphProto] = {}
        self.copies: set[tuple[str, int]] = set()
        """(source, precision) pairs this pass made; they win over a converter Cast of the same source."""

    def apply(self, model: onnx.ModelProto) -> RepairReport:
        self.node_names = NodeNames.of(model.graph)
        self._index(model.graph, scope_fp32=False)
        self._fix_graph(model.graph, scope_fp32=False, top=True)
        self.report.casts_removed = remove_dead_casts(model.graph)
        replaced = set(self.report.initializer_copies.values())
        for graph in walk_graphs(model.graph):
            remove_unused_initializers(graph, replaced - {value.name for value in graph.input})
        self._write_value_info(model.graph)
        sort_topologically(model.graph, strict=True)  # the repair appended its Casts last
        name_nodes_uniquely(model)
        return self.report

    # ---- what exists, and in which precision ----------------------------------------------

    def _node_fp32(self, node: onnx.NodeProto, scope_fp32: bool) -> bool:
        return scope_fp32 or node.name in self.plan.float32_nodes

    def _index(self, graph: onnx.GraphProto, scope_fp32: bool) -> None:
        for value in graph.input:
            self._define(value.name, value.type.tensor_type.elem_type, graph)
        for init in graph.initializer:
            self._define(init.name, init.data_type, graph)
            self.initializers[init.name] = graph
        for node in graph.node:
            if node.name in self.original_outputs:
                fp32 = self._node_fp32(node, scope_fp32)
                originals = self.original_outputs[node.name]
                for index, out in enumerate(node.output):
                    before = self.original_types.get(originals[index]) if index < len(originals) else None
                    precision = (FLOAT if fp32 else FLOAT16) if before == FLOAT else before
                    self._define(out, precision, graph)
                    if index < len(originals) and out != originals[index]:
                        self.renamed_from[out] = originals[index]
            elif node.op_type == "Cast":  # a Cast the converter inserted
                to = next(attr.i for attr in node.attribute if attr.name == "to")
                self._define(node.output[0], to, graph)
                self.cast_source[node.output[0]] = node.input[0]
            for sub in subgraphs(node):
                self._index(sub, self._node_fp32(node, scope_fp32))
        for node in graph.node:  # existing float Casts, preferring outputs that keep an original name
            if node.op_type == "Cast" and self.types.get(node.input[0]) in FLOATS:
                key = (node.input[0], self.types.get(node.output[0], 0))
                if key not in self.casts or node.output[0] in self.original_types:
                    self.casts[key] = node.output[0]

    def _define(self, name: str, elem_type: int | None, graph: onnx.GraphProto) -> None:
        if name:
            self.types[name] = elem_type or 0
            self.owner[name] = graph

    def _root(self, name: str) -> str:
        """The value behind a chain of converter-inserted float Casts."""
        seen = set()
        while name in self.cast_source and name not in seen:
            seen.add(name)
            name = self.cast_source[name]
        return name

    # ---- fixing ---------------------------------------------------------------------------

    def _fix_graph(self, graph: onnx.GraphProto, scope_fp32: bool, top: bool) -> None:
        self._fix_outputs(graph, scope_fp32, top)  # first: it settles which tensor carries each output name
        for node in list(graph.node):
            if node.name not in self.original_outputs:
                continue
            fp32 = self._node_fp32(node, scope_fp32)
            keep = self.plan.float32_inputs.get(node.name, set())
            for index, name in enumerate(node.input):
                root = self._root(name) if name else ""
                if root and self.types.get(root) in FLOATS:
                    node.input[index] = self._provide(root, FLOAT if fp32 or index in keep else FLOAT16)
            if not fp32 and self._first_output_was_float(node) and fix_output_type_attributes(node, self.to_float16):
                self.report.attributes.append(node.name)
            for sub in subgraphs(node):
                self._fix_graph(sub, fp32, top=False)

    def _first_output_was_float(self, node: onnx.NodeProto) -> bool:
        originals = self.original_outputs.get(node.name) or [""]
        return self.original_types.get(originals[0]) == FLOAT

    def _provide(self, root: str, want: int) -> str:
        """The name of `root`'s value in precision `want`: itself, a copy of an initializer, or one Cast."""
        if self.types.get(root) == want:
            return root
        key = (root, want)
        constant = (root in self.initializers and root in self.original_initializers) or \
            root in self.original_constants
        if key in self.casts and (not constant or key in self.copies):
            return self.casts[key]
        graph = self.owner[root]
        name = self._fresh(f"{root}__{SUFFIX[want]}")
        if root in self.initializers and root in self.original_initializers:
            self._copy_initializer(root, name, want, graph)  # exact values, not a Cast of rounded ones
        elif root in self.original_constants:
            self._copy_constant(root, name, want, graph)
        else:
            from onnx import helper

            graph.node.append(helper.make_node("Cast", [root], [name], name=self.node_names.fresh(f"{name}_cast"),
                                               to=want))
            self.report.casts += 1
        self._define(name, want, graph)
        self.renamed_from[name] = self.renamed_from.get(root, root)
        self.casts[key] = name
        self.copies.add(key)
        return name

    def _fresh(self, name: str) -> str:
        candidate, suffix = name, 1
        while candidate in self.types:
            candidate = f"{name}_{suffix}"
            suffix += 1
        return candidate

    def _copy_initializer(self, source: str, name: str, want: int, graph: onnx.GraphProto) -> None:
        from onnx import numpy_helper

        values = numpy_helper.to_array(self.original_initializers[source])
        values = self.to_float16(values) if want == FLOAT16 else values
        graph.initializer.append(numpy_helper.from_array(values, name))
        self.initializers[name] = graph
        self.report.initializer_copies[name] = source

    def _copy_constant(self, source: str, name: str, want: int, graph: onnx.GraphProto) -> None:
        """A Constant read in both precisions: a second Constant from the original float32 value."""
        import numpy as np
        from onnx import helper, numpy_helper

        node = self.original_constants[source]
        attr = next(a for a in node.attribute if a.name in ("value", "value_float", "value_floats"))
        if attr.name == "value":
            values = numpy_helper.to_array(attr.t)
        else:
            values = np.asarray(attr.f if attr.name == "value_float" else list(attr.floats), np.float32)
        values = self.to_float16(values) if want == FLOAT16 else values
        graph.node.append(helper.make_node("Constant", [], [name], name=self.node_names.fresh(f"{name}_constant"),
                                           value=numpy_helper.from_array(values, name)))
        self.report.constant_copies[name] = source

    def _fix_outputs(self, graph: onnx.GraphProto, scope_fp32: bool, top: bool) -> None:
        """Graph outputs keep their names and get the precision their graph declares for them."""
        fixed = {value.name for value in graph.input} | {init.name for init in graph.initializer}
        for value in graph.output:
            if self.original_types.get(value.name) != FLOAT or value.name in fixed:
                continue
            want = FLOAT if (top and self.plan.keep_io_types) or scope_fp32 else FLOAT16
            root = self._root(value.name)
            if root != value.name:
                self._reroute_output(graph, value.name, root, want)
            elif self.types.get(root) != want:
                self._cast_output(graph, value.name, want)
            if value.type.tensor_type.elem_type != want:
                value.type.tensor_type.elem_type = want
                self.report.outputs_retyped.append(value.name)
            self.types[value.name] = want

    def _reroute_output(self, graph: onnx.GraphProto, output: str, root: str, want: int) -> None:
        """The output is made by converter Casts from `root`: produce it from root directly, or by one Cast."""
        cast = next(node for node in graph.node if output in node.output)
        self.casts = {key: out for key, out in self.casts.items() if out != output}
        if self.types.get(root) == want and self.owner.get(root) is graph and root not in self.initializers \
                and root not in {value.name for value in graph.input}:
            graph.node.remove(cast)
            del self.cast_source[output]
            rename_tensor(graph, root, output)
            self._alias(root, output)
            return
        cast.input[0] = root
        for attr in cast.attribute:
            if attr.name == "to":
                attr.i = want
        self.cast_source[output] = root
        self.casts[(root, want)] = output

    def _cast_output(self, graph: onnx.GraphProto, output: str, want: int) -> None:
        """A node makes the output in the wrong precision: it now makes an inner tensor, a Cast makes the output."""
        from onnx import helper

        inner = self._fresh(f"{output}__{SUFFIX[self.types[output]]}")
        rename_tensor(graph, output, inner)
        self._alias(output, inner)
        graph.node.append(helper.make_node("Cast", [inner], [output], to=want,
                                           name=self.node_names.fresh(f"{output}_cast_{SUFFIX[want]}")))
        self.cast_source[output] = inner
        self.report.casts += 1

    def _alias(self, old: str, new: str) -> None:
        """Bookkeeping after a rename: `new` is what `old` was."""
        self.types[new] = self.types[old]
        self.owner[new] = self.owner[old]
        self.renamed_from[new] = self.renamed_from.get(old, old)
        self.cast_source = {(new if out == old else out): (new if src == old else src)
                            for out, src in self.cast_source.items()}
        self.casts = {(new if src == old else src, to): (new if out == old else out)
                      for (src, to), out in self.casts.items()}

    def _write_value_info(self, top: onnx.GraphProto) -> None:
        """value_info agrees with the precision of every float tensor; new Casts get entries."""
        from onnx import helper

        prune_unused_value_info_recursive(top)
        for graph in walk_graphs(top):
            declared = {value.name: value for value in graph.value_info}
            produced = [out for node in graph.node for out in node.output if out]
            outputs = {value.name for value in graph.output}
            for name in produced:
                want = self.types.get(name)
                if want not in FLOATS or name in outputs:
                    continue
                if name in declared:
                    declared[name].type.tensor_type.elem_type = want
                    continue
                value = helper.make_tensor_value_info(name, want, None)
                shape = self.original_shapes.get(self.renamed_from.get(name, name))
                if shape is not None:
                    value.type.tensor_type.shape.CopyFrom(shape)
                graph.value_info.append(value)
