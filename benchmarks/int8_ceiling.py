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
    python benchmarks/int8_ceiling.py --ort-conv-paths [--threads 1]

``--ort-conv-paths``: ONNX Runtime's int8 convolution per shape on its symmetric kernel (weight zero point 0) and
on its int8 GEMM (zero point -1, AMX tiles on AMX CPUs), the outputs compared, and what qdeploy's rule for the
graph it shapes for ONNX Runtime picks (``stages/quantize/ptq/_amx_convs.py``).
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


ORT_CONVS = ((3, 32, 3, 112), (16, 16, 3, 56), (32, 32, 3, 56), (48, 48, 3, 56), (64, 64, 3, 56), (32, 64, 1, 56),
             (64, 256, 1, 56), (64, 64, 3, 28), (96, 96, 3, 28), (128, 128, 3, 28), (128, 128, 1, 28),
             (128, 512, 1, 28), (256, 64, 1, 28), (128, 128, 3, 56), (256, 256, 3, 28), (64, 64, 3, 14),
             (256, 256, 1, 14), (512, 128, 1, 14), (1024, 256, 1, 14), (256, 256, 3, 14), (512, 512, 3, 7),
             (512, 2048, 1, 7))
"""(in, out, kernel, height and width) of the ONNX Runtime convolution-path table: ResNet-like and mobile shapes."""


def _ort_conv_model(cin: int, cout: int, kernel: int, size: int, routed: bool) -> bytes:
    """One QDQ convolution as qdeploy's ptq writes it (uint8 input, per-channel symmetric int8 weights), or the
    same with its weights routed to ONNX Runtime's GEMM (zero point -1)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from qdeploy.stages.quantize.ptq._amx_convs import route_convs_to_gemm

    rng = np.random.default_rng(0)
    weights = rng.standard_normal((cout, cin, kernel, kernel)) * 0.05
    scales = np.abs(weights).reshape(cout, -1).max(axis=1) / 127
    values = np.round(weights / scales[:, None, None, None]).astype(np.int8)
    scalar = numpy_helper.from_array
    inits = [scalar(values, "wq"), scalar(scales.astype(np.float32), "ws"), scalar(np.zeros(cout, np.int8), "wz"),
             scalar(np.array(0.02, np.float32), "xs"), scalar(np.array(128, np.uint8), "xz"),
             scalar(np.array(0.05, np.float32), "ys"), scalar(np.array(128, np.uint8), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], name="conv", pads=[kernel // 2] * 4),
             helper.make_node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["out"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                              [1, cin, size, size])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if routed:
        route_convs_to_gemm(model, pays=lambda depth, pixels: True)
    return model.SerializeToString()


def ort_conv_lines(args: argparse.Namespace) -> list[str]:
    """ONNX Runtime's int8 convolution on its symmetric kernel (weight zero point 0) and on its GEMM (zero point
    -1; AMX tiles on AMX CPUs), per shape, with what qdeploy's rule (``_amx_convs.gemm_pays``) picks."""
    import numpy as np
    import onnxruntime as ort

    from qdeploy.stages.quantize.ptq._amx_convs import gemm_pays

    lines = ["| conv (in->out, kernel, image) | depth | symmetric kernel ms | GEMM ms | GEMM speedup | outputs | "
             "rule picks |", "|---|---|---|---|---|---|---|"]
    for cin, cout, kernel, size in ORT_CONVS:
        feeds = {"x": np.random.default_rng(1).standard_normal((1, cin, size, size)).astype(np.float32)}
        timed, outputs = {}, {}
        for routed in (False, True):
            options = ort.SessionOptions()
            options.intra_op_num_threads = args.threads
            session = ort.InferenceSession(_ort_conv_model(cin, cout, kernel, size, routed), options,
                                           providers=["CPUExecutionProvider"])
            outputs[routed] = session.run(None, feeds)[0]
            timed[routed] = _cpu_ms(lambda s=session, f=feeds: s.run(None, f), args.rounds, args.iterations)
        depth = cin * kernel * kernel
        same = "identical" if np.array_equal(outputs[False], outputs[True]) else "DIFFER"
        pick = "GEMM" if gemm_pays(depth, size * size) else "symmetric"
        lines.append(f"| {cin}->{cout}, {kernel}x{kernel}, {size}x{size} | {depth} | {timed[False]:.3f} | "
                     f"{timed[True]:.3f} | {timed[False] / timed[True]:.2f}x | {same} | {pick} |")
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
    parser.add_argument("--ort-conv-paths", action="store_true",
                        help="only the table of ONNX Runtime's two int8 convolution paths per shape")
    args = parser.parse_args()
    if args.ort_conv_paths:
        print(cpu_kind())
        print(f"ONNX Runtime int8 convolutions, {args.threads} thread(s), CPU ms per call (median of {args.rounds} "
              f"rounds of {args.iterations})")
        print()
        print("\n".join(ort_conv_lines(args)))
        print(f"\n1-minute load average at the end: {os.getloadavg()[0]:.2f}")
        return
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
