"""The demo model mutated (bit flips, truncations, structural field swaps) through `qdeploy check` and `qdeploy run`.

`check` answers 0 or 2; `run` 0, 1 or 2, where 1 is a failure the report records (a stage, a gate, a validation, a
measurement it could not make), never a crash; neither prints a traceback or "internal error", and neither hangs.
Budget and the longer campaign: tests/helpers/fuzz.py.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto

from tests.helpers.fuzz import assert_clean_exit, demo_copy, fuzz_settings, invoke
from tests.helpers.models import DEMO_RECIPE

DEMO_MODEL = DEMO_RECIPE.parent / "models" / "demo_cnn.onnx"
RAW = DEMO_MODEL.read_bytes()
BASE = onnx.load_from_string(RAW)
DEMO = yaml.safe_load(DEMO_RECIPE.read_text())
CHECK_SECONDS, RUN_SECONDS = 60, 240
"""Time limits of one `check` (~0.05 s on the demo) and one `run` (~1 s): a hang fails the example, not the suite."""


def _regions() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The byte ranges of the serialized demo: the graph's structure (where a flipped bit changes the graph) and the
    weights' payloads (where it changes a number, maybe to inf or NaN)."""
    structure, weights, position = [], [], 0
    for init in BASE.graph.initializer:  # serialized in this order
        start = RAW.find(init.raw_data, position) if init.raw_data else -1
        if start >= 0:
            structure.append((position, start))
            position = start + len(init.raw_data)
            weights.append((start, position))
    structure.append((position, len(RAW)))
    return [(start, end) for start, end in structure if end > start], weights


STRUCTURE, WEIGHTS = _regions()
INDEX = st.integers(0, 10_000)  # taken modulo the length of what it indexes when applied
ELEM_TYPES = st.one_of(st.integers(0, 25), st.sampled_from([-1, 99, 2**31 - 1]))
DIMS = st.sampled_from([-1, 0, -100, 1, 2, 3, 7, 64, 2**40])
NAMES = st.sampled_from(["", "input", "logits", "block0.W", "block0.conv", "pool", "x", "名前", "a" * 300])

Mutation = Callable[..., None]
MUTATORS: dict[str, tuple[Mutation, tuple[st.SearchStrategy[Any], ...]]] = {}


def mutation(*arguments: st.SearchStrategy[Any]) -> Callable[[Mutation], Mutation]:
    """Register a structural mutation: a function of (model, *arguments), a strategy for each argument.  Each is
    a no-op where the model lacks what it names (an earlier mutation may have removed it)."""
    def register(change: Mutation) -> Mutation:
        MUTATORS[change.__name__] = (change, arguments)
        return change
    return register


def _pick(items: Any, i: int) -> Any:
    return items[i % len(items)] if len(items) else None


def _value_info(model: onnx.ModelProto, which: str, i: int = 0) -> Any:
    return _pick(model.graph.input if which == "input" else model.graph.output, i)


SIDES = st.sampled_from(["input", "output"])


@mutation(INDEX, INDEX, INDEX, INDEX)
def swap_inputs(model: onnx.ModelProto, a: int, i: int, b: int, j: int) -> None:
    node_a, node_b = _pick(model.graph.node, a), _pick(model.graph.node, b)
    if node_a and node_b and node_a.input and node_b.input:
        i, j = i % len(node_a.input), j % len(node_b.input)
        node_a.input[i], node_b.input[j] = node_b.input[j], node_a.input[i]


@mutation(SIDES, ELEM_TYPES)
def elem_type(model: onnx.ModelProto, side: str, value: int) -> None:
    if info := _value_info(model, side):
        info.type.tensor_type.elem_type = value


@mutation(INDEX)
def drop_initializer(model: onnx.ModelProto, i: int) -> None:
    if model.graph.initializer:
        del model.graph.initializer[i % len(model.graph.initializer)]


