"""OpenVINO's GPU device on this machine: its properties, and what each demo artifact really runs at there.

    python benchmarks/openvino_gpu_probe.py runs/demo-cnn/artifacts [DEVICE]

For each artifact (fp32, fp16, int8@openvino) and INFERENCE_PRECISION_HINT (the default, f32, f16): whether it
compiles, the hint the compiled model reads back, its runtime model's layers as (type, runtimePrecision,
outputPrecisions), 1 - cosine and the largest error against the fp32 file run on the CPU pinned to f32, and a
mean latency of 300 synchronous calls (a rough figure; benchmark_app's is the one to quote).  Then the median
of 1,000 back-to-back calls through qdeploy's own bound call (what its benchmark times), to set beside
benchmark_app's median of the same calls (benchmarks/gpu_machine.sh runs it before and after).  Run by
benchmarks/gpu_machine.sh on a lent GPU machine.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import openvino as ov

HINTS = (None, "f32", "f16")
VARIANTS = ("fp32", "fp16", "int8@openvino")


def print_properties(core: ov.Core, device: str) -> None:
    for key in core.get_property(device, "SUPPORTED_PROPERTIES"):
        try:
            print(f"  {device} {key} = {core.get_property(device, str(key))}")
        except Exception as exc:  # a probe: some properties cannot be read without a model
            print(f"  {device} {key}: {type(exc).__name__}")


def layers(compiled: ov.CompiledModel) -> Counter[tuple[str, str, str]]:
    found: Counter[tuple[str, str, str]] = Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        read = [info[key].astype(str) if key in info else "-"
                for key in ("layerType", "runtimePrecision", "outputPrecisions")]
        found[(read[0] if read[0] != "-" else op.get_type_name(), read[1], read[2])] += 1
    return found


def mean_ms(request: ov.InferRequest, feeds: list[np.ndarray], calls: int = 300) -> float:
    for _ in range(20):
        request.infer(feeds)
    start = time.perf_counter()
    for _ in range(calls):
        request.infer(feeds)
    return (time.perf_counter() - start) / calls * 1e3


def harness_median_ms(artifact: Path, device: str, feeds: list[np.ndarray], calls: int = 1000) -> float:
    """qdeploy's timed call (``Session.bind(...).run()``) back to back, as benchmark_app -api sync times it."""
    from qdeploy.targets import get_target

    session = get_target(f"openvino:{device.lower()}").load(artifact, pin_f32="fp32" in artifact.name)
    bound = session.bind({session.input_names[0]: feeds[0]})
    times = []
    for index in range(calls + 50):
        start = time.perf_counter()
        bound.run()
        if index >= 50:
            times.append(time.perf_counter() - start)
    return float(np.median(times) * 1e3)


def main(artifacts: Path, device: str = "GPU") -> None:
    core = ov.Core()
    print("devices", core.available_devices)
    print_properties(core, device)
    sample = np.load("recipes/data/val/sample_00.npy").astype(np.float32)
    feeds = [sample if sample.ndim == 4 else sample[None]]
    reference = core.compile_model(core.read_model(artifacts / "fp32.onnx"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    expected = np.asarray(reference.create_infer_request().infer(feeds)[0]).ravel()
    for variant in VARIANTS:
        for hint in HINTS:
            config = {} if hint is None else {"INFERENCE_PRECISION_HINT": hint}
            try:
                compiled = core.compile_model(core.read_model(artifacts / f"{variant}.onnx"), device, config)
            except Exception as exc:
                print(f"{variant} hint={hint}: compile failed: {str(exc)[-300:]}")
                continue
            request = compiled.create_infer_request()
            got = np.asarray(request.infer(feeds)[0]).ravel()
            cosine = float(got @ expected / np.linalg.norm(got) / np.linalg.norm(expected))
            print(f"{variant} hint={hint}: compiled hint {compiled.get_property('INFERENCE_PRECISION_HINT')}; "
                  f"1-cos {1 - cosine:.2e}, max err {np.abs(got - expected).max():.2e}, "
                  f"{mean_ms(request, feeds):.3f} ms")
            print("   layers:", dict(layers(compiled)))
    for variant in ("fp32", "int8@openvino"):
        median = harness_median_ms(artifacts / f"{variant}.onnx", device, feeds)
        print(f"{variant}: qdeploy's bound call, median of 1000: {median:.3f} ms")


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])  # a device other than GPU: CPU, to try it here
