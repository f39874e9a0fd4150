"""qdeploy's fp16 stage against onnxconverter-common called directly: wall time and fidelity.

    python benchmarks/fp16.py [--repeat 3] [--samples 2] [--raw-evaluator] [--budget]
        [--models demo encoder attention layernorm rmsnorm pp-ocr-rec pp-ocr-det pp-ocr-det-noise]

Models: the demo CNN (with its recipe's validation samples), a PyTorch transformer
encoder built here (4 layers, d_model 128; skipped without torch), an unnormalized
attention block, an exported-style LayerNorm (Pow) and an RMSNorm (Mul x*x, Reciprocal) fed
transformer-like activations with outlier channels (all overflow float16), and the PP-OCRv4
recognition and detection models from the rapidocr-onnxruntime wheel, found in
``QDEPLOY_REAL_MODELS`` or ``~/.cache/qdeploy/test-models`` (``python -m tests.real_models``
fills it); the detector is fed synthetic text pages of 320x320, or uniform noise (-noise).

Timing (median of ``--repeat`` runs after one warm-up, the tools taking turns so that drifting
machine load affects them alike), each starting from the model file:
- converter: ``onnx.load`` + ``convert_float_to_float16(model, keep_io_types=True)`` with its
  defaults, as its users call it;
- qdeploy: the stage's ``run`` with its defaults and no data (block lists, schema rules,
  static patterns, type repair, onnx.checker full check, ORT load); "no ORT" sets
  ``onnxruntime_check: false``;
  "+data" adds ``calibration`` (activation analysis on the calibration samples and the
  float16 emulation check), timed once.

Fidelity of each artifact against the float32 model on ORT, over ``--samples`` evaluation
samples that the calibration never saw, under true float16 arithmetic (onnx's reference
evaluator, every op in its declared precision, with qdeploy's kernel corrections, see
qdeploy.targets.evaluator; ``--raw-evaluator`` uses onnx's kernels as they are): worst cosine
and SNR over outputs, largest absolute error, and the count of NaN/Inf values.  The ``ort``
column gives the same cosine on ORT's CPU provider, which computes many float16 ops in float32
and can hide overflow.  The row "float32" runs the float32 model itself through the evaluator:
how far the evaluator agrees with ORT before any float16 is involved.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qdeploy.calibration import data_context  # noqa: E402
from qdeploy.core.compare import compare_outputs  # noqa: E402
from qdeploy.core.context import Artifact  # noqa: E402
from qdeploy.core.tolerance import Tolerance  # noqa: E402
from qdeploy.pipeline.recipe.schema import DatasetSpec  # noqa: E402
from qdeploy.stages import fp16  # noqa: E402
from qdeploy.stages.fp16 import Fp16Config  # noqa: E402

log = logging.getLogger("benchmarks.fp16")
Samples = list[dict[str, np.ndarray]]
T, D = 64, 128


# ---- models: (path, calibration samples, evaluation samples) ----------------------------------


def demo(folder: Path, count: int) -> tuple[Path, Samples, Samples]:
    files = sorted((REPO / "recipes" / "data" / "val").glob("*.npy"))
    arrays = [np.load(path).astype(np.float32) for path in files]
    samples = [{"input": array[None] if array.ndim == 3 else array} for array in arrays]
    return REPO / "recipes" / "models" / "demo_cnn.onnx", samples[:4], samples[4:4 + count]


def encoder(folder: Path, count: int) -> tuple[Path, Samples, Samples]:
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=D, nhead=4, dim_feedforward=4 * D, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).eval()
    path = folder / "encoder.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(1, T, D),), str(path), input_names=["x"], output_names=["y"],
                          opset_version=17, dynamo=False)
    rng = np.random.default_rng(0)
    draw = [{"x": rng.standard_normal((1, T, D)).astype(np.float32)} for _ in range(4 + count)]
    return path, draw[:4], draw[4:]


def _hidden_states(rng: np.random.Generator, scale: float) -> np.ndarray:
    x = rng.standard_normal((1, T, D)) * scale
    x[..., :3] *= 40  # outlier channels, as real transformer activations have
    return x.astype(np.float32)


def _save(folder: Path, name: str, nodes: list[Any], inits: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", 1, [1, T, D])],
                              [helper.make_tensor_value_info("y", 1, [1, T, D])],
                              [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = folder / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def attention(folder: Path, count: int) -> tuple[Path, Samples, Samples]:
    rng = np.random.default_rng(0)
    inits = {"Wq": rng.standard_normal((D, D)), "Wk": rng.standard_normal((D, D)),
             "Wv": rng.standard_normal((D, D)) * 0.1}
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["x", "Wk"], ["k"], name="k_proj"),
             helper.make_node("MatMul", ["x", "Wv"], ["v"], name="v_proj"),
             helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
             helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="context")]
    draw = [{"x": _hidden_states(rng, 0.5)} for _ in range(4 + count)]
    return _save(folder, "attention", nodes, inits), draw[:4], draw[4:]


def layernorm(folder: Path, count: int) -> tuple[Path, Samples, Samples]:
    rng = np.random.default_rng(1)
    inits = {"two": 2.0, "eps": 1e-5, "gamma": np.ones(D), "beta": np.zeros(D),
             "W": rng.standard_normal((D, D)) * 0.1}
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], name="mean", axes=[-1]),
             helper.make_node("Sub", ["x", "mean"], ["c"], name="center"),
             helper.make_node("Pow", ["c", "two"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq"], ["var"], name="variance", axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["std"], name="std"),
             helper.make_node("Div", ["c", "std"], ["n"], name="normalize"),
             helper.make_node("Mul", ["n", "gamma"], ["g"], name="gamma"),
             helper.make_node("Add", ["g", "beta"], ["ln"], name="beta"),
             helper.make_node("MatMul", ["ln", "W"], ["y"], name="proj")]
    draw = [{"x": _hidden_states(rng, 8.0)} for _ in range(4 + count)]
    return _save(folder, "layernorm", nodes, inits), draw[:4], draw[4:]


def rmsnorm(folder: Path, count: int) -> tuple[Path, Samples, Samples]:
    rng = np.random.default_rng(2)
    inits = {"eps": 1e-6, "weight": rng.uniform(0.5, 1.5, D), "W": rng.standard_normal((D, D)) * 0.1}
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq"], ["ms"], name="mean_square", axes=[-1]),
             helper.make_node("Add", ["ms", "eps"], ["mse"], name="add_eps"),
             helper.make_node("Sqrt", ["mse"], ["rms"], name="rms"),
             helper.make_node("Reciprocal", ["rms"], ["inv"], name="inverse"),
             helper.make_node("Mul", ["x", "inv"], ["normed"], name="normalize"),
             helper.make_node("Mul", ["normed", "weight"], ["scaled"], name="weight"),
             helper.make_node("MatMul", ["scaled", "W"], ["y"], name="proj")]
    draw = [{"x": _hidden_states(rng, 8.0)} for _ in range(4 + count)]
    return _save(folder, "rmsnorm", nodes, inits), draw[:4], draw[4:]


def _real_model(file_name: str) -> Path:
    root = os.environ.get("QDEPLOY_REAL_MODELS") or str(Path.home() / ".cache" / "qdeploy" / "test-models")
    found = sorted(Path(root).rglob(file_name))
    if not found:
        raise FileNotFoundError(f"no {file_name} under {root}: run python -m tests.real_models")
    return found[0]


def pp_ocr_rec(folder: Path, count: int) -> tuple[Path, Samples, Samples]:
    lines = [{"x": _text_line(seed)} for seed in range(2 + count)]
    return _real_model("ch_PP-OCRv4_rec_infer.onnx"), lines[:2], lines[2:]


def pp_ocr_det(folder: Path, count: int) -> tuple[Path, Samples, Samples]:
    pages = [{"x": _text_page(seed)} for seed in range(4 + count)]
    return _real_model("ch_PP-OCRv4_det_infer.onnx"), pages[:4], pages[4:]


def pp_ocr_det_noise(folder: Path, count: int) -> tuple[Path, Samples, Samples]:
    """The detector fed uniform noise in [-1, 1] (no text: its probabilities stay in the sigmoid's tail)."""
    rng = np.random.default_rng(0)
    draw = [{"x": rng.uniform(-1, 1, (1, 3, 320, 320)).astype(np.float32)} for _ in range(4 + count)]
    return _real_model("ch_PP-OCRv4_det_infer.onnx"), draw[:4], draw[4:]


def _text_page(seed: int, size: int = 320) -> np.ndarray:
    """Rows of dark word-like blocks on a light page, normalised like PP-OCR det (ImageNet mean and std)."""
    rng = np.random.default_rng(seed)
    page = np.full((size, size, 3), rng.uniform(200, 250, 3)) + rng.normal(0, 4, (size, size, 1))
    for top in range(12, size - 24, 36):
        left = int(rng.integers(4, 40))
        while left < size - 30:
            width = int(rng.integers(12, 60))
            page[top:top + int(rng.integers(12, 22)), left:left + width] = rng.uniform(10, 70, 3)
            left += width + int(rng.integers(6, 20))
    pixels = np.clip(page, 0, 255) / 255.0
    normalised = (pixels - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    return normalised.transpose(2, 0, 1)[None].astype(np.float32)


def _text_line(seed: int) -> np.ndarray:
    """A synthetic text line, normalised like PP-OCR's preprocessing ((pixel / 255 - 0.5) / 0.5)."""
    rng = np.random.default_rng(seed)
    image = np.full((48, 320), 235.0) + rng.normal(0, 6, (48, 320))
    for left in range(8, 300, 22):
        width, top = rng.integers(8, 18), rng.integers(8, 14)
        image[top:top + rng.integers(20, 30), left:left + width] = rng.uniform(10, 60)
    pixels = np.clip(image, 0, 255)[None, None].repeat(3, axis=1) / 255.0
    return ((pixels - 0.5) / 0.5).astype(np.float32)


MODELS: dict[str, Callable[[Path, int], tuple[Path, Samples, Samples]]] = {
    "demo": demo, "encoder": encoder, "attention": attention, "layernorm": layernorm, "rmsnorm": rmsnorm,
    "pp-ocr-rec": pp_ocr_rec, "pp-ocr-det": pp_ocr_det, "pp-ocr-det-noise": pp_ocr_det_noise,
}



# ---- measuring ---------------------------------------------------------------------------------


def _interleaved_medians(actions: dict[str, Callable[[], Any]], repeat: int) -> dict[str, tuple[float, Any]]:
    """Median wall time of each action, the actions taking turns so drifting machine load hits all alike."""
    results = {label: action() for label, action in actions.items()}  # warm-up (imports, caches)
    times: dict[str, list[float]] = {label: [] for label in actions}
    for _ in range(repeat):
        for label, action in actions.items():
            started = time.perf_counter()
            results[label] = action()
            times[label].append(time.perf_counter() - started)
    return {label: (statistics.median(times[label]), results[label]) for label in actions}


def _converter(path: Path) -> onnx.ModelProto:
    from onnxconverter_common.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_float_to_float16(onnx.load(str(path)), keep_io_types=True)


def _qdeploy(path: Path, folder: Path, samples: Samples, **config: Any) -> Callable[[], onnx.ModelProto]:
    data = folder / "calib"
    data.mkdir(exist_ok=True)
    for index, sample in enumerate(samples):
        np.savez(data / f"{index:03d}.npz", **sample)
    artifact = Artifact(path=path, sidecar=path.with_suffix(".json"), key="k", sha256="s",
                        size_bytes=path.stat().st_size, stages=("export",), parent=None)

    def convert() -> onnx.ModelProto:
        with tempfile.TemporaryDirectory(dir=folder) as work:
            ctx = data_context("bench", Path(work), datasets={"calib": DatasetSpec(reader="npy", path=str(data))})
            return fp16.run(artifact, Fp16Config(**config), ctx).model

    return convert


def _fidelity(model: onnx.ModelProto, candidate: onnx.ModelProto, samples: Samples, raw: bool) -> dict[str, Any]:
    try:
        return _measure_fidelity(model, candidate, samples, raw)
    except Exception as exc:  # a broken artifact is a result of this benchmark, not a crash of it
        return {"broken": " ".join(str(exc).split())[:110]}


def _measure_fidelity(model: onnx.ModelProto, candidate: onnx.ModelProto, samples: Samples,
                      raw: bool) -> dict[str, Any]:
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    from qdeploy.targets.evaluator import build_evaluator

    names = [value.name for value in model.graph.output]
    reference_session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = [dict(zip(names, reference_session.run(None, s), strict=True)) for s in samples]
    session = ort.InferenceSession(candidate.SerializeToString(), providers=["CPUExecutionProvider"])
    on_ort = [dict(zip(names, session.run(None, s), strict=True)) for s in samples]
    evaluator = ReferenceEvaluator(candidate) if raw else build_evaluator(candidate)
    with np.errstate(all="ignore"):
        true_fp16 = [dict(zip(names, (np.asarray(o, np.float32) for o in evaluator.run(None, s)), strict=True))
                     for s in samples]
    loose = Tolerance()
    worst = compare_outputs(expected, true_fp16, loose).worst()
    return {"cosine": worst["cosine"], "snr_db": worst["snr_db"], "max_abs_err": worst["max_abs_err"],
            "nonfinite": worst["nonfinite"], "ort_cosine": compare_outputs(expected, on_ort, loose).worst()["cosine"]}


def measure(name: str, folder: Path, repeat: int, count: int, raw: bool, budget: bool) -> dict[str, Any] | None:
    try:
        path, calibration, evaluation = MODELS[name](folder, count)
    except (ImportError, FileNotFoundError) as exc:
        log.warning("%s skipped: %s", name, exc)
        return None
    model = onnx.load(str(path))
    timed = _interleaved_medians({
        "converter": lambda: _converter(path),
        "qdeploy": _qdeploy(path, folder, calibration),
        "bare": _qdeploy(path, folder, calibration, onnxruntime_check=False),
    }, repeat)
    with_data = _qdeploy(path, folder, calibration, calibration={"data": "calib"})
    started = time.perf_counter()
    ours_data = with_data()
    data_s = time.perf_counter() - started
    fidelity = {"float32": _fidelity(model, model, evaluation, raw),
                "converter": _fidelity(model, timed["converter"][1], evaluation, raw),
                "qdeploy": _fidelity(model, timed["qdeploy"][1], evaluation, raw),
                "qdeploy+data": _fidelity(model, ours_data, evaluation, raw)}
    if budget:  # mode auto: the fewest further float32 nodes meeting the fp16 default tolerance on the data
        started = time.perf_counter()
        auto = _qdeploy(path, folder, calibration, calibration={"data": "calib"}, mode="auto")()
        fidelity[f"qdeploy auto ({time.perf_counter() - started:.0f} s)"] = _fidelity(model, auto, evaluation, raw)
    return {
        "model": name, "nodes": len(model.graph.node), "converter_s": timed["converter"][0],
        "qdeploy_s": timed["qdeploy"][0], "bare_s": timed["bare"][0], "data_s": data_s,
        "fidelity": fidelity,
    }


# ---- report ------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 6) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def print_tables(rows: list[dict[str, Any]]) -> None:
    out = sys.stdout
    out.write("\n| model | nodes | converter s | qdeploy s | ratio | qdeploy no ORT s | ratio | qdeploy +data s |\n")
    out.write("|---|---:|---:|---:|---:|---:|---:|---:|\n")
    for r in rows:
        out.write(f"| {r['model']} | {r['nodes']} | {r['converter_s']:.3f} | {r['qdeploy_s']:.3f} | "
                  f"{r['qdeploy_s'] / r['converter_s']:.2f}x | {r['bare_s']:.3f} | "
                  f"{r['bare_s'] / r['converter_s']:.2f}x | {r['data_s']:.3f} |\n")
    out.write("\n| model | artifact | cosine (true fp16) | SNR dB | max abs err | NaN/Inf | cosine (ort:cpu) |\n")
    out.write("|---|---|---:|---:|---:|---:|---:|\n")
    for r in rows:
        for label, f in r["fidelity"].items():
            if "broken" in f:
                out.write(f"| {r['model']} | {label} | broken: {f['broken']} | | | | |\n")
                continue
            out.write(f"| {r['model']} | {label} | {_fmt(f['cosine'])} | {_fmt(f['snr_db'], 1)} | "
                      f"{_fmt(f['max_abs_err'], 4)} | {f['nonfinite']} | {_fmt(f['ort_cosine'])} |\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per tool (median reported)")
    parser.add_argument("--samples", type=int, default=2, help="evaluation samples per model")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--raw-evaluator", action="store_true",
                        help="true-fp16 columns with onnx's reference kernels as they are (no corrections)")
    parser.add_argument("--budget", action="store_true", help="also build with mode: auto (slow on large models)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="qdeploy-bench-fp16-") as tmp:
        for name in args.models:
            folder = Path(tmp) / name
            folder.mkdir()
            row = measure(name, folder, args.repeat, args.samples, args.raw_evaluator, args.budget)
            if row is not None:
                rows.append(row)
    print_tables(rows)


if __name__ == "__main__":
    main()