@mutation(st.booleans(), INDEX)
def duplicate_output(model: onnx.ModelProto, of_graph: bool, i: int) -> None:
    """The graph's first output listed twice, or node i writing the output of node i+1."""
    graph = model.graph
    if of_graph and graph.output:
        graph.output.append(graph.output[0])
    elif not of_graph and len(graph.node) > 1:
        _pick(graph.node, i).output[0] = _pick(graph.node, i + 1).output[0]


@mutation(st.sampled_from(["", "ai.onnx", "com.microsoft", "x"]), st.one_of(st.integers(-1, 30), st.just(10**9)))
def opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    for entry in model.opset_import:
        if entry.domain == domain:
            entry.version = version
    if domain:
        model.opset_import.add(domain=domain, version=version)


@mutation(SIDES, INDEX, DIMS)
def dim(model: onnx.ModelProto, side: str, i: int, value: int) -> None:
    if (info := _value_info(model, side)) and (dims := info.type.tensor_type.shape.dim):
        _pick(dims, i).dim_value = value


@mutation(SIDES, INDEX, st.sampled_from(["N", "", "?"]))
def dim_param(model: onnx.ModelProto, side: str, i: int, value: str) -> None:
    if (info := _value_info(model, side)) and (dims := info.type.tensor_type.shape.dim):
        _pick(dims, i).dim_param = value


@mutation(st.integers(-1, 20))
def ir_version(model: onnx.ModelProto, value: int) -> None:
    model.ir_version = value


@mutation(INDEX, st.sampled_from(["Conv2", "", "Identity", "Relu", "If", "Loop", "Add"]))
def op_type(model: onnx.ModelProto, i: int, value: str) -> None:
    if node := _pick(model.graph.node, i):
        node.op_type = value


@mutation(INDEX)
def drop_node(model: onnx.ModelProto, i: int) -> None:
    if model.graph.node:
        del model.graph.node[i % len(model.graph.node)]


@mutation()
def reverse_nodes(model: onnx.ModelProto) -> None:
    nodes = list(reversed(model.graph.node))
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)


@mutation(INDEX, st.sampled_from([[-1], [0], [10**6], [], [1] * 8, None]))
def attribute(model: onnx.ModelProto, i: int, ints: list[int] | None) -> None:
    """An attribute of node i dropped (None) or made these ints, also where the operator wants a float."""
    if (node := _pick(model.graph.node, i)) and node.attribute:
        chosen = _pick(node.attribute, i)
        if ints is None:
            node.attribute.remove(chosen)
        else:
            chosen.ClearField("ints")
            chosen.ints.extend(ints)
            chosen.type = onnx.AttributeProto.INTS


@mutation(INDEX, INDEX, DIMS)
def initializer_dim(model: onnx.ModelProto, i: int, axis: int, value: int) -> None:
    if (init := _pick(model.graph.initializer, i)) and init.dims:
        init.dims[axis % len(init.dims)] = value


@mutation(INDEX, ELEM_TYPES)
def initializer_type(model: onnx.ModelProto, i: int, value: int) -> None:
    if init := _pick(model.graph.initializer, i):
        init.data_type = value


@mutation(st.sampled_from(["input", "output", "initializer", "node_output"]), INDEX, NAMES)
def rename(model: onnx.ModelProto, which: str, i: int, name: str) -> None:
    if which in ("input", "output") and (info := _value_info(model, which, i)):
        info.name = name
    elif which == "initializer" and (init := _pick(model.graph.initializer, i)):
        init.name = name
    elif which == "node_output" and (node := _pick(model.graph.node, i)):
        node.output[0] = name


@mutation(NAMES)
def extra_input(model: onnx.ModelProto, name: str) -> None:
    if model.graph.input:
        model.graph.input.append(model.graph.input[0])
        model.graph.input[-1].name = name


@mutation(st.sampled_from(["input", "output", "node", "initializer", "opset_import"]))
def clear(model: onnx.ModelProto, field: str) -> None:
    (model if field == "opset_import" else model.graph).ClearField(field)


@mutation(INDEX, st.sampled_from(["missing.bin", "../../../etc/hostname", "/etc/passwd", "demo_cnn.onnx", "", "."]),
          st.integers(-5, 10**7))
