"""Write qdeploy's demo model and its validation samples (onnx + numpy only, seeded).

The model is a small image classifier: ``input`` float32 [1,3,64,64] -> ``logits`` [1,10],
built from Conv+BatchNormalization+Relu blocks (so ``simplify`` has BatchNormalization to
fuse), strided convolutions, GlobalAveragePool, Flatten and Gemm, at opset 17.  The
BatchNormalization statistics are measured on the validation images so that every block's
output is roughly normalised: fp16 and int8 variants then stay close to fp32.

Run ``python recipes/make_demo_model.py [--out-dir DIR]``; it writes ``DIR/models/demo_cnn.onnx``,
``DIR/data/val/sample_XX.npy`` and ``DIR/data/calib/sample_XX.npy`` and is idempotent.  The calibration
samples come from their own seed, so int8 is calibrated on images that validation never sees.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

log = logging.getLogger(__name__)

SEED = 20240611
IMAGE_SIZE = 64
NUM_CLASSES = 10
VAL_SAMPLES = 16
CALIB_SAMPLES = 16
CALIB_SEED = SEED + 1  # its own stream: the model and the validation samples stay as they were
LOGIT_STD = 2.0
OPSET = 17
IR_VERSION = 8  # the IR of opset 17; recent onnx writes a newer IR than many runtimes read
# (output channels, stride) of each Conv+BatchNormalization+Relu block.
BLOCKS: tuple[tuple[int, int], ...] = (
    (32, 1), (32, 1),
    (64, 2), (64, 1), (64, 1),
    (128, 2), (128, 1), (128, 1),
)
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def make_images(rng: np.random.Generator, count: int, size: int = IMAGE_SIZE) -> np.ndarray:
    """Image-like samples [count,3,size,size]: gratings, gradients and blobs plus noise, ImageNet-normalised."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    images = np.empty((count, 3, size, size), dtype=np.float32)
    for index in range(count):
        base = np.zeros((3, size, size), dtype=np.float32)
        for _ in range(3):  # oriented sinusoid gratings, a colour each
            angle, freq, phase = rng.uniform(0, np.pi), rng.uniform(1, 6), rng.uniform(0, 2 * np.pi)
            wave = np.sin(2 * np.pi * freq * (np.cos(angle) * xx + np.sin(angle) * yy) + phase)
            base += rng.uniform(0.05, 0.25, size=(3, 1, 1)).astype(np.float32) * wave
        for _ in range(2):  # soft blobs
            cy, cx, radius = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.08, 0.3)
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * radius**2))
            base += rng.uniform(-0.4, 0.4, size=(3, 1, 1)).astype(np.float32) * blob
        gradient = rng.uniform(-0.3, 0.3) * xx + rng.uniform(-0.3, 0.3) * yy
        contrast, colour = rng.uniform(0.4, 1.8), rng.uniform(-0.2, 0.2, size=(3, 1, 1))
        image = 0.5 + colour + contrast * (base + gradient) + rng.normal(0, 0.03, size=base.shape)
        image = np.clip(image, 0.0, 1.0)
        images[index] = (image - IMAGENET_MEAN[:, None, None]) / IMAGENET_STD[:, None, None]
    return images


def conv2d(x: np.ndarray, weight: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """A plain NCHW convolution (no bias) in numpy, float64 accumulation."""
    kernel = weight.shape[2]
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (kernel, kernel), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride]
    out = np.tensordot(windows.astype(np.float64), weight.astype(np.float64), axes=([1, 4, 5], [1, 2, 3]))
    return out.transpose(0, 3, 1, 2)


