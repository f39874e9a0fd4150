"""onnxoptimizer's passes, run on a light copy of the model.

onnxoptimizer serialises the model, converts it to its C++ IR, runs the passes
and converts everything back: with megabytes of weights most of that time is
spent copying them.  The passes listed in ``LIGHT_SAFE_PASSES`` never read the
values of float tensors (they read shapes, types and small integer inputs such
as pads or axes), so large float initializers travel as short tags, one per
distinct content (so that eliminate_duplicate_initializer still merges equal
weights), and get their bytes back afterwards, also where a pass copied them
under a new name (fuse_bn_into_conv does).  Any other pass gets the full model.

Edits protobuf directly: onnxoptimizer's interface is protobuf.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qdeploy.graph.light import Light, light_copy, restore_into, unknown_tags
from qdeploy.graph.utils import delete_where, names_read, subgraphs
from qdeploy.stages.simplify._optimizer_pieces import optimize_in_pieces

if TYPE_CHECKING:
    import onnx


log = logging.getLogger(__name__)

LIGHT_SAFE_PASSES = frozenset({
    "eliminate_identity", "eliminate_nop_transpose", "eliminate_nop_pad", "eliminate_nop_dropout",
    "eliminate_nop_cast", "eliminate_nop_reshape", "eliminate_shape_gather", "eliminate_slice_after_shape",
    "eliminate_shape_op", "fuse_consecutive_transposes", "fuse_bn_into_conv", "fuse_pad_into_conv",
    "fuse_add_bias_into_conv", "fuse_matmul_add_bias_into_gemm", "extract_constant_to_initializer",
    "eliminate_common_subexpression", "eliminate_deadend", "eliminate_unused_initializer",
    "eliminate_duplicate_initializer", "eliminate_if_with_const_cond", "fuse_consecutive_squeezes",
    "fuse_consecutive_unsqueezes", "fuse_transpose_into_gemm", "eliminate_nop_flatten",
})
"""Passes that read no float tensor's values (checked in onnxoptimizer 0.4's sources)."""
@dataclass
class Optimized:
    """onnxoptimizer's result, before the caller accepts it: a light model (tags for weights) or a full one."""

    model: onnx.ModelProto
    light: Light | None = None
    """Set when ``model`` is light: ``into`` then moves its graph into the full model instead of the weights
    into it (one model's weights in memory, not two)."""
    dedupe: bool = False

    def into(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """The accepted result as a full model: ``model`` itself, rewritten, when the run was light."""
        if self.light is None:
            return self.model
        restore_into(model, self.model, self.light)
        if self.dedupe:
            dedupe_initializers(model)  # the copies a pass made (fuse_bn_into_conv's constants)
        return model


def optimize(model: onnx.ModelProto, passes: list[str]) -> Optimized:
    """onnxoptimizer's ``passes`` to a fixed point, on a light copy when they read no float values.

    ``model`` is left as it was (``Optimized.into`` applies the result), except that duplicate initializers
    are merged first when the passes include eliminate_duplicate_initializer (which compares tensor values that
    tags lack).  Raises what onnxoptimizer raises.
    """
    import onnxoptimizer

    if not set(passes) <= LIGHT_SAFE_PASSES:
        return Optimized(onnxoptimizer.optimize(model, passes, fixed_point=True))
    dedupe = "eliminate_duplicate_initializer" in passes
    if dedupe:
        dedupe_initializers(model)
    light = light_copy(model)
    light_passes = [name for name in passes if name != "eliminate_duplicate_initializer"]
    if len(light.model.graph.node) > PIECES_ABOVE:
        optimized = _in_pieces(light.model, light_passes)
    else:
        optimized = onnxoptimizer.optimize(light.model, light_passes, fixed_point=True)
    leftover = unknown_tags(optimized, light)
    if leftover:  # a pass moved a tagged tensor somewhere unexpected: run again on the full model
        log.debug("tagged tensors %s were not restored; optimizing the full model", leftover[:5])
        return Optimized(onnxoptimizer.optimize(model, passes, fixed_point=True))
    return Optimized(optimized, light, dedupe)


PIECES_ABOVE = 1000
"""Graphs with more nodes go through onnxoptimizer in pieces (``qdeploy.stages.simplify._optimizer_pieces``)."""


def _in_pieces(model: onnx.ModelProto, passes: list[str]) -> onnx.ModelProto:
    optimized = optimize_in_pieces(model, passes)
    graph = optimized.graph
    if "eliminate_unused_initializer" in passes:
        read = names_read(list(graph.node), graph) | {value.name for value in graph.input}
        delete_where(graph.initializer, lambda init: init.name not in read)
    return optimized


def _duplicates(graph: onnx.GraphProto) -> dict[str, str]:
    """Initializer name -> name of the first initializer with the same type, shape and bytes."""

    protected = {value.name for value in (*graph.input, *graph.output)}
    candidates = [init for init in graph.initializer if init.name not in protected and init.data_location == 0
                  and init.data_type != 8]  # strings are left alone
    shapes = Counter((init.data_type, tuple(init.dims)) for init in candidates)
    first: dict[tuple[int, tuple[int, ...], bytes], onnx.TensorProto] = {}
    renames = {}
    for init in candidates:
        if shapes[(init.data_type, tuple(init.dims))] < 2:
            continue  # a tensor of a unique type and shape has no duplicate: its bytes need not be read
        # keyed by a digest, not the bytes: holding every payload would be a second copy of the weights
        key = (init.data_type, tuple(init.dims), hashlib.sha256(_payload(init)).digest())
        if key in first and _payload(first[key]) == _payload(init):
            renames[init.name] = first[key].name
        elif key not in first:
            first[key] = init
    return renames


_TYPED_FIELDS = {1: ("float_data", "float32"), 7: ("int64_data", "int64"), 11: ("double_data", "float64")}


def _payload(init: onnx.TensorProto) -> bytes:
    """A tensor's values as bytes, cheaply: raw data as it is, typed fields through numpy without onnx's helper."""
    import numpy as np
    from onnx import numpy_helper

    if init.HasField("raw_data"):
        return init.raw_data
    if init.data_type in _TYPED_FIELDS:
        field_name, dtype = _TYPED_FIELDS[init.data_type]
        return np.asarray(getattr(init, field_name), dtype=dtype).tobytes()
    return numpy_helper.to_array(init).tobytes()


def dedupe_initializers(model: onnx.ModelProto) -> int:
    """Merge initializers of equal type, shape and bytes (what eliminate_duplicate_initializer does); how many."""
    graph = model.graph
    renames = _duplicates(graph)
    if not renames:
        return 0

    def rename(nodes: list[onnx.NodeProto]) -> None:
        for node in nodes:
            for index, name in enumerate(node.input):
                if name in renames:
                    node.input[index] = renames[name]
            for subgraph in subgraphs(node):
                rename(list(subgraph.node))

    rename(list(graph.node))
    delete_where(graph.initializer, lambda init: init.name in renames)
    return len(renames)


def op_delta(before: Counter[str], after: Counter[str]) -> dict[str, dict[str, int]]:
    """Nodes removed and added per op type between two op counts."""
    removed = {op: count for op, count in (before - after).items() if count}
    added = {op: count for op, count in (after - before).items() if count}
    return {"removed": dict(sorted(removed.items())), "added": dict(sorted(added.items()))}


PASS_SIGNATURES: dict[str, tuple[str, ...]] = {
    "eliminate_identity": ("Identity",), "eliminate_nop_transpose": ("Transpose",), "eliminate_nop_pad": ("Pad",),
    "eliminate_nop_dropout": ("Dropout",), "eliminate_nop_cast": ("Cast",), "eliminate_nop_reshape": ("Reshape",),
    "eliminate_shape_gather": ("Gather",), "eliminate_slice_after_shape": ("Slice",), "eliminate_shape_op": ("Shape",),
    "fuse_consecutive_transposes": ("Transpose",), "fuse_bn_into_conv": ("BatchNormalization",),
    "fuse_pad_into_conv": ("Pad",), "fuse_add_bias_into_conv": ("Add",), "fuse_matmul_add_bias_into_gemm": ("Gemm",),
    "extract_constant_to_initializer": ("Constant",), "eliminate_if_with_const_cond": ("If",),
    "fuse_consecutive_squeezes": ("Squeeze",), "fuse_consecutive_unsqueezes": ("Unsqueeze",),
    "fuse_transpose_into_gemm": ("Transpose",), "eliminate_nop_flatten": ("Flatten",),
}
"""The op type whose count a pass changes when it does something; used to name the passes that likely acted."""


def likely_passes(passes: list[str], delta: dict[str, dict[str, int]]) -> list[str]:
    """Passes whose signature op type changed count (onnxoptimizer reports nothing per pass)."""
    touched = set(delta["removed"]) | set(delta["added"])
    return [name for name in passes if set(PASS_SIGNATURES.get(name, ())) & touched]
