"""Which precision's default tolerance a validation row is held to.

An artifact's precision comes from its stages (fp32, fp16, int8).  A model that
arrives already quantized (ConvInteger, MatMulInteger, DynamicQuantizeLSTM,
QLinearConv, Q/DQ pairs...) keeps its integer ops through simplify and fp16,
and runtimes round integer arithmetic differently (requantization, saturating
int16 sums on AVX2, VNNI or not): ONNX Runtime and OpenVINO disagree on such a
"float32" model by about 40 dB SNR, far below the fp32 default of 60.  Such a
variant is held to the int8 default tolerance, and its row says why.  A
tolerance written in the recipe applies as written.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from pathlib import Path

from qdeploy.core.onnx_wire import load_model

log = logging.getLogger(__name__)

INTEGER_OP_TYPES = frozenset({
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
    "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QGemm", "QAttention", "DynamicQuantizeLSTM",
    "QEmbedLayerNormalization", "MatMulNBits", "MatMulBnb4", "GatherBlockQuantized",
})
"""Ops that compute on quantized integers or produce them (besides every QLinear* and QOrdered* op)."""
INTEGER_OP_PREFIXES = ("QLinear", "QOrdered", "NhwcQLinear")
_LOOSENESS = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3, "int4": 3}
"""How loose each precision's default tolerance is: a row that two bases apply to takes the looser."""


def is_integer_op(op_type: str) -> bool:
    return op_type in INTEGER_OP_TYPES or op_type.startswith(INTEGER_OP_PREFIXES)


def looseness(basis: str) -> int:
    """The rank of a precision's default tolerance, strictest (fp32) first."""
    return _LOOSENESS.get(basis, 0)


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
