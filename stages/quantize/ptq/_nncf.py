"""``quantize: {engine: nncf}``: NNCF's ``nncf.quantize`` builds the int8 model; qdeploy does the rest.

NNCF (OpenVINO's post-training quantization tool) places Q/DQ the way OpenVINO's low-precision transformations
want them (symmetric activations where the range allows, Add/Mul/Concat handled for OpenVINO's fusions) and
applies fast bias correction; where OpenVINO runs the graph, its int8 pairs at Concats move to uint8, exactly
(``_concat_uint8``), and its per-channel pairs before depthwise convolutions become a rescaling and one scale, which
ONNX Runtime can run too (``_depthwise``).  With this engine qdeploy calibrates NNCF on the recipe's data, maps
``reduce_range`` to NNCF's ``overflow_fix`` (7-bit weights for x86 CPUs without VNNI), checks the model loads,
counts the int8 kernels each target really runs, and validates and benchmarks it like any artifact; the verdict
then picks, per target, the fastest artifact that passes (``docs/quantize.md``: NNCF is the faster graph on
OpenVINO for some models, qdeploy's own on ONNX Runtime).  NNCF is optional: ``pip install 'qdeploy[nncf]'``.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from qdeploy.core.errors import StageError
from qdeploy.stages.quantize._common import SevenBit, resolve_reduce_range
from qdeploy.stages.quantize.config import STAGE, CalibrationRef
from qdeploy.stages.quantize.findings import NncfPtqFindings
from qdeploy.stages.quantize.ptq._concat_uint8 import moved_where_openvino_runs
from qdeploy.stages.quantize.ptq._depthwise import per_tensor_at_depthwise
from qdeploy.stages.quantize.ptq._prepare import for_quantizer, give_back

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.context import Artifact, StageContext
    from qdeploy.stages.quantize.config import NncfPtqConfig

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'qdeploy[nncf]' (or pip install nncf)"


def _nncf() -> Any:
    try:
        import nncf
    except ImportError:
        return None
    nncf.set_log_level(logging.ERROR)  # its progress bars and INFO lines are not qdeploy's progress display
    return nncf


def quantize_with_nncf(artifact: Artifact, config: NncfPtqConfig,
                       ctx: StageContext) -> tuple[onnx.ModelProto, SevenBit, Callable[..., NncfPtqFindings]]:
    """NNCF's int8 model of the artifact, calibrated on the recipe's data, the operand on 7 bits (overflow_fix:
    the weights, or none), and what was done: the findings, less the int8 counts that the stage adds."""
    import onnx

    nncf = _nncf()
    if nncf is None:
        raise StageError(STAGE, ctx.variant, f"quantize.engine 'nncf' needs NNCF, which is not installed: "
                                             f"{INSTALL_HINT}; or leave engine at 'qdeploy'")
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    calibration = config.calibration or CalibrationRef()
    ctx.on_progress("calibrating (NNCF)")
    samples = list(ctx.samples(calibration.data, artifact.path, calibration.samples))
    if not samples:
        raise StageError(STAGE, ctx.variant, f"calibration dataset '{calibration.data or 'random'}' yielded no samples")
    wanted, why = resolve_reduce_range(config, ctx.targets)
    seven_bit: SevenBit = "none" if wanted == "none" else "weights"  # overflow_fix narrows the weights only
    overflow_fix = OverflowFix.DISABLE if seven_bit == "none" else OverflowFix.ENABLE
    ignored = nncf.IgnoredScope(names=list(config.exclude_nodes), patterns=list(config.exclude_patterns),
                                types=list(config.exclude_op_types), validate=False)
    model_type = nncf.ModelType.TRANSFORMER if config.nncf_model_type == "transformer" else None
    source = onnx.load(str(artifact.path))
    widened, undone = for_quantizer(source)  # NNCF writes float16 scales too, which opset < 19 refuses
    try:  # its rich progress bars ("Statistics collection", "Applying Fast Bias correction") are not qdeploy's
        with contextlib.redirect_stdout(io.StringIO()):
            quantized = nncf.quantize(source, nncf.Dataset(samples), subset_size=len(samples),
                                      model_type=model_type, ignored_scope=ignored,
                                      advanced_parameters=AdvancedQuantizationParameters(overflow_fix=overflow_fix))
    except Exception as exc:  # NNCF's own failure on this model, said as such
        raise StageError(STAGE, ctx.variant, f"NNCF could not quantize the model: {type(exc).__name__}: "
                                             f"{' '.join(str(exc).split())[:300]}") from exc
    give_back(quantized, undone)
    moved = moved_where_openvino_runs(quantized, ctx.variant, ctx.targets)
    # its per-channel pairs before depthwise convolutions make ONNX Runtime's fused QLinearConv fail at run time
    rescaled = per_tensor_at_depthwise(quantized)
    findings = partial(NncfPtqFindings, nncf_version=nncf.__version__, calibration_data=calibration.data or "random",
                       calibration_samples=len(samples), model_type=config.nncf_model_type or "default",
                       reduce_range={"setting": config.reduce_range, "seven_bit": seven_bit, "why": why,
                                     "nncf_overflow_fix": overflow_fix.value},
                       excluded=sorted(config.exclude_nodes), uint8_at_concats=moved,
                       per_tensor_depthwise=rescaled or None, half_precision=widened)
    return quantized, seven_bit, findings