def external(model: onnx.ModelProto, i: int, location: str, offset: int) -> None:
    """Initializer i's data moved to an external file that is missing, elsewhere, or too short."""
    if init := _pick(model.graph.initializer, i):
        init.ClearField("raw_data")
        init.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", str(offset)), ("length", "4096")):
            init.external_data.add(key=key, value=value)


@mutation(INDEX, st.sampled_from(["com.microsoft", "ai.onnx.ml", "custom", "ai.onnx"]))
def domain(model: onnx.ModelProto, i: int, value: str) -> None:
    if node := _pick(model.graph.node, i):
        node.domain = value


@mutation(INDEX, ELEM_TYPES, DIMS)
def value_info(model: onnx.ModelProto, i: int, elem: int, size: int) -> None:
    """A wrong type and shape declared for node i's output."""
    if node := _pick(model.graph.node, i):
        model.graph.value_info.append(onnx.helper.make_tensor_value_info(node.output[0], elem % 26, [size, 3]))


@mutation(INDEX, DIMS)
def initializer_as_input(model: onnx.ModelProto, i: int, size: int) -> None:
    """Initializer i also declared a graph input (old-style overridable weight), with another shape."""
    if init := _pick(model.graph.initializer, i):
        model.graph.input.append(onnx.helper.make_tensor_value_info(init.name, TensorProto.FLOAT, [size]))


MUTATIONS = st.one_of([st.tuples(st.just(name), *arguments) for name, (_, arguments) in MUTATORS.items()])


def _flipped(flips: list[tuple[int, int, int]], cut: int | None = None, regions: list[tuple[int, int]] = STRUCTURE,
             ) -> bytes:
    """The demo's bytes with bits flipped at (region, offset, bit) places and cut to `cut` bytes."""
    data = bytearray(RAW)
    for region, offset, bit in flips:
        start, end = regions[region % len(regions)]
        data[start + offset % (end - start)] ^= 1 << bit
    return bytes(data[:cut] if cut is not None else data)


def _swapped(mutations: list[tuple[Any, ...]]) -> bytes:
    model = onnx.ModelProto()
    model.CopyFrom(BASE)
    for name, *arguments in mutations:
        MUTATORS[name][0](model, *arguments)
    return model.SerializeToString()


flips = st.lists(st.tuples(INDEX, st.integers(0, 2**31), st.integers(0, 7)), min_size=1, max_size=6)
cuts = st.one_of(st.integers(0, len(RAW) - 1), st.integers(len(RAW) - 3000, len(RAW) - 1), st.integers(0, 3000))
swaps = st.lists(MUTATIONS, min_size=1, max_size=3)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_copy(tmp_path_factory.mktemp("fuzz-models"))


_serial = itertools.count()


def _write_model(folder: Path, data: bytes) -> str:
    """A fresh file per example: no cache keyed by path, size and mtime can hand back the previous one."""
    for old in folder.glob("models/fuzzed-*.onnx"):
        old.unlink()
    name = f"models/fuzzed-{next(_serial)}.onnx"
    (folder / name).write_bytes(data)
    return name


def _check_model(folder: Path, data: bytes, declared: bool) -> int:
    """`qdeploy check` on the demo recipe (with or without its declared inputs and opset) naming the model."""
    model = {**DEMO["model"], "onnx": _write_model(folder, data)}
    if not declared:
        model = {"onnx": model["onnx"]}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({**DEMO, "model": model}, sort_keys=False))
    result = invoke("check", str(path), seconds=CHECK_SECONDS)
    assert_clean_exit(result)
    return result.exit_code


@fuzz_settings(60)
@given(flips=flips, declared=st.booleans())
def test_bit_flipped_models_through_check(workdir: Path, flips: list, declared: bool) -> None:
    """Bits flipped where the graph is (between the weights' payloads), so most flips change the structure."""
    _check_model(workdir, _flipped(flips), declared)


@fuzz_settings(30)
@given(flips=st.lists(st.tuples(INDEX, st.integers(0, 2**31), st.integers(0, 7)), max_size=2), cut=cuts)
def test_truncated_models_through_check(workdir: Path, flips: list, cut: int) -> None:
    _check_model(workdir, _flipped(flips, cut), declared=True)


