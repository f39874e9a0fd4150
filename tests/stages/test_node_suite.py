"""The ONNX backend node tests through simplify and fp16: no artifact published that is unloadable or wrong.

A deterministic subset (``benchmarks/onnx_node_suite.py --subset``: control flow, sequences and optionals, the
ops that take sizes, and every tenth other case: 306 cases, about 40 s on 2 cores); the full
suite's table is in docs/measurements/2026-11-23-onnx-node-suite.md.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from benchmarks.onnx_node_suite import FP16_TOOLS, PUBLISHED_BAD, prepare, run_workers, summarize


@pytest.mark.slow
def test_node_suite_subset_publishes_nothing_unloadable_or_wrong(tmp_path: Path) -> None:
    tools = ["qdeploy-simplify", *[tool for tool in FP16_TOOLS if tool.startswith("qdeploy")]]
    names = prepare(tmp_path, None, None, subset=True)
    assert len(names) > 250
    results = run_workers(tmp_path, names, tools, jobs=2, memory_gb=6.0, timeout_s=180.0)
    table, counts = summarize(results, tools)
    bad = [line for line in results if line["tool"] in tools and line["outcome"] in (*PUBLISHED_BAD, "crash", "died",
                                                                                     "timeout")]
    assert bad == [], table
    assert counts["qdeploy-simplify"]["correct"] >= 0.98 * sum(counts["qdeploy-simplify"].values()), table
    assert Counter(line["tool"] for line in results)["qdeploy-simplify"] > 200
