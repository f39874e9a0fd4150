"""model.causal_lm: a transformers causal LM exported with its KV cache (optimum's names and axes), its tied
embedding stored once (also after simplify), prefill and decode checked against PyTorch, and clear errors for a
checkpoint that is not there."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from qdeploy.calibration import data_context
from qdeploy.core.context import StageResult
from qdeploy.core.errors import ModelError, RecipeError
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export
from qdeploy.stages.export import _causal_lm_source as source_module
from qdeploy.stages.export._causal_lm_check import decode_feeds, prefill_feeds
from tests.helpers.simplify import simplify_model
from tests.stages.export.causal_lm_models import HIDDEN, VOCAB, tiny_llama

pytestmark = pytest.mark.torch
pytest.importorskip("transformers")

LAYERS = 2
TABLE_BYTES = VOCAB * HIDDEN * 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama", layers=LAYERS)


@pytest.fixture(scope="module")
def exported(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> StageResult:
    return _export(tmp_path_factory.mktemp("export"), {"path": str(checkpoint)})


def _recipe(causal_lm: dict[str, Any]) -> Recipe:
    return Recipe(name="t", model={"causal_lm": causal_lm}, variants={"v": []})


def _export(folder: Path, causal_lm: dict[str, Any]) -> StageResult:
    recipe = _recipe(causal_lm)
    ctx = recipe.stage_context("exported", folder / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return export.run(None, recipe.model, ctx)


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]


def _tables(model: onnx.ModelProto) -> list[str]:
    """Initializers of the embedding table's size."""
    return [init.name for init in model.graph.initializer if int(np.prod(init.dims)) * 4 == TABLE_BYTES]


def test_the_interface_is_optimums_decoder_with_past(exported: StageResult) -> None:
    graph = exported.model.graph
    inputs = {value.name: value for value in graph.input}
    outputs = {value.name: value for value in graph.output}
    past = [f"past_key_values.{i}.{kind}" for i in range(LAYERS) for kind in ("key", "value")]
    assert list(inputs) == ["input_ids", "attention_mask", "position_ids", *past]
    assert list(outputs) == ["logits", *[name.replace("past_key_values", "present") for name in past]]
    assert _dims(inputs["input_ids"]) == ["batch", "sequence_length"]
    assert _dims(inputs["attention_mask"]) == ["batch", "total_sequence_length"]
    assert _dims(inputs["past_key_values.1.value"]) == ["batch", 2, "past_sequence_length", 16]
    assert _dims(outputs["present.0.key"]) == ["batch", 2, "total_sequence_length", 16]
    assert _dims(outputs["logits"])[:2] == ["batch", "sequence_length"]
    assert inputs["input_ids"].type.tensor_type.elem_type == onnx.TensorProto.INT64


def test_the_tied_table_is_stored_once_and_said(exported: StageResult) -> None:
    assert len(_tables(exported.model)) == 1
    findings = exported.findings.to_report()
    tied = findings["tied_embedding"]
    assert tied["bytes_saved"] == TABLE_BYTES and tied["table"] == _tables(exported.model)[0]
    head = next(node for node in exported.model.graph.node if node.op_type == "Transpose"
                and node.input[0] == tied["table"])
    assert [attr.ints for attr in head.attribute] == [[1, 0]]
    assert findings["source"] == "causal_lm" and findings["causal_lm"]["tie_word_embeddings"] is True
    json.dumps(exported.report())


