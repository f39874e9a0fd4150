"""Which precision's default tolerance a validation row is held to.

An artifact's precision comes from its stages (fp32, fp16, int8).  A model that
arrives already quantized (ConvInteger, MatMulInteger, DynamicQuantizeLSTM,
QLinearConv, Q/DQ pairs...) keeps its integer ops through simplify and fp16,
and runtimes round integer arithmetic differently (requantization, saturating
int16 sums on AVX2, VNNI or not): ONNX Runtime and OpenVINO disagree on such a
"float32" model by about 40 dB SNR, far below the fp32 default of 60.  Such a
variant is held to the int8 default tolerance, and its row says why.  A
tolerance written in the recipe applies as written.

An integer output the graph casts from float values (``qdeploy.graph.measured_integers``)
is compared as values unless the recipe's limits set ``integer_values`` (``[]``: all exact).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from pathlib import Path

from qdeploy.core.onnx_wire import load_model
from qdeploy.core.tolerance import Tolerance
from qdeploy.graph.measured_integers import with_integer_values
from qdeploy.stages.validate._precision import device_default_basis
from qdeploy.targets.base import ExecutionInfoDict

log = logging.getLogger(__name__)

INTEGER_OP_TYPES = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention", "DynamicQuantizeLSTM",
    "QEmbedLayerNormalization", "MatMulNBits", "MatMulBnb4", "GatherBlockQuantized",
})
"""Ops that compute on quantized integers or produce them (besides every QLinear* and QOrdered* op)."""
INTEGER_OP_PREFIXES = ("QLinear", "QOrdered", "NhwcQLinear")
BF16_BASIS = ("held to the bf16 default tolerance, not the fp16 one: {target} ran this float16 graph in bfloat16, "
              "its default on this CPU (INFERENCE_PRECISION_HINT f32 where you deploy it gives float32's arithmetic; "
              "the reference:cpu row checks true float16)")
DECLARED_BASIS = "held to the tolerance its own accuracy budget was built to (the variant's steps in the recipe)"
_LOOSENESS = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3, "int4": 3}
"""How loose each precision's default tolerance is: a row that two bases apply to takes the looser."""


def is_integer_op(op_type: str) -> bool:
    return op_type in INTEGER_OP_TYPES or op_type.startswith(INTEGER_OP_PREFIXES)


def looseness(basis: str) -> int:
    """The rank of a precision's default tolerance, strictest (fp32) first."""
    return _LOOSENESS.get(basis, 0)


def row_basis(precision: str, path: Path, target: str, executed: ExecutionInfoDict | None, *, declared: bool,
              recipe_tolerance: bool, device_default: bool) -> tuple[str, str]:
    """Whose default limits a validation row is held to, and why when not its artifact's own precision's: the
    limits its variant's steps declared, the recipe's validate.tolerance (its precision's), int8's for a graph that
    already holds integer ops, bf16's where a float16 graph ran in bfloat16, and the device default's where it is
    looser.  The package check computes a row's limits again with the same rule (``pipeline.publish.package``)."""
    if declared:
        return precision, DECLARED_BASIS
    basis, held = (precision, "") if recipe_tolerance else tolerance_precision(precision, path)
    if basis == "fp16" and not held and not recipe_tolerance and (executed or {}).get("precision") == "bf16":
        basis, held = "bf16", BF16_BASIS.format(target=target)
    if device_default and not recipe_tolerance:
        default_basis, default_held = device_default_basis(target, executed)
        if looseness(default_basis) >= looseness(basis):  # a model already quantized keeps the looser int8 limits
            basis, held = default_basis, default_held
    return basis, held


def tolerance_precision(precision: str, path: Path) -> tuple[str, str]:
    """(the precision whose default tolerance applies, why when it is not the artifact's own)."""
    if precision in ("int8", "int4"):  # integer artifacts have their own defaults
        return precision, ""
    found = integer_ops(path)
    if not found:
        return precision, ""
    listed = ", ".join(f"{op} x{count}" for op, count in sorted(found.items()))
    return "int8", (f"held to the int8 default tolerance, not the {precision} one: the graph already holds integer "
                    f"ops ({listed}), which runtimes round differently")


@functools.lru_cache(maxsize=64)
def _integer_ops_cached(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, int], ...]:
    try:
        model = load_model(Path(path), load_external_data=False)
    except Exception as exc:  # the runtimes will say what is wrong with the file; the fp32 default applies
        log.debug("cannot read %s for its op types: %s", path, exc)
        return ()
    counts: Counter[str] = Counter()
    pending = [model.graph]
    while pending:
        graph = pending.pop()
        for node in graph.node:
            if is_integer_op(node.op_type):
                counts[node.op_type] += 1
            for attr in node.attribute:
                pending.extend([attr.g] if attr.HasField("g") else [])
                pending.extend(attr.graphs)
    return tuple(sorted(counts.items()))


def integer_ops(path: Path) -> dict[str, int]:
    """Integer op type -> count in the model file (subgraphs included); {} when there are none."""
    stat = Path(path).stat()
    return dict(_integer_ops_cached(str(path), stat.st_mtime_ns, stat.st_size))



def measured_integer_limits(tolerance: Tolerance, per_output: dict[str, Tolerance], measured: frozenset[str]
                            ) -> tuple[Tolerance, dict[str, Tolerance], list[str]]:
    """The row's limits with ``integer_values`` the measured integer outputs where the recipe leaves it open, and
    a note naming the outputs compared as values (the row says which integers were not held to equality)."""
    tolerance = with_integer_values(tolerance, measured)
    per_output = {name: with_integer_values(limits, measured) for name, limits in per_output.items()}
    held = sorted(name for name in measured
                  if name in (per_output.get(name, tolerance).integer_values or ()))
    if not held:
        return tolerance, per_output, []
    names = ", ".join(f"'{name}'" for name in held)
    return tolerance, per_output, [
        f"integer output {names} holds float values the graph casts to integers: compared as values (cosine, SNR, "
        "errors), not element by element; validate.tolerance.integer_values: [] asks for equality"]
