"""ONNX Runtime's QDQ quantizer without its quadratic steps: same model out, in about linear time.

ORT's ``QDQQuantizer`` edits the graph through ``ONNXModel``, whose helpers scan
the whole graph on every call: ``input_name_to_nodes`` once per Relu/Clip (in
``adjust_tensor_ranges``, from the constructor), ``replace_input_of_all_nodes``
once per quantized tensor, ``find_by_name`` / ``get_initializer`` /
``add_initializer`` over every initializer once per weight, scale and zero
point, ``clean_initializers`` once per quantized Relu.  A 20,000-node chain did
not finish in 400 s.

``FastQDQQuantizer`` is ORT's quantizer with its ``model`` replaced by an
``IndexedONNXModel``: the same operations on the same protobuf, backed by
indices (tensor -> consumers, tensor -> producer, name -> initializer) that its
own edits keep up to date.  Removed initializers are dropped in one pass when
the initializer list is next read; ``clean_initializers`` runs for real only
when an edit since the last run can have left an initializer unused.  ORT's
``find_by_name`` is wrapped, in ORT's quantization modules, to use the index
when it is handed the indexed initializer list (any other list: ORT's own
function).  The result is compared node for node with ORT's own output in
``tests/stages/quantize/ptq/test_scaling_shapes.py``.

Edits protobuf directly: it is ORT's own quantizer, whose ``ONNXModel`` is protobuf-based.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import onnx
from onnxruntime.quantization import quant_utils
from onnxruntime.quantization.onnx_model import ONNXModel
from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
from onnxruntime.quantization.qdq_quantizer import QDQQuantizer

from qdeploy.graph.utils import delete_where, subgraph_references
from qdeploy.stages.quantize.ptq._preprocess import load_with_shapes, with_shapes

_ORIGINAL_FIND_BY_NAME = quant_utils.find_by_name


class _Initializers:
    """What ``IndexedONNXModel.initializer()`` returns: the live initializer list, looked up by name in O(1)."""

    def __init__(self, owner: IndexedONNXModel) -> None:
        self._owner = owner

    def lookup(self, name: str) -> onnx.TensorProto | None:
        return self._owner.get_initializer(name)

    def _container(self) -> Any:
        self._owner.compact()
        return self._owner.model.graph.initializer

    def __iter__(self) -> Iterator[onnx.TensorProto]:
        return iter(self._container())

    def __len__(self) -> int:
        return len(self._container())

    def __getitem__(self, index: int) -> onnx.TensorProto:
        return self._container()[index]


class _NodeList(list):  # type: ignore[type-arg]
    """ORT's dynamic quantizer's ``new_nodes``: a list whose nodes are also found by name in O(1) (ORT looks
    one up for every MatMul and Conv).  Appends extend the index; any other change drops it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._index: dict[str, onnx.NodeProto] | None = None

    def lookup(self, name: str) -> Any:
        if self._index is None:
            self._index = {}
            self._add(self)
        return self._index.get(name)

    def _add(self, nodes: Any) -> None:
        if self._index is not None:
            for node in nodes:
                self._index.setdefault(node.name, node)

    def append(self, node: Any) -> None:
        super().append(node)
        self._add([node])

    def extend(self, nodes: Any) -> None:
        nodes = list(nodes)
        super().extend(nodes)
        self._add(nodes)

    def __iadd__(self, nodes: Any) -> _NodeList:  # type: ignore[override]
        self.extend(nodes)
        return self

    def _changed(self) -> None:
        self._index = None


for _method in ("__setitem__", "__delitem__", "insert", "pop", "remove", "clear", "sort", "reverse"):
    def _dropping(self: _NodeList, *args: Any, _name: str = _method, **kwargs: Any) -> Any:
        self._changed()
        return getattr(list, _name)(self, *args, **kwargs)
    setattr(_NodeList, _method, _dropping)


def _find_by_name(item_name: str, item_list: Any) -> Any:
    """ORT's ``find_by_name``; O(1) on an indexed initializer or node list."""
    if isinstance(item_list, (_Initializers, _NodeList)):
        return item_list.lookup(item_name)
    return _ORIGINAL_FIND_BY_NAME(item_name, item_list)


def install_find_by_name() -> None:
    """Route ORT's quantization modules' ``find_by_name`` through ``_find_by_name`` (same results for every
    other caller).  Idempotent."""
    for name, module in list(sys.modules.items()):
        if name.startswith("onnxruntime.quantization") and getattr(module, "find_by_name", None) \
                is _ORIGINAL_FIND_BY_NAME:
            module.find_by_name = _find_by_name  # type: ignore[attr-defined]