def test_weights_come_from_torch_transposed_once_not_through_the_exporter(
        checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exporter writes the graph only (with the weights in its call it held several copies of them, 2.9 GB for a
    539 MB model); each Linear's weight arrives transposed as its folding would store it, the tied table once."""
    import torch

    calls: list[dict[str, Any]] = []
    original = torch.onnx.export

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", spy)
    result = _export(tmp_path, {"path": str(checkpoint)})
    assert calls and all(call["export_params"] is False for call in calls)
    graph = result.model.graph
    weights = {init.name for init in graph.initializer}
    transposed_weights = [node.input[0] for node in graph.node if node.op_type == "Transpose" and
                          node.input[0] in weights]
    assert transposed_weights == [_tables(result.model)[0]]  # only the tied table's, read by the Gather too
    matmul_weights = [node.input[1] for node in graph.node if node.op_type == "MatMul" and node.input[1] in weights]
    assert len(matmul_weights) == LAYERS * 7  # q, k, v, o, gate, up, down of each layer, already transposed


def test_a_graph_input_without_a_weight_fails_the_export_naming_it(tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    from qdeploy.core.errors import StageError
    from qdeploy.stages.export._causal_lm import attach_weights

    torch = pytest.importorskip("torch")
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"]),
         helper.make_node("Add", ["y", "b"], ["z"])], "g",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in
         (("x", [1, 2]), ("w", [3, 2]), ("b", [3]))],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3])])
    path = tmp_path / "graph.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(StageError, match=r"neither the decoder's interface nor a weight of the model: \['b'\]"):
        attach_weights(path, {"w": torch.ones(3, 2)}, {"x"}, "exported")
    w = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    attach_weights(path, {"w": w, "b": torch.ones(3)}, {"x"}, "exported")
    x = np.array([[1.0, 2.0]], np.float32)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, x @ w.numpy().T + 1)


def test_the_check_ran_on_the_tokenizers_tokens_for_prefill_and_decode(exported: StageResult) -> None:
    check = exported.findings.to_report()["causal_lm"]["check"]
    assert check["tokens"] == "tokenizer" and check["prefill_tokens"] >= 10
    for key in ("prefill_logits", "prefill_presents", "decode_logits", "decode_presents"):
        assert check[key] < 1e-5 <= check["bound"], key


