"""Chain models, perturbed artifacts and contexts of the validate tests."""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qdeploy.core.context import Artifact, StageContext
from qdeploy.core.rows import ValidationRow
from qdeploy.pipeline.recipe.loader import load_recipe_file
from tests.helpers.models import write_recipe

RECIPE = """
    name: t
    model: {onnx: model.onnx}
    variants: {v: []}
    """


def chain_model(seed: int = 0, width: int = 6, depth: int = 4) -> onnx.ModelProto:
    """x[N, width] -> (MatMul 'mm{i}' -> Relu 'relu{i}') x depth -> MatMul 'head' -> logits[N, 10]."""
    rng = np.random.default_rng(seed)
    nodes, inits, current = [], [], "x"
    for i in range(1, depth + 1):
        weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(weight, f"w{i}"))
        nodes += [helper.make_node("MatMul", [current, f"w{i}"], [f"h{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}")]
        current = f"r{i}"
    inits.append(numpy_helper.from_array(rng.standard_normal((width, 10)).astype(np.float32), "w_head"))
    nodes.append(helper.make_node("MatMul", [current, "w_head"], ["logits"], name="head"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def chain_numpy(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The chain model's logits computed by numpy, from its own initializers."""
    weights = {init.name: numpy_helper.to_array(init).astype(np.float64) for init in model.graph.initializer}
    h = x.astype(np.float64)
    for i in range(1, len(weights)):
        h = np.maximum(h @ weights[f"w{i}"], 0.0)
    return h @ weights["w_head"]


def perturbed(model: onnx.ModelProto, initializer: str, factor: float = 1.5) -> onnx.ModelProto:
    """A copy with one weight scaled: the node that reads it is where the copy goes wrong."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for index, init in enumerate(copy.graph.initializer):
        if init.name == initializer:
            scaled = numpy_helper.to_array(init) * np.float32(factor)
            copy.graph.initializer[index].CopyFrom(numpy_helper.from_array(scaled, initializer))
            return copy
    raise KeyError(initializer)


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxconverter_common import float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its note on constants it rounds
        converted = float16.convert_float_to_float16(model, keep_io_types=True)
    converted.ir_version = 8
    return converted


def artifact(path: Path, model: onnx.ModelProto, stages: tuple[str, ...] = ("export",)) -> Artifact:
    """An artifact as the runner hands it to evaluation stages (its precision follows the stages)."""
    onnx.save(model, str(path))
    data = path.read_bytes()
    sidecar = path.with_suffix(".json")
    sidecar.write_text("{}")
    digest = hashlib.sha256(data).hexdigest()
    return Artifact(path=path, sidecar=sidecar, key=digest, sha256=digest, size_bytes=len(data), stages=stages,
                    parent=None)


def context(folder: Path, body: str = RECIPE) -> StageContext:
    """A stage context on a recipe written into folder (its relative paths resolve there)."""
    if not (folder / "model.onnx").exists():
        onnx.save(chain_model(), str(folder / "model.onnx"))
    recipe = load_recipe_file(write_recipe(folder, body))
    (folder / "work").mkdir(exist_ok=True)
    return recipe.stage_context("*", folder / "work")


def by_pair(rows: list[ValidationRow] | list[dict[str, Any]]) -> dict[tuple[str, str], ValidationRow]:
    """Validation rows by (variant, target); report.json's dicts are parsed into rows first."""
    typed = [row if isinstance(row, ValidationRow) else ValidationRow.from_json(row) for row in rows]
    return {(row.variant, row.target): row for row in typed}
