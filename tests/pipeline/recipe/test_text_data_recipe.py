"""A recipe's text datasets and causal_lm source as the loader, the preflight, the stages' contexts, the cache keys
and the docs see them: file checks with lines, the model's tokenizer as the default, the export's libraries."""

from __future__ import annotations

from pathlib import Path

import pytest

from qdeploy.calibration.spec import DatasetSpec
from qdeploy.core.errors import RecipeError
from qdeploy.pipeline.publish.store import library_versions
from qdeploy.pipeline.recipe import registry
from qdeploy.pipeline.recipe.docs import recipe_reference
from qdeploy.pipeline.recipe.loader import load_recipe_file
from qdeploy.pipeline.recipe.schema import GateSpec, Recipe
from qdeploy.pipeline.recipe.text_data import causal_lm_checkpoint, check_text_tokenizers, with_model_tokenizer
from qdeploy.pipeline.results.identity import dataset_fingerprint, recipe_content
from qdeploy.pipeline.run.plan import describe_plan
from tests.helpers.models import write_recipe

RECIPE = """
    name: lm
    model: {MODEL}
    data:
      held: {reader: text, path: corpus.txt, window: 4{TOKENIZER}}
    variants:
      fp32: [simplify]
    targets: [ort:cpu]
    validate: {data: held, metric: perplexity}
    benchmark: {enabled: false}
    """


def _folder(tmp_path: Path) -> Path:
    """A checkpoint folder as the loader sees it (config.json and files; nothing here loads it)."""
    folder = tmp_path / "tiny-llama"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "tokenizer.json").write_text("{}")
    (tmp_path / "corpus.txt").write_text("the cat sat on the mat " * 10, encoding="utf-8")
    return folder


def _load(tmp_path: Path, model: str = "{causal_lm: {path: tiny-llama}}", tokenizer: str = "") -> Recipe:
    body = RECIPE.replace("{MODEL}", model).replace("{TOKENIZER}", tokenizer)
    return load_recipe_file(write_recipe(tmp_path, body))


