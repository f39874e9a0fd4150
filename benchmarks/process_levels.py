"""One model's latency in fresh processes, block by block: how far does this machine's speed move, and does the
guest see it?

    python benchmarks/process_levels.py MODEL.onnx [--processes 8] [--runtime openvino|ort] [--hint bf16|f32]

Each process loads the model once (OpenVINO on CPU with qdeploy's latency settings: LATENCY hint, one stream, every
core, pinned; or ONNX Runtime's CPU provider at its defaults), feeds one seeded uniform [0, 1) input (symbolic
dimensions 1), runs it 3 times, then times 4 blocks of 10 calls; it prints the median per block, the 1-minute load
average and the CPU time the hypervisor took from this machine (steal, /proc/stat) while the process ran.  On
2026-12-05 the same model ran at two levels 1.3-1.5x apart for seconds to minutes at a time, with neither load nor
steal to show it (docs/measurements/2026-12-05-unseen-models-round-two.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
import onnx
path, runtime, hint = sys.argv[1], sys.argv[2], sys.argv[3]
model = onnx.load(path, load_external_data=False)
initialized = {tensor.name for tensor in model.graph.initializer}
feeds = {}
for value in model.graph.input:
    if value.name in initialized:
        continue
    shape = [dim.dim_value if dim.HasField("dim_value") else 1 for dim in value.type.tensor_type.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    feeds[value.name] = np.random.default_rng(0).uniform(0, 1, shape).astype(dtype)
if runtime == "openvino":
    import openvino
    config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "ENABLE_CPU_PINNING": True}
    if hint != "default":
        config["INFERENCE_PRECISION_HINT"] = hint
    request = openvino.Core().compile_model(path, "CPU", config).create_infer_request()
    call = lambda: request.infer(list(feeds.values()))
else:
    import onnxruntime
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    call = lambda: session.run(None, feeds)
for _ in range(3):
    call()
blocks = []
for _ in range(4):
    times = []
    for _ in range(10):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    blocks.append(round(float(np.median(times)) * 1000, 1))
print(json.dumps(blocks))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--runtime", choices=["openvino", "ort"], default="openvino")
    parser.add_argument("--hint", default="default", help="OpenVINO's INFERENCE_PRECISION_HINT (default: none)")
    args = parser.parse_args()

    print(f"{args.model} on {args.runtime} ({args.hint})")
    print("| process | ms per block (median of 10 calls) | load average | steal s |")
    print("|---|---|---|---|")
    for index in range(args.processes):
        steal = _steal_seconds()
        done = subprocess.run([sys.executable, "-c", CHILD, str(args.model), args.runtime, args.hint],
                              capture_output=True, text=True, check=True)
        blocks = ", ".join(str(ms) for ms in json.loads(done.stdout.splitlines()[-1]))
        print(f"| {index + 1} | {blocks} | {os.getloadavg()[0]:.2f} | {_steal_seconds() - steal:.2f} |", flush=True)


def _steal_seconds() -> float:
    """CPU time the hypervisor gave to others, all CPUs together (/proc/stat's 8th counter, in clock ticks)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