def fit_block(rng: np.random.Generator, x: np.ndarray, out_channels: int,
              stride: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """He-initialised conv weights and BatchNormalization parameters measured on x; returns params and output."""
    in_channels = x.shape[1]
    fan_in = in_channels * 9
    weight = rng.normal(0.0, np.sqrt(2.0 / fan_in), size=(out_channels, in_channels, 3, 3)).astype(np.float32)
    conv = conv2d(x, weight, stride, pad=1)
    mean = conv.mean(axis=(0, 2, 3))
    var = conv.var(axis=(0, 2, 3)) + 1e-3
    gamma = rng.uniform(0.7, 1.3, size=out_channels)
    beta = rng.normal(0.1, 0.2, size=out_channels)
    normalised = (conv - mean[None, :, None, None]) / np.sqrt(var + 1e-5)[None, :, None, None]
    out = np.maximum(normalised * gamma[None, :, None, None] + beta[None, :, None, None], 0.0)
    params = {"W": weight, "scale": gamma, "B": beta, "mean": mean, "var": var}
    return {k: v.astype(np.float32) for k, v in params.items()}, out.astype(np.float32)


def add_block(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], index: int, source: str,
              params: dict[str, np.ndarray], stride: int) -> str:
    """Append Conv -> BatchNormalization -> Relu nodes of block `index`; returns the output name."""
    prefix = f"block{index}"
    for key in ("W", "scale", "B", "mean", "var"):
        inits.append(numpy_helper.from_array(params[key], f"{prefix}.{key}"))
    nodes.append(helper.make_node("Conv", [source, f"{prefix}.W"], [f"{prefix}.conv"], name=f"{prefix}/conv",
                                  kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride]))
    bn_inputs = [f"{prefix}.conv"] + [f"{prefix}.{key}" for key in ("scale", "B", "mean", "var")]
    nodes.append(helper.make_node("BatchNormalization", bn_inputs, [f"{prefix}.bn"], name=f"{prefix}/bn",
                                  epsilon=1e-5))
    nodes.append(helper.make_node("Relu", [f"{prefix}.bn"], [f"{prefix}.relu"], name=f"{prefix}/relu"))
    return f"{prefix}.relu"


def build_model(rng: np.random.Generator, images: np.ndarray) -> onnx.ModelProto:
    """The demo classifier, with BatchNormalization statistics fitted on `images`."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    source, x = "input", images
    for index, (channels, stride) in enumerate(BLOCKS):
        params, x = fit_block(rng, x, channels, stride)
        source = add_block(nodes, inits, index, source, params, stride)
    pooled = x.mean(axis=(2, 3))
    weight = rng.normal(0.0, np.sqrt(1.0 / pooled.shape[1]), size=(NUM_CLASSES, pooled.shape[1]))
    bias = -(pooled @ weight.T).mean(axis=0)  # centre the logits on the data
    scale = LOGIT_STD / (pooled @ weight.T + bias).std()  # logits spread like a trained classifier's
    weight, bias = weight * scale, bias * scale
    inits += [numpy_helper.from_array(weight.astype(np.float32), "head.W"),
              numpy_helper.from_array(bias.astype(np.float32), "head.B")]
    nodes += [
        helper.make_node("GlobalAveragePool", [source], ["pool"], name="head/pool"),
        helper.make_node("Flatten", ["pool"], ["flat"], name="head/flatten", axis=1),
        helper.make_node("Gemm", ["flat", "head.W", "head.B"], ["logits"], name="head/gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "demo_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, IMAGE_SIZE, IMAGE_SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, NUM_CLASSES])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="qdeploy-make-demo-model", producer_version="1")
    model.doc_string = "qdeploy demo CNN: seeded He-initialised weights, BatchNormalization fitted on recipes/data/val."
    onnx.checker.check_model(model, full_check=True)
    return model


def write_samples(folder: Path, images: np.ndarray) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, image in enumerate(images):
        paths.append(folder / f"sample_{index:02d}.npy")
        np.save(paths[-1], image)
    return paths


def write_demo(out_dir: Path) -> tuple[Path, list[Path]]:
    """Write the model, the validation and the calibration samples under out_dir; returns the model's and the
    validation samples' paths."""
    rng = np.random.default_rng(SEED)
    images = make_images(rng, VAL_SAMPLES)
    model = build_model(rng, images)
    model_path = out_dir / "models" / "demo_cnn.onnx"
    model_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(model_path))
    sample_paths = write_samples(out_dir / "data" / "val", images)
    calib_paths = write_samples(out_dir / "data" / "calib", make_images(np.random.default_rng(CALIB_SEED),
                                                                        CALIB_SAMPLES))
    log.info("wrote %s (%d bytes), %d validation and %d calibration samples", model_path,
             model_path.stat().st_size, len(sample_paths), len(calib_paths))
    return model_path, sample_paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent,
                        help="folder that receives models/demo_cnn.onnx, data/val/ and data/calib/ "
                             "(default: this script's folder)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    write_demo(args.out_dir)


if __name__ == "__main__":
    main()
