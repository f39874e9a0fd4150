"""The int8 accuracy budget on a task metric, on PP-OCRv4 rec reading rendered text lines (docs/quantize-budget.md).

Text lines are rendered with PIL (its bundled font) from known random strings (letters and digits), 4 lines per
sample; the metric is the character accuracy after CTC greedy decoding (1 - edit distance / characters), with
the dictionary shipped in the model's metadata (rapidocr's wheel).  Compared, each measured on held-out lines on
ort:cpu and openvino:cpu (device default precision), metric drop against float32 on ONNX Runtime (the budget's
and validation's reference) and median latency of one line:

- plain int8 (no budget);
- the cosine budget (``tolerance: {cosine_min: 0.98}``);
- the task-metric budget (``tolerance: {metric: char_accuracy, max_drop: 0.01}``);
- the same, latency-aware (``budget.weigh_latency``);
- NNCF's ``quantize_with_accuracy_control`` on OpenVINO with the same metric, max_drop and data.

    python benchmarks/quantize_budget_task.py [--budget-samples 8] [--held-out 16] [--out /tmp/ocr-budget]

Every quantize run is the stage itself (``qdeploy.stages.quantize.run``) with targets ort:cpu and openvino:cpu.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = Path.home() / ".cache/qdeploy/test-models/rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789"
"""Letters and digits without the pairs a reader cannot tell apart in this font (0/O, 1/l/I)."""
HEIGHT, WIDTH, LINES, MAX_CHARS = 48, 320, 4, 16
MAX_DROP = 0.01
METRIC = '''import numpy as np


def _decode(row):
    out, previous = [], 0
    for index in row:
        if index != previous and index != 0:
            out.append(int(index))
        previous = index
    return out


def _distance(a, b):
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diagonal, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (x != y))
    return row[-1]


def char_accuracy(outputs, labels):
    """1 - edit distance / characters over all lines, after CTC greedy decoding (index 0 is the blank)."""
    probs = np.asarray(next(iter(outputs.values())))
    errors = total = 0
    for row, label in zip(probs.argmax(-1), np.asarray(labels).reshape(len(probs), -1)):
        truth = [int(c) for c in label if c >= 0]
        errors += _distance(_decode(row), truth)
        total += len(truth)
    return 1.0 - errors / max(total, 1)
'''


def characters() -> dict[str, int]:
    """Character -> class index: the model's dictionary (metadata 'character') after the CTC blank."""
    import onnx

    model = onnx.load(str(MODEL), load_external_data=False)
    table = {prop.key: prop.value for prop in model.metadata_props}["character"].splitlines()
    return {char: index for index, char in enumerate(["blank", *table, " "])}


def render(text: str, size: int, shift: int) -> np.ndarray:
    """One line, black on white, 48 px high, left-aligned and padded to 320 px; PP-OCR's normalisation."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=size)
    width = min(int(font.getlength(text)) + 16, WIDTH)
    image = Image.new("RGB", (width, HEIGHT), "white")
    ImageDraw.Draw(image).text((4 + shift, (HEIGHT - size) // 2 - 2), text, fill="black", font=font)
    pixels = (np.asarray(image, dtype=np.float32) / 255.0 - 0.5) / 0.5
    padded = np.zeros((HEIGHT, WIDTH, 3), np.float32)
    padded[:, :width] = pixels
    return padded.transpose(2, 0, 1)


def write_lines(folder: Path, count: int, seed: int, index: dict[str, int]) -> None:
    """``count`` samples of 4 lines each: x [4, 3, 48, 320], label [4, 16] (class indices, -1 padded)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for sample in range(count):
        images, labels = [], np.full((LINES, MAX_CHARS), -1, np.int64)
        for line in range(LINES):
            text = "".join(rng.choice(list(ALPHABET), int(rng.integers(5, 13))))
            images.append(render(text, int(rng.integers(24, 34)), int(rng.integers(0, 8))))
            labels[line, :len(text)] = [index[char] for char in text]
        np.savez(folder / f"{sample:03d}.npz", x=np.stack(images), label=labels)


