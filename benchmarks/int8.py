"""qdeploy's int8 artifacts against ONNX Runtime's ``quantize_static`` defaults and NNCF: latency and fidelity.

    python benchmarks/int8.py [--models demo resnet18 encoder pp-ocr-det pp-ocr-rec] [--iterations 20]
                              [--rounds 5] [--threads 1]

Models: the demo CNN (its recipe's validation samples), a ResNet-18 built here with torch (random
weights, 1x3x224x224), a transformer encoder built here with torch (4 layers, d_model 384, 128 tokens,
a few LayerNorm channels with a large gain: the outlier features of trained transformers), and the
PP-OCRv4 detection and recognition models of the rapidocr-onnxruntime wheel when
``QDEPLOY_REAL_MODELS`` (or ``python -m tests.real_models``) provides them, fed rendered text images.
Calibration and evaluation use different samples of the same kind.

Artifacts per model:
- ``fp32``: the float model;
- ``ort-default``: ``quantize_static(model, output, reader)`` with ONNX Runtime's defaults (QDQ, int8
  activations and weights, per-tensor, MinMax, every op type it knows);
- ``qdeploy``: the quantize stage with its defaults (op set 'balanced', uint8 activations, int8
  per-channel weights, minmax), calibrated on the same samples;
- ``qdeploy@ort``: the same shaped for ONNX Runtime (``runtime: ort``): on AMX CPUs its deep convolutions run on
  ONNX Runtime's AMX GEMM (weight zero point -1), elsewhere it is ``qdeploy``;
- ``qdeploy@openvino``: the same shaped for OpenVINO (``runtime: openvino``, what ``per_runtime`` builds for
  ``openvino:*`` targets); the goals judge ``qdeploy`` on ONNX Runtime and this one on OpenVINO;
  ``qdeploy@openvino-sym`` (``--openvino-symmetric``) the same with symmetric int8 activations;
- ``qdeploy+budget`` (encoder): the same with ``tolerance: {cosine_min: 0.98}`` on the calibration data;
- ``qdeploy+smooth`` (encoder): the same with ``smooth_quant: 0.8`` (SmoothQuant);
- ``nncf`` / ``nncf-transformer`` (encoder): NNCF's ``nncf.quantize`` on the ONNX model, defaults and
  ``model_type=TRANSFORMER`` (``benchmarks/int8_peers.py``; missing rows say NNCF is not installed).

Then the machine's ceiling: a large MatMul in fp32 and int8 on each runtime (``--ceiling-size``), and per
model and runtime qdeploy's default (``per_runtime: auto``: ``qdeploy@openvino`` on OpenVINO where the
placements differ for the model, else ``qdeploy``; the decision is printed), its speedup over fp32, its share of
the ceiling's int8 gain, its latency ratio and cosine against each peer, the goal against the fastest peer (at
most 1.05x its latency at a cosine no lower than its minus 0.002), and the one-graph (``per_runtime: false``) and
per-runtime graphs beside it.

Latency through qdeploy's target adapters (``ort:cpu``, ``openvino:cpu`` pinned to f32, and ``openvino:cpu
default``: every artifact at OpenVINO's default inference precision, bf16 float parts on AMX and AVX512-BF16 CPUs,
which is how a user deploys it; its speedups are against the fp32 model at that default), artifacts taking turns
in ``--rounds`` rounds of ``--iterations`` timed runs after warm-up; the median of the round medians is reported.
Fidelity: worst cosine against fp32 over the evaluation samples on ORT.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8_models import BUILDERS, Case, Samples  # noqa: E402
from benchmarks.int8_peers import ceiling, ceiling_lines, nncf_artifacts  # noqa: E402
from qdeploy.calibration import data_context  # noqa: E402
from qdeploy.core.compare import compare_outputs  # noqa: E402
from qdeploy.core.context import Artifact  # noqa: E402
from qdeploy.core.tolerance import Tolerance  # noqa: E402
from qdeploy.pipeline.recipe.schema import DatasetSpec  # noqa: E402
from qdeploy.stages import quantize  # noqa: E402
from qdeploy.stages.quantize import QuantizeConfig  # noqa: E402
from qdeploy.targets import get_target  # noqa: E402
from qdeploy.targets.cpu_facts import device_precisions  # noqa: E402
from qdeploy.targets.int8_path import cpu_flags, int8_path  # noqa: E402

log = logging.getLogger("benchmarks.int8")
TARGETS = ("ort:cpu", "openvino:cpu")
AT_DEFAULT = "openvino:cpu default"
"""Timed like ``openvino:cpu`` but at the device's default precision (not pinned to f32)."""
TIMED = {"ort:cpu": ("ort:cpu", True), "openvino:cpu": ("openvino:cpu", True), AT_DEFAULT: ("openvino:cpu", False)}
"""Column -> (target, pinned to f32)."""


