"""What an edit session (``qdeploy.graph.edit.editing``) costs when a pass touches every node of a graph.

    python benchmarks/edit_session.py [--nodes 50000]

A chain of Add (small weight) and Relu nodes is edited twice: once by walking the protobuf node list and
renaming every tensor a node writes and reads (what the fp16 repair and emulation twins do to nearly every node),
once through an edit session renaming every node output (onnx-ir renames the uses with it).  The session pays
for reading the whole graph into onnx-ir and, every node being changed, for writing every node back; the
protobuf walk pays for nothing else.  Seconds are printed; the model holds no large weight, so no copy of
weights is measured (the session copies none anyway).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qdeploy.graph.edit import editing


def chain(nodes: int) -> onnx.ModelProto:
    made, weights, previous = [], [], "x"
    for index in range(nodes):
        inputs = [previous]
        if index % 2 == 0:
            weights.append(numpy_helper.from_array(np.full([8], index, np.float32), f"w{index}"))
            inputs.append(f"w{index}")
        made.append(helper.make_node("Add" if index % 2 == 0 else "Relu", inputs, [f"t{index}"], name=f"n{index}"))
        previous = f"t{index}"
    graph = helper.make_graph(made, "chain", [helper.make_tensor_value_info("x", 1, [8])],
                              [helper.make_tensor_value_info(previous, 1, [8])], weights)
    return helper.make_model(graph)


def protobuf_walk(model: onnx.ModelProto) -> float:
    output = model.graph.output[0].name
    start = time.perf_counter()
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            if name.startswith("t"):
                node.input[index] = f"{name}_r"
        for index, name in enumerate(node.output):
            if name != output:
                node.output[index] = f"{name}_r"
    return time.perf_counter() - start


def edit_session(model: onnx.ModelProto) -> tuple[float, float]:
    start = time.perf_counter()
    with editing(model) as edit:
        opened = time.perf_counter()
        for node in edit.graph:
            for value in node.outputs:
                if not value.is_graph_output():
                    value.name = f"{value.name}_e"
        edited = time.perf_counter()
    return opened - start, time.perf_counter() - edited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50_000)
    args = parser.parse_args()
    walk = protobuf_walk(chain(args.nodes))
    opened, written = edit_session(chain(args.nodes))
    print(f"{args.nodes} nodes: protobuf walk {walk:.2f} s; edit session: open {opened:.2f} s, "
          f"write back {written:.2f} s")


if __name__ == "__main__":
    main()
