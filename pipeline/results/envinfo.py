"""The environment fingerprint: library versions, CPU and the targets this machine has."""

from __future__ import annotations

import platform
import sys
from functools import cache
from pathlib import Path
from typing import TypedDict

from qdeploy.pipeline.publish.store import library_versions
from qdeploy.pipeline.results.tested_versions import version_differences
from qdeploy.targets import available_targets
from qdeploy.targets.int8_path import int8_path, target_int8_paths

__all__ = ["CPU_FLAGS", "LIBRARIES", "CpuInfoDict", "EnvironmentDict", "Int8PathEntryDict", "TestedVersionsDict",
           "VersionGapDict", "cpu_info", "environment"]

LIBRARIES = ("onnx", "onnxruntime", "openvino", "onnxconverter-common", "onnxoptimizer", "numpy", "qdeploy", "torch")
CPU_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8",
             "avx512_fp16", "f16c", "fma")


class CpuInfoDict(TypedDict):
    """The CPU model, its cores, and per flag of ``CPU_FLAGS`` whether it has it."""

    model: str
    cores: int
    flags: dict[str, bool]


class Int8PathEntryDict(TypedDict):
    """``Int8Path.to_dict()`` with what it means per CPU target (``targets``)."""

    kind: str
    exact: bool
    meaning: str
    flags_source: str
    targets: dict[str, str]


class VersionGapDict(TypedDict):
    installed: str | None
    tested: str


class TestedVersionsDict(TypedDict):
    """Whether the runtimes are the tested versions, and those that are not."""

    match: bool
    differ: dict[str, VersionGapDict]


class EnvironmentDict(TypedDict):
    """report.json's ``environment`` as the run writes it (``qdeploy.core.report_parts.Environment`` reads it)."""

    python: str
    platform: str
    versions: dict[str, str]
    cpu: CpuInfoDict
    targets: dict[str, str]
    available_targets: list[str]
    int8_path: Int8PathEntryDict
    tested_versions: TestedVersionsDict


def cpu_info() -> CpuInfoDict:
    """CPU model and the instruction-set flags that decide int8, bf16 and fp16 speed."""
    model, flags = platform.processor() or platform.machine(), set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    return {"model": model, "cores": _cores(), "flags": {flag: flag in flags for flag in CPU_FLAGS}}


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@cache
def environment() -> EnvironmentDict:
    targets = available_targets()
    available = [name for name, reason in targets.items() if not reason]
    path = int8_path()
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": library_versions(LIBRARIES),
        "cpu": cpu_info(),
        "targets": {name: ("available" if not reason else f"unavailable: {reason}") for name, reason in
                    targets.items()},
        "available_targets": available,
        "int8_path": {**path.to_dict(), "targets": target_int8_paths(path, available)},
        "tested_versions": _tested_versions(),
    }


def _tested_versions() -> TestedVersionsDict:
    """Whether the runtimes are the versions qdeploy was tested with (constraints.txt), and which are not."""
    untested: dict[str, VersionGapDict] = {name: {"installed": installed, "tested": tested} for level, name, installed,
                                           tested in version_differences() if level == "warning"}
    return {"match": not untested, "differ": untested}
