"""A package is held to the limits its artifact was validated to, so every pair that passed validation packages.

The tutorial's int8 artifact passes validation with little to spare (SNR about 15.7 dB against a 15 dB limit on
its 8 validation samples); its first 4 samples alone read 13.9 dB.  When the package check ran on those 4, every
int8 package of a passing run failed its own check, and the run's own package failed whenever the verdict picked
int8 (under load).  The check now runs on the samples validation compared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qdeploy.core.runtimes import is_device_default
from qdeploy.pipeline.publish.package import data as data_module
from qdeploy.pipeline.publish.package import packable
from tests.helpers.docs_runs import current_run, run_tutorial


@pytest.mark.slow
def test_every_pair_that_passed_validation_builds_a_package_that_passes_its_check(tmp_path: Path) -> None:
    run = current_run(run_tutorial).out
    report = json.loads((run / "report.json").read_text())
    passed = [(row["variant"], row["target"]) for row in report["validation"]
              if row["status"] == "passed" and packable(row["target"]) and not is_device_default(row["variant"])]
    assert any(variant.startswith("int8") for variant, _ in passed), passed  # the pair this test is about
    refused, samples = [], {}
    for variant, target in passed:
        out = tmp_path / f"{variant}-{target.replace(':', '-')}"
        done = subprocess.run([sys.executable, "-m", "qdeploy", "package", str(run), "-t", target, "--variant",
                               variant, "-o", str(out)], capture_output=True, text=True, timeout=600, check=False)
        if done.returncode:
            refused.append(f"{variant} on {target}: {done.stdout}\n{done.stderr}")
            continue
        samples[variant, target] = json.loads(next(out.glob("*/manifest.json")).read_text())["check"]["samples"]
    assert not refused, "\n".join(refused)
    validated = {(row["variant"], row["target"]): row["samples"] for row in report["validation"]}
    assert samples == {pair: validated[pair] for pair in passed}  # held on the samples it passed on


def test_check_data_keeps_the_longest_prefix_of_samples_under_the_byte_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    feeds = [{"x": np.full(256, index, np.float32)} for index in range(8)]  # 1 KiB each, 2 KiB with the output
    monkeypatch.setattr(data_module, "CHECK_MAX_BYTES", 5 * 1024 + 1)
    data, first = data_module._fitting(feeds, lambda feed: {"y": feed["x"] * 2}, "variant 'fp32' on ort:cpu")
    assert data.samples == 2 and first == 2048
    assert [int(sample["y"][0]) for sample in data.reference] == [0, 2]  # the first samples, in order
    monkeypatch.setattr(data_module, "CHECK_MAX_BYTES", 1024)
    assert data_module._fitting(feeds, lambda feed: {"y": feed["x"]}, "x")[0].samples == 0
