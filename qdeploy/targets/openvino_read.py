"""Reading an ONNX file into OpenVINO, past the limits of its ONNX frontend that a rewrite can lift.

Every OpenVINO read of an artifact goes through ``read_onnx``: the adapter's
sessions, the throughput pool, the layer profile, the package's IR.  When the
model holds a pattern OpenVINO's frontend refuses and an exact rewrite avoids,
the rewrite is applied to a copy in memory and OpenVINO reads that; the file
itself is never changed, and the notes say what was rewritten (a session puts
them in what it reports as having run).

Lifted today: a Loop/Scan body that returns a loop-carried input unchanged
(``qdeploy.graph.loop_carried``; OpenVINO 2026.4 refuses it in ``loop.cpp``), an If whose condition has
rank above 1 (``qdeploy.graph.if_condition``; refused in ``if.cpp``), an LSTM with peepholes, which it reads
and computes without them (``qdeploy.graph.lstm_peepholes``), and a constant added to a product by a huge mask
constant, whose sum its CPU plugin regroups and loses the constant in (``qdeploy.graph.offset_barrier``), and
simple ``ai.onnx.ml`` operators (Scaler, Imputer, LinearRegressor, ...), which it cannot convert at all
(``qdeploy.graph.ml_ops``).

The copy holds the graph only.  Without external data it is handed to OpenVINO
in memory; with weights in a data file, or in the model file itself past 64 MB
(``qdeploy.core.onnx_wire``), it is written under a temporary name beside the
file for the read (OpenVINO resolves external data only inside the folder of
what it reads), and removed right after.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.files import TMP_PREFIX, all_tensors
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.if_condition import squeeze_if_conditions
from qdeploy.graph.loop_carried import isolate_pass_through
from qdeploy.graph.lstm_peepholes import write_out_peephole_lstms
from qdeploy.graph.ml_ops import lower_ml_ops
from qdeploy.graph.offset_barrier import shield_mask_products

if TYPE_CHECKING:
    import onnx

__all__ = ["read_onnx"]

log = logging.getLogger(__name__)

LISTED = 5
"""Rewritten values named in a note (the count covers all)."""
EXTERNAL = 1
"""``TensorProto.EXTERNAL``: the tensor's bytes lie in a file."""


def read_onnx(core: Any, model_path: Path) -> tuple[Any, list[str]]:
    """OpenVINO's ``Model`` of the ONNX file at ``model_path``, and notes on what was rewritten so that OpenVINO's
    ONNX frontend reads it (empty when it reads the file as it is).  Raises what ``Core.read_model`` raises."""
    model_path = Path(model_path)
    model = load_model(model_path, load_external_data=False)
    notes = _rewrite(model)
    if not notes:
        del model  # the parsed copy is not needed while OpenVINO reads the file
        return core.read_model(str(model_path)), []
    for note in notes:
        log.info("%s: %s", model_path.name, note)
    if not any(tensor.data_location == EXTERNAL for tensor in all_tensors(model)):
        return core.read_model(model.SerializeToString()), notes
    return _read_beside(core, model, model_path), notes


_REWRITES = (
    (lower_ml_ops, "{count} ai.onnx.ml node(s) written out in standard ops (its ONNX frontend converts no ml "
                   "operator but Normalizer"),
    (isolate_pass_through, "an Identity between {count} loop-carried value(s) and the Loop/Scan body outputs that "
                           "return them unchanged (its ONNX frontend refuses those"),
    (squeeze_if_conditions, "the condition of {count} If node(s) squeezed to a scalar (its ONNX frontend refuses a "
                            "condition of rank above 1"),
    (write_out_peephole_lstms, "{count} LSTM node(s) with peepholes written out as Scans (its ONNX frontend drops "
                               "the peepholes and computes them wrongly"),
    (shield_mask_products, "Max(x, -inf), an identity, after {count} product(s) by a huge mask constant that a "
                           "constant is added to (its CPU plugin regroups the sum and loses the constant"),
)
"""Each exact rewrite (in place, returning what it rewrote) and what its note says it did."""


def _rewrite(model: onnx.ModelProto) -> list[str]:
    """Apply every rewrite to ``model``; a note for each that changed something."""
    notes = []
    for rewrite, what in _REWRITES:
        rewritten = rewrite(model)
        if rewritten:
            notes.append(f"OpenVINO read a copy of the model with {what.format(count=len(rewritten))}; the artifact "
                         f"itself is unchanged): {_listed(rewritten)}")
    return notes


def _listed(rewritten: list[str]) -> str:
    return f"{', '.join(rewritten[:LISTED])}{' ...' if len(rewritten) > LISTED else ''}"


def _read_beside(core: Any, model: onnx.ModelProto, model_path: Path) -> Any:
    """OpenVINO's model of the graph-only ``model``, written under a temporary name beside ``model_path`` for the
    read: its external data resolves there as the file's own does (OpenVINO refuses data outside the folder of
    what it reads, and a model read from memory has none)."""
    fd, name = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{model_path.name}.p{os.getpid()}.", suffix=".onnx",
                                dir=model_path.parent)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(model.SerializeToString())
        return core.read_model(name)
    finally:
        Path(name).unlink(missing_ok=True)