@dataclass
class Row:
    model: str
    artifact: str
    path: Path
    seconds: float
    cosine: float | None = None
    snr_db: float | None = None
    on_openvino: tuple[float, float] | None = None
    """Worst cosine and SNR against fp32 where OpenVINO (pinned to f32) runs both: its kernels, not ORT's."""
    latency: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    kernels: dict[str, Any] = field(default_factory=dict)
    findings: dict[str, Any] = field(default_factory=dict)
    """The quantize stage's findings (qdeploy's rows)."""


# ---- artifacts --------------------------------------------------------------------------------------------


def ort_default(case: Case, folder: Path) -> Row:
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self._samples = iter(case.calib)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._samples, None)

    output = folder / f"{case.name}-ort-default.onnx"
    started = time.perf_counter()
    quantize_static(str(case.path), str(output), Reader())
    return Row(case.name, "ort-default", output, time.perf_counter() - started)


def case_artifact(case: Case) -> Artifact:
    """The case's model file as a stage's input artifact (an exported model; no sidecar, key or hash needed)."""
    return Artifact(path=case.path, sidecar=case.path.with_suffix(".json"), key="k", sha256="s",
                    size_bytes=case.path.stat().st_size, stages=("export",), parent=None)


def qdeploy(case: Case, folder: Path, label: str, config: QuantizeConfig, targets: tuple[str, ...] = ()) -> Row:
    """The quantize stage on ``case`` as variant ``label`` (``x@openvino``: a per-runtime build), for ``targets``
    (unknown when empty)."""
    data = folder / f"{case.name}-calib"
    data.mkdir(exist_ok=True)
    for index, sample in enumerate(case.calib):
        np.savez(data / f"{index:03d}.npz", **sample)
    work = folder / f"{case.name}-{label}-work"
    work.mkdir(exist_ok=True)
    artifact = case_artifact(case)
    started = time.perf_counter()
    context = data_context(label, work, datasets={"calib": DatasetSpec(reader="npy", path=str(data))},
                           targets=targets)
    result = quantize.run(artifact, config, context)
    seconds = time.perf_counter() - started
    output = folder / f"{case.name}-{label}.onnx"
    onnx.save(result.model, str(output))
    found = result.report()  # the rows keep the report's form of the findings
    row = Row(case.name, label, output, seconds, kernels=found.get("int8_kernels", {}), findings=found)
    if "budget" in found:
        budget = found["budget"]
        log.info("%s budget: met %s, %d kept float, %d evaluations", case.name, budget["met"],
                 len(budget["kept_float"]), budget["evaluations"])
    return row


def nncf_rows(case: Case, folder: Path) -> list[Row]:
    """NNCF's nncf.quantize (defaults; and model_type TRANSFORMER for the encoder) on the same calibration."""
    built, note = nncf_artifacts(case.path, case.calib, folder, transformer=case.budget)
    if note:
        log.info("%s: %s", case.name, note)
    return [Row(case.name, label, path, seconds) for label, path, seconds in built]


def qdeploy_rows(case: Case, folder: Path, openvino_symmetric: bool = False) -> list[Row]:
    calibration = {"data": "calib", "samples": len(case.calib)}
    rows = [qdeploy(case, folder, "qdeploy", QuantizeConfig(calibration=calibration)),
            qdeploy(case, folder, "qdeploy@ort", QuantizeConfig(calibration=calibration, runtime="ort")),
            qdeploy(case, folder, "qdeploy@openvino", QuantizeConfig(calibration=calibration, runtime="openvino"))]
    if openvino_symmetric:
        rows.append(qdeploy(case, folder, "qdeploy@openvino-sym", QuantizeConfig(
            calibration=calibration, runtime="openvino", activation_type="int8", symmetric_activations=True)))
    if case.budget:
        config = QuantizeConfig(calibration=calibration, tolerance={"cosine_min": 0.98},
                                budget={"samples": 8})
        rows.append(qdeploy(case, folder, "qdeploy+budget", config))
        rows.append(qdeploy(case, folder, "qdeploy+smooth", QuantizeConfig(calibration=calibration,
                                                                          smooth_quant=0.8)))
    return rows


