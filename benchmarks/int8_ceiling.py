"""The machine's int8 ceiling per runtime, against float32 pinned and against the float default a user gets.

A large MatMul (weights constant, activations an input, as in a Linear layer) in float32 and in int8 (QDQ: uint8
activations, 7-bit int8 per-channel weights) on ort:cpu and openvino:cpu, CPU ms per call at one thread:
- fp32 (f32): float32 pinned (OpenVINO INFERENCE_PRECISION_HINT f32; ONNX Runtime's CPU provider has no other);
- fp32 (default): the float32 model at the device default (OpenVINO: bfloat16 on CPUs with AVX512-BF16 or AMX);
- int8: the QDQ model at the device default.
The gains say what int8 can buy at best on this CPU: against f32, and against what deploying without quantizing
gives.  The header names the CPU kind (AMX, VNNI, AVX2-only) and the flags that decide it.

    python benchmarks/int8_ceiling.py [--size 1024] [--threads 1] [--rounds 5] [--iterations 3]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.int8_peers import ceiling  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=3)
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


if __name__ == "__main__":
    main()