class IndexedONNXModel(ONNXModel):
    """ORT's ``ONNXModel`` with indexed lookups; every graph edit ORT's QDQ quantizer makes goes through it."""

    def __init__(self, model: onnx.ModelProto) -> None:
        super().__init__(model)
        self._consumers: dict[str, list[onnx.NodeProto]] | None = None
        self._producers: dict[str, onnx.NodeProto] | None = None
        self._initializers: dict[str, onnx.TensorProto] | None = None
        self._dead: set[str] = set()
        self._io: tuple[set[str], set[str]] | None = None
        self._cleaned = False
        self._needs_cleaning = True
        self._checked_existing = False
        self._names: tuple[Any, dict[str, onnx.NodeProto]] | None = None
        self._new_names: tuple[int, int, dict[str, onnx.NodeProto]] | None = None

    # ---- indices, built on first use and after anything that rebuilds the node list --------------------

    def _node_indices(self) -> tuple[dict[str, list[onnx.NodeProto]], dict[str, onnx.NodeProto]]:
        if self._consumers is None or self._producers is None:
            consumers: dict[str, list[onnx.NodeProto]] = {}
            producers: dict[str, onnx.NodeProto] = {}
            for node in self.model.graph.node:
                self._register(node, consumers, producers)
            self._consumers, self._producers = consumers, producers
        return self._consumers, self._producers

    @staticmethod
    def _register(node: onnx.NodeProto, consumers: dict[str, list[onnx.NodeProto]],
                  producers: dict[str, onnx.NodeProto]) -> None:
        for name in node.input:
            if name:
                consumers.setdefault(name, []).append(node)
        for name in node.output:
            if name:
                producers[name] = node

    def _initializer_index(self) -> dict[str, onnx.TensorProto]:
        if self._initializers is None:
            index: dict[str, onnx.TensorProto] = {}
            for init in self.model.graph.initializer:
                if init.name not in self._dead:
                    index.setdefault(init.name, init)
            self._initializers = index
        return self._initializers

    def _graph_io(self) -> tuple[set[str], set[str]]:
        if self._io is None:
            self._io = ({value.name for value in self.model.graph.input},
                        {value.name for value in self.model.graph.output})
        return self._io

    def _forget_nodes(self) -> None:
        self._consumers = self._producers = None

    def compact(self) -> None:
        """Drop the initializers removed since the last call (and graph inputs of the same name), in one pass."""
        if not self._dead:
            return

        dead, self._dead = self._dead, set()
        delete_where(self.model.graph.initializer, lambda init: init.name in dead)
        delete_where(self.model.graph.input, lambda value: value.name in dead)
        self._initializers = None
        self._io = None

    # ---- initializers -----------------------------------------------------------------------------

    def initializer(self) -> _Initializers:  # type: ignore[override]
        return _Initializers(self)

    def get_initializer(self, name: str) -> onnx.TensorProto | None:
        return self._initializer_index().get(name)

    def get_initializer_name_set(self) -> set[str]:
        return set(self._initializer_index())

    def get_largest_initializer_name_suffix(self, initializer_name_prefix: str) -> int:
        self.compact()
        return super().get_largest_initializer_name_suffix(initializer_name_prefix)

    def add_initializer(self, tensor: onnx.TensorProto) -> None:
        if tensor.name in self._initializer_index():
            return
        self._check_init(tensor)
        self._append_initializer(tensor)

    def initializer_extend(self, inits: list[onnx.TensorProto]) -> None:
        if len(inits) == 0:
            raise ValueError("Can add an empty list.")
        if not self._checked_existing:  # ORT re-checks every initializer on each call; once is the same
            for init in self.initializer():
                self._check_init(init, "gain")
            self._checked_existing = True
        for init in inits:
            self._check_init(init)
            self._append_initializer(init)

    def _append_initializer(self, tensor: onnx.TensorProto) -> None:
        graph = self.model.graph
        graph.initializer.append(tensor)
        self._initializer_index().setdefault(tensor.name, graph.initializer[-1])
        self._needs_cleaning = True

    def remove_initializer(self, tensor: onnx.TensorProto) -> None:
        index = self._initializer_index()
        present = index.get(tensor.name)
        if present is None or present != tensor:
            self.compact()
            super().remove_initializer(tensor)
            self._initializers = None
            self._io = None
        else:
            del index[tensor.name]
            self._dead.add(tensor.name)
            self._graph_io()[0].discard(tensor.name)  # ORT drops the graph input of that name with it
        self._needs_cleaning = True

    def remove_initializers(self, init_to_remove: list[onnx.TensorProto]) -> None:
        for init in init_to_remove:
            self.remove_initializer(init)

    def clean_initializers(self) -> Any:
        """ORT's cleaning, run again only when an edit since can have left an initializer unread (ORT calls it
        for every quantized Relu; it rebuilds the node list each time)."""
        if self._cleaned and not self._needs_cleaning:
            return self.graph(), set()
        self.compact()
        result = super().clean_initializers()
        self._cleaned, self._needs_cleaning = True, False
        self._forget_nodes()
        self._initializers = None
        self._io = None
        return result

    # ---- nodes ------------------------------------------------------------------------------------

    def input_name_to_nodes(self) -> dict[str, list[onnx.NodeProto]]:
        return self._node_indices()[0]

    def output_name_to_node(self) -> dict[str, onnx.NodeProto]:
        return self._node_indices()[1]

    def add_node(self, node: onnx.NodeProto) -> None:
        graph = self.model.graph
        graph.node.extend([self._check_node(node)])
        if self._consumers is not None and self._producers is not None:
            self._register(graph.node[-1], self._consumers, self._producers)
        if any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attr in node.attribute):
            self._needs_cleaning = True

    def add_nodes(self, nodes_to_add: list[onnx.NodeProto]) -> None:
        for node in nodes_to_add:
            self.add_node(node)

    def remove_node(self, node: onnx.NodeProto) -> None:
        self.remove_nodes([node])

    def remove_nodes(self, nodes_to_remove: list[onnx.NodeProto]) -> None:
        """Each listed node's first equal node removed (as ORT's ``remove`` does), in one pass."""
        if not nodes_to_remove:
            return
        wanted = Counter(node.SerializeToString(deterministic=True) for node in nodes_to_remove)
        kept = []
        for node in self.model.graph.node:
            key = node.SerializeToString(deterministic=True) if wanted else b""
            if wanted.get(key):
                wanted[key] -= 1
            else:
                kept.append(node)
        graph = self.model.graph
        if len(kept) != len(graph.node):
            graph.ClearField("node")
            graph.node.extend(kept)
            self._forget_nodes()
            self._needs_cleaning = True

    def replace_node_input(self, node: onnx.NodeProto, old_input_name: str,  # type: ignore[override]
                           new_input_name: str) -> None:
        self._replace_inputs([node], old_input_name, new_input_name)

    def replace_input_of_all_nodes(self, old_input_name: str, new_input_name: str) -> None:
        assert isinstance(old_input_name, str) and isinstance(new_input_name, str)
        if old_input_name == new_input_name:
            return
        consumers = self._node_indices()[0]
        readers = self._consumers_of(old_input_name)
        consumers.pop(old_input_name, None)
        for node in readers:
            for index, name in enumerate(node.input):
                if name == old_input_name:
                    node.input[index] = new_input_name
                    if new_input_name:
                        consumers.setdefault(new_input_name, []).append(node)
        if readers:
            self._needs_cleaning = True

    def replace_input_of_nodes(self, old_input_name: str, new_input_name: str, node_names_set: set[str]) -> None:
        chosen = [node for node in self._consumers_of(old_input_name) if node.name in node_names_set]
        self._replace_inputs(chosen, old_input_name, new_input_name)

    def _consumers_of(self, name: str) -> list[onnx.NodeProto]:
        """Each node reading ``name`` once, in the order they were indexed (protobuf messages are unhashable)."""
        seen: set[int] = set()
        return [node for node in self._node_indices()[0].get(name, []) if id(node) not in seen
                and not seen.add(id(node))]  # type: ignore[func-returns-value]

    def _replace_inputs(self, nodes: list[onnx.NodeProto], old: str, new: str) -> None:
        assert isinstance(old, str) and isinstance(new, str)
        if old == new:
            return
        consumers = self._node_indices()[0]
        for node in nodes:
            for index, name in enumerate(node.input):
                if name != old:
                    continue
                node.input[index] = new
                readers = consumers.get(old, [])
                position = next((i for i, reader in enumerate(readers) if reader is node), None)
                if position is not None:
                    del readers[position]
                    if not readers:
                        del consumers[old]
                if new:
                    consumers.setdefault(new, []).append(node)
        if nodes:
            self._needs_cleaning = True

    def replace_output_of_all_nodes(self, old_output_name: str, new_output_name: str) -> None:
        producers = self._node_indices()[1]
        node = producers.get(old_output_name)
        if node is not None:
            self.replace_output_of_nodes(old_output_name, new_output_name, {node.name})

    def replace_output_of_nodes(self, old_output_name: str, new_output_name: str,
                                node_names_set: set[str]) -> None:
        producers = self._node_indices()[1]
        node = producers.get(old_output_name)
        if node is None or node.name not in node_names_set:
            return
        for index, name in enumerate(node.output):
            if name == old_output_name:
                node.output[index] = new_output_name
        del producers[old_output_name]
        producers[new_output_name] = node

    def find_node_by_name(self, node_name: str, new_nodes_list: list[onnx.NodeProto],
                          graph: onnx.GraphProto) -> onnx.NodeProto | None:
        """The first node of that name in the graph, else in the list (ORT's dynamic quantizer asks once per
        node, and ORT's own version copies the whole graph each time)."""
        if graph is not self.model.graph:
            return super().find_node_by_name(node_name, new_nodes_list, graph)
        found = self._graph_names().get(node_name)
        return found if found is not None else self._list_names(new_nodes_list).get(node_name)

    def _graph_names(self) -> dict[str, onnx.NodeProto]:
        """Name -> first node of the graph; rebuilt when the node list was rebuilt (its first node changed)."""
        nodes = self.model.graph.node
        first = nodes[0] if len(nodes) else None
        if self._names is None or self._names[0] is not first:
            index: dict[str, onnx.NodeProto] = {}
            for node in nodes:
                index.setdefault(node.name, node)
            self._names = (first, index)
        return self._names[1]

    def _list_names(self, nodes: list[onnx.NodeProto]) -> dict[str, onnx.NodeProto]:
        """Name -> first node of an append-only list (ORT's ``new_nodes``), indexed as it grows."""
        if self._new_names is None or self._new_names[0] != id(nodes) or self._new_names[1] > len(nodes):
            self._new_names = (id(nodes), 0, {})
        _, seen, index = self._new_names
        for node in nodes[seen:]:
            index.setdefault(node.name, node)
        self._new_names = (id(nodes), len(nodes), index)
        return index

    def is_graph_output(self, output_name: str) -> bool:
        return output_name in self._graph_io()[1]

    def is_graph_input(self, tensor_name: str) -> bool:
        return tensor_name in self._graph_io()[0]

    def topological_sort(self) -> None:
        self.compact()
        super().topological_sort()
        self._forget_nodes()


