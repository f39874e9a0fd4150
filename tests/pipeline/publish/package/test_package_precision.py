"""A pair validation ships at a pinned precision (the bf16 default missed, f32 held) is packaged with that pin:
runtime.json sets INFERENCE_PRECISION_HINT to it and says why, check.py compiles with it and passes, and the
same package at the bf16 default would fail its own check."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import qdeploy.stages.validate as validate
from qdeploy.core.report import Report
from qdeploy.pipeline.publish.package import PackageSource, build_package, write_manifest
from qdeploy.pipeline.publish.package import check as package_check
from qdeploy.pipeline.publish.package.data import CheckData
from qdeploy.stages.validate import ValidateConfig
from qdeploy.targets.int8_path import FLAGS_ENV
from tests.helpers.precision import BF16_CPU, offset_model, openvino_runs_bf16_here
from tests.helpers.reports import report_with
from tests.helpers.validate import artifact, by_pair, context, to_fp16

pytestmark = pytest.mark.skipif(not openvino_runs_bf16_here(), reason="this machine's OpenVINO cannot run "
                                "bfloat16: the bf16 default that misses cannot be measured here")


def test_runtime_json_pins_the_shipped_precision_and_check_py_uses_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FLAGS_ENV, BF16_CPU)
    model = offset_model()
    artifacts = {"exported": artifact(tmp_path / "ref.onnx", model),
                 "fp16": artifact(tmp_path / "fp16.onnx", to_fp16(model), ("export", "fp16"))}
    row = by_pair(validate.run(artifacts, ["openvino:cpu"], ValidateConfig(samples=4), context(tmp_path)))[
        ("fp16", "openvino:cpu")]
    assert row.deploy_precision == "f32", row.reason
    feeds = [{"x": np.random.default_rng(i).standard_normal((2, 16)).astype(np.float32)} for i in range(3)]
    session = ort.InferenceSession(str(tmp_path / "ref.onnx"), providers=["CPUExecutionProvider"])
    reference = [{"y": session.run(["y"], feed)[0]} for feed in feeds]
    source = PackageSource("fp16", "openvino:cpu", tmp_path / "fp16.onnx", row, None,
                           Report.model_validate(report_with()))
    folder = build_package(source, tmp_path / "dist", CheckData(feeds, reference, source="test"))  # checks itself
    runtime = json.loads((folder / "runtime.json").read_text())
    assert runtime["properties"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert runtime["properties"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 0  # float32 activations, as validated
    assert runtime["precision_pinned"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert "device default (bf16) missed" in runtime["precision_pinned"]["why"]
    said: list[str] = []
    assert package_check.check_package(folder, said.append)["model.xml"] == []
    assert any("inference precision f32 (pinned by runtime.json)" in line for line in said)
    # the negative control: the same package at the device default misses the tolerance it was validated to
    default = tmp_path / "default"
    shutil.copytree(folder, default)
    runtime["properties"].pop("INFERENCE_PRECISION_HINT")
    (default / "runtime.json").write_text(json.dumps(runtime))
    manifest = json.loads((default / "manifest.json").read_text())
    del manifest["files"]
    write_manifest(default, manifest)
    assert package_check.check_package(default, lambda _: None)["model.xml"]
