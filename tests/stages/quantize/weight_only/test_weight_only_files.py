"""Weight-only quantization reads the float weights through a memory map: each weight's pages are handed back
once it is written, so the process does not end up holding the whole float model (file pages count as its
memory once read)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.peak import peak_mib


def test_the_float_weights_do_not_stay_resident_after_they_are_written(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Six 16 MB float weights (96 MB, external data): the peak stays well under the float model plus its int8
    (~120 MB when every read weight stayed mapped)."""
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))  # the peak measures what is held, not the heap
    setup = f"""
        import numpy as np
        import onnx
        from pathlib import Path
        from onnx import TensorProto, helper, numpy_helper
        from qdeploy.stages.quantize import QuantizeConfig
        from qdeploy.stages.quantize.weight_only._build import quantize_file

        folder = Path({str(tmp_path)!r})
        d, x, nodes, weights = 2048, "x", [], []
        for i in range(6):
            weights.append(numpy_helper.from_array(
                np.random.default_rng(i).standard_normal((d, d)).astype(np.float32), f"w{{i}}"))
            nodes.append(helper.make_node("MatMul", [x, f"w{{i}}"], [f"m{{i}}"], name=f"mm{{i}}"))
            x = f"m{{i}}"
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d])],
                                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, d])], weights)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(folder / "f.onnx"),
                  save_as_external_data=True, location="f.onnx.data")
        del graph, weights
        config = QuantizeConfig.model_validate({{"mode": "weight_only", "bits": 8}})
    """
    measured = """
        quantize_file(folder / "f.onnx", folder / "q.onnx", config)
    """
    peak = peak_mib(tmp_path, setup, measured, timeout=120)
    assert peak < 80, peak  # ~43 MB; every read weight kept mapped: ~120 MB
