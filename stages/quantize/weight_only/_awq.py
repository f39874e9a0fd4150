"""Activation-aware scaling of int4 MatMul weights (``awq: true``), as AWQ (Lin et al. 2023) and NNCF's ``awq``
search it, on the calibration statistics the other data-aware methods read.

A few input channels of a language model's MatMuls carry far larger values than the rest, and the weight rows they
multiply matter most to the output.  Scaling row ``k`` of ``W`` [K, N] up by ``s_k`` before rounding gives those
rows finer levels within their blocks; the input is divided by the same ``s`` so that the product is unchanged:
``y = (x / s) @ Q(diag(s) W)``.  The scales are searched per input tensor (the MatMuls that share it, such as
q/k/v, get one ``s``, since they read one scaled input): ``s = rms(x)^alpha``, normalised around 1, for ``alpha``
on a grid in [0, 1], keeping the one whose round-to-nearest output error ``trace(D^T H D)`` (``H = X^T X / rows``,
D the dequantized weight's error) summed over the group is lowest; ``alpha = 0`` (no scaling) is on the grid, so
the result is never worse than without, on the calibration data.

In the graph the division is one ``Mul`` by ``1 / s`` in front of the group (a float elementwise op on the
activation; the artifact stays weight-only).  GPTQ and scale estimation then run on the scaled weights with the
scaled input's Hessian ``H / (s s^T)``.  Left out: tied LM heads (their table is also the embedding), weights
read by more than one MatMul, and int8 weights (8 bits leave little to gain).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx

from qdeploy.stages.quantize.findings import AwqSearch
from qdeploy.stages.quantize.weight_only._data import Target
from qdeploy.stages.quantize.weight_only._gptq import rtn_dequantized

__all__ = ["ALPHAS", "awq_scales", "input_scalings"]

ALPHAS = tuple(round(0.1 * step, 1) for step in range(11))
"""The grid of ``alpha`` searched (0 first: no scaling)."""


def _scales(rms: np.ndarray, alpha: float) -> np.ndarray:
    scale = np.where(rms > 0, rms, 1.0) ** alpha
    return scale / np.sqrt(scale.max() * scale.min())  # centred on 1: the levels of the other rows barely move


def _error(weights: list[np.ndarray], scale: np.ndarray, hessian: np.ndarray, group: int, symmetric: bool) -> float:
    """Round to nearest's output error of the group with rows scaled by ``scale`` (float32 products: a ranking)."""
    total = 0.0
    for weight in weights:
        approx = rtn_dequantized(weight * scale[:, None], 4, group, symmetric) / scale[:, None]
        delta = weight - approx
        total += float(np.einsum("kn,kn->", delta, hessian @ delta, dtype=np.float64))
    return total


def awq_scales(targets: list[Target], array_of: Callable[[str], np.ndarray], hessians: dict[str, np.ndarray],
               group_of: Callable[[tuple[int, ...]], int], symmetric: bool
               ) -> tuple[list[Target], dict[str, np.ndarray], dict[str, AwqSearch]]:
    """The targets (scaled groups' Hessians replaced by the scaled input's), weight -> its row scales ``s``, and
    input -> what the search found; only groups whose best alpha is above 0 are scaled."""
    readers: dict[str, int] = {}
    for found in targets:
        readers[found.weight] = readers.get(found.weight, 0) + 1
    groups: dict[str, list[Target]] = {}
    for found in targets:
        if (found.kind == "matmul" and found.bits == 4 and found.transposed_from is None
                and readers[found.weight] == 1 and found.node.input[0] in hessians):
            groups.setdefault(found.node.input[0], []).append(found)
    weight_scales: dict[str, np.ndarray] = {}
    found_groups: dict[str, AwqSearch] = {}
    replaced: dict[int, Target] = {}
    for name, members in groups.items():
        hessian = hessians[name].astype(np.float32)
        rms = np.sqrt(np.maximum(np.diag(hessian), 0.0))
        arrays = [np.asarray(array_of(found.weight), np.float32) for found in members]
        block = group_of(arrays[0].shape)
        errors = {alpha: _error(arrays, _scales(rms, alpha), hessian, block, symmetric) for alpha in ALPHAS}
        alpha = min(errors, key=lambda key: (errors[key], key))
        found_groups[name] = AwqSearch(matmuls=[found.node.name for found in members], alpha=alpha,
                                      error_ratio=round(errors[alpha] / errors[0.0], 4) if errors[0.0] else 1.0)
        if alpha == 0.0:
            continue
        scale = _scales(rms, alpha).astype(np.float64)
        scaled_hessian = hessians[name] / np.outer(scale, scale)
        for found in members:
            weight_scales[found.weight] = scale
            replaced[id(found)] = dataclasses.replace(found, hessian=scaled_hessian)  # type: ignore[type-var]
    return [replaced.get(id(found), found) for found in targets], weight_scales, found_groups


def input_scalings(graph: onnx.GraphProto, targets: list[Target], weight_scales: dict[str, np.ndarray]
                   ) -> dict[int, tuple[onnx.NodeProto, onnx.TensorProto]]:
    """For each scaled input, the ``Mul`` by ``1 / s`` and its constant, keyed by the id of the first node (in
    the graph's order) that reads it; every scaled MatMul is rewired to read the Mul's output."""
    from onnx import helper, numpy_helper

    if not weight_scales:
        return {}
    nodes = list(graph.node)
    taken = {init.name for init in graph.initializer} | {value.name for value in [*graph.input, *graph.output]}
    taken |= {name for node in nodes for name in [node.name, *node.input, *node.output]}
    members: dict[str, list[Target]] = {}
    for found in targets:
        if found.weight in weight_scales:
            members.setdefault(found.node.input[0], []).append(found)
    order = {id(node): index for index, node in enumerate(nodes)}
    inserted: dict[int, tuple[onnx.NodeProto, onnx.TensorProto]] = {}
    for name, group in members.items():
        scaled, inverse = _fresh(f"{name}_awq", taken), _fresh(f"{name}_awq_inverse_scale", taken)
        constant = numpy_helper.from_array((1.0 / weight_scales[group[0].weight]).astype(np.float32), inverse)
        first = min(group, key=lambda found: order[id(found.node)]).node
        inserted[id(first)] = (helper.make_node("Mul", [name, inverse], [scaled], name=scaled), constant)
        for found in group:
            found.node.input[0] = scaled
    return inserted


def _fresh(base: str, taken: set[str]) -> str:
    name, count = base, 0
    while name in taken:
        count += 1
        name = f"{base}_{count}"
    taken.add(name)
    return name
