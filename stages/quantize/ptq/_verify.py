"""Did int8 kernels really run?  Count them per target.

A QDQ model only says which ops *may* run in int8; each runtime decides.

- ``quantizable``: compute nodes (Conv, ConvTranspose, MatMul, Gemm) of the
  artifact whose data and weight inputs both come from DequantizeLinear (or
  from data movement of dequantized values only: Concat, MaxPool...), plus
  integer compute nodes (ConvInteger, MatMulInteger, QLinear*...).
- ``ort:cpu``: ONNX Runtime's optimized graph (what the session executes, at
  its default optimization level) is read back; ``int8`` counts its quantized
  compute kernels (QLinearConv, QLinearMatMul, MatMulIntegerToFloat, QGemm,
  DynamicQuantizeMatMul, ...).
- ``openvino:cpu``: the compiled model's runtime graph; ``int8`` counts compute
  layers (Convolution, FullyConnected, MatMul, ...) whose runtime precision is
  i8 or u8.  Compiled with f32 inference precision, as validation runs it.
  OpenVINO's compile time grows with the square of a QDQ chain's length (15 s
  at 1,000 nodes, 259 s at 4,000 on this machine): above ``IN_PROCESS_NODES``
  nodes it compiles in a child process stopped after ``OPENVINO_CHECK_SECONDS``,
  and a compile that takes longer is reported ``unchecked`` with that reason.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from qdeploy.core.onnx_wire import load_model
from qdeploy.stages.quantize.findings import KernelCount
from qdeploy.stages.quantize.ptq._openvino import dequantized_values
from qdeploy.targets import get_target
from qdeploy.targets.base import short_message
from qdeploy.targets.openvino_read import read_onnx

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
INTEGER_COMPUTE_OPS = frozenset({
    "QLinearConv", "NhwcQLinearConv", "QLinearConvTranspose", "QLinearMatMul", "MatMulInteger",
    "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "ConvInteger", "QGemm", "QAttention", "DynamicQuantizeLSTM",
})
OPENVINO_COMPUTE_LAYERS = frozenset({
    "Convolution", "GroupConvolution", "Deconvolution", "FullyConnected", "MatMul", "Gemm",
})
_INT8_PRECISIONS = frozenset({"i8", "u8"})
IN_PROCESS_NODES = 2000
OPENVINO_CHECK_SECONDS = 120.0


class _Unchecked(Exception):
    """A check that could not finish in its time budget: reported as unchecked, never as a pass."""


def quantizable_nodes(model: onnx.ModelProto) -> int:
    """Compute nodes meant to run in int8: data and weight both dequantized, or an integer op already."""
    # through data movement too: OpenVINO's placement drops the Q/DQ pairs after a Concat that round nothing
    dequantized = dequantized_values(model)
    def dequantized_inputs(node: onnx.NodeProto) -> bool:
        return len(node.input) >= 2 and node.input[0] in dequantized and node.input[1] in dequantized

    return sum(1 for node in model.graph.node if node.op_type in INTEGER_COMPUTE_OPS
               or (node.op_type in COMPUTE_OPS and dequantized_inputs(node)))


def compute_nodes(model: onnx.ModelProto) -> int:
    return sum(1 for node in model.graph.node if node.op_type in COMPUTE_OPS | INTEGER_COMPUTE_OPS)


def int8_kernels(model_path: Path, model: onnx.ModelProto, targets: list[str],
                 work_dir: Path) -> dict[str, KernelCount]:
    """Per target: quantizable compute nodes, and how many run as int8 kernels (or why it was not checked)."""
    quantizable = quantizable_nodes(model)
    if not compute_nodes(model):  # a scikit-learn model of ml ops only: said once, here, not only as 0 kernels
        kinds = sorted({node.op_type for node in model.graph.node} - {"QuantizeLinear", "DequantizeLinear"})
        log.warning("int8: the model has no node int8 computes (Conv, MatMul, Gemm, ...; it has %s): the artifact "
                    "computes in float32", ", ".join(kinds[:8]) or "no node")
    results: dict[str, KernelCount] = {}
    for target in targets:
        available, reason = get_target(target).availability()
        if not available:
            results[target] = {"status": "unavailable", "reason": reason}
            continue
        try:
            counted = _ort_counts(model_path, work_dir) if target == "ort:cpu" else \
                _bounded_openvino_counts(model_path, len(model.graph.node))
        except _Unchecked as exc:
            results[target] = {"status": "unchecked", "reason": str(exc)}
            continue
        except Exception as exc:  # a runtime that cannot load the artifact is a finding, not a crash here
            log.warning("int8 kernel check on %s failed: %s", target, short_message(exc))
            results[target] = {"status": "error", "reason": f"{type(exc).__name__}: {short_message(exc)}"}
            continue
        results[target] = {"quantizable": quantizable, **counted}
    return results


def _ort_counts(model_path: Path, work_dir: Path) -> KernelCount:
    import onnxruntime as ort

    optimized = work_dir / "ort_optimized.onnx"
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(optimized)
    options.log_severity_level = 3
    ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    ops = Counter(node.op_type for node in load_model(optimized, load_external_data=False).graph.node)
    optimized.unlink(missing_ok=True)
    kernels = {op: n for op, n in sorted(ops.items()) if op in INTEGER_COMPUTE_OPS}
    float_compute = {op: n for op, n in sorted(ops.items()) if op in COMPUTE_OPS or op in ("FusedConv", "FusedGemm",
                                                                                         "FusedMatMul", "NchwcConv")}
    return {"int8": sum(kernels.values()), "int8_kernels": kernels, "float_compute_kernels": float_compute}


def _bounded_openvino_counts(model_path: Path, nodes: int) -> KernelCount:
    """OpenVINO's counts; for large graphs in a child process with a time limit (see the module doc)."""
    if nodes <= IN_PROCESS_NODES:
        return _openvino_counts(model_path)
    command = [sys.executable, "-c",
               "import sys; from qdeploy.stages.quantize.ptq._verify import _child; _child(sys.argv[1])",
               str(model_path)]
    root = str(Path(__file__).resolve().parent.parent)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=OPENVINO_CHECK_SECONDS,
                              check=False, cwd=root)
    except subprocess.TimeoutExpired:
        raise _Unchecked(f"OpenVINO's compile of this {nodes}-node graph took longer than "
                         f"{OPENVINO_CHECK_SECONDS:.0f} s (it grows with the square of the node count on QDQ "
                         "chains); int8 kernels not counted here, validation still runs the artifact") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError((done.stderr.strip().splitlines() or ["OpenVINO's compile failed"])[-1])
    return json.loads(lines[-1])


def _child(model_path: str) -> None:
    print(json.dumps(_openvino_counts(Path(model_path))))


def _openvino_counts(model_path: Path) -> KernelCount:
    import openvino

    core = openvino.Core()
    model, _ = read_onnx(core, model_path)  # as every OpenVINO target reads it (frontend rewrites included)
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    layers: Counter[str] = Counter()
    int8_layers: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if layer not in OPENVINO_COMPUTE_LAYERS:
            continue
        layers[layer] += 1
        precision = info["runtimePrecision"].astype(str).lower() if "runtimePrecision" in info else ""
        if precision in _INT8_PRECISIONS:
            int8_layers[layer] += 1
    return {"int8": sum(int8_layers.values()), "compute_layers": dict(sorted(layers.items())),
            "int8_layers": dict(sorted(int8_layers.items()))}
