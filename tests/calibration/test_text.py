"""The text reader: windows of token ids from a UTF-8 file, parts kept apart, empty caches, labels, errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from pydantic import ValidationError

from qdeploy.calibration import DatasetSpec, iter_samples, load_tokenizer, token_windows
from qdeploy.core.errors import DataError, RecipeError
from qdeploy.stages.validate import read_labels

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "the", "dog", "ran", "to", "the", "park", "while", "birds",
         "sang"]


def _tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{word: index + 1 for index, word in enumerate(dict.fromkeys(WORDS))}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def _model(folder: Path, *, heads: int | str = 2, extra: str | None = None) -> Path:
    """A graph with a causal LM's interface (only its inputs matter to the reader)."""
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total_sequence_length"]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence_length"]),
              helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT,
                                            ["batch", heads, "past_sequence_length", 4])]
    if extra:
        inputs.append(helper.make_tensor_value_info(extra, TensorProto.INT64, ["batch", "sequence_length"]))
    graph = helper.make_graph([helper.make_node("Identity", ["input_ids"], ["logits"])], "lm", inputs,
                              [helper.make_tensor_value_info("logits", TensorProto.INT64, None)])
    path = folder / "lm.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    (tmp_path / "corpus.txt").write_text(" ".join(WORDS * 10), encoding="utf-8")  # 160 tokens: 20 windows of 8
    _tokenizer(tmp_path)
    return tmp_path


def _spec(**fields: object) -> DatasetSpec:
    return DatasetSpec(**{"reader": "text", "path": "corpus.txt", "window": 8, "tokenizer": "tokenizer.json",
                          **fields})


def _samples(folder: Path, spec: DatasetSpec, **options: object) -> list[dict[str, np.ndarray]]:
    return list(iter_samples(spec, options.pop("model", None) or _model(folder),
                             resolve=lambda relative: folder / relative, dataset_name="text", **options))


def test_windows_feed_ids_mask_positions_and_an_empty_cache(corpus: Path) -> None:
    samples = _samples(corpus, _spec(samples=3))
    assert len(samples) == 3
    tokenizer = load_tokenizer(corpus / "tokenizer.json")
    expected = np.asarray(tokenizer.encode(" ".join(WORDS * 10))[:24]).reshape(3, 8)
    for index, feed in enumerate(samples):
        assert feed["input_ids"].dtype == np.int64 and feed["input_ids"].tolist() == [expected[index].tolist()]
        assert feed["attention_mask"].tolist() == [[1] * 8]
        assert feed["position_ids"].tolist() == [list(range(8))]
        past = feed["past_key_values.0.key"]
        assert past.shape == (1, 2, 0, 4) and past.dtype == np.float32


def test_parts_split_the_windows_apart_and_labels_are_the_windows(corpus: Path) -> None:
    first = _samples(corpus, _spec(part=[0.0, 0.5]))
    second = _samples(corpus, _spec(part=[0.5, 1.0]))
    assert len(first) == len(second) == 10
    whole = token_windows(corpus / "corpus.txt", load_tokenizer(corpus / "tokenizer.json"), 8)
    assert whole.total == 20 and whole.first == 0
    joined = np.concatenate([feed["input_ids"] for feed in first + second])
    assert np.array_equal(joined, whole.ids)  # disjoint, in order, covering every window
    later = token_windows(corpus / "corpus.txt", load_tokenizer(corpus / "tokenizer.json"), 8, (0.5, 1.0), 2)
    assert later.first == 10 and "windows 10..11 of 20" in later.describe()
    datasets = {"val": _spec(part=[0.5, 1.0], samples=4)}
    labels = read_labels(datasets, lambda relative: corpus / relative, "val", ["input_ids"], None)
    assert labels is not None and len(labels) == 4
    assert all(np.array_equal(label, feed["input_ids"]) for label, feed in zip(labels, second, strict=False))


def test_a_missing_file_an_empty_part_and_a_missing_tokenizer_are_clear_errors(corpus: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        _samples(corpus, _spec(path="nowhere.txt"))
    with pytest.raises(DataError, match="selects none"):
        _samples(corpus, _spec(window=1000))
    with pytest.raises(RecipeError, match=r"set data\.text\.tokenizer .*, or use a model\.causal_lm source") as caught:
        _samples(corpus, _spec(tokenizer=None))
    assert caught.value.field == "data.text.tokenizer"


def test_a_tokenizer_is_loaded_once_whichever_dataset_asks(corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two datasets over one tokenizer (calibration and validation parts) load it once: a GGUF's takes seconds."""
    from qdeploy.calibration import text

    loads: list[Path] = []

    def counted(path: Path, field: str = "tokenizer") -> text.Tokenizer:
        loads.append(path)
        return load_tokenizer(path, field)

    monkeypatch.setattr(text, "load_tokenizer", counted)
    (corpus / "other").mkdir()
    _tokenizer(corpus / "other")  # a path never loaded before in this process
    spec = _spec(tokenizer="other/tokenizer.json")
    first = text.tokenizer_for(spec, lambda relative: corpus / relative, "calib")
    again = text.tokenizer_for(spec.model_copy(update={"part": [0.5, 1.0]}), lambda relative: corpus / relative,
                               "held")
    assert first is again and loads == [(corpus / "other" / "tokenizer.json").resolve()]


@pytest.mark.parametrize(("fields", "words"), [
    ({"part": [0.5, 0.5]}, "0 <= start < end <= 1"),
    ({"part": [0.0, 1.5]}, "0 <= start < end <= 1"),
    ({"part": [0.0]}, "start, end"),
    ({"path": None}, "needs a 'path'"),
])
def test_bad_fields_are_refused_at_load_time(fields: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("[", r"\[")):
        _spec(**fields)


def test_text_fields_belong_to_the_text_reader() -> None:
    with pytest.raises(ValidationError, match="apply to reader 'text' only"):
        DatasetSpec(reader="npy", path="samples", window=64)


def test_an_input_the_reader_cannot_fill_is_named(corpus: Path) -> None:
    with pytest.raises(DataError, match="cannot fill model input 'token_type_ids'"):
        _samples(corpus, _spec(), model=_model(corpus, extra="token_type_ids"))


def test_symbolic_heads_say_what_to_set(corpus: Path) -> None:
    with pytest.raises(DataError, match=r"symbolic axis 1 \('num_heads'.*model\.inputs"):
        _samples(corpus, _spec(), model=_model(corpus, heads="num_heads"))
