"""How the int8 accuracy budget's cost grows with a transformer encoder's size, up to BERT-base.

    python benchmarks/budget_cost.py [--sizes 4x384 6x768 12x768] [--tokens 128] [--samples 8]

Each size ``LxD`` is a PyTorch ``TransformerEncoder`` of L layers, d_model D (D/64 heads, 4D feed-forward),
built as ``benchmarks/int8.py`` builds its encoder (outlier LayerNorm channels, 128 tokens); 12x768 is
BERT-base's shape.  The quantize stage runs with ``tolerance: {cosine_min: 0.98}`` on 8 budget samples (the
calibration data, 16 samples).  Columns: float nodes quantized (the candidates), the ranking's and search's
ORT evaluations, seconds of the whole stage, of plain PTQ alone, and of one fp32 inference on ORT, and what
the budget kept float.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8 import qdeploy  # noqa: E402
from benchmarks.int8_models import encoder  # noqa: E402
from qdeploy.stages.quantize import QuantizeConfig  # noqa: E402


def fp32_ms(path: Path, sample: dict) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    session.run(None, sample)
    started = time.perf_counter()
    for _ in range(5):
        session.run(None, sample)
    return (time.perf_counter() - started) / 5 * 1000


def measure(size: str, folder: Path, tokens: int, samples: int) -> str:
    layers, d = (int(part) for part in size.split("x"))
    case = encoder(folder, d=d, heads=max(1, d // 64), layers=layers, tokens=tokens)
    calibration = {"data": "calib", "samples": len(case.calib)}
    plain = qdeploy(case, folder, "plain", QuantizeConfig(calibration=calibration))
    budget = qdeploy(case, folder, "budget", QuantizeConfig(
        calibration=calibration, tolerance={"cosine_min": 0.98}, budget={"samples": samples}))
    plain_s, budget_s, found = plain.seconds, budget.seconds, budget.findings.get("budget", {})
    return (f"| {size} | {case.path.stat().st_size / 1e6:.0f} | {fp32_ms(case.path, case.evaluation[0]):.0f} | "
            f"{found.get('candidates', '-')} | {found.get('evaluations', '-')} | {plain_s:.0f} | "
            f"{budget_s:.0f} | {len(found.get('kept_float', []))} | {found.get('met')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["4x384", "6x768", "12x768"])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    lines = ["| encoder LxD | MB | fp32 ms | candidates | evaluations | ptq s | ptq+budget s | kept float | met |",
             "|---|---|---|---|---|---|---|---|---|"]
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="qdeploy-budget-cost-") as tmp:
            lines.append(measure(size, Path(tmp), args.tokens, args.samples))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    print(f"\n{os.cpu_count()} CPUs; 1-minute load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
