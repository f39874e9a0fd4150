"""Weight-only int4/int8 on a GPT-style decoder: qdeploy's ``mode: weight_only`` (rtn, gptq, mixed int4/int8 by
``ratio``) against ONNX Runtime's ``MatMulNBitsQuantizer`` (RTN, HQQ, GPTQ) and NNCF's ``compress_weights``
(default, AWQ + scale estimation, GPTQ), on ONNX Runtime and OpenVINO, in one run; then the same tools on the real
MiniLM encoder's MatMuls (``weight_only_quality.py``).

    python benchmarks/weight_only.py [--work /tmp/qdeploy-wo] [--layers 6] [--hidden 512] [--vocab 32000]
                                     [--rounds 5] [--iterations 4] [--threads 1] [--no-minilm]

Quality (``weight_only_quality.py``): the decoder reads real text (standard-library docstrings through the MiniLM
wheel's WordPiece vocabulary); next-token agreement with fp32 and KL divergence on held-out windows; the
data-aware tools all calibrate on the same 16 windows of the first half.  Every int4 artifact here is
symmetric, group 128.

The decoder is ``tests/helpers/decoder.py`` (transformers Llama config, seeded random weights, past key/values as
optimum writes them).  Columns: size (model + data files), build seconds, prefill latency (32 tokens, no past)
and one decode step (1 token after 32 cached; fed the fp32 model's real past), each the median over
``--rounds`` interleaved rounds (every artifact takes its turn each round) of ``--iterations`` timed calls,
CPU time per call with ``--threads`` threads (robust to other jobs on a shared machine); cosine of the logits
against fp32; and what the runtime keeps: ORT's optimized-graph weight ops, OpenVINO's compiled
FullyConnected weight types.  NNCF writes OpenVINO IR, so its rows are OpenVINO only; it is imported lazily
and reported as not installed when absent (``pip install nncf``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import weight_only_quality as quality
from benchmarks.weight_only_peers import build_nncf, build_ort_tool
from tests.helpers.decoder import export, feeds, io_names

PROMPT, PAST = 32, 32


@dataclass
class Artifact:
    name: str
    engine: str
    path: Path
    build_s: float
    runtimes: tuple[str, ...] = ("ort", "openvino")


def size_of(path: Path) -> int:
    """The model file plus the files beside it that share its name (external data, an IR's .bin)."""
    return path.stat().st_size + sum(other.stat().st_size for other in path.parent.iterdir()
                                     if other != path and other.name.startswith((path.name + ".", path.stem + "."))
                                     and other.suffix in (".data", ".bin", ".weights"))


_CALIBRATION = "calibration: {data: prompts, samples: 16}"
QDEPLOY_VARIANTS = {  # embeddings int8 as NNCF's default backup precision: the same layout and size as NNCF's
    "int4 rtn": "[simplify, {quantize: {mode: weight_only, embeddings: int8}}]",
    "int4 gptq": f"[simplify, {{quantize: {{mode: weight_only, embeddings: int8, method: gptq, {_CALIBRATION}}}}}]",
    "int4 gptq ratio 0.8": "[simplify, {quantize: {mode: weight_only, embeddings: int8, method: gptq, ratio: 0.8, "
                           f"{_CALIBRATION}}}}}]",
    "int8 rtn": "[simplify, {quantize: {mode: weight_only, bits: 8}}]",
}


def build_qdeploy(source: Path, folder: Path, config: Any, ids: np.ndarray) -> list[Artifact]:
    """qdeploy's variants through its runner, as a user's recipe builds them (validation and benchmark off)."""
    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    names = {label: label.replace(" ", "_") for label in QDEPLOY_VARIANTS}
    variants = "\n".join(f"  {names[label]}: {steps}" for label, steps in QDEPLOY_VARIANTS.items())
    recipe = folder / "recipe.yaml"
    quality.write_calibration(folder / "prompts", config, ids, 16)  # real text, first half
    recipe.write_text(f"name: wo\nmodel: {{onnx: {source}}}\ndata: {{prompts: {{reader: npy, path: prompts}}}}\n"
                      f"variants:\n{variants}\ntargets: [ort:cpu]\nvalidate: {{data: prompts, samples: 1}}\n"
                      "benchmark: {enabled: false}\nreport: {formats: [json]}\n")
    result = run_recipe(load_recipe_file(recipe), RunOptions(out_dir=folder / "run", show_progress=False))
    seconds = {row["name"]: row.get("seconds", 0.0) for row in result.report["artifacts"]}
    built = []
    for label, name in names.items():
        path = folder / "run" / "artifacts" / f"{name}.onnx"
        if path.exists():
            built.append(Artifact(label, "qdeploy", path, seconds.get(name, 0.0)))
        else:
            print(f"qdeploy {label} was not built: {result.report.get('failures')}", file=sys.stderr)
    return built


def _timed_build(build: Callable[[], Path]) -> tuple[Path | None, float, str]:
    started = time.perf_counter()
    try:
        return build(), time.perf_counter() - started, ""
    except ImportError as exc:
        return None, 0.0, f"not installed ({exc.name})"
    except Exception as exc:
        return None, 0.0, f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


def build_peers(source: Path, folder: Path, calibration: list[dict[str, np.ndarray]]
                ) -> tuple[list[Artifact], list[str]]:
    both, ov_only = ("ort", "openvino"), ("openvino",)
    plans: list[tuple[str, str, Callable[[], Path], tuple[str, ...]]] = [
        ("int4 rtn", "ORT MatMulNBitsQuantizer", lambda: build_ort_tool(source, folder / "ort_rtn.onnx", "rtn",
                                                                         None), both),
        ("int4 hqq", "ORT MatMulNBitsQuantizer", lambda: build_ort_tool(source, folder / "ort_hqq.onnx", "hqq",
                                                                         None), both),
        ("int4 gptq", "ORT MatMulNBitsQuantizer", lambda: build_ort_tool(source, folder / "ort_gptq.onnx", "gptq",
                                                                          calibration), both),
        ("int4", "NNCF compress_weights", lambda: build_nncf(source, folder / "nncf_int4.xml", "INT4_SYM"), ov_only),
        ("int4 awq+se", "NNCF compress_weights", lambda: build_nncf(source, folder / "nncf_awq.xml", "INT4_SYM",
                                                                    data=calibration, awq=True), ov_only),
        ("int4 gptq", "NNCF compress_weights", lambda: build_nncf(source, folder / "nncf_gptq.xml", "INT4_SYM",
                                                                  data=calibration, gptq=True), ov_only),
        ("int4 ratio 0.8", "NNCF compress_weights", lambda: build_nncf(
            source, folder / "nncf_ratio.xml", "INT4_SYM", ratio=0.8, data=calibration), ov_only),
    ]
    built, problems = [], []
    for name, engine, build, runtimes in plans:
        path, seconds, problem = _timed_build(build)
        if path is None:
            problems.append(f"{engine}: {problem}")
        else:
            built.append(Artifact(name, engine, path, seconds, runtimes))
    return built, problems


class Runner:
    """One artifact loaded on one runtime: a call on feeds, and what the runtime keeps of the weights."""

    def __init__(self, artifact: Artifact, runtime: str, threads: int) -> None:
        self.artifact, self.runtime = artifact, runtime
        if runtime == "ort":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads, options.log_severity_level = threads, 3
            options.optimized_model_filepath = str(artifact.path.with_name(artifact.path.stem + ".ort-opt.onnx"))
            self.session = ort.InferenceSession(str(artifact.path), options, providers=["CPUExecutionProvider"])
            self.names = {value.name for value in self.session.get_inputs()}
            self.kept = _ort_kept(Path(options.optimized_model_filepath))
        else:
            import openvino as ov

            self.compiled = ov.Core().compile_model(str(artifact.path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                                "INFERENCE_NUM_THREADS": threads})
            self.kept = _ov_kept(self.compiled)

    def __call__(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        if self.runtime == "ort":
            return self.session.run(["logits"], {k: v for k, v in feed.items() if k in self.names})[0]
        return self.compiled(feed)["logits"]


def _ort_kept(optimized: Path) -> str:
    import onnx

    model = onnx.load(str(optimized), load_external_data=False)
    counts = Counter(node.op_type for node in model.graph.node
                     if node.op_type in ("MatMulNBits", "MatMulInteger", "MatMul", "GatherBlockQuantized",
                                         "DynamicQuantizeMatMul", "FusedMatMul", "DequantizeLinear", "Gather"))
    for leftover in optimized.parent.glob(optimized.name + "*"):
        leftover.unlink()
    return ", ".join(f"{op} {n}" for op, n in sorted(counts.items()))


def _ov_kept(compiled: Any) -> str:
    counts: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if kind in ("FullyConnected", "MatMul") and op.get_input_size() > 1:
            counts[f"FC {op.input(1).get_source_output().get_node().get_output_element_type(0).get_type_name()}"] += 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def _cpu_ms(call: Callable[[], Any], iterations: int) -> float:
    started = time.process_time()
    for _ in range(iterations):
        call()
    return (time.process_time() - started) / iterations * 1e3


def measure(runners: list[Runner], inputs: dict[str, dict[str, np.ndarray]], reference: dict[str, np.ndarray],
            rounds: int, iterations: int, texts: tuple[list[dict[str, np.ndarray]], list[np.ndarray]]
            ) -> list[dict[str, Any]]:
    """Every runner in turn, ``rounds`` times; the median of its round medians per phase."""
    times: dict[int, dict[str, list[float]]] = {id(r): {"prefill": [], "decode": []} for r in runners}
    for runner in runners:  # warm-up
        for feed in inputs.values():
            runner(feed)
    for _ in range(rounds):
        for runner in runners:
            for phase, feed in inputs.items():
                times[id(runner)][phase].append(_cpu_ms(lambda: runner(feed), iterations))  # noqa: B023
    rows = []
    for runner in runners:
        art = runner.artifact
        rows.append({"variant": art.name, "engine": art.engine, "runtime": runner.runtime,
                     "size_mb": size_of(art.path) / 1e6, "build_s": art.build_s, "kept": runner.kept,
                     **{f"{phase}_ms": statistics.median(times[id(runner)][phase]) for phase in inputs},
                     **{f"cos_{phase}": cosine(reference[phase], runner(feed)) for phase, feed in inputs.items()},
                     **quality.next_token_quality(runner, *texts)})
    return rows


def _inputs(source: Path, config: Any) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """Prefill and decode-step feeds (the decode step gets the fp32 model's real past), and the fp32 logits."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    _, outputs = io_names(config.num_hidden_layers)
    prefill = feeds(config, prompt=PROMPT, past=0, seed=7)
    results = dict(zip(outputs, session.run(None, prefill), strict=True))
    decode = feeds(config, prompt=1, past=PAST, seed=8, past_values=results)
    return {"prefill": prefill, "decode": decode}, {"prefill": results["logits"],
                                                    "decode": session.run(["logits"], decode)[0]}


def table(rows: list[dict[str, Any]], fp32: dict[str, dict[str, float]]) -> str:
    lines = ["| variant | engine | runtime | size MB | build s | prefill ms (x fp32) | decode ms (x fp32) | "
             "next-token agree | KL | cos decode | weights the runtime keeps |", "|" + "---|" * 11]
    for row in rows:
        base = fp32.get(row["runtime"], {})
        speed = {phase: base.get(phase, 0.0) / row[f"{phase}_ms"] if row[f"{phase}_ms"] else 0.0
                 for phase in ("prefill", "decode")}
        lines.append(f"| {row['variant']} | {row['engine']} | {row['runtime']} | {row['size_mb']:.1f} | "
                     f"{row['build_s']:.1f} | {row['prefill_ms']:.1f} ({speed['prefill']:.2f}x) | "
                     f"{row['decode_ms']:.2f} ({speed['decode']:.2f}x) | {row['agree']:.4f} | {row['kl']:.4f} | "
                     f"{row['cos_decode']:.4f} | {row['kept']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/qdeploy-wo"))
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-minilm", action="store_true", help="skip the MiniLM encoder table")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    source, config = export(args.work / "decoder.onnx", layers=args.layers, hidden=args.hidden, vocab=args.vocab)
    ids = quality.corpus_ids()
    calibration = [quality.decoder_feeds(config, tokens) for tokens in quality.windows(ids, 16, second_half=False)]
    artifacts = [Artifact("fp32", "exported (torch.onnx)", source, 0.0),
                 *build_qdeploy(source, args.work, config, ids)]
    peers, problems = build_peers(source, args.work, calibration)
    runners = []
    for art in artifacts + peers:
        for runtime in art.runtimes:
            try:
                runners.append(Runner(art, runtime, args.threads))
            except Exception as exc:  # a tool's artifact the runtime cannot load is a finding, not a crash
                problems.append(f"{art.engine} {art.name} on {runtime}: {type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:200]}")
    inputs, reference = _inputs(source, config)
    evals = [quality.decoder_feeds(config, tokens) for tokens in quality.windows(ids, 8, second_half=True)]
    exact = Runner(artifacts[0], "ort", args.threads)
    load_before = os.getloadavg()[0]
    rows = measure(runners, inputs, reference, args.rounds, args.iterations, (evals, [exact(f) for f in evals]))
    fp32 = {row["runtime"]: {p: row[f"{p}_ms"] for p in inputs} for row in rows if row["variant"] == "fp32"}
    print(table(rows, fp32))
    print(f"\n{args.layers} layers, hidden {args.hidden}, vocab {args.vocab}; {args.threads} thread(s), CPU ms per "
          f"call; 1-minute load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    for problem in problems:
        print(f"not measured: {problem}")
    if not args.no_minilm:
        print("\nall-MiniLM-L6-v2 (real weights), int4 MatMuls, sentence-vector cosine against fp32 on held-out "
              "sentences:\n")
        print(quality.minilm_table(args.work / "minilm"))


if __name__ == "__main__":
    main()
