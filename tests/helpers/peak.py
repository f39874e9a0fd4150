"""Peak resident memory of a piece of code, measured in a fresh interpreter (Linux: /proc)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_MEASURE = """
def _rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

open("/proc/self/clear_refs", "w").write("5")  # reset the peak to what is resident now
_start = _rss("VmRSS")
{measured}
print((_rss("VmHWM") - _start) / 2**20)
"""


def peak_mib(folder: Path, setup: str, measured: str, *, timeout: float = 300) -> float:
    """Run ``setup`` then ``measured`` (Python source) in a new interpreter; the MiB ``measured`` adds at its peak
    to what was resident after ``setup``.  Skips where the kernel cannot reset the peak."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("peak memory is read from /proc (Linux only)")
    script = folder / "peak.py"
    script.write_text(textwrap.dedent(setup) + _MEASURE.format(measured=textwrap.dedent(measured)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return float(done.stdout.split()[-1])
