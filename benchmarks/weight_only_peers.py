"""The peers' weight-only int4 builders, as their users call them: ONNX Runtime's ``MatMulNBitsQuantizer`` and NNCF's
``compress_weights``.  Shared by ``weight_only.py`` (the decoder) and ``weight_only_quality.py`` (the MiniLM encoder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def build_ort_tool(source: Path, out: Path, algorithm: str, data: list[dict[str, np.ndarray]] | None, *,
                   group: int = 128) -> Path:
    """ORT's MatMulNBitsQuantizer (int4 symmetric, MatMul weights, accuracy_level 4) as its users call it:
    ``rtn`` (its default config), ``hqq`` or ``gptq`` (a CalibrationDataReader over ``data``)."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization import matmul_nbits_quantizer as mnq

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter(data or [])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.feeds, None)

    ops = ("MatMul",)
    config: Any = {
        "rtn": lambda: mnq.DefaultWeightOnlyQuantConfig(block_size=group, is_symmetric=True, bits=4,
                                                        accuracy_level=4, op_types_to_quantize=ops),
        "hqq": lambda: mnq.HQQWeightOnlyQuantConfig(block_size=group, bits=4, op_types_to_quantize=ops),
        "gptq": lambda: mnq.GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader(), block_size=group,
                                                      op_types_to_quantize=ops),
    }[algorithm]()
    quantizer = mnq.MatMulNBitsQuantizer(onnx.load(str(source)), block_size=group, is_symmetric=True,
                                         accuracy_level=4, algo_config=config)
    quantizer.process()
    onnx.save_model(quantizer.model.model, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)
    return out


def build_nncf(source: Path, out: Path, mode: str, *, group: int = 128, ratio: float = 1.0,
               data: list[dict[str, np.ndarray]] | None = None, awq: bool = False, gptq: bool = False) -> Path:
    """NNCF's compress_weights on the OpenVINO model read from the fp32 ONNX file (group 128, ratio 1: int4 with
    the embedding and LM head in int8, its defaults), with AWQ + scale estimation or GPTQ on ``data``; saved as
    OpenVINO IR."""
    import nncf
    import openvino as ov

    options: dict[str, Any] = {"group_size": group, "ratio": ratio} if mode.startswith("INT4") else {}
    if data is not None:
        options.update(dataset=nncf.Dataset(data), awq=awq, scale_estimation=awq, gptq=gptq)
    compressed = nncf.compress_weights(ov.Core().read_model(str(source)),
                                       mode=getattr(nncf.CompressWeightsMode, mode), **options)
    ov.save_model(compressed, str(out))
    return out


def build_nncf_onnx(source: Path, out: Path, mode: str, *, group: int = 128, ratio: float = 1.0,
                    data: list[dict[str, np.ndarray]] | None = None, scale_estimation: bool = False) -> Path:
    """NNCF's compress_weights on the ONNX model itself (its ONNX backend: an ONNX artifact both runtimes read),
    data-aware on ``data`` (its mixed-precision choice, and scale estimation where asked)."""
    import nncf
    import onnx

    # adjust: a weight whose axis the group does not divide gets a group that does (576-wide layers), as qdeploy
    options: dict[str, Any] = {"group_size": group, "ratio": ratio, "advanced_parameters":
                               nncf.AdvancedCompressionParameters(
                                   group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST)}
    if data is not None:
        options.update(dataset=nncf.Dataset(data), scale_estimation=scale_estimation)
    compressed = nncf.compress_weights(onnx.load(str(source)), mode=getattr(nncf.CompressWeightsMode, mode),
                                       **options)
    out.with_name(out.name + ".data").unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(compressed, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=out.name + ".data", size_threshold=1024)
    return out
