"""OpenVINO's own per-layer profile of qdeploy's OpenVINO int8 graph beside NNCF's: where the time goes.

    python benchmarks/openvino_layers.py [--models resnet18 pp-ocr-rec] [--runs 30] [--signed asymmetric|auto|symmetric]
                                         [--without STEP ...] [--fp32] [--depthwise-float]

For each model of ``benchmarks/int8.py`` (its builders, calibration and evaluation samples): qdeploy's ptq
with ``runtime: openvino`` (``signed_activations`` from ``--signed``; ``--without`` switches off OpenVINO-only
placement steps of ``stages/quantize/ptq/_openvino.py``, e.g. ``pooled_before_quantizing``) and NNCF's
``nncf.quantize`` (defaults), compiled on CPU at OpenVINO's default precision with ``PERF_COUNT``, one thread,
one stream.  Per build: the CPU time of a call (median) and, from ``get_profiling_info`` over ``--runs`` calls, each
layer's median time summed per layer type and kernel (``exec_type``: ``_I8``/``_i8`` a uint8/int8 input,
``_bf16``/``_f32`` float; ``--fp32``: the float32 model beside them, at the default, bf16 on AMX), then the layers
whose time differs most between qdeploy's and NNCF's.  ``--depthwise-float`` adds qdeploy's graph with every
depthwise convolution kept float (``exclude_nodes``), to weigh OpenVINO's bf16 depthwise kernel against its int8 one
with the layout conversions around it.
"""

from __future__ import annotations

import argparse
import collections
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8 import nncf_rows, qdeploy  # noqa: E402
from benchmarks.int8_models import BUILDERS  # noqa: E402
from benchmarks.openvino_placement import _OFF, _OPENVINO_STEPS  # noqa: E402
from qdeploy.stages.quantize import QuantizeConfig  # noqa: E402
from qdeploy.stages.quantize.ptq import _ptq  # noqa: E402


def profile(path: Path, feed: dict, runs: int) -> tuple[float, dict[tuple[str, str], list[float]], dict[str, float]]:
    """CPU ms per call (median), (layer type, kernel) -> [layers, us per call], layer name -> us per call: each
    layer's median over the runs (a run disturbed by another job moves a mean, not a median)."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU", {"PERF_COUNT": True, "INFERENCE_NUM_THREADS": 1,
                                                          "NUM_STREAMS": 1})
    request = compiled.create_infer_request()
    for _ in range(5):
        request.infer(feed)
    per_run: dict[str, list[float]] = collections.defaultdict(list)
    kind_of: dict[str, tuple[str, str]] = {}
    times = []
    for _ in range(runs):
        started = time.process_time()
        request.infer(feed)
        times.append(time.process_time() - started)
        for layer in request.profiling_info:
            if layer.status == layer.Status.EXECUTED:
                per_run[layer.node_name].append(layer.real_time.total_seconds() * 1e6)
                kind_of[layer.node_name] = (layer.node_type, layer.exec_type)
    layers = {name: statistics.median(values) for name, values in per_run.items()}
    kinds: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for name, micros in layers.items():
        kinds[kind_of[name]][0] += 1
        kinds[kind_of[name]][1] += micros
    return statistics.median(times) * 1e3, kinds, layers


def depthwise_convs(path: Path) -> list[str]:
    """Names of the depthwise Conv nodes (the quantize stage's ``_depthwise_convs``), weights in initializers or
    Constant nodes."""
    import onnx

    from qdeploy.stages.quantize.ptq._depthwise import _depthwise_convs

    model = onnx.load(str(path))
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    shapes.update((node.output[0], tuple(node.attribute[0].t.dims)) for node in model.graph.node
                  if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value")
    producer = {out: node for node in model.graph.node for out in node.output}
    return [conv.name for conv, _ in _depthwise_convs(model, producer, shapes)]


def lines(name: str, built: dict[str, Any], runs: int, feed: dict) -> list[str]:
    measured = {label: profile(path, feed, runs) for label, path in built.items()}
    calls = ", ".join(f"{label} {ms:.3f} ms" for label, (ms, _, _) in measured.items())
    ratio = measured["qdeploy"][0] / measured["nncf"][0]
    out = [f"### {name}: {calls} per call (qdeploy / NNCF {ratio:.2f}x)", "",
           "| layer type / kernel | " + " | ".join(f"{label} layers | {label} us" for label in measured) + " |",
           "|---|" + "---|---|" * len(measured)]
    kinds = {label: found[1] for label, found in measured.items()}
    every = set().union(*(found.keys() for found in kinds.values()))
    for key in sorted(every, key=lambda k: -sum(found.get(k, [0, 0.0])[1] for found in kinds.values())):
        cells = " | ".join(f"{found.get(key, [0, 0.0])[0]} | {found.get(key, [0, 0.0])[1]:.1f}"
                           for found in kinds.values())
        out.append(f"| {key[0]} / {key[1]} | {cells} |")
    mine, peer = measured["qdeploy"][2], measured["nncf"][2]
    shared = sorted(mine.keys() & peer.keys(), key=lambda k: -abs(mine[k] - peer[k]))[:8]
    out += ["", "| layer (same name in both) | qdeploy us | NNCF us |", "|---|---|---|",
            *(f"| {layer[:60]} | {mine[layer]:.1f} | {peer[layer]:.1f} |" for layer in shared), ""]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "pp-ocr-rec"], choices=list(BUILDERS))
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--signed", choices=("asymmetric", "auto", "symmetric"), default="auto")
    parser.add_argument("--without", nargs="*", default=[], choices=_OPENVINO_STEPS)
    parser.add_argument("--fp32", action="store_true", help="also the float32 model at the default precision")
    parser.add_argument("--depthwise-float", action="store_true",
                        help="also qdeploy's graph with its depthwise convolutions kept float")
    args = parser.parse_args()
    for step in args.without:  # this process only
        setattr(_ptq, step, _OFF[step])
    logging.basicConfig(level=logging.ERROR)
    out = []
    with tempfile.TemporaryDirectory(prefix="qdeploy-ov-layers-") as tmp:
        for name in args.models:
            folder = Path(tmp) / name
            folder.mkdir()
            case = BUILDERS[name](folder)
            if case is None:
                continue
            config = QuantizeConfig(calibration={"data": "calib", "samples": len(case.calib)}, runtime="openvino",
                                    signed_activations=args.signed)
            # named as a run's per-runtime build is: a graph only OpenVINO runs (signed beside 7-bit activations)
            built = {"qdeploy": qdeploy(case, folder, "qdeploy@openvino", config).path}
            if args.depthwise_float:
                kept = QuantizeConfig(**{**config.model_dump(exclude_unset=True),
                                         "exclude_nodes": depthwise_convs(case.path)})
                built["dw-float"] = qdeploy(case, folder, "dw-float@openvino", kept).path
            built.update({row.artifact: row.path for row in nncf_rows(case, folder) if row.artifact == "nncf"})
            if args.fp32:
                built["fp32"] = case.path
            out += lines(name, built, args.runs, case.evaluation[0])
    print("\n".join(out))


if __name__ == "__main__":
    main()