def test_prefill_and_decode_match_torch(exported: StageResult, checkpoint: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()
    session = ort.InferenceSession(exported.model.SerializeToString(), providers=["CPUExecutionProvider"])
    tokens = [5, 9, 2, 14, 3, 7]
    feeds = prefill_feeds(tokens, LAYERS, 2, 16)
    names = [output.name for output in session.get_outputs()]
    prefill = dict(zip(names, session.run(None, feeds), strict=True))
    with torch.no_grad():
        expected = model(torch.tensor([tokens])).logits.numpy()
        following = model(torch.tensor([[*tokens, 11]])).logits.numpy()[:, -1:]
    np.testing.assert_allclose(prefill["logits"], expected, atol=1e-5)
    decode = session.run(["logits"], decode_feeds(11, prefill, LAYERS))[0]
    np.testing.assert_allclose(decode, following, atol=1e-5)


def test_simplify_keeps_the_table_once(exported: StageResult, tmp_path: Path) -> None:
    ctx = data_context("v", tmp_path / "work")
    ctx.work_dir.mkdir()
    result = simplify_model(exported.model, tmp_path, ctx)
    assert len(_tables(result.model)) == 1
    assert "Transpose" in {node.op_type for node in result.model.graph.node}
    skipped = result.findings.to_report()["fold_skipped"]
    assert any("second copy" in entry["reason"] for entry in skipped), skipped


def test_preflight_knows_the_inputs_and_the_files_without_exporting(checkpoint: Path) -> None:
    recipe = _recipe({"path": str(checkpoint)})
    inputs = {info.name: info for info in export.inspect_source(recipe.model, recipe.resolve)}
    assert inputs["input_ids"].shape == (None, None) and inputs["input_ids"].dtype == np.int64
    assert inputs["past_key_values.1.key"].shape == (None, 2, None, 16)
    assert len(inputs) == 3 + 2 * LAYERS
    files = export.source_files(recipe.model, recipe.stage_context("exported", checkpoint.parent / "w"))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {path.name for path in files}


def test_the_tokenizer_is_the_checkpoints(checkpoint: Path) -> None:
    recipe = _recipe({"path": str(checkpoint)})
    tokenizer = export.causal_lm_tokenizer(recipe.model, recipe.resolve)
    ids = tokenizer("The quick brown fox")["input_ids"]
    assert len(ids) == 4 and max(ids) < VOCAB


def test_a_checkpoint_inside_a_package_is_found_without_importing_it(checkpoint: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "site" / "tiny_llm_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "model").symlink_to(checkpoint, target_is_directory=True)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    recipe = _recipe({"package": "tiny_llm_pkg", "file": "model"})
    assert source_module.resolve_checkpoint(recipe.model.causal_lm, recipe.resolve).folder == package / "model"
    with pytest.raises(RecipeError, match="does not exist") as raised:
        source_module.resolve_checkpoint(_recipe({"package": "tiny_llm_pkg", "file": "x.gguf"}).model.causal_lm,
                                         recipe.resolve)
    assert raised.value.field == "model.causal_lm.file" and "model" in str(raised.value)


def test_a_missing_package_says_what_to_install() -> None:
    recipe = _recipe({"package": "llm_nowhere_here", "file": "m.gguf"})
    with pytest.raises(RecipeError, match="pip install llm-nowhere-here") as raised:
        export.inspect_source(recipe.model, recipe.resolve)
    assert raised.value.field == "model.causal_lm.package" and "llm_nowhere_here" in str(raised.value)


@pytest.mark.parametrize(("name", "said"), [("missing", "does not exist"), ("notes.txt", "not a .gguf file"),
                                            ("empty", "no config.json")])
def test_a_missing_or_wrong_path_names_the_field(tmp_path: Path, name: str, said: str) -> None:
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    recipe = _recipe({"path": str(tmp_path / name)})
    with pytest.raises(RecipeError, match=said) as raised:
        _export(tmp_path, {"path": str(tmp_path / name)})
    assert raised.value.field == "model.causal_lm.path"
    with pytest.raises(RecipeError):
        export.source_files(recipe.model, recipe.stage_context("exported", tmp_path / "w"))


def test_without_transformers_the_error_says_how_to_install(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = source_module.importlib.util.find_spec
    monkeypatch.setattr(source_module.importlib.util, "find_spec",
                        lambda name, *rest: None if name == "transformers" else real(name, *rest))
    recipe = _recipe({"path": str(checkpoint)})
    with pytest.raises(ModelError, match=r'transformers, which is not installed: pip install "qdeploy\[llm\]"'):
        export.inspect_source(recipe.model, recipe.resolve)


@pytest.mark.parametrize(("model", "said"), [
    ({"causal_lm": {"path": "a", "package": "b", "file": "c"}}, "exactly one of 'path'"),
    ({"causal_lm": {"package": "b"}}, "needs 'file'"),
    ({"causal_lm": {"path": "a"}, "onnx": "m.onnx"}, "exactly one of 'onnx', 'torch' or 'causal_lm'"),
    ({"causal_lm": {"path": "a"}, "inputs": [{"name": "input_ids"}]}, "inputs are fixed"),
    ({"causal_lm": {"path": "a", "dtype": "float16"}}, "float32"),
])
def test_recipe_mistakes_are_refused_at_load(model: dict[str, Any], said: str, tmp_path: Path) -> None:
    from qdeploy.api import load_recipe

    with pytest.raises(RecipeError, match=said) as raised:
        load_recipe({"name": "t", "model": model, "variants": {"v": []}}, base_dir=tmp_path)
    assert (raised.value.field or "").startswith("model")


def test_a_checkpoint_without_tokenizer_is_checked_on_seeded_ids(tmp_path: Path) -> None:
    folder = tiny_llama(tmp_path / "bare", layers=1, tokenizer=False, tied=False)
    result = _export(tmp_path, {"path": str(folder)})
    findings = result.findings.to_report()
    assert findings["causal_lm"]["check"]["tokens"].startswith("seeded ids")
    assert "tied_embedding" not in findings
    with pytest.raises(ModelError, match="cannot load its tokenizer"):
        export.causal_lm_tokenizer(_recipe({"path": str(folder)}).model, Path)


def test_loading_shows_no_gguf_progress_bar(capsys: pytest.CaptureFixture[str]) -> None:
    """The GGUF reader's plain tqdm bar printed over the run's own progress display while loading."""
    import transformers
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    bars = transformers.utils.logging.is_progress_bar_enabled()
    with source_module._quiet(transformers):
        assert list(gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors...")) == [0, 1, 2]
    assert "de-quantizing" not in capsys.readouterr().err
    assert transformers.utils.logging.is_progress_bar_enabled() == bars  # the user's setting, as it was
