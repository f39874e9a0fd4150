"""model.torch.exporter: 'auto' (the default) takes the exporter the installed torch recommends and falls back to
TorchScript, saying why, where that one cannot export the model; 'torchscript' and 'dynamo' stay selectable."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from qdeploy.core.context import StageResult
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export
from qdeploy.stages.export.config import TorchSource
from tests.helpers.models import TORCH_NET

pytestmark = pytest.mark.torch


BRANCHY = '''
import torch


class Branchy(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot capture it, TorchScript traces one branch
            return x * 2
        return x - 1


def build():
    return Branchy()
'''


def _write_net(folder: Path) -> Path:
    path = folder / "net.py"
    path.write_text(TORCH_NET)
    return path


def _export(tmp_path: Path, **model: object) -> StageResult:
    recipe = Recipe(name="t", model=model, variants={"v": []})
    ctx = recipe.stage_context("exported", tmp_path / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return export.run(None, recipe.model, ctx)


def test_auto_is_the_default_and_takes_what_torch_recommends(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from qdeploy.stages.export._exporter import recommended_exporter

    assert TorchSource(factory="net.py:build").exporter == "auto"
    expected, _ = recommended_exporter(torch)
    net = _write_net(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _export(tmp_path, torch={"factory": f"{net}:build", "dynamic": {"x": {0: "batch"}}},
                         inputs=[{"name": "x", "shape": [1, 3, 16, 16]}])
    findings = result.findings.to_report()
    assert findings["exporter"] == expected and findings["exporter_setting"] == "auto"
    assert "exporter_fallback" not in findings and findings["max_abs_err_vs_torch"] < 1e-4
    if expected == "dynamo":  # torch >= 2.9: no deprecation warning of the legacy exporter on every run
        assert not [w for w in caught if "legacy TorchScript" in str(w.message)]
    x = np.random.default_rng(0).standard_normal((3, 3, 16, 16)).astype(np.float32)
    session = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": x})[0].shape == (3, 4)  # the batch axis is still symbolic


def test_auto_falls_back_to_torchscript_and_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    from qdeploy.stages.export._exporter import recommended_exporter

    if recommended_exporter(torch)[0] != "dynamo":
        pytest.skip("this torch recommends the TorchScript exporter: there is nothing to fall back from")
    factory = tmp_path / "branchy.py"
    factory.write_text(BRANCHY)
    with caplog.at_level(logging.WARNING, logger="qdeploy.stages.export._exporter"):
        result = _export(tmp_path, torch={"factory": f"{factory}:build"}, inputs=[{"name": "x", "shape": [1, 4]}])
    findings = result.findings.to_report()
    assert findings["exporter"] == "torchscript" and findings["exporter_setting"] == "auto"
    assert "dynamo exporter" in findings["exporter_fallback"]
    assert "data-dependent" in findings["exporter_fallback"]  # the cause torch wraps, not only its wrapper
    assert "exported with the TorchScript exporter" in findings["exporter_fallback"]
    assert any("exporter auto" in record.getMessage() for record in caplog.records)


def test_an_opset_dynamo_cannot_write_falls_back_too(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from qdeploy.stages.export._exporter import recommended_exporter

    if recommended_exporter(torch)[0] != "dynamo":
        pytest.skip("this torch recommends the TorchScript exporter")
    net = _write_net(tmp_path)
    result = _export(tmp_path, torch={"factory": f"{net}:build"}, inputs=[{"name": "x", "shape": [1, 3, 8, 8]}],
                     opset=13)
    assert result.findings.exporter == "torchscript" and result.findings.opset == 13
    assert "not the requested 13" in result.findings.exporter_fallback


def test_torchscript_stays_selectable(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    net = _write_net(tmp_path)
    result = _export(tmp_path, torch={"factory": f"{net}:build", "exporter": "torchscript"},
                     inputs=[{"name": "x", "shape": [1, 3, 8, 8]}])
    assert result.findings.exporter == "torchscript"
    reported = result.findings.to_report()
    assert "exporter_fallback" not in reported and "exporter_setting" not in reported
    assert "trace_warnings" not in reported  # the net has no decision on tensor values


def test_the_tracers_frozen_decisions_become_findings_not_terminal_warnings(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Branchy's ``if x.sum() > 0`` is traced on one branch: the ONNX model computes x * 2 for every input.  The
    tracer says so in a TracerWarning, which used to print to the terminal as a raw Python warning."""
    pytest.importorskip("torch")
    factory = tmp_path / "branchy.py"
    factory.write_text(BRANCHY)
    line = BRANCHY.splitlines().index(next(text for text in BRANCHY.splitlines() if "if x.sum()" in text)) + 1
    with warnings.catch_warnings(record=True) as escaped, \
            caplog.at_level(logging.WARNING, logger="qdeploy.stages.export._exporter"):
        warnings.simplefilter("always")
        result = _export(tmp_path, torch={"factory": f"{factory}:build", "exporter": "torchscript"},
                         inputs=[{"name": "x", "shape": [1, 4]}])
    [traced] = result.findings.to_report()["trace_warnings"]
    assert traced.startswith(f"branchy.py:{line}: Converting a tensor to a Python boolean")
    assert not [caught for caught in escaped if caught.category.__name__ == "TracerWarning"]
    assert any("Python constants on the example input" in record.getMessage() and "branchy.py" in record.getMessage()
               for record in caplog.records)
    session = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    positive, negative = np.ones((1, 4), np.float32), np.full((1, 4), -3.0, np.float32)
    right = [np.allclose(session.run(None, {"x": positive})[0], positive * 2),
             np.allclose(session.run(None, {"x": negative})[0], negative - 1)]
    assert sorted(right) == [False, True]  # one branch frozen in: what the finding warns of


