"""The quantize stage: int8 QDQ models that run int8 kernels, from a float model or a fake-quant one.

- ``ptq``: static QDQ quantization.  Activation ranges are calibrated by qdeploy
  (``calibration/``: minmax, percentile, entropy, mse; streamed), and ONNX
  Runtime's QDQ quantizer writes the model (uint8 activations with int8
  per-channel weights by default: what ONNX Runtime fuses on x86).
- ``dynamic``: int8 weights, activations quantized at run time (transformer
  encoders on CPU).
- ``lower``: fake quantization from quantization-aware training lowered to
  exact QuantizeLinear/DequantizeLinear (``stages/quantize/lower``).
- ``weight_only``: int4/int8 MatMul and embedding weights in blocks, float
  activations (``_weight_only.py``): decoders and LLMs; calibration data only for method gptq and ratio.

With ``tolerance`` (ptq, dynamic), the stage keeps the quantized nodes that hurt
accuracy most in float until the tolerance holds against float32 on the budget
data (the one accuracy-budget engine, ``stages/accuracy_budget/search.py``, with what
``stages/quantize/budget`` supplies).  Every mode reports, per target, how many
quantizable ops really run int8 kernels (``int8_kernels``).  A model that is
already quantized is refused (ptq, dynamic), never quantized twice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.core.errors import StageError
from qdeploy.stages.quantize.config import (
    STAGE,
    CalibrationRef,
    LowerConfig,
    ModeConfig,
    NncfPtqConfig,
    QuantizeConfig,
    WeightOnlyConfig,
)
from qdeploy.stages.quantize.ptq._amx_convs import host_facts
from qdeploy.stages.quantize.ptq._guard import QuantizerFailure
from qdeploy.stages.quantize.ptq._placement import placement_differences
from qdeploy.stages.quantize.ptq._prepare import count_quantized_nodes, quantized_ops, weight_qdq_pairs

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

# what other packages use; a mode's own model is in qdeploy.stages.quantize.config
__all__ = ["CalibrationRef", "QuantizeConfig", "host_facts", "placement_differences", "run"]


def run(artifact: Artifact, config: ModeConfig, ctx: StageContext) -> StageResult:
    """Quantize (or lower) the artifact's model with the model of the step's mode; returns the new model and what
    was done."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize import _modes as quantize_modes

    if isinstance(config, LowerConfig):
        return quantize_modes.lower(artifact, config, ctx)
    _refuse_if_quantized(artifact, ctx)
    if isinstance(config, WeightOnlyConfig):
        return quantize_modes.weight_only(artifact, config, ctx)
    if isinstance(config, NncfPtqConfig):
        return quantize_modes.nncf_ptq(artifact, config, ctx)
    try:
        return quantize_modes.post_training(artifact, config, ctx)
    except QuantizerFailure as exc:
        raise StageError(STAGE, ctx.variant, str(exc)) from exc


def _refuse_if_quantized(artifact: Artifact, ctx: StageContext) -> None:
    model = artifact.load(load_external_data=False)  # the graph: a one-file model's weights stay in the file
    already = count_quantized_nodes(model)
    if already:
        raise _refuse_already_quantized(model, already, ctx)


def _refuse_already_quantized(model: onnx.ModelProto, count: int, ctx: StageContext) -> StageError:
    """The error for a model that is quantized already: quantizing it again would compound the error."""
    kinds = quantized_ops(model)
    listed = ", ".join(f"{op} {n}" for op, n in sorted(kinds.items()))
    hint = "remove the quantize stage from this variant"
    pairs = weight_qdq_pairs(model)
    if pairs:
        hint += f", or use mode lower: {pairs} QuantizeLinear nodes act on float weights and fold into int8"
    return StageError(STAGE, ctx.variant, f"model is already quantized ({count} quantization nodes: {listed}); "
                                          f"quantizing it again would compound the error: {hint}")


