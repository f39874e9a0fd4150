"""Running a package's check.py as production would: where qdeploy cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

SITES = list(dict.fromkeys(sysconfig.get_paths()[kind] for kind in ("purelib", "platlib")))


def without_qdeploy(package: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """check.py in an interpreter that cannot import qdeploy: -I (no user site, no PYTHONPATH) and -S (no .pth
    files: the editable install of qdeploy is one), with only site-packages on sys.path for numpy and runtimes."""
    code = (f"import sys, runpy; sys.path += {SITES!r}; sys.argv = ['check.py', *{list(args)!r}]; "
            "runpy.run_path('check.py', run_name='__main__')")
    return subprocess.run([sys.executable, "-I", "-S", "-c", code], cwd=package, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, timeout=300)
