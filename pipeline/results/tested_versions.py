"""The versions qdeploy's test suite passed with, and how the installed ones differ from them.

``constraints.txt`` at the repository root is the file users install with
(``pip install -c constraints.txt ...``); ``TESTED`` below is the same list shipped inside the package, so
``qdeploy doctor`` can compare without the repository.  Both are written by ``tools/pin_versions.py``; a test
asserts they agree.  The package's own requirements (pyproject.toml) stay ranges.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

__all__ = ["OPTIONAL", "RUNTIME_DISTRIBUTIONS", "TESTED", "difference_lines", "installed_version", "normalize",
           "plain_version", "read_constraints", "tested_versions_record", "version_differences"]

RUNTIME_DISTRIBUTIONS = ("onnx", "onnxruntime", "openvino", "onnxconverter-common", "onnxoptimizer", "onnx-ir", "numpy",
            "protobuf", "pydantic", "torch", "onnxscript")
"""Distributions whose version changes qdeploy's numbers or behaviour: doctor warns on these, notes the rest."""
OPTIONAL = ("torch", "onnxscript")
"""Runtimes qdeploy runs without (PyTorch export only): their absence is no warning."""
_LOCAL_VERSION = re.compile(r"\+.*$")

# BEGIN TESTED (written by tools/pin_versions.py; do not edit by hand)
TESTED: dict[str, str] = {
    'onnx': '1.23.2',
    'onnxruntime': '1.32.0',
    'openvino': '2026.4.1',
    'onnxconverter-common': '1.16.0',
    'onnxoptimizer': '0.4.2',
    'onnx-ir': '1.1.0',
    'numpy': '2.4.6',
    'protobuf': '7.36.2',
    'pydantic': '2.14.3',
    'torch': '2.13.0',
    'onnxscript': '0.7.2',
    'accelerate': '1.15.0',
    'annotated-doc': '0.0.7',
    'annotated-types': '0.8.0',
    'anyio': '4.16.0',
    'attrs': '26.1.0',
    'certifi': '2026.10.18',
    'charset-normalizer': '3.5.2',
    'click': '8.5.1',
    'cloudpickle': '3.1.2',
    'contourpy': '1.3.3',
    'cycler': '0.12.1',
    'execnet': '2.1.2',
    'filelock': '4.2.12',
    'flatbuffers': '25.12.19',
    'fonttools': '4.68.0',
    'fsspec': '2026.9.0',
    'gguf': '0.19.0',
    'h11': '0.16.0',
    'hf-xet': '1.8.0',
    'httpcore2': '2.16.2',
    'httpx2': '2.16.2',
    'huggingface-hub': '2.4.0',
    'hypothesis': '6.170.15',
    'idna': '3.20',
    'iniconfig': '2.3.1',
    'jinja2': '3.1.6',
    'joblib': '1.6.0',
    'jsonschema': '4.26.0',
    'jsonschema-specifications': '2025.9.1',
    'kiwisolver': '1.5.1',
    'markdown-it-py': '4.3.0',
    'markupsafe': '3.0.4',
    'matplotlib': '3.11.2',
    'mdurl': '0.1.2',
    'ml-dtypes': '0.6.0',
    'mpmath': '1.3.0',
    'msgpack': '1.2.4',
    'narwhals': '2.29.0',
    'networkx': '3.6.1',
    'ninja': '1.13.2',
    'nncf': '3.4.0',
    'openvino-telemetry': '2025.2.0',
    'packaging': '26.3',
    'pillow': '13.0.0',
    'pluggy': '1.7.0',
    'psutil': '7.2.2',
    'pydantic-core': '2.50.4',
    'pydot': '4.0.1',
    'pygments': '2.21.0',
    'pyparsing': '3.3.3',
    'pytest': '9.2.0',
    'pytest-xdist': '3.8.0',
    'python-dateutil': '4.0.0',
    'pyyaml': '6.0.3',
    'ray': '2.60.0',
    'referencing': '0.37.0',
    'regex': '2026.11.15',
    'requests': '2.34.2',
    'rich': '15.0.0',
    'rpds-py': '2026.9.1',
    'ruff': '0.17.6',
    'safetensors': '0.8.0',
    'scikit-learn': '1.9.1',
    'scipy': '1.17.1',
    'setuptools': '84.2.1',
    'shellingham': '1.5.4',
    'sortedcontainers': '2.4.0',
    'sympy': '1.14.0',
    'tabulate': '0.10.0',
    'threadpoolctl': '3.8.0',
    'tokenizers': '0.23.3',
    'tqdm': '4.70.1',
    'transformers': '5.23.0',
    'truststore': '0.10.5',
    'typer': '0.29.2',
    'typing-extensions': '4.16.0',
    'typing-inspection': '0.4.5',
    'tzdata': '2026.6',
    'urllib3': '2.8.0',
    'wheel': '0.48.0',
}
# END TESTED


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of -_. as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def plain_version(version: str) -> str:
    """A version without its local label: torch 2.13.0+cpu is the tested 2.13.0 (pip matches it so too)."""
    return _LOCAL_VERSION.sub("", version)


def read_constraints(path: Path) -> dict[str, str]:
    """name -> pinned version of a constraints file's ``name==version`` lines (comments and blanks skipped)."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"{path}:{number}: expected 'name==version', found {raw.strip()!r}")
        pins[normalize(name.strip())] = version.strip()
    return pins


def installed_version(name: str) -> str | None:
    try:
        return plain_version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None


def version_differences(tested: dict[str, str] | None = None) -> list[tuple[str, str, str | None, str]]:
    """(level, name, installed or None, tested) for each distribution that is not at its tested version.

    level is 'warning' for a runtime (its version changes qdeploy's numbers), 'note' for the rest.  A missing
    distribution is reported only when it is a runtime qdeploy needs.
    """
    found = []
    for name, version in (TESTED if tested is None else tested).items():
        installed = installed_version(name)
        if installed == version:
            continue
        if installed is None and (name not in RUNTIME_DISTRIBUTIONS or name in OPTIONAL):
            continue
        found.append(("warning" if name in RUNTIME_DISTRIBUTIONS else "note", name, installed, version))
    return found


def difference_lines(tested: dict[str, str] | None = None) -> list[str]:
    """Doctor's lines, one per difference."""
    lines = []
    for level, name, installed, version in version_differences(tested):
        if installed is None:
            lines.append(f"{level}: {name} is not installed; qdeploy was tested with {version}")
        else:
            lines.append(f"{level}: {name} {installed} is installed; qdeploy was tested with {version}")
    if lines:
        lines.append("  pip install -c constraints.txt ... installs the tested versions (docs/packages.md)")
    return lines


def tested_versions_record(tested: dict[str, str] | None = None) -> dict[str, dict[str, str | None]]:
    """name -> {tested, installed} of every runtime: what `doctor --json` and a report's environment record."""
    pins = TESTED if tested is None else tested
    return {name: {"tested": pins[name], "installed": installed_version(name)}
            for name in RUNTIME_DISTRIBUTIONS if name in pins}
