"""The int8 accuracy budget on models where it is hard: what it keeps float, what it costs, and whether the
tolerance holds on samples neither the search nor its confirmation saw.

    python benchmarks/quantize_budget.py [--models detector encoder pp-ocr-det] [--cosine-min 0.98]

- ``detector``: the binarizing detector of ``tests/stages/quantize/budget/test_quantize_budget.py``
  (48 MatMuls whose errors add up; a Sigmoid(1000 x) head hides each one alone).
- ``encoder``: a 4-layer PyTorch transformer encoder with outlier LayerNorm
  channels (skipped without torch).
- ``pp-ocr-det``: PP-OCRv4 det from the rapidocr-onnxruntime wheel on uniform
  noise in [-1, 1] at 160x160 (issue 15's case: 16 budget samples).

Calibration and budget data are one set (as a recipe without ``budget.data``
does); the unseen samples are drawn the same way and used by nothing but this
script.  Columns: candidates, nodes kept float, evaluations, seconds of the
stage, worst cosine on the search / held-back / unseen samples (plain PTQ ->
with the budget), met.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qdeploy.core.compare import compare_outputs  # noqa: E402
from qdeploy.core.tolerance import Tolerance  # noqa: E402
from qdeploy.stages import quantize  # noqa: E402
from qdeploy.stages.quantize import QuantizeConfig  # noqa: E402
from tests.helpers.quantize import artifact_at, run_ort, stage_context  # noqa: E402

Case = tuple[Path, list[np.ndarray], list[np.ndarray]]
"""Model file, budget (and calibration) samples, unseen samples."""


def detector(folder: Path) -> Case:
    from tests.helpers.budget import binarizing_detector, confident_samples

    model = binarizing_detector()
    path = folder / "detector.onnx"
    onnx.save(model, str(path))
    samples = confident_samples(model, 32)
    return path, samples[8:24], samples[24:]


def encoder(folder: Path) -> Case:
    from tests.helpers.budget import TOKENS, WIDTH, outlier_encoder

    rng = np.random.default_rng(1)
    samples = [rng.standard_normal((1, TOKENS, WIDTH)).astype(np.float32) for _ in range(24)]
    return outlier_encoder(folder / "encoder.onnx"), samples[:16], samples[16:]


def pp_ocr_det(folder: Path) -> Case:
    from tests.real_models import PP_OCR_DET, real_model

    rng = np.random.default_rng(0)
    samples = [rng.uniform(-1, 1, (1, 3, 160, 160)).astype(np.float32) for _ in range(20)]
    return real_model(PP_OCR_DET), samples[:16], samples[16:]


CASES: dict[str, Callable[[Path], Case]] = {"detector": detector, "encoder": encoder, "pp-ocr-det": pp_ocr_det}


def unseen_cosine(reference: Path, model: onnx.ModelProto, samples: list[np.ndarray]) -> float:
    name = onnx.load(str(reference), load_external_data=False).graph.input[0].name
    expected = [dict(enumerate(run_ort(reference, {name: x}))) for x in samples]
    got = [dict(enumerate(run_ort(model, {name: x}))) for x in samples]
    return float(compare_outputs(expected, got, Tolerance()).worst()["cosine"])


def row(name: str, folder: Path, cosine_min: float) -> str:
    path, budget, unseen = CASES[name](folder)
    data = folder / f"{name}-data"
    data.mkdir()
    for index, sample in enumerate(budget):
        np.save(data / f"{index:02d}.npy", sample)
    config = QuantizeConfig(calibration={"data": "data", "samples": len(budget)}, tolerance={"cosine_min": cosine_min},
                            budget={"samples": len(budget)}, verify_targets=[])
    started = time.perf_counter()
    result = quantize.run(artifact_at(path), config, stage_context(folder, {"data": data}))
    seconds = time.perf_counter() - started
    found = result.report()["budget"]  # the report form of the budget record
    plain = quantize.run(artifact_at(path), QuantizeConfig(calibration=config.calibration, verify_targets=[]),
                         stage_context(folder, {"data": data}))
    initial, final = found["initial"], found["final"]

    def pair(part: str) -> str:
        return f"{initial[part]['cosine']:.4f} -> {final[part]['cosine']:.4f}" if part in final else "-"

    return (f"| {name} | {found.get('candidates', '-')} | {len(found['kept_float'])} | {found['evaluations']} | "
            f"{seconds:.0f} | {pair('search')} | {pair('held_back')} | {unseen_cosine(path, plain.model, unseen):.4f} "
            f"-> {unseen_cosine(path, result.model, unseen):.4f} | {found['met']} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--cosine-min", type=float, default=0.98)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print("| model | candidates | kept float | evaluations | seconds | search cosine | held-back cosine "
          "| unseen cosine | met |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="qdeploy-budget-") as tmp:
        for name in args.models:
            folder = Path(tmp) / name
            folder.mkdir()
            print(row(name, folder, args.cosine_min), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
