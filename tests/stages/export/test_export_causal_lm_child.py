"""A large causal LM exports in a child process (torch never enters the run's process) and gives what the
export in the run's own process gives; a failure there comes back as the same kind of error.  A .gguf tokenizer
is converted in a child too, with the same ids."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from qdeploy.core.errors import QdeployInputError
from qdeploy.pipeline.recipe.schema import Recipe
from qdeploy.stages import export
from qdeploy.stages.export import _causal_lm_child as child_module
from tests.stages.export.causal_lm_models import tiny_llama

pytestmark = pytest.mark.torch
pytest.importorskip("transformers")


def _export(folder: Path, causal_lm: dict[str, Any]) -> Any:
    recipe = Recipe(name="t", model={"causal_lm": causal_lm}, variants={"v": []})
    ctx = recipe.stage_context("exported", folder / "work")
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    return export.run(None, recipe.model, ctx)


def _without_times(findings: dict[str, Any]) -> dict[str, Any]:
    record = dict(findings["causal_lm"])
    for key in ("load_seconds", "export_seconds"):
        record.pop(key)
    return {**findings, "causal_lm": record}


def test_a_large_checkpoint_exports_in_a_child_and_gives_the_same_model(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = tiny_llama(tmp_path / "tiny-llama", layers=1)
    here = _export(tmp_path / "here", {"path": str(checkpoint)})
    spawned = []
    real_child = child_module.export_in_child
    monkeypatch.setattr(child_module, "CHILD_ABOVE_BYTES", 0)
    monkeypatch.setattr(child_module, "export_in_child", lambda *args: spawned.append(1) or real_child(*args))
    apart = _export(tmp_path / "apart", {"path": str(checkpoint)})
    assert spawned == [1]
    assert _without_times(apart.findings.to_report()) == _without_times(here.findings.to_report())
    assert apart.findings.to_report()["causal_lm"]["checkpoint"] == str(checkpoint)
    assert [node.op_type for node in apart.model.graph.node] == [node.op_type for node in here.model.graph.node]
    for ours, theirs in zip(apart.model.graph.initializer, here.model.graph.initializer, strict=True):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(ours), onnx.numpy_helper.to_array(theirs))
    assert not list((tmp_path / "apart" / "work").glob("causal_lm_checked*"))  # read back, then removed


def test_a_bad_checkpoint_in_the_child_is_the_same_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad input stays one (exit 2), with the message the export in this process gives."""
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    messages = []
    for threshold in (0, 1 << 40):  # in a child, then here
        monkeypatch.setattr(child_module, "CHILD_ABOVE_BYTES", threshold)
        with pytest.raises(QdeployInputError) as raised:
            _export(tmp_path, {"path": str(folder)})
        messages.append(str(raised.value))
    assert messages[0] == messages[1] and "not a valid JSON file" in messages[0]


@pytest.mark.slow
def test_a_gguf_tokenizer_converted_in_a_child_gives_transformers_ids() -> None:
    """In a fresh interpreter (torch not loaded): the tokenizers-library copy, and no torch afterwards."""
    pytest.importorskip("gguf")
    from tests.real_models import SMOLLM2_GGUF, real_model

    gguf = real_model(SMOLLM2_GGUF)
    text = (Path(__file__).resolve().parents[3] / "recipes" / "data" / "text" / "english.txt").read_text()[:4000]
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from qdeploy.calibration.text import load_tokenizer
        tokenizer = load_tokenizer(Path({str(gguf)!r}))
        print(json.dumps([type(tokenizer).__name__, "torch" in sys.modules, tokenizer.encode({text!r})]))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    kind, torch_loaded, ids = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    assert kind == "_Fast" and not torch_loaded
    assert ids == reference(text, add_special_tokens=False, verbose=False)["input_ids"]