# ---- measurement ------------------------------------------------------------------------------------------


def fidelity(rows: list[Row], case: Case) -> None:
    """Worst cosine over outputs of each artifact against fp32 on the evaluation samples, on ORT and on OpenVINO
    pinned to f32 (each runtime's int8 kernels; an artifact OpenVINO cannot load keeps None there)."""
    reference = outputs(case.path, case.evaluation)
    on_openvino = outputs(case.path, case.evaluation, "openvino:cpu")
    for row in rows:
        worst = compare_outputs(reference, outputs(row.path, case.evaluation), Tolerance()).worst()
        row.cosine, row.snr_db = worst["cosine"], worst["snr_db"]
        try:
            worst = compare_outputs(on_openvino, outputs(row.path, case.evaluation, "openvino:cpu"),
                                    Tolerance()).worst()
        except Exception:  # a runtime refusing an artifact is a result here (the latency says why)
            continue
        row.on_openvino = (worst["cosine"], worst["snr_db"])


def outputs(path: Path, samples: Samples, target: str = "ort:cpu") -> Samples:
    with get_target(target).load(path, pin_f32=True) as session:
        return [session.run(sample) for sample in samples]


def latency(rows: list[Row], sample: dict[str, np.ndarray], iterations: int, rounds: int,
            threads: int | None) -> None:
    """Median of per-round medians; the artifacts take turns each round so that load drifts hit all alike.
    An artifact a target cannot load gets no latency and the reason."""
    for column, (target, pinned) in TIMED.items():
        sessions: dict[int, Any] = {}
        for index, row in enumerate(rows):
            try:
                sessions[index] = get_target(target).load(row.path, threads=threads, pin_f32=pinned)
                for _ in range(3):
                    sessions[index].run(sample)
            except Exception as exc:  # a runtime refusing an artifact is a result here
                row.failures[column] = f"{type(exc).__name__}: {str(exc)[:160]}"
                sessions.pop(index, None)
        medians: dict[int, list[float]] = {index: [] for index in sessions}
        for _ in range(rounds):
            for index, session in sessions.items():
                times = []
                for _ in range(iterations):
                    started = time.perf_counter()
                    session.run(sample)
                    times.append(time.perf_counter() - started)
                medians[index].append(statistics.median(times))
        for index, session in sessions.items():
            rows[index].latency[column] = statistics.median(medians[index]) * 1e3
            session.close()


# ---- report -----------------------------------------------------------------------------------------------