@pytest.mark.slow  # bit flips and truncations reach check on the fast loop
@fuzz_settings(150)
@given(mutations=swaps, declared=st.booleans())
def test_field_swapped_models_through_check(workdir: Path, mutations: list, declared: bool) -> None:
    _check_model(workdir, _swapped(mutations), declared)


RUN_RECIPE = {"name": "fz", "model": {"onnx": "MODEL"}, "variants": {"fp32": []}, "targets": ["ort:cpu"],
              "validate": {"reference": "fp32", "samples": 2},
              "benchmark": {"batch_sizes": [1], "warmup": 1, "iterations": 3, "rounds": 1}}


def _run_model(folder: Path, data: bytes) -> None:
    """`qdeploy run` of fp32 alone on ort:cpu: 0, 2, or 1 with the failure in report.json."""
    recipe = {**RUN_RECIPE, "model": {"onnx": _write_model(folder, data)}}
    path, out = folder / "run.yaml", folder / "out"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    shutil.rmtree(out, ignore_errors=True)
    result = invoke("run", str(path), "--out", str(out), seconds=RUN_SECONDS)
    assert_clean_exit(result, (0, 1, 2))
    if result.exit_code == 1:  # a recorded failure, not a crash: the report says what failed
        assert _recorded_failures(json.loads((out / "report.json").read_text())), result.output[-3000:]


def _recorded_failures(report: dict[str, Any]) -> list[Any]:
    """What makes a run exit 1 (pipeline.gates.run_passes): a build failure, a failed gate or validation, or a
    measurement the recipe asked for and did not get."""
    return [*report["failures"], *(gate for gate in report["gates"] if gate["passed"] is False and not
                                   gate.get("skipped")),
            *(row for row in report["validation"] if row["status"] == "failed"),
            *(entry for entry in report["unmeasured"] if not entry["allowed"])]


@pytest.mark.slow  # whole runs; the ORT-refused mutations go through run on the fast loop
@fuzz_settings(12, cost=10, seconds=RUN_SECONDS)
@given(mutation=st.one_of(st.tuples(st.just("swaps"), swaps), st.tuples(st.just("structure flips"), flips),
                          st.tuples(st.just("weight flips"), flips)))
def test_mutated_models_through_run(workdir: Path, mutation: tuple[str, list]) -> None:
    """Field swaps, bits flipped in the graph's structure, or in the weights (inf and NaN weights), then `run`."""
    kind, changes = mutation
    data = (_swapped(changes) if kind == "swaps" else
            _flipped(changes, regions=STRUCTURE if kind == "structure flips" else WEIGHTS))
    _run_model(workdir, data)


ORT_REFUSES = [
    pytest.param([("initializer_dim", 41, 0, 7)], id="head.B-dims-smaller-than-its-raw-data"),
    pytest.param([("initializer_dim", 40, 0, 2)], id="head.W-dims-smaller-than-its-raw-data"),
    pytest.param([("value_info", 15, 21, 0)], id="conv-output-declared-uint4-shape-0x3"),
    pytest.param([("initializer_as_input", 16, 2**40)], id="initializer-redeclared-as-input-other-shape"),
    pytest.param([("initializer_type", 30, 65)], id="initializer-data-type-65"),
]


@pytest.mark.parametrize("mutations", ORT_REFUSES)
def test_check_and_run_refuse_what_onnxruntime_cannot_load(workdir: Path, mutations: list) -> None:
    """Found by this campaign: `check` exited 0 and `run` 1 (ONNX Runtime refused the model at validation)."""
    assert _check_model(workdir, _swapped(mutations), declared=False) == 2
    recipe = {**RUN_RECIPE, "model": {"onnx": _write_model(workdir, _swapped(mutations))}}
    path = workdir / "run.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    result = invoke("run", str(path), "--out", str(workdir / "out"), seconds=RUN_SECONDS)
    assert_clean_exit(result, (2,))
    assert "ONNX Runtime cannot load the model" in result.output, result.output[-2000:]