class _OnIndexedModel:
    """What both fast quantizers share: ORT's constructor, with ``self.model`` kept as an ``IndexedONNXModel``
    (ORT's constructors assign ``self.model = ONNXModel(...)``; the setter wraps it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        install_find_by_name()
        super().__init__(*args, **kwargs)

    @property
    def model(self) -> IndexedONNXModel:
        return self._indexed_model

    @model.setter
    def model(self, value: ONNXModel) -> None:
        self._indexed_model = value if isinstance(value, IndexedONNXModel) else IndexedONNXModel(value.model)


class FastQDQQuantizer(_OnIndexedModel, QDQQuantizer):
    """ORT's ``QDQQuantizer`` (same constructor) working on an ``IndexedONNXModel``."""

    def quantize_model(self) -> onnx.ModelProto:
        self._read_by_subgraphs = subgraph_references(self.model.model.graph)
        result = super().quantize_model()
        self.model.compact()
        return result

    def try_replacing_upstream_output(self, upstream_output_name: str, output_name: str) -> bool:
        """ORT removes a Relu or Clip after a quantized node and gives the node the activation's output name
        (the uint8 range clips in its place), counting only the main graph's readers.  An If or Loop body that
        reads the activation's output from the outer scope would then read the value before the Relu, with
        nothing clipping it (silero-vad's LSTM branch: cosine 0.56 with every node float): keep the activation
        when a subgraph reads either name."""
        if {upstream_output_name, output_name} & self._read_by_subgraphs:
            return False
        return bool(super().try_replacing_upstream_output(upstream_output_name, output_name))