def test_a_text_dataset_without_a_tokenizer_reads_with_the_models(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    recipe = _load(tmp_path)
    assert causal_lm_checkpoint(recipe.model, recipe.resolve) == folder.resolve()
    context = recipe.stage_context("fp32", tmp_path / "work")
    assert context.datasets["held"].tokenizer == str(folder.resolve())
    assert recipe.data["held"].tokenizer is None  # the recipe (its report, its keys) keeps what the user wrote
    check_text_tokenizers(recipe.data, recipe.model, ["held"])  # nothing to refuse, nothing loaded


def test_a_gguf_checkpoint_is_its_own_tokenizer_and_a_dataset_keeps_its_own(tmp_path: Path) -> None:
    _folder(tmp_path)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    (tmp_path / "own.json").write_text("{}")
    recipe = _load(tmp_path, "{causal_lm: {path: model.gguf}}")
    assert with_model_tokenizer(recipe.data, recipe.model, recipe.resolve)["held"].tokenizer == \
        str((tmp_path / "model.gguf").resolve())
    own = _load(tmp_path, "{causal_lm: {path: model.gguf}}", ", tokenizer: own.json")
    assert own.stage_context("fp32", tmp_path / "work").datasets["held"].tokenizer == "own.json"


def test_without_a_tokenizer_or_a_causal_lm_the_error_says_both_ways(tmp_path: Path) -> None:
    _folder(tmp_path)
    (tmp_path / "m.onnx").write_bytes(b"")
    recipe = _load(tmp_path, "{onnx: m.onnx}")
    assert recipe.stage_context("fp32", tmp_path / "work").datasets["held"].tokenizer is None
    with pytest.raises(RecipeError, match=r"set data\.held\.tokenizer .*, or use a model\.causal_lm source") as caught:
        check_text_tokenizers(recipe.data, recipe.model, ["held"])
    assert caught.value.field == "data.held.tokenizer"
    check_text_tokenizers(recipe.data, recipe.model, [])  # a dataset the run does not read is not its concern


@pytest.mark.parametrize(("tokenizer", "setup", "field", "said"), [
    ("", lambda folder: (folder / "corpus.txt").unlink() or (folder / "corpus.txt").mkdir(), "data.held.path",
     "is a folder, not a file"),
    (", tokenizer: nowhere.json", lambda folder: None, "data.held.tokenizer", "does not exist"),
    ("", lambda folder: (folder / "tiny-llama" / "config.json").unlink(), "model.causal_lm.path", "config.json"),
])
def test_the_loader_checks_text_and_checkpoint_paths_with_lines(tmp_path: Path, tokenizer: str, setup: object,
                                                                field: str, said: str) -> None:
    _folder(tmp_path)
    setup(tmp_path)  # type: ignore[operator]
    with pytest.raises(RecipeError, match=said) as caught:
        _load(tmp_path, tokenizer=tokenizer)
    assert caught.value.field == field and caught.value.line is not None


def test_a_missing_checkpoint_is_named_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text("text")
    with pytest.raises(RecipeError, match="does not exist") as caught:
        _load(tmp_path)
    assert caught.value.field == "model.causal_lm.path" and caught.value.line == 2


def test_a_tokenizer_folder_is_accepted(tmp_path: Path) -> None:
    _folder(tmp_path)
    assert _load(tmp_path, tokenizer=", tokenizer: tiny-llama").data["held"].tokenizer == "tiny-llama"


def test_the_export_key_holds_transformers_torch_and_gguf_versions(tmp_path: Path) -> None:
    _folder(tmp_path)
    libraries = registry.export_libraries(_load(tmp_path).model)
    assert {"transformers", "torch", "gguf"} <= set(libraries)
    assert library_versions(["no-such-distribution-qdeploy"]) == {"no-such-distribution-qdeploy": "absent"}
    (tmp_path / "m.onnx").write_bytes(b"")
    assert registry.export_libraries(_load(tmp_path, "{onnx: m.onnx}").model) == ("onnx",)


def test_the_plan_names_the_checkpoint(tmp_path: Path) -> None:
    _folder(tmp_path)
    assert "export from causal_lm tiny-llama" in describe_plan(_load(tmp_path))


def test_identity_follows_the_checkpoint_the_text_and_the_tokenizer(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    recipe = _load(tmp_path)
    content, data = recipe_content(recipe), dataset_fingerprint(recipe, ["held"])
    assert [name for name, _ in data["held"]["files"]] == ["corpus.txt", "tokenizer/config.json",
                                                          "tokenizer/tokenizer.json"]  # weights left out
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert recipe_content(recipe)["model"] != content["model"]
    assert dataset_fingerprint(recipe, ["held"]) == data
    (folder / "tokenizer.json").write_text('{"other": 1}')
    assert dataset_fingerprint(recipe, ["held"]) != data
    data = dataset_fingerprint(recipe, ["held"])
    (tmp_path / "corpus.txt").write_text("another text", encoding="utf-8")
    assert dataset_fingerprint(recipe, ["held"]) != data
    assert recipe_content(recipe)["data"] != content["data"]


def test_a_gate_may_hold_kl_and_the_docs_list_causal_lm() -> None:
    assert GateSpec(variant="int8", target="ort:cpu", metric="kl", max=0.05).metric == "kl"
    reference = recipe_reference()
    assert "model.causal_lm" in reference and "`check_text`" in reference
    assert DatasetSpec(reader="text", path="c.txt").tokenizer is None


def test_check_refuses_a_text_dataset_with_no_tokenizer_to_read_with(tmp_path: Path) -> None:
    """`qdeploy check` (the preflight) says it before anything runs, naming the field and both ways out."""
    import onnx
    from onnx import TensorProto, helper

    from qdeploy.pipeline.recipe.preflight import check_before_run

    _folder(tmp_path)
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["logits"])], "lm",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
                              [helper.make_tensor_value_info("logits", TensorProto.INT64, ["batch", "sequence"])])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    with pytest.raises(RecipeError, match=r"set data\.held\.tokenizer .*model\.causal_lm source"):
        check_before_run(_load(tmp_path, "{onnx: m.onnx}"))


def test_a_tokenizer_file_is_read_once_per_process_until_it_is_rewritten(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every stage's key fingerprints the text dataset and its tokenizer (a GGUF is about 100 MB): each file is
    hashed once; a file rewritten in place with the same size and mtime is hashed again (its change time moved)."""
    import os

    from qdeploy.pipeline.results import identity

    _folder(tmp_path)
    recipe = _load(tmp_path)
    read: list[str] = []
    real = identity.sha256_file
    monkeypatch.setattr(identity, "sha256_file", lambda path: read.append(Path(path).name) or real(path))
    first = dataset_fingerprint(recipe, ["held"])
    assert dataset_fingerprint(recipe, ["held"]) == first and sorted(read) == ["config.json", "corpus.txt",
                                                                               "tokenizer.json"]
    corpus = tmp_path / "corpus.txt"
    before = corpus.stat()
    corpus.write_text("the dog sat on the mat " * 10, encoding="utf-8")  # same size
    os.utime(corpus, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same mtime
    assert dataset_fingerprint(recipe, ["held"]) != first and read.count("corpus.txt") == 2
