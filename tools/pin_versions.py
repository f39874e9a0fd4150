"""Write constraints.txt and pipeline/results/tested_versions.py from the versions installed in this environment.

    python tools/pin_versions.py           # after a green test run on new versions; commit both files
    python tools/pin_versions.py --check   # exit 1 when the two files disagree with each other

The pins are the installed requirement closure of qdeploy[torch,ray,test], not ``pip freeze``: that would pin
whatever else lies in the venv.  Local version labels are dropped (torch 2.13.0+cpu -> 2.13.0).
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from qdeploy.pipeline.results.tested_versions import RUNTIME_DISTRIBUTIONS, TESTED, plain_version, read_constraints  # noqa: E402

EXTRAS = ("torch", "ray", "test")
CONSTRAINTS = REPO / "constraints.txt"
MODULE = REPO / "pipeline" / "results" / "tested_versions.py"
BLOCK = re.compile(r"(# BEGIN TESTED.*?\n)(.*?)(# END TESTED)", re.S)


def closure(root: str = "qdeploy", extras: tuple[str, ...] = EXTRAS) -> dict[str, str]:
    """Installed distribution name -> version for root[extras] and everything it requires, transitively."""
    found: dict[str, str] = {}
    pending = [(root, set(extras))]
    while pending:
        name, wanted = pending.pop()
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        key = canonicalize_name(dist.metadata["Name"])
        if key in found:
            continue
        if key != canonicalize_name(root):
            found[key] = plain_version(dist.version)
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            applies = marker is None or any(marker.evaluate({"extra": extra}) for extra in (wanted or {""}))
            if applies and canonicalize_name(requirement.name) not in found:
                pending.append((requirement.name, set(requirement.extras)))
    return found


def ordered(pins: dict[str, str]) -> list[tuple[str, str]]:
    runtimes = [name for name in RUNTIME_DISTRIBUTIONS if name in pins]
    names = runtimes + sorted(name for name in pins if name not in RUNTIME_DISTRIBUTIONS)
    return [(name, pins[name]) for name in names]


def constraints_text(pins: dict[str, str]) -> str:
    header = [f"# Versions qdeploy's test suite passed with (python {sys.version_info.major}."
              f"{sys.version_info.minor}, Linux x86_64); written by tools/pin_versions.py.",
              "# Use: pip install -c constraints.txt torch==2.13.0 -e \".[test,ray]\"  (see docs/packages.md)",
              "# pyproject.toml keeps ranges; this file pins what was tested."]
    return "\n".join(header + [f"{name}=={version}" for name, version in ordered(pins)]) + "\n"


def module_text(pins: dict[str, str]) -> str:
    body = "TESTED: dict[str, str] = {\n" + "".join(f"    {name!r}: {version!r},\n"
                                                    for name, version in ordered(pins)) + "}\n"
    return BLOCK.sub(lambda m: m.group(1) + body + m.group(3), MODULE.read_text(), count=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="Only check that the two files agree.")
    args = parser.parse_args()
    if args.check:
        agree = read_constraints(CONSTRAINTS) == TESTED
        print("constraints.txt and tested_versions.py agree" if agree else "they differ: rerun the tool")
        return 0 if agree else 1
    pins = closure()
    CONSTRAINTS.write_text(constraints_text(pins))
    MODULE.write_text(module_text(pins))
    print(f"wrote {len(pins)} pins to {CONSTRAINTS.name} and {MODULE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