def load(folder: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    files = sorted(folder.glob("*.npz"))
    return [np.load(path)["x"] for path in files], [np.load(path)["label"] for path in files]


def ort_runner(path: Path) -> Callable[[np.ndarray], np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda x: session.run(None, {"x": x})[0]


def openvino_runner(model: Any) -> Callable[[np.ndarray], np.ndarray]:
    """OpenVINO CPU at the device's default precision (as validation runs int8 artifacts)."""
    import openvino as ov

    compiled = ov.Core().compile_model(model if not isinstance(model, Path) else str(model), "CPU")
    return lambda x: next(iter(compiled(x).values()))


def measure(run: Callable[[np.ndarray], np.ndarray], inputs: list[np.ndarray], labels: list[np.ndarray],
            metric: Callable[..., float]) -> tuple[float, float]:
    """(metric on the held-out lines, median ms of one line)."""
    outputs = np.concatenate([run(x) for x in inputs])
    value = metric({"y": outputs}, np.concatenate(labels))
    one = inputs[0][:1]
    run(one)
    times = []
    for _ in range(15):
        started = time.perf_counter()
        run(one)
        times.append(time.perf_counter() - started)
    return value, 1000 * float(np.median(times))


def quantize_variants(work: Path, budget_samples: int, only: str = "") -> dict[str, tuple[Path, dict[str, Any]]]:
    """The qdeploy variants: name -> (artifact path, budget findings or {})."""
    import onnx

    from qdeploy.calibration import DatasetSpec, data_context
    from qdeploy.core.context import Artifact
    from qdeploy.core.files import sha256_file
    from qdeploy.stages import quantize
    from qdeploy.stages.quantize import CalibrationRef, QuantizeConfig

    artifact = Artifact(path=MODEL, sidecar=work / "float.json", key="float", sha256=sha256_file(MODEL),
                        size_bytes=MODEL.stat().st_size, stages=("export",), parent=None)
    task = {"metric": "metrics.py:char_accuracy", "max_drop": MAX_DROP}
    settings: dict[str, dict[str, Any]] = {
        "plain int8": {},
        "cosine budget (0.98)": {"tolerance": {"cosine_min": 0.98}, "budget": {"samples": budget_samples}},
        f"task-metric budget (max_drop {MAX_DROP})": {"tolerance": task, "budget": {"samples": budget_samples}},
        "task-metric, latency-aware": {"tolerance": task, "budget": {"samples": budget_samples,
                                                                     "weigh_latency": True}},
    }
    made = {}
    for name, extra in settings.items():
        if only not in name:
            continue
        folder = work / name.split(" (")[0].replace(" ", "_").replace(",", "")
        folder.mkdir(parents=True, exist_ok=True)
        context = data_context("v", folder, datasets={"budget": DatasetSpec(reader="npy", path="budget")},
                               resolve=lambda relative: work / relative, targets=("ort:cpu", "openvino:cpu"))
        config = QuantizeConfig(calibration=CalibrationRef(data="budget", samples=budget_samples),
                                verify_targets=[], per_runtime=False, **extra)
        started = time.perf_counter()
        result = quantize.run(artifact, config, context)
        path = work / f"{folder.name}.onnx"
        onnx.save(result.model, str(path))
        budget = result.report().get("budget") or {}
        budget["stage_seconds"] = round(time.perf_counter() - started, 1)
        made[name] = (path, budget)
        print(f"{name}: {budget.get('stage_seconds')} s, met {budget.get('met')}, "
              f"kept float {len(budget.get('kept_float') or [])}", flush=True)
    return made


def nncf_accuracy_control(work: Path, metric: Callable[..., float], budget_samples: int) -> tuple[Any, float]:
    """NNCF's quantize_with_accuracy_control on the OpenVINO model, same data, metric and max_drop."""
    import nncf
    import openvino as ov

    inputs, labels = load(work / "budget")
    inputs, labels = inputs[:budget_samples], labels[:budget_samples]
    items = list(zip(inputs, labels, strict=True))

    def validate(compiled: Any, data: Any) -> float:
        pairs = list(data)
        outputs = np.concatenate([next(iter(compiled(x).values())) for x, _ in pairs])
        return metric({"y": outputs}, np.concatenate([label for _, label in pairs]))

    started = time.perf_counter()
    model = nncf.quantize_with_accuracy_control(
        ov.Core().read_model(str(MODEL)), nncf.Dataset(items, lambda item: item[0]), nncf.Dataset(items),
        validation_fn=validate, max_drop=MAX_DROP, drop_type=nncf.DropType.ABSOLUTE, subset_size=len(items))
    return model, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-samples", type=int, default=8, help="budget samples (4 lines each)")
    parser.add_argument("--held-out", type=int, default=16, help="held-out samples (4 lines each)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/ocr-budget"))
    parser.add_argument("--skip-nncf", action="store_true", help="leave NNCF's accuracy control out")
    parser.add_argument("--only-nncf", action="store_true", help="only float32 and NNCF's accuracy control")
    parser.add_argument("--variants", default="", help="only the qdeploy variants whose name holds this text")
    args = parser.parse_args()
    work = args.out
    work.mkdir(parents=True, exist_ok=True)
    (work / "metrics.py").write_text(METRIC)
    namespace: dict[str, Any] = {}
    exec(METRIC, namespace)  # the same function the stage loads
    metric = namespace["char_accuracy"]
    index = characters()
    write_lines(work / "budget", args.budget_samples, 1, index)
    write_lines(work / "held_out", args.held_out, 2, index)
    inputs, labels = load(work / "held_out")

    rows: dict[str, dict[str, Any]] = {}
    reference = {"ort:cpu": measure(ort_runner(MODEL), inputs, labels, metric),
                 "openvino:cpu": measure(openvino_runner(MODEL), inputs, labels, metric)}
    rows["float32"] = {"targets": reference, "budget": {}}
    made = {} if args.only_nncf else quantize_variants(work, args.budget_samples, args.variants)
    for name, (path, budget) in made.items():
        rows[name] = {"targets": {"ort:cpu": measure(ort_runner(path), inputs, labels, metric),
                                  "openvino:cpu": measure(openvino_runner(path), inputs, labels, metric)},
                      "budget": budget}
        print(f"{name}: held-out {rows[name]['targets']}", flush=True)
    if not args.skip_nncf:
        model, seconds = nncf_accuracy_control(work, metric, args.budget_samples)
        rows["NNCF quantize_with_accuracy_control"] = {
            "targets": {"openvino:cpu": measure(openvino_runner(model), inputs, labels, metric)},
            "budget": {"stage_seconds": round(seconds, 1)}}
    print(f"\nheld-out: {args.held_out * LINES} lines; budget: {args.budget_samples * LINES} lines; float32 char "
          f"accuracy ort:cpu {reference['ort:cpu'][0]:.4f}, openvino:cpu {reference['openvino:cpu'][0]:.4f}\n")
    print("| variant | drop ort:cpu | ms/line ort:cpu | drop openvino:cpu | ms/line openvino:cpu | kept float | "
          "met | evaluations | stage s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        cells = []
        for target in ("ort:cpu", "openvino:cpu"):
            value = row["targets"].get(target)
            # against float32 on ONNX Runtime, the budget's and validation's reference
            cells += ["–", "–"] if value is None else [f"{reference['ort:cpu'][0] - value[0]:+.4f}",
                                                       f"{value[1]:.1f}"]
        budget = row["budget"]
        kept = len(budget["kept_float"]) if "kept_float" in budget else "–"
        print(f"| {name} | {' | '.join(cells)} | {kept} | {budget.get('met', '–')} | "
              f"{budget.get('evaluations', '–')} | {budget.get('stage_seconds', '–')} |")
    (work / "results.json").write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
