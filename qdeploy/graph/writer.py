"""Nodes and constants that replace one node, under names nothing else in the graph has.

The rewrites that write a node out in other ops (``lstm_peepholes``, ``ml_ops``) share this: each new tensor is
named after the node it replaces, made unique against every name the graph already holds, and each constant
becomes an initializer of the graph.  Edits protobuf directly, as those rewrites do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.utils import fresh_name

if TYPE_CHECKING:
    import onnx

__all__ = ["GraphWriter"]


class GraphWriter:
    """Fresh names after ``node`` (``<node><separator><suffix>``) and constants added to ``graph``; the nodes to
    put in the replaced node's place collect in ``nodes``."""

    def __init__(self, graph: onnx.GraphProto, node: onnx.NodeProto, taken: set[str], separator: str = "/") -> None:
        self.graph, self.node, self.taken, self.separator = graph, node, taken, separator
        self.base = node.name or node.output[0]
        self.nodes: list[onnx.NodeProto] = []

    def fresh(self, suffix: str) -> str:
        return fresh_name(f"{self.base}{self.separator}{suffix}", self.taken)  # which records it as taken

    def constant(self, suffix: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        name = self.fresh(suffix)
        self.graph.initializer.append(numpy_helper.from_array(np.array(value, order="C"), name))  # 0-d stays 0-d
        return name