def test_a_factory_that_raises_is_the_users_error_naming_it_not_an_internal_one(tmp_path: Path) -> None:
    """transformers' WhisperConfig with a pad token past a small vocabulary asserts inside nn.Embedding: the CLI
    said "internal error (a bug in qdeploy)"."""
    from qdeploy.core.errors import ModelError

    factory = tmp_path / "broken.py"
    factory.write_text("def build():\n    assert False, 'Padding_idx must be within num_embeddings'\n")
    with pytest.raises(ModelError, match=r"model.torch.factory .*broken.py:build raised AssertionError: "
                                         r"Padding_idx must be within num_embeddings"):
        _export(tmp_path, torch={"factory": f"{factory}:build"}, inputs=[{"name": "x", "shape": [1, 4]}])


TAGGER = '''
import torch


class Tagger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.gru = torch.nn.GRU(16, 32, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(64, 5)

    def forward(self, ids):
        out, _ = self.gru(self.embed(ids))
        return self.head(out)


def build():
    torch.manual_seed(0)
    return Tagger().eval()
'''


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_named_axis_is_traced_at_a_size_above_one_and_outputs_follow_it(tmp_path: Path, exporter: str) -> None:
    """The example gave a named axis size 1, which torch.export specializes: a GRU tagger's output was declared
    [1, 1, 5] for a 'seq' input (and ONNX Runtime crashed on its float16 copy)."""
    import onnxruntime as ort

    factory = tmp_path / "tagger.py"
    factory.write_text(TAGGER)
    result = _export(tmp_path, torch={"factory": f"{factory}:build", "exporter": exporter},
                     inputs=[{"name": "ids", "shape": [1, "seq"], "dtype": "int64", "low": 0, "high": 50}])
    (output,) = result.model.graph.output
    dims = [dim.dim_value or dim.dim_param or None for dim in output.type.tensor_type.shape.dim]
    assert len(dims) == 3 and dims[1] not in (1, 32), dims  # neither the old example's size nor the new one's
    session = ort.InferenceSession(result.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in (1, 7):
        assert session.run(None, {"ids": np.arange(length, dtype=np.int64)[None]})[0].shape == (1, length, 5)
