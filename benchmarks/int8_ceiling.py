"""The machine's int8 ceiling per runtime, against float32 pinned and against the float default a user gets.

A large MatMul (weights constant, activations an input, as in a Linear layer) in float32 and in int8 (QDQ: uint8
activations, 7-bit int8 per-channel weights) on ort:cpu and openvino:cpu, CPU ms per call at one thread:
- fp32 (f32): float32 pinned (OpenVINO INFERENCE_PRECISION_HINT f32; ONNX Runtime's CPU provider has no other);
- fp32 (default): the float32 model at the device default (OpenVINO: bfloat16 on CPUs with AVX512-BF16 or AMX);
- int8: the QDQ model at the device default.
The gains say what int8 can buy at best on this CPU: against f32, and against what deploying without quantizing
gives.  The header names the CPU kind (AMX, VNNI, AVX2-only) and the flags that decide it.

A second table does the same for single 3x3 convolutions of ResNet-like widths (``--convs``): whether a runtime's
int8 convolution reaches the rate of its int8 GEMM (on AMX CPUs, ONNX Runtime's GEMM runs on AMX tiles; its
convolution does not).  The int8 convolutions are ONNX Runtime's ``quantize_static`` QDQ (uint8 activations,
per-channel int8 weights, symmetric; ``--conv-weights asymmetric``: with zero points, which keeps ONNX Runtime
from its symmetric-weights convolution kernel): they measure kernels, not qdeploy's placement.

    python benchmarks/int8_ceiling.py [--size 1024] [--threads 1] [--rounds 5] [--iterations 3] [--convs]
                                      [--conv-weights symmetric|asymmetric]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8_peers import _cpu_ms, ceiling  # noqa: E402

TARGETS = ("ort:cpu", "openvino:cpu")


def cpu_kind() -> str:
    from qdeploy.targets.cpu_facts import device_precisions
    from qdeploy.targets.int8_path import cpu_flags, int8_path

    flags, _ = cpu_flags()
    amx = [flag for flag in ("amx_int8", "amx_bf16", "amx_tile") if flag in flags]
    path = int8_path(flags)
    facts = device_precisions("CPU")
    return (f"CPU kind: {'AMX (' + ', '.join(amx) + ') + ' if amx else ''}{path.kind}; OpenVINO's float default "
            f"{facts.default}; {os.cpu_count()} cores")


CONVS = ((64, 56), (256, 28), (512, 14))
"""(channels in and out, height and width) of the convolution table."""


def _conv_models(channels: int, size: int, folder: Path, symmetric_weights: bool = True) -> dict[str, Path]:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    shape = (1, channels, size, size)
    weights = (rng.standard_normal((channels, channels, 3, 3)) * 0.05).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(weights, "w")])
    paths = {"fp32": folder / f"conv{channels}.onnx", "int8": folder / f"conv{channels}-int8.onnx"}
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), paths["fp32"])

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

        def get_next(self) -> dict | None:
            return next(self.samples, None)

    quantize_static(str(paths["fp32"]), str(paths["int8"]), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True,
                    extra_options={"WeightSymmetric": symmetric_weights})
    return paths


def conv_lines(args: argparse.Namespace) -> list[str]:
    import tempfile

    import numpy as np

    from qdeploy.targets import get_target

    lines = ["| conv (3x3, 1 image) | target | fp32 (f32) ms | fp32 (default) ms | int8 ms | int8 GOP/s | "
             "int8 vs f32 | int8 vs default |", "|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory(prefix="qdeploy-convs-") as tmp:
        for channels, size in CONVS:
            paths = _conv_models(channels, size, Path(tmp), args.conv_weights == "symmetric")
            feeds = {"x": np.random.default_rng(1).standard_normal((1, channels, size, size)).astype(np.float32)}
            gop = 2 * channels * channels * 9 * size * size / 1e9
            for target in TARGETS:
                measured = {}
                for label, path, pinned in (("f32", paths["fp32"], True), ("default", paths["fp32"], False),
                                            ("int8", paths["int8"], False)):
                    with get_target(target).load(path, threads=args.threads, pin_f32=pinned) as session:
                        measured[label] = _cpu_ms(lambda s=session, f=feeds: s.run(f), args.rounds, args.iterations)
                lines.append(f"| {channels}->{channels} @{size}x{size} | {target} | {measured['f32']:.2f} | "
                             f"{measured['default']:.2f} | {measured['int8']:.2f} | {gop / measured['int8'] * 1e3:.0f} "
                             f"| {measured['f32'] / measured['int8']:.2f}x | "
                             f"{measured['default'] / measured['int8']:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--convs", action="store_true", help="also the 3x3 convolution table")
    parser.add_argument("--conv-weights", choices=("symmetric", "asymmetric"), default="symmetric",
                        help="the int8 convolutions' weights: symmetric (zero point 0) or with zero points")
    args = parser.parse_args()
    options = {"size": args.size, "threads": args.threads, "rounds": args.rounds, "iterations": args.iterations}
    pinned = ceiling(TARGETS, pin_f32=True, **options)
    default = ceiling(TARGETS, pin_f32=False, **options)
    gops = 2 * args.size ** 3 / 1e9
    print(cpu_kind())
    print(f"A {args.size}x{args.size}x{args.size} MatMul, {args.threads} thread(s), CPU ms per call "
          f"(median of {args.rounds} rounds); 1-minute load average {os.getloadavg()[0]:.2f}")
    print()
    print("| target | fp32 (f32) ms | fp32 (default) ms | int8 ms | int8 GOP/s | int8 vs f32 | int8 vs default |")
    print("|---|---|---|---|---|---|---|")
    for target in TARGETS:
        f32, at_default = pinned[target]["fp32"], default[target]["fp32"]
        int8 = default[target]["int8"]
        print(f"| {target} | {f32:.1f} | {at_default:.1f} | {int8:.1f} | {gops / int8 * 1e3:.0f} | "
              f"{f32 / int8:.2f}x | {at_default / int8:.2f}x |")
    if args.convs:
        print()
        print("\n".join(conv_lines(args)))


if __name__ == "__main__":
    main()
