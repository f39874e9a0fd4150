"""A dataclass whose ``to_dict`` returns ``SomeDict(**asdict(self))`` has a TypedDict that mirrors it: the two
must name the same fields in the same order, or the type promised to readers drifts from what is written."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest

from qdeploy.core.compare import OutputMetrics, OutputMetricsDict
from qdeploy.stages.benchmark._decode import DecodeRecord, DecodeRecordDict
from qdeploy.stages.validate._layers_error import LayerErrors, LayerErrorsDict
from qdeploy.stages.validate._localize import Divergence, DivergenceDict
from qdeploy.targets.base import ExecutionInfo, ExecutionInfoDict
from qdeploy.targets.cpu_facts import DevicePrecisions, DevicePrecisionsDict
from qdeploy.targets.int8_path import Int8Path, Int8PathDict
from qdeploy.targets.layer_profile import LayerTime, LayerTimeDict
from tests.helpers.imports import modules

MIRRORS = [(OutputMetrics, OutputMetricsDict), (LayerErrors, LayerErrorsDict), (Divergence, DivergenceDict),
           (ExecutionInfo, ExecutionInfoDict), (DevicePrecisions, DevicePrecisionsDict), (Int8Path, Int8PathDict),
           (LayerTime, LayerTimeDict), (DecodeRecord, DecodeRecordDict)]


@pytest.mark.parametrize(("record", "mirror"), MIRRORS, ids=lambda item: item.__name__)
def test_the_typed_dict_names_the_dataclass_fields_in_order(record: type, mirror: type) -> None:
    assert list(typing.get_type_hints(mirror)) == [field.name for field in dataclasses.fields(record)]


def test_every_mirror_is_checked() -> None:
    """Each ``return X(**asdict(self))`` in the package names a TypedDict listed in MIRRORS."""
    found = set()
    for path in modules().values():
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.keywords) == 1
                    and node.keywords[0].arg is None and isinstance(node.keywords[0].value, ast.Call)
                    and ast.unparse(node.keywords[0].value) == "asdict(self)"):
                found.add(node.func.id)
    assert found == {mirror.__name__ for _, mirror in MIRRORS}
