"""Multiply-accumulates of the compute nodes, from the tensor shapes one reference inference saw (issue 31)."""

from __future__ import annotations

from qdeploy.stages.benchmark._layers_macs import node_macs
from tests.helpers.models import tiny_cnn


def test_macs_from_shapes() -> None:
    model = tiny_cnn(channels=8, size=16)
    macs = node_macs(model, {"conv": [1, 8, 16, 16], "flat": [1, 8], "logits": [1, 10]})
    assert macs == {"conv": 8 * 16 * 16 * 3 * 3 * 3, "fc": 10 * 8}
