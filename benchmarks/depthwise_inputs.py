"""A scale per channel at depthwise convolution inputs (``stages/quantize/ptq/_depthwise.py``): OpenVINO's graph
with and without it, beside NNCF's.

    python benchmarks/depthwise_inputs.py [--models layout pp-ocr-det pp-ocr-rec] [--iterations 10] [--rounds 3]
                                          [--headrooms 1 3 ...] [--layout-pages CALIBRATION EVALUATION]

Per model of ``benchmarks/int8_models.py``: the quantize stage's graph for OpenVINO (``int8@openvino``,
``runtime: openvino``, defaults) as built now, the same build with the rescaling switched off (this process only),
and NNCF's ``nncf.quantize`` (defaults) on the model file as it is and after qdeploy's simplify (BatchNormalization
folded, what a recipe's ``[simplify, {quantize: {engine: nncf}}]`` hands it).  Per graph: the depthwise
convolutions rescaled, the worst cosine over the evaluation samples against fp32 on ONNX Runtime and on OpenVINO
pinned to f32 (each against fp32 on the same runtime), and the median ms per call on OpenVINO at its default
precision (bf16 float parts on CPUs with AVX512-BF16 or AMX), the graphs taking turns each round.
``--headrooms``: also the build at each of these ``_depthwise.HEADROOM`` values; ``--layout-pages``: the layout
detector's calibration and evaluation page counts.
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8 import (  # noqa: E402
    AT_DEFAULT,
    Row,
    case_artifact,
    latency,
    nncf_rows,
    outputs,
    print_model_table,
    qdeploy,
)
from benchmarks.int8_models import BUILDERS, Case, layout  # noqa: E402
from benchmarks.int8_peers import nncf_artifacts  # noqa: E402
from qdeploy.calibration import data_context  # noqa: E402
from qdeploy.core.compare import compare_outputs  # noqa: E402
from qdeploy.core.tolerance import Tolerance  # noqa: E402
from qdeploy.stages import simplify  # noqa: E402
from qdeploy.stages.quantize import QuantizeConfig  # noqa: E402
from qdeploy.stages.quantize.ptq import _depthwise, _ptq  # noqa: E402
from qdeploy.stages.simplify import SimplifyConfig  # noqa: E402


def builds(case: Case, folder: Path, headrooms: tuple[float, ...] = ()) -> list[Row]:
    config = QuantizeConfig(calibration={"data": "calib", "samples": len(case.calib)}, runtime="openvino")
    rows = [qdeploy(case, folder, "int8@openvino", config, ("openvino:cpu",))]
    shipped = _depthwise.HEADROOM
    try:
        for headroom in headrooms:
            _depthwise.HEADROOM = headroom
            rows.append(qdeploy(case, folder, f"headroom {headroom:g}@openvino", config, ("openvino:cpu",)))
    finally:
        _depthwise.HEADROOM = shipped
    rescale = _ptq.per_channel_at_depthwise
    _ptq.per_channel_at_depthwise = lambda *args, **kwargs: []  # type: ignore[assignment]
    try:
        rows.append(qdeploy(case, folder, "off@openvino", config, ("openvino:cpu",)))
    finally:
        _ptq.per_channel_at_depthwise = rescale
    rows += [row for row in nncf_rows(case, folder) if row.artifact == "nncf"]
    # NNCF on the model a recipe hands it: after qdeploy's simplify (BatchNormalization folded into the Convs)
    for label, path, seconds in nncf_artifacts(simplified(case, folder), case.calib, folder, transformer=False)[0]:
        rows.append(Row(case.name, f"{label} after simplify", path, seconds))
    return rows


def simplified(case: Case, folder: Path) -> Path:
    """The case's model through qdeploy's simplify stage (its defaults), saved."""
    work = folder / f"{case.name}-simplify-work"
    work.mkdir(exist_ok=True)
    output = folder / f"{case.name}-simplified.onnx"
    onnx.save(simplify.run(case_artifact(case), SimplifyConfig(), data_context("simplify", work)).model, str(output))
    return output


def model_lines(name: str, folder: Path, iterations: int, rounds: int, headrooms: tuple[float, ...] = (),
                pages: tuple[int, int] | None = None) -> list[str]:
    case = BUILDERS[name](folder) if name != "layout" or pages is None else layout(folder, *pages)
    if case is None:
        return [f"| {name} | not available here | | | |"]
    rows = builds(case, folder, headrooms)
    latency(rows, case.evaluation[0], iterations, rounds, 1)
    references = {target: outputs(case.path, case.evaluation, target) for target in ("ort:cpu", "openvino:cpu")}
    lines = []
    for row in rows:
        cosines = [compare_outputs(references[target], outputs(row.path, case.evaluation, target),
                                   Tolerance()).worst()["cosine"] for target in references]
        rescaled = len(row.findings.get("per_channel_depthwise") or []) if row.findings else ""
        ms = row.latency.get(AT_DEFAULT, float("nan"))
        lines.append(f"| {name} | {row.artifact} | {rescaled} | {cosines[0]:.4f} / {cosines[1]:.4f} | {ms:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["layout", "pp-ocr-det", "pp-ocr-rec"], choices=list(BUILDERS))
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--headrooms", nargs="*", type=float, default=[])
    parser.add_argument("--layout-pages", nargs=2, type=int, metavar=("CALIBRATION", "EVALUATION"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    header = ["| model | graph | depthwise inputs rescaled | worst cosine ORT / OpenVINO f32 | ms OpenVINO default |",
             "|---|---|---|---|---|"]
    lines = partial(model_lines, headrooms=tuple(args.headrooms),
                    pages=tuple(args.layout_pages) if args.layout_pages else None)
    print_model_table(header, args.models, "qdeploy-depthwise-", lines, args.iterations, args.rounds)


if __name__ == "__main__":
    main()
