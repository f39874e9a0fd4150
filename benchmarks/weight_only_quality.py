"""Quality side of ``benchmarks/weight_only.py``: real text through a real tokenizer, and the real MiniLM encoder.

No small real decoder ships its weights inside a PyPI wheel that this project can use offline (the package lists
were searched; nothing may come from a model hub), so quality is measured on:

- the seeded decoder (``tests/helpers/decoder.py``) fed real text: the docstrings of a fixed list of Python
  standard-library modules (``TEXT_MODULES``; fixed for a Python version, unlike the project's own docs) tokenized
  with the BERT WordPiece vocabulary of the all-MiniLM-L6-v2 wheel (``tests/real_models.py``; 30,522 ids, inside the
  decoder's 32,000).  Calibration windows come from the first half of the token stream, evaluation windows from
  the second.  Measures against fp32 on every position of every window: next-token agreement (the same top-1
  token) and the mean KL divergence of the next-token distributions;
- the real all-MiniLM-L6-v2 encoder (exported here from the wheel's weights): cosine of its sentence vectors
  against fp32 on held-out real sentences, calibration on the other half.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

WINDOW = 64
TEXT_MODULES = ("argparse", "logging", "subprocess", "unittest", "textwrap", "difflib", "decimal", "json",
                "collections", "functools", "itertools", "pathlib", "typing", "dataclasses", "contextlib")


def corpus_ids() -> np.ndarray:
    """Standard-library docstrings (modules and their public members) as WordPiece ids (one stream, no
    [CLS]/[SEP]/[PAD])."""
    import importlib
    import inspect

    from tests import real_models as rm
    from tests.real_recipes import data

    vocab = data.read_vocab(rm.ensure(rm.MINILM_VOCAB))
    special = {vocab[token] for token in ("[CLS]", "[SEP]", "[PAD]")}
    stream: list[int] = []
    for name in TEXT_MODULES:
        module = importlib.import_module(name)
        members = [module, *(value for key, value in sorted(vars(module).items()) if not key.startswith("_"))]
        text = "\n\n".join(inspect.getdoc(member) or "" for member in members
                            if inspect.getmodule(member) is module or member is module)
        for paragraph in text.split("\n\n"):
            ids, _ = data.wordpiece_ids(paragraph, vocab, 512)
            stream.extend(int(i) for i in ids[0] if int(i) not in special)
    return np.asarray(stream, np.int64)


def windows(ids: np.ndarray, count: int, second_half: bool) -> list[np.ndarray]:
    """``count`` windows of WINDOW tokens, evenly spread over one half of the stream."""
    half = len(ids) // 2
    start, stop = (half, len(ids)) if second_half else (0, half)
    starts = np.linspace(start, stop - WINDOW, count).astype(int)
    return [ids[s:s + WINDOW][None, :] for s in starts]


def decoder_feeds(config: Any, tokens: np.ndarray) -> dict[str, np.ndarray]:
    """A prefill call on ``tokens`` [1, T] with an empty past (optimum's inputs)."""
    from tests.helpers.decoder import feeds

    feed = feeds(config, prompt=tokens.shape[1], past=0)
    feed["input_ids"] = tokens
    return feed


def write_calibration(folder: Path, config: Any, ids: np.ndarray, count: int) -> Path:
    """Calibration prompts (real text, first half) as a recipe's npz dataset."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, tokens in enumerate(windows(ids, count, second_half=False)):
        np.savez(folder / f"{index:03d}.npz", **decoder_feeds(config, tokens))
    return folder


def _softmax_log(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def next_token_quality(call: Callable[[dict[str, np.ndarray]], np.ndarray], evals: list[dict[str, np.ndarray]],
                       references: list[np.ndarray]) -> dict[str, float]:
    """Top-1 agreement with fp32 and mean KL(fp32 || artifact) over every position of the evaluation windows."""
    agree, kl, positions = 0, 0.0, 0
    for feed, reference in zip(evals, references, strict=True):
        got = call(feed)
        agree += int((got.argmax(-1) == reference.argmax(-1)).sum())
        log_p, log_q = _softmax_log(reference), _softmax_log(got)
        kl += float((np.exp(log_p) * (log_p - log_q)).sum())
        positions += reference.shape[0] * reference.shape[1]
    return {"agree": agree / positions, "kl": kl / positions}


# ---- MiniLM encoder ----------------------------------------------------------------------------------------

def export_minilm(out: Path) -> Path:
    """all-MiniLM-L6-v2 from the wheel's weights, exported by torch (sentence vector output)."""
    import torch
    from safetensors.numpy import load_file

    from tests import real_models as rm
    from tests.real_recipes import minilm

    weights = load_file(rm.ensure(rm.MINILM_WEIGHTS))
    weights.pop("embeddings.position_ids", None)
    encoder = minilm.build().eval()
    encoder.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()})
    ids = torch.ones((1, 32), dtype=torch.int64)
    torch.onnx.export(encoder, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(out),
                      input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["vector"],
                      dynamic_axes={name: {0: "batch", 1: "tokens"} for name in ("input_ids", "attention_mask",
                                                                                 "token_type_ids")},
                      opset_version=17, dynamo=False)
    return out


