"""Running the simplify stage on a model in a test."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.stages.simplify import SimplifyConfig, run


def simplify_model(model: onnx.ModelProto, tmp_path: Path, ctx: StageContext, **config: object) -> StageResult:
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    artifact = Artifact(path=path, sidecar=tmp_path / "x.json", key="k", sha256="", size_bytes=0, stages=(),
                        parent=None)
    result = run(artifact, SimplifyConfig(**config), ctx)
    onnx.checker.check_model(result.model)
    json.dumps(result.report())  # the sidecar must be able to hold them
    return result
