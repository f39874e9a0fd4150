"""Classes of layers kept float in qdeploy's OpenVINO int8 graph: squeeze-and-excitation gates, their pools,
depthwise convolutions; does either runtime gain, and does each runtime still compute the graph right?

    python benchmarks/float_classes.py [--models pp-ocr-det pp-ocr-rec] [--rounds 15] [--per-block]

Tried on 2026-12-05 and not adopted ([the record](../docs/measurements/2026-12-05-int8-vnni-levers.md)).  For
each real-model corpus CNN (``tests/real_recipes``; ``python -m tests.real_models`` fetches them): calibrate once
on 16 calibration images, build ``runtime: openvino`` ptq from those ranges as ``openvino_placement.py``'s ``new``
(today's placement) and the same with one class of nodes excluded:

- ``float gates``: each squeeze-and-excitation block's gate (Conv -> activation -> Conv -> (Hard)Sigmoid between
  a GlobalAveragePool/ReduceMean of ``x`` and the Mul by ``x``): a 1x1 map, where int8 saves nothing;
- ``float gates and pools``: the pools too (NNCF's ``SE_BLOCK`` ignored pattern);
- ``float depthwise``: every depthwise convolution (OpenVINO's bf16 depthwise kernel beats its int8 one on
  AVX512-BF16 CPUs, before the layout conversions around it);

and NNCF's default graph.  Worst and mean cosine against the float32 model over 8 validation images on ONNX
Runtime and on OpenVINO pinned to f32 (the same graph: where they differ one runtime computes it wrongly), and CPU
ms per call at OpenVINO's default precision, 1 thread, median over interleaved rounds (``openvino_placement.
measure``).  ``--per-block``: one build per squeeze-and-excitation block with its gate and pool float (which blocks
OpenVINO computes wrongly).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8_peers import nncf_artifacts  # noqa: E402
from benchmarks.openvino_layers import depthwise_convs  # noqa: E402
from benchmarks.openvino_placement import _compiled, _cosine, build_replacing, calibrated, measure  # noqa: E402
from qdeploy.stages.quantize.ptq import _ptq  # noqa: E402

POOLS = frozenset({"GlobalAveragePool", "ReduceMean"})
GATE_OPS = frozenset({"Conv", "Gemm", "MatMul", "Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Mul", "Add",
                      "Div", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def se_blocks(model_path: Path) -> list[tuple[str, list[str]]]:
    """(pool, gate nodes) of each Mul of ``x`` by a gate computed, through a convolution or matrix product, from a
    pool of that same ``x`` and constants only."""
    import onnx

    model = onnx.load(str(model_path))
    producer = {out: node for node in model.graph.node for out in node.output if out}
    constants = {init.name for init in model.graph.initializer}
    constants |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    found = []
    for mul in (node for node in model.graph.node if node.op_type == "Mul" and len(node.input) == 2):
        for gate, scaled in (mul.input, mul.input[::-1]):
            members, pools, frontier, valid = [], set(), [gate], True
            while frontier and valid:
                node = producer.get(frontier.pop())
                if node is None or node.name in members or len(members) > 16:
                    valid = node is not None and len(members) <= 16
                    continue
                if node.op_type in POOLS:
                    valid, _ = node.input[0] == scaled, pools.add(node.name)
                    continue
                valid = node.op_type in GATE_OPS
                members.append(node.name)
                frontier.extend(name for name in node.input if name and name not in constants)
            compute = any(producer[out].op_type in {"Conv", "Gemm", "MatMul"} for out in
                          (output for node in model.graph.node if node.name in members for output in node.output))
            if valid and len(pools) == 1 and compute:
                found.append((pools.pop(), members))
                break
    return found


def cosines(path: Path, source: Path, val: list[dict]) -> str:
    """Worst / mean cosine against the float32 model on ONNX Runtime, then on OpenVINO f32."""
    import onnxruntime as ort

    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    expected = [reference.run(None, feed)[0] for feed in val]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    request = _compiled(path, f32=True)
    cells = []
    for run in (lambda feed: session.run(None, feed)[0], lambda feed: request.infer(feed)[0]):
        found = [_cosine(run(feed), want) for feed, want in zip(val, expected, strict=True)]
        cells.append(f"{min(found):.4f} / {np.mean(found):.4f}")
    return " | ".join(cells)


def run_model(name: str, folder: Path, rounds: int, per_block: bool) -> list[str]:
    source, calib, val, prepared, ranges = calibrated(name, folder)
    blocks = se_blocks(prepared)
    gates = [member for _, members in blocks for member in members]
    kept = {"new": [], "float gates": gates, "float gates and pools": gates + [pool for pool, _ in blocks],
            "float depthwise": depthwise_convs(prepared)}
    if per_block:
        kept.update({f"block {index} ({pool}): gate and pool float": [*members, pool]
                     for index, (pool, members) in enumerate(blocks)})
    models = {"fp32": source}
    for index, (label, nodes) in enumerate(kept.items()):
        models[label] = build_replacing(prepared, ranges, folder / f"build{index}.onnx", {},
                                        signed_int8=_ptq.CENTRED, excluded=tuple(nodes))
    built, _ = nncf_artifacts(source, calib, folder, transformer=False)
    models.update({label: path for label, path, _ in built if label == "nncf"})
    timed = measure({label: path for label, path in models.items() if not label.startswith("block")}, val, rounds)
    base = timed["nncf"][1] if "nncf" in timed else timed["new"][1]
    lines = []
    for label, path in models.items():
        nodes = len(kept.get(label, []))
        ms = f"{timed[label][1]:.2f} | {timed[label][1] / base:.3f}" if label in timed else " | "
        lines.append(f"| {name} | {label} | {nodes} | {cosines(path, source, val)} | {ms} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["pp-ocr-det", "pp-ocr-rec"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--per-block", action="store_true")
    args = parser.parse_args()
    lines = ["| model | build | nodes float | cosine ORT worst / mean | cosine OpenVINO f32 worst / mean | CPU ms | "
             "latency / NNCF's |", "|---|---|---|---|---|---|---|"]
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix=f"qdeploy-float-classes-{name}-") as tmp:
            lines += run_model(name, Path(tmp), args.rounds, args.per_block)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