def minilm_feeds() -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """Real sentences, WordPiece with the wheel's vocabulary: (calibration half, evaluation half)."""
    from tests import real_models as rm
    from tests.real_recipes import data

    vocab = data.read_vocab(rm.ensure(rm.MINILM_VOCAB))
    feeds = []
    for sentence in data.SENTENCES:
        ids, mask = data.wordpiece_ids(sentence, vocab, 32)
        feeds.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    half = len(feeds) // 2
    return feeds[:half], feeds[half:]


def minilm_table(work: Path) -> str:
    """Sentence-vector cosine against fp32 for each int4 tool on the encoder's MatMuls (group 32: K is 384)."""
    import onnxruntime as ort
    import openvino as ov

    from benchmarks.weight_only_peers import build_nncf, build_ort_tool  # lazy: imports nncf only when run
    from qdeploy.stages.quantize import QuantizeConfig
    from qdeploy.stages.quantize.weight_only._build import quantize_file

    work.mkdir(parents=True, exist_ok=True)
    source = export_minilm(work / "minilm.onnx")
    calibration, evaluation = minilm_feeds()
    reference = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    expected = [reference.run(None, feed)[0] for feed in evaluation]

    def qdeploy(method: str) -> Callable[[], Path]:
        config = QuantizeConfig(mode="weight_only", method=method, group_size=32, op_types=["MatMul"],
                                lm_head="same")
        return lambda: (quantize_file(source, work / f"q_{method}.onnx", config, calibration),
                        work / f"q_{method}.onnx")[1]

    plans: list[tuple[str, Callable[[], Path], str]] = [
        ("qdeploy rtn", qdeploy("rtn"), "ort"), ("qdeploy gptq", qdeploy("gptq"), "ort"),
        ("ORT RTN", lambda: build_ort_tool(source, work / "ort_rtn.onnx", "rtn", None, group=32), "ort"),
        ("ORT HQQ", lambda: build_ort_tool(source, work / "ort_hqq.onnx", "hqq", None, group=32), "ort"),
        ("ORT GPTQ", lambda: build_ort_tool(source, work / "ort_gptq.onnx", "gptq", calibration, group=32), "ort"),
        ("NNCF INT4_SYM", lambda: build_nncf(source, work / "nncf.xml", "INT4_SYM", group=32, ratio=1.0), "ov"),
        ("NNCF INT4_SYM awq+scale_estimation", lambda: build_nncf(
            source, work / "nncf_awq.xml", "INT4_SYM", group=32, ratio=1.0, data=calibration, awq=True), "ov"),
        ("NNCF INT4_SYM gptq", lambda: build_nncf(source, work / "nncf_gptq.xml", "INT4_SYM", group=32, ratio=1.0,
                                                  data=calibration, gptq=True), "ov"),
    ]
    lines = ["| tool (int4 sym, group 32, MatMuls) | runtime | build s | mean cosine | min cosine |",
             "|---|---|---|---|---|"]
    for name, build, runtime in plans:
        started = time.perf_counter()
        try:
            path = build()
            seconds = time.perf_counter() - started
            if runtime == "ort":
                session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                outputs = [session.run(None, feed)[0] for feed in evaluation]
            else:
                compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
                outputs = [compiled(feed)[0] for feed in evaluation]
        except Exception as exc:  # a tool that fails here is a finding, not a crash
            lines.append(f"| {name} | {runtime} | - | not measured: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:120]} | |")
            continue
        cosines = [float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))
                   for a, b in zip(outputs, expected, strict=True)]
        lines.append(f"| {name} | {runtime} | {seconds:.1f} | {np.mean(cosines):.4f} | {min(cosines):.4f} |")
    return "\n".join(lines)
