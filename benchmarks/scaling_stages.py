"""One stage of ``benchmarks/scaling.py`` on the files of a folder, as the runner would call it.

``source.onnx`` is the generated model; each stage writes ``<stage>.onnx`` beside it
(validate writes nothing).  Only ``run`` is timed by the caller, not the writing.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from qdeploy.core.context import Artifact, StageContext, StageResult
from qdeploy.graph.external_data import needs_external_data
from qdeploy.pipeline.recipe.schema import Recipe

_STAGES_OF = {"export": ("export",), "simplify": ("export", "simplify"), "fp16": ("export", "simplify", "fp16"),
              "ptq": ("export", "simplify", "quantize"), "dynamic": ("export", "simplify", "quantize")}


def _artifact(path: Path, stages: tuple[str, ...]) -> Artifact:
    return Artifact(path=path, sidecar=path.with_suffix(".json"), key=path.stem, sha256="-",
                    size_bytes=path.stat().st_size, stages=stages, parent=None)


def _context(folder: Path, stage: str) -> StageContext:
    recipe = Recipe(name="scaling", model={"onnx": str(folder / "source.onnx")}, variants={"v": []})
    work = folder / f"work-{stage}"
    work.mkdir(exist_ok=True)
    return recipe.stage_context(stage, work)


def run_stage(stage: str, folder: Path) -> int:
    """Run the stage; returns the node count of what it wrote (validate: the number of result rows)."""
    ctx = _context(folder, stage)
    if stage == "validate":
        return _validate(folder, ctx)
    result = _transform(stage, folder, ctx)
    onnx.save(result.model, str(folder / f"{stage}.onnx"),
              save_as_external_data=needs_external_data(result.model))
    return len(result.model.graph.node)


def _transform(stage: str, folder: Path, ctx: StageContext) -> StageResult:
    if stage == "export":
        from qdeploy.stages.export import ExportConfig, run

        return run(None, ExportConfig(onnx=str(folder / "source.onnx")), ctx)
    source = _artifact(folder / ("export.onnx" if stage == "simplify" else "simplify.onnx"),
                       _STAGES_OF[stage][:-1])
    if stage == "simplify":
        from qdeploy.stages.simplify import SimplifyConfig, run

        return run(source, SimplifyConfig(), ctx)
    if stage == "fp16":
        from qdeploy.stages.fp16 import Fp16Config, run

        return run(source, Fp16Config(), ctx)
    from qdeploy.stages.quantize import QuantizeConfig, run

    return run(source, QuantizeConfig(mode=stage), ctx)


def _validate(folder: Path, ctx: StageContext) -> int:
    from qdeploy.stages.validate import ValidateConfig, run

    artifacts = {name: _artifact(folder / f"{file}.onnx", _STAGES_OF[file])
                 for name, file in (("exported", "export"), ("fp32", "simplify"), ("fp16", "fp16"), ("int8", "ptq"))
                 if (folder / f"{file}.onnx").exists()}  # "exported" is the recipe's default reference
    rows = run(artifacts, ["ort:cpu"], ValidateConfig(fp16_reference="never"), ctx)
    return len(rows)