class FastONNXQuantizer(_OnIndexedModel, ONNXQuantizer):
    """ORT's ``ONNXQuantizer`` (what ``quantize_dynamic`` uses) working on an ``IndexedONNXModel``."""

    @property
    def new_nodes(self) -> _NodeList:
        return self._new_nodes

    @new_nodes.setter
    def new_nodes(self, value: list[onnx.NodeProto]) -> None:
        self._new_nodes = value if isinstance(value, _NodeList) else _NodeList(value)


_DYNAMIC_LOCK = threading.Lock()


@contextlib.contextmanager
def fast_quantize_dynamic() -> Iterator[None]:
    """ORT's ``quantize_dynamic`` builds its quantizer and loads its model by name: within this block it builds
    the indexed quantizer and infers shapes on light copies."""
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")  # the package hides it by a function
    ort_quantizer = importlib.import_module("onnxruntime.quantization.onnx_quantizer")
    # its shape inference reloads the whole model twice; ours infers on a light copy (``_preprocess``)
    swaps = [(ort_quantize, "ONNXQuantizer", FastONNXQuantizer), (ort_quantize, "load_model_with_shape_infer",
             load_with_shapes), (ort_quantizer, "save_and_reload_model_with_shape_infer", with_shapes)]
    with _DYNAMIC_LOCK:
        originals = [getattr(module, name) for module, name, _ in swaps]
        for module, name, replacement in swaps:
            setattr(module, name, replacement)
        try:
            yield
        finally:
            for (module, name, _), original in zip(swaps, originals, strict=True):
                setattr(module, name, original)
