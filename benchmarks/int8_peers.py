"""Peers and the machine's ceiling for ``benchmarks/int8.py``.

- ``nncf_artifacts``: NNCF's ``nncf.quantize`` on the ONNX model, as OpenVINO's users call it first (defaults),
  and with ``model_type=TRANSFORMER`` for encoders; NNCF is imported lazily (``pip install nncf``) and its
  absence is reported, not hidden.
- ``ceiling``: for this CPU, the int8 and fp32 time of a large MatMul (weights constant, activations an input,
  as in a Linear layer) on each runtime: what int8 can gain here at best.  On x86 without VNNI the int8 kernels
  of both runtimes do little better than float32; with VNNI or AMX they do several times better.
"""

from __future__ import annotations

import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

log = logging.getLogger("benchmarks.int8")


def nncf_artifacts(model_path: Path, calib: list[dict[str, np.ndarray]], folder: Path, *,
                   transformer: bool) -> tuple[list[tuple[str, Path, float]], str]:
    """(label, path, build seconds) of NNCF's int8 artifacts; a note when NNCF is missing or fails."""
    try:
        import nncf
    except ImportError:
        return [], "NNCF not installed (pip install nncf): its rows are missing"
    plans: list[tuple[str, dict[str, Any]]] = [("nncf", {})]
    if transformer:
        plans.append(("nncf-transformer", {"model_type": nncf.ModelType.TRANSFORMER}))
    built = []
    for label, options in plans:
        output = folder / f"{model_path.stem}-{label}.onnx"
        started = time.perf_counter()
        try:
            quantized = nncf.quantize(onnx.load(str(model_path)), nncf.Dataset(calib), subset_size=len(calib),
                                      **options)
        except Exception as exc:  # a peer failing is a result
            return built, f"{label} failed: {type(exc).__name__}: {str(exc)[:160]}"
        onnx.save(quantized, str(output))
        built.append((label, output, time.perf_counter() - started))
    return built, ""


def _matmul(size: int, weights: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], "mm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])], [numpy_helper.from_array(weights, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _qdq_matmul(size: int, weights: np.ndarray) -> onnx.ModelProto:
    """DQ(Q(A)) @ DQ(Wq): uint8 activations, 7-bit int8 per-channel weights, float output (what qdeploy writes
    on CPUs without VNNI; ORT runs MatMulIntegerToFloat, OpenVINO a u8 FullyConnected)."""
    scale = np.abs(weights).max(axis=0) / 63.0
    inits = [numpy_helper.from_array(np.clip(np.round(weights / scale), -63, 63).astype(np.int8), "wq"),
             numpy_helper.from_array(scale.astype(np.float32), "sw"),
             numpy_helper.from_array(np.zeros(size, np.int8), "zw"),
             numpy_helper.from_array(np.array(8.0 / 255, np.float32), "sa"),
             numpy_helper.from_array(np.array(128, np.uint8), "za")]
    nodes = [helper.make_node("QuantizeLinear", ["a", "sa", "za"], ["aq"]),
             helper.make_node("DequantizeLinear", ["aq", "sa", "za"], ["ad"]),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], axis=1),
             helper.make_node("MatMul", ["ad", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _cpu_ms(run: Callable[[], Any], rounds: int, iterations: int) -> float:
    """Median over rounds of the CPU ms per call (robust to other jobs when one thread runs)."""
    run()
    per_round = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(iterations):
            run()
        per_round.append((time.process_time() - started) / iterations * 1e3)
    return statistics.median(per_round)


def ceiling(targets: tuple[str, ...], *, size: int = 1024, threads: int = 1, rounds: int = 5,
            iterations: int = 3, pin_f32: bool = True) -> dict[str, dict[str, float]]:
    """target -> {"fp32": ms, "int8": ms, "gain": fp32/int8} for a size^3 MatMul, ``threads`` threads.
    ``pin_f32=False``: float at the device's default precision (OpenVINO: bfloat16 on AVX512-BF16/AMX CPUs)."""
    from qdeploy.targets import get_target

    rng = np.random.default_rng(0)
    weights = (rng.standard_normal((size, size)) * 0.05).astype(np.float32)
    feeds = {"a": rng.uniform(-4, 4, (size, size)).astype(np.float32)}
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="qdeploy-ceiling-") as tmp:
        paths = {"fp32": Path(tmp) / "fp32.onnx", "int8": Path(tmp) / "int8.onnx"}
        onnx.save(_matmul(size, weights), str(paths["fp32"]))
        onnx.save(_qdq_matmul(size, weights), str(paths["int8"]))
        for target in targets:
            measured = {}
            for kind, path in paths.items():
                with get_target(target).load(path, threads=threads, pin_f32=pin_f32) as session:
                    measured[kind] = _cpu_ms(lambda s=session: s.run(feeds), rounds, iterations)
            results[target] = {**measured, "gain": measured["fp32"] / measured["int8"]}
    return results


def ceiling_lines(results: dict[str, dict[str, float]], size: int, threads: int) -> list[str]:
    gops = 2 * size**3 / 1e9
    lines = [f"The machine's int8 ceiling: a {size}x{size}x{size} MatMul, {threads} thread(s), CPU ms per call",
             "| target | fp32 ms | int8 ms | fp32 GOP/s | int8 GOP/s | int8 gain |", "|---|---|---|---|---|---|"]
    for target, row in results.items():
        lines.append(f"| {target} | {row['fp32']:.1f} | {row['int8']:.1f} | {gops / row['fp32'] * 1e3:.1f} | "
                     f"{gops / row['int8'] * 1e3:.1f} | {row['gain']:.2f}x |")
    return lines
