"""A tensor's peaks computed inside the graph: the activation analysis reads four small outputs per tensor.

Exposing every float tensor as a graph output makes ONNX Runtime hand each run's every intermediate back at once
(1.2 GB per sample on a 135M-parameter decoder).  Instead each tensor ``x`` gets four outputs, computed where
``x`` is made, so the run holds one activation at a time:

- ``<x>__peak_abs``: the largest magnitude of its finite values (0 when none);
- ``<x>__peak_max``: the largest finite value (float32's lowest when none);
- ``<x>__peak_bad``: 1 when any value is Inf or NaN, else 0;
- ``<x>__peak_shape``: its shape.

IsInf needs opset 10: below it (and for a graph that already uses these names) the caller exposes the tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.utils import place_after_producers

if TYPE_CHECKING:
    import onnx

__all__ = ["PROBE_MIN_OPSET", "PeakNames", "add_peak_probes", "names_taken", "peaks_of"]

PROBE_MIN_OPSET = 10
SUFFIXES = ("__peak_abs", "__peak_max", "__peak_bad", "__peak_shape")
LOWEST = float(np.finfo(np.float32).min)

PeakNames = tuple[str, str, str, str]
"""The four probe outputs of one tensor, in ``SUFFIXES`` order."""


def names_taken(graph: onnx.GraphProto) -> bool:
    """Whether the graph already names a tensor as the probes would (``__peak_``/``__probe_`` in it): the
    probes' names would clash, so the caller exposes the tensors instead."""
    names = {name for node in graph.node for name in (*node.input, *node.output)}
    names |= {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    return any("__peak_" in name or "__probe_" in name for name in names)


def add_peak_probes(graph: onnx.GraphProto, names: list[str]) -> dict[str, PeakNames]:
    """Add the probes of each named float tensor to ``graph`` (nodes, two constants, outputs); tensor -> its
    probe outputs.

    Each tensor's probe nodes are placed right after the node that makes it: a session that runs the nodes in
    the model's order (``probe_session(in_order=True)``) then reduces a tensor while it is fresh and frees the
    probe's seven full-size intermediates before the next layer, where a default-ordered one may run every probe
    at the end, each watched activation alive until then (0.4 GB more per sample on a 135M-parameter decoder)."""
    from onnx import TensorProto, helper, numpy_helper

    if not names:  # no probe would read the constants: ONNX Runtime warns of unused initializers
        return {}
    zero, lowest = "__peak_zero", "__peak_lowest"
    graph.initializer.extend([numpy_helper.from_array(np.zeros((), np.float32), zero),
                              numpy_helper.from_array(np.array(LOWEST, np.float32), lowest)])
    probes: dict[str, PeakNames] = {}
    nodes_of: dict[str, list[onnx.NodeProto]] = {}
    for name in names:
        nodes_of[name] = _probe_nodes(name, zero, lowest)
        probes[name] = tuple(f"{name}{suffix}" for suffix in SUFFIXES)  # type: ignore[assignment]
        graph.output.extend([*(helper.make_tensor_value_info(out, TensorProto.FLOAT, []) for out in probes[name][:3]),
                             helper.make_tensor_value_info(probes[name][3], TensorProto.INT64, [None])])
    place_after_producers(graph, nodes_of)
    return probes


def _probe_nodes(name: str, zero: str, lowest: str) -> list[onnx.NodeProto]:
    from onnx import TensorProto, helper

    abs_name, max_name, bad_name, shape_name = (f"{name}{suffix}" for suffix in SUFFIXES)
    step = f"{name}__probe"  # intermediates; the outputs end in __peak_*
    return [
        helper.make_node("IsInf", [name], [f"{step}_inf"]),
        helper.make_node("IsNaN", [name], [f"{step}_nan"]),
        helper.make_node("Or", [f"{step}_inf", f"{step}_nan"], [f"{step}_bad"]),
        helper.make_node("Where", [f"{step}_bad", zero, name], [f"{step}_finite"]),
        helper.make_node("Abs", [f"{step}_finite"], [f"{step}_abs"]),
        helper.make_node("ReduceMax", [f"{step}_abs"], [abs_name], keepdims=0),
        helper.make_node("Where", [f"{step}_bad", lowest, name], [f"{step}_low"]),
        helper.make_node("ReduceMax", [f"{step}_low"], [max_name], keepdims=0),
        helper.make_node("Cast", [f"{step}_bad"], [f"{step}_bad_float"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMax", [f"{step}_bad_float"], [bad_name], keepdims=0),
        helper.make_node("Shape", [name], [shape_name]),
    ]


def peaks_of(arrays: dict[str, np.ndarray], probe: PeakNames) -> tuple[float, float, bool, tuple[int, ...]] | None:
    """(abs_max, max, nonfinite, shape) of one tensor on one run; None for an empty tensor (nothing to record)."""
    shape = tuple(int(dim) for dim in arrays[probe[3]])
    if not all(shape):
        return None
    abs_max, top, bad = (float(arrays[out]) for out in probe[:3])
    finite_top = 0.0 if top == LOWEST and bad else top  # no finite value at all: what numpy's analysis records
    return abs_max, finite_top, bool(bad), shape
