"""Large test models with external data, written without ever holding the weights in memory.

    python -m tests.helpers.large_models OUT_DIR --gb 2.2 [--layers 2] [--seed 0]

The model is ``layers`` float32 MatMuls of d x d (d chosen so the weights total ``--gb`` GB,
1 GB = 1e9 bytes), with a Relu between them: ``x[batch, d] -> MatMul -> Relu -> ... -> MatMul -> y``.
Two 17,000 x 17,000 MatMuls (the issue's 2.15 GiB model) is ``--dim 17000``.  The weights are streamed
into one data file ``model.onnx.data`` beside ``model.onnx`` (offsets aligned to 4 KiB, as onnx writes
them), chunk by chunk from a seeded generator, so writing a 4 GB model needs a few MB of memory.
Weights are uniform in +-sqrt(3/d): each layer keeps activations near unit variance.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

ALIGN = 4096
CHUNK_ROWS_BYTES = 64 << 20


def dim_for(gigabytes: float, layers: int) -> int:
    """Side of the square weights so that ``layers`` of them hold ``gigabytes`` * 1e9 bytes of float32."""
    return int(math.sqrt(gigabytes * 1e9 / (4 * layers)))


def _write_weight(stream, dim: int, rng: np.random.Generator) -> tuple[int, int]:
    """Append one d x d float32 weight at an aligned offset; (offset, length)."""
    offset = stream.tell()
    pad = (-offset) % ALIGN
    stream.write(b"\0" * pad)
    offset += pad
    bound = math.sqrt(3.0 / dim)
    rows = max(1, CHUNK_ROWS_BYTES // (4 * dim))
    for start in range(0, dim, rows):
        count = min(rows, dim - start)
        chunk = rng.random((count, dim), dtype=np.float32)
        chunk *= 2 * bound
        chunk -= bound
        stream.write(chunk.tobytes())
    return offset, dim * dim * 4


def _external(name: str, dim: int, location: str, offset: int, length: int) -> TensorProto:
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = TensorProto.FLOAT
    tensor.dims.extend([dim, dim])
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def make_model(out_dir: Path, *, dim: int, layers: int = 2, seed: int = 0, opset: int = 17) -> Path:
    """Write OUT_DIR/model.onnx and OUT_DIR/model.onnx.data; the model's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path, data = out_dir / "model.onnx", out_dir / "model.onnx.data"
    rng = np.random.default_rng(seed)
    initializers, nodes = [], []
    current = "x"
    with data.open("wb") as stream:
        for index in range(layers):
            offset, length = _write_weight(stream, dim, rng)
            weight = f"w{index}"
            initializers.append(_external(weight, dim, data.name, offset, length))
            out = "y" if index == layers - 1 else f"h{index}"
            nodes.append(helper.make_node("MatMul", [current, weight], [out], name=f"matmul{index}"))
            current = out
            if index < layers - 1:
                nodes.append(helper.make_node("Relu", [current], [f"r{index}"], name=f"relu{index}"))
                current = f"r{index}"
    graph = helper.make_graph(nodes, "large_matmuls",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", dim])],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="qdeploy-tests")
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())  # the graph alone: the weights are in the data file
    return path


def recipe_text(model: Path, variants: dict[str, list], targets: list[str], *, benchmark: bool = False,
                validate_extra: str = "") -> str:
    """A recipe for a model of ``make_model``: random calibration and validation inputs, the given variants."""
    import json

    lines = "\n".join(f"  {name}: {json.dumps(chain)}" for name, chain in variants.items())
    return (f"name: large-{model.parent.name}\nmodel:\n  onnx: {model.name}\n"
            "data:\n  calib: {reader: random, samples: 4, seed: 1}\n  val: {reader: random, samples: 2, seed: 2}\n"
            f"variants:\n{lines}\ntargets: {json.dumps(targets)}\nvalidate: {{data: val, samples: 2{validate_extra}}}\n"
            f"benchmark: {{enabled: {str(benchmark).lower()}}}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--gb", type=float, default=2.2, help="weights in GB (1e9 bytes)")
    parser.add_argument("--dim", type=int, default=None, help="side of each weight (overrides --gb)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dim = args.dim or dim_for(args.gb, args.layers)
    path = make_model(args.out_dir, dim=dim, layers=args.layers, seed=args.seed)
    size = path.stat().st_size + (path.parent / "model.onnx.data").stat().st_size
    print(f"{path}: {args.layers} MatMuls of {dim}x{dim}, {size / 1e9:.3f} GB with external data")


if __name__ == "__main__":
    main()


def peak_rss_prelude(result: Path) -> str:
    """Code for ``run_cli(code=...)``: the child samples its resident memory every 20 ms and writes the peak (bytes)
    and the progress step it was reached in to ``result`` at exit.  Sampled, not read from VmHWM: the benchmark's
    memory probe resets the kernel's high-water mark (``/proc/self/clear_refs``)."""
    return f"""
import atexit, json, os, threading, time
from qdeploy.pipeline.run import progress as _progress
_page, _peak, _step = os.sysconf("SC_PAGE_SIZE"), [0, "start"], ["start"]
def _sample():
    while True:
        with open("/proc/self/statm") as handle:
            rss = int(handle.read().split()[1]) * _page
        if rss > _peak[0]:
            _peak[:] = [rss, _step[0]]
        time.sleep(0.02)
threading.Thread(target=_sample, daemon=True).start()
_phase, _detail = _progress.Progress.phase, _progress.Progress.detail
def _on_phase(self, text):
    _step[0] = text
    _phase(self, text)
def _on_detail(self, text):
    _step[0] = self._phase + " > " + text
    _detail(self, text)
_progress.Progress.phase, _progress.Progress.detail = _on_phase, _on_detail
atexit.register(lambda: open({str(result)!r}, "w").write(json.dumps({{"peak": _peak[0], "step": _peak[1]}})))
"""