def table(rows: list[Row]) -> list[str]:
    lines = ["| model | artifact | ort:cpu ms | openvino:cpu ms | ov default ms | speedup ort / ov / ov default |"
             " cosine vs fp32 ort / ov | SNR dB ort / ov | int8 ort / ov | build s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fp32 = {row.model: row for row in rows if row.artifact == "fp32"}
    for row in rows:
        base = fp32[row.model]
        speedups = " / ".join(f"{base.latency[t] / row.latency[t]:.2f}x" if t in row.latency and t in base.latency
                              else "-" for t in TIMED)
        kernels = " / ".join(_kernels(row.kernels.get(t)) for t in TARGETS) if row.kernels else "-"
        cosine = f"{_cos(row)} / {_cos(row, 'openvino:cpu')}"
        snr = (f"{row.snr_db:.1f}" if row.snr_db is not None else "-") + " / " + \
            (f"{row.on_openvino[1]:.1f}" if row.on_openvino else "-")
        times = " | ".join(f"{row.latency[t]:.2f}" if t in row.latency else "fails to load" for t in TIMED)
        lines.append(f"| {row.model} | {row.artifact} | {times} | {speedups} | {cosine} | {snr} | {kernels} | "
                     f"{row.seconds:.1f} |")
    failures = [f"- {row.model} {row.artifact} on {target}: {reason}" for row in rows
                for target, reason in row.failures.items()]
    return lines + (["", *failures] if failures else [])


def print_model_table(header: list[str], models: list[str], prefix: str,
                      model_lines: Callable[[str, Path, int, int], list[str]], iterations: int, rounds: int) -> None:
    """A table of ``model_lines(name, folder, iterations, rounds)`` per model, built in one temporary folder,
    under the machine's line."""
    lines = list(header)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        for name in models:
            lines += model_lines(name, Path(tmp), iterations, rounds)
    print(machine_line())
    print("\n".join(lines))


def machine_line() -> str:
    """The CPU kind the table was measured on: its int8 path (VNNI, AMX...) and OpenVINO's default precision."""
    flags, _ = cpu_flags()
    known = ("amx_int8", "amx_bf16", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx2")
    shown = [flag for flag in known if flag in flags]
    default = device_precisions("CPU").default
    return (f"CPU: {int8_path(flags).kind} int8 path ({', '.join(shown) or 'no int8 flags'}); OpenVINO's default "
            f"precision there: {default}; {os.cpu_count()} cores\n")


def _kernels(counted: dict[str, Any] | None) -> str:
    if not counted or "int8" not in counted:
        return "?"
    return f"{counted['int8']}/{counted['quantizable']}"


PEERS = ("ort-default", "nncf", "nncf-transformer")
OURS = {"ort:cpu": "qdeploy@ort", "openvino:cpu": "qdeploy@openvino"}
"""qdeploy's per-runtime artifact for each target: what ``per_runtime: true`` builds (``qdeploy`` is the one
graph ``per_runtime: false`` builds; ``qdeploy@ort`` differs from it on AMX CPUs only, where its deep
convolutions run on ONNX Runtime's AMX GEMM: ``stages/quantize/ptq/_amx_convs.py``)."""


def placements(case: Case, folder: Path) -> list[str]:
    """Nodes whose Q/DQ placement differs between the runtimes' builds: what ``per_runtime: auto`` decides on."""
    from qdeploy.stages.quantize.ptq._placement import placement_differences

    return placement_differences(case.path, QuantizeConfig(), folder / f"{case.name}-placement")


def peer_goals(rows: list[Row], gains: dict[str, dict[str, float]], decided: dict[str, list[str]]) -> list[str]:
    """Per model and runtime: qdeploy's default (per_runtime auto, ``decided``: the nodes whose placement differs)
    against each peer and the fastest (goal: at most 1.05x its latency at a cosine no lower than its minus 0.002),
    against fp32 (never slower), its int8 gain as a share of the ceiling's, and the other qdeploy graph."""
    by = {(row.model, row.artifact): row for row in rows}
    lines = []
    for model in dict.fromkeys(row.model for row in rows):
        base, nodes = by[(model, "fp32")], decided.get(model, [])
        lines.append(f"- {model}: per_runtime auto: " + (f"one graph per runtime: placements differ at {len(nodes)} "
                     "nodes" if nodes else "one graph for both runtimes: placements agree"))
        for target in TARGETS:
            ours = by.get((model, OURS[target] if nodes else "qdeploy")) or by.get((model, "qdeploy"))
            if ours is None:
                continue
            peers = [by[(model, p)] for p in PEERS if (model, p) in by and target in by[(model, p)].latency]
            if target not in ours.latency or target not in base.latency:
                continue
            speedup = base.latency[target] / ours.latency[target]
            faster = "faster" if speedup >= 1 else "not faster"
            line = f"- {model} on {target}: default {ours.artifact} {speedup:.2f}x fp32 ({faster} than fp32)"
            if target in gains:
                line += f"; {speedup / gains[target]['gain']:.0%} of the ceiling's int8 gain"
            line += "".join(f"; {ours.latency[target] / peer.latency[target]:.2f}x {peer.artifact}'s latency, "
                            f"cosine {_cos(ours, target)} vs {_cos(peer, target)}" for peer in peers)
            if peers:
                best = min(peers, key=lambda row: row.latency[target])
                mine, theirs = _cosine(ours, target), _cosine(best, target)
                close = mine is not None and theirs is not None and mine >= theirs - 0.002
                met = ours.latency[target] / best.latency[target] <= 1.05 and close
                line += f"; against the fastest peer ({best.artifact}): goal {'met' if met else 'missed'}"
            other = by.get((model, OURS["openvino:cpu"] if target == "ort:cpu" else "qdeploy"))
            if other is not None and other is not ours and target in other.latency:  # the graph auto did not pick
                line += f"; {other.artifact} {other.latency[target] / ours.latency[target]:.2f}x the default's latency"
            lines.append(line)
        lines += _at_default(model, by, OURS["openvino:cpu"] if nodes else "qdeploy")
    return lines


def _at_default(model: str, by: dict[tuple[str, str], Row], ours_name: str) -> list[str]:
    """int8 as a user deploys it on OpenVINO (the device's default precision) against the fp32 model there, the
    baseline a user who does not quantize gets, and against NNCF there: worth shipping at 1.5x, ahead at 0.95x."""
    base, ours, nncf = by.get((model, "fp32")), by.get((model, ours_name)), by.get((model, "nncf"))
    if base is None or ours is None or AT_DEFAULT not in ours.latency or AT_DEFAULT not in base.latency:
        return []
    gain = base.latency[AT_DEFAULT] / ours.latency[AT_DEFAULT]
    verdict = "pays" if gain >= 1.5 else "gains under 1.5x" if gain > 1 else "does not pay: fp32 at the default ships"
    line = f"- {model} on {AT_DEFAULT}: {ours.artifact} {gain:.2f}x fp32 at the default ({verdict})"
    if nncf is not None and AT_DEFAULT in nncf.latency:
        ratio = ours.latency[AT_DEFAULT] / nncf.latency[AT_DEFAULT]
        line += f"; {ratio:.2f}x NNCF's latency there (goal <= 0.95x: {'met' if ratio <= 0.95 else 'missed'})"
    return [line]


def _cosine(row: Row, target: str = "ort:cpu") -> float | None:
    """The row's worst cosine against fp32 where ``target``'s runtime runs both."""
    if target.startswith("openvino"):
        return row.on_openvino[0] if row.on_openvino else None
    return row.cosine


def _cos(row: Row, target: str = "ort:cpu") -> str:
    value = _cosine(row, target)
    return f"{value:.4f}" if value is not None else "-"


def goals(rows: list[Row]) -> list[str]:
    by = {(row.model, row.artifact): row for row in rows}
    lines = []
    for model in dict.fromkeys(row.model for row in rows):
        ours, theirs, base = by.get((model, "qdeploy")), by.get((model, "ort-default")), by[(model, "fp32")]
        if ours and theirs:
            faster = [t for t in TARGETS if t in ours.latency and ours.latency[t] <= theirs.latency.get(t, np.inf)]
            lines.append(f"- {model}: qdeploy at least as fast as ort-default on {faster or 'no target'}; cosine "
                         f"{ours.cosine:.4f} vs {theirs.cosine:.4f}")
        budget = by.get((model, "qdeploy+budget"))
        if budget and ours:
            faster = all(budget.latency.get(t, np.inf) < base.latency[t] for t in TARGETS)
            lines.append(f"- {model}: plain cosine {ours.cosine:.4f}; budget cosine {budget.cosine:.4f}, faster "
                         f"than fp32 on both targets: {faster}")
    resnet = by.get(("resnet18", "qdeploy"))
    if resnet:
        speedup = by[("resnet18", "fp32")].latency["openvino:cpu"] / resnet.latency["openvino:cpu"]
        lines.append(f"- resnet18 int8 vs fp32 on openvino:cpu: {speedup:.2f}x (goal >= 2.5x)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[name for name in BUILDERS
                                                       if name not in ("layout", "orientation", "word-segmenter")],
                        choices=list(BUILDERS))
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (runtime default when absent)")
    parser.add_argument("--openvino-symmetric", action="store_true",
                        help="also qdeploy@openvino-sym: the OpenVINO graph with symmetric int8 activations")
    parser.add_argument("--ceiling-size", type=int, default=1024, help="the ceiling MatMul's size (0: skip it)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("qdeploy.stages", "qdeploy.calibration", "root"):  # ORT's quantizer warns through the root logger
        logging.getLogger(noisy).setLevel(logging.ERROR)
    log.setLevel(logging.INFO)
    rows: list[Row] = []
    decided: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="qdeploy-int8-bench-") as tmp:
        folder = Path(tmp)
        for name in args.models:
            case = BUILDERS[name](folder)
            if case is None:
                continue
            log.info("%s: quantizing", name)
            decided[name] = placements(case, folder)
            model_rows = [Row(name, "fp32", case.path, 0.0), ort_default(case, folder), *nncf_rows(case, folder),
                          *qdeploy_rows(case, folder, args.openvino_symmetric)]
            fidelity(model_rows, case)
            log.info("%s: timing", name)
            latency(model_rows, case.evaluation[0], args.iterations, args.rounds, args.threads)
            rows += model_rows
            log.info("\n".join(table(model_rows)))
    gains = ceiling(TARGETS, size=args.ceiling_size, threads=args.threads or 1) if args.ceiling_size else {}
    print(machine_line())
    print("\n".join(table(rows)))
    if gains:
        print("\n".join(["", *ceiling_lines(gains, args.ceiling_size, args.threads or 1)]))
    print("\n".join(["", *goals(rows), *peer_goals(rows, gains, decided)]))
    print(f"\n1-minute load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
