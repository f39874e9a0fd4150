"""openWakeWord's models through the whole recipe: tf2onnx and PyTorch exports nobody here wrote.

    python benchmarks/wakeword.py [--models melspectrogram embedding hey_mycroft hey_jarvis] [--work DIR]
                                  [--calib 8] [--val 4] [--timeout 900]

openwakeword==0.4.0 ships its models in the wheel (fetched with ``pip download --no-deps``, each file checked
against its sha256, into ``$QDEPLOY_REAL_MODELS`` like the test corpus).  They are not in the test corpus: the
pre-trained models are licensed CC BY-NC-SA 4.0 (the code Apache-2.0), so they are fetched only when this script
is run.  What each exercises:

- ``melspectrogram`` (PyTorch 1.11): STFT as two Convs, Log, a dynamic sample count; input: speech-like audio at
  16 kHz scaled to int16's range, 2 s;
- ``embedding`` (tf2onnx 1.9.3): NHWC convolutions with LeakyRelu merged by element-wise Max, MaxPool; input:
  76 x 32 mel frames (``mel / 10 + 2``, openWakeWord's own scaling);
- ``hey_mycroft`` (tf2onnx 1.10.1): two bidirectional LSTMs and a Sigmoid head; input: 16 x 96 embeddings;
- ``hey_jarvis`` (PyTorch 1.12): LayerNorm written out, and an If on a ``[1, 1]`` condition running a verifier
  head (OpenVINO's frontend refuses that condition as written).

The data chain is openWakeWord's: audio -> melspectrogram -> embedding windows -> the wake-word heads, computed by
ONNX Runtime from the same files. Speech-like audio without the wake word: the heads' probabilities lie near 1e-5,
where ONNX Runtime's own Sigmoid is a few tenths of a percent off. Each recipe (fp32 ``[simplify]``, fp16, int8 PTQ
with ``tolerance: {cosine_min: 0.98}``, one graph for both runtimes as in the test corpus; ort:cpu and openvino:cpu;
validated against the exported model) runs as ``qdeploy run`` in its own process; the table is
``benchmarks/real_models.py``'s. Below it: every row that did not pass, the float32 rows the float64 arbiter judged,
and what OpenVINO read rewritten.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.real_models import Outcome, summarise, table  # noqa: E402
from tests.real_models import RealModelError, Wheel, fetch_wheel, real_model_dir, sha256_of  # noqa: E402
from tests.real_recipes.data import speech_like  # noqa: E402

MODELS = "openwakeword/resources/models/"
WHEEL = Wheel("openwakeword==0.4.0", {
    f"{MODELS}melspectrogram.onnx": "ba2b0e0f8b7b875369a2c89cb13360ff53bac436f2895cced9f479fa65eb176f",
    f"{MODELS}embedding_model.onnx": "ba754db3cd768a524c655ea90655ee5e6055a43b8dfd29366a11e93716ae9e51",
    f"{MODELS}hey_mycroft_v0.1.onnx": "785bdf5655863ae47553b23793aa108c7b0152d4823f7869b41f2d2d765912fc",
    f"{MODELS}hey_jarvis_v0.1.onnx": "94a13cfe60075b132f6a472e7e462e8123ee70861bc3fb58434a73712ee0d2cb",
})
FILES = {"melspectrogram": "melspectrogram.onnx", "embedding": "embedding_model.onnx",
         "hey_mycroft": "hey_mycroft_v0.1.onnx", "hey_jarvis": "hey_jarvis_v0.1.onnx"}
WINDOW, STEP, FEATURES = 76, 8, 16  # openWakeWord: 76 mel frames per embedding, 8 apart; 16 embeddings per head


def ensure_models(folder: Path) -> dict[str, Path]:
    """Name -> path of each model, fetched and checked against its sha256."""
    paths = {name: folder / MODELS / file for name, file in FILES.items()}
    if not all(path.is_file() and sha256_of(path) == WHEEL.files[f"{MODELS}{path.name}"] for path in paths.values()):
        fetch_wheel(WHEEL, folder)
    for path in paths.values():
        if sha256_of(path) != WHEEL.files[f"{MODELS}{path.name}"]:
            raise RealModelError(f"{path} differs from its pinned sha256", unreachable=False)
    return paths


def features(paths: dict[str, Path], seed: int, index: int) -> dict[str, np.ndarray]:
    """One sample of each model's input, down openWakeWord's chain from 2 s of speech-like audio."""
    import onnxruntime as ort

    def run(name: str, feed: np.ndarray) -> np.ndarray:
        session = ort.InferenceSession(str(paths[name]), providers=["CPUExecutionProvider"])
        return session.run(None, {session.get_inputs()[0].name: feed})[0]

    audio = speech_like(2.0, 16000, seed=seed * 1000 + index)
    audio = (audio / (np.abs(audio).max() + 1e-9) * 12000).astype(np.float32)[None]  # int16's range
    mel = np.squeeze(run("melspectrogram", audio)) / 10 + 2
    windows = np.stack([mel[start:start + WINDOW] for start in range(0, len(mel) - WINDOW + 1, STEP)])
    windows = windows[:, :, :, None].astype(np.float32)
    embeddings = run("embedding", windows).reshape(len(windows), -1)
    heads = np.resize(embeddings, (FEATURES, embeddings.shape[1]))[None].astype(np.float32)
    return {"melspectrogram": audio, "embedding": windows[:1], "hey_mycroft": heads, "hey_jarvis": heads}


def write_recipes(paths: dict[str, Path], work: Path, calib: int, val: int) -> dict[str, Path]:
    import onnx

    samples = {split: [features(paths, seed, index) for index in range(count)]
               for split, seed, count in (("calib", 1, calib), ("val", 2, val))}
    recipes = {}
    for name, path in paths.items():
        folder = work / name
        input_name = onnx.load(str(path), load_external_data=False).graph.input[0].name
        for split, items in samples.items():
            (folder / split).mkdir(parents=True, exist_ok=True)
            for index, sample in enumerate(items):
                np.savez(folder / split / f"{index:03d}.npz", **{input_name: sample[name]})
        # one int8 graph for both runtimes, as the test corpus builds it (the table reads one "int8" row per target)
        quantize = {"mode": "ptq", "calibration": {"data": "calib"}, "tolerance": {"cosine_min": 0.98},
                    "per_runtime": False}
        recipe = {"name": f"wakeword-{name}", "model": {"onnx": str(path)},
                  "data": {"calib": {"reader": "npy", "path": "calib"}, "val": {"reader": "npy", "path": "val"}},
                  "variants": {"fp32": ["simplify"], "fp16": ["simplify", "fp16"],
                               "int8": ["simplify", {"quantize": quantize}]},
                  "targets": ["ort:cpu", "openvino:cpu"], "validate": {"data": "val"},
                  "benchmark": {"batch_sizes": [1], "warmup": 3, "iterations": 20}}
        recipes[name] = folder / "recipe.yaml"
        recipes[name].write_text(yaml.safe_dump(recipe, sort_keys=False))
    return recipes


def run_one(name: str, recipe: Path, timeout: float) -> tuple[Outcome, list[str]]:
    started = time.perf_counter()
    out = recipe.parent / "run"
    command = [sys.executable, "-m", "qdeploy", "run", str(recipe), "--out", str(out), "--no-cache", "-q"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)
    except subprocess.TimeoutExpired:
        return Outcome(name, time.perf_counter() - started, None, problems=[f"run: over {timeout:.0f} s"]), []
    outcome = Outcome(name, time.perf_counter() - started, done.returncode)
    if not (out / "report.json").is_file():
        outcome.problems.append(f"run: exit {done.returncode}, no report: {done.stderr.strip()[-500:]}")
        return outcome, []
    report = json.loads((out / "report.json").read_text())
    summarise(report, outcome)
    return outcome, notes_of(report)


def notes_of(report: dict[str, Any]) -> list[str]:
    """The float64 arbiter's verdicts and OpenVINO's rewritten reads, once each."""
    found = []
    for row in report.get("validation", []):
        arbitrated = row.get("arbitrated")
        if arbitrated:
            sides = {side: arbitrated.get(side, {}).get("snr_db") for side in ("target", "reference")}
            said = {side: f"{value:.1f} dB" if isinstance(value, float) else str(value)
                    for side, value in sides.items()}
            found.append(f"{row['variant']} on {row['target']} ({row['status']}): float64 arbiter verdict "
                         f"{arbitrated['verdict']} (SNR against float64: {row['target']} {said['target']}, "
                         f"ort:cpu {said['reference']})")
        for note in (row.get("execution") or {}).get("notes", []):
            if "OpenVINO read a copy" in note and note not in found:
                found.append(note)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(FILES), default=list(FILES))
    parser.add_argument("--work", type=Path, help="folder for recipes, data and runs (a temporary one if absent)")
    parser.add_argument("--calib", type=int, default=8)
    parser.add_argument("--val", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    paths = ensure_models(real_model_dir())
    with tempfile.TemporaryDirectory(prefix="qdeploy-wakeword-") as tmp:
        work = args.work or Path(tmp)
        recipes = write_recipes(paths, work, args.calib, args.val)
        results = [run_one(name, recipes[name], args.timeout) for name in args.models]
    print("\n".join(table([outcome for outcome, _ in results])))
    print("\ncells: validation status, worst cosine vs the exported model, speedup over it on that target\n")
    for outcome, notes in results:
        for line in [*outcome.problems, *notes]:
            print(f"- {outcome.model}: {line}")


if __name__ == "__main__":
    main()
