"""The machine around the timed runs: keeping one artifact's runtime threads out of the next one's timing, and seeing
the other work that competes for the cores.

Runtime thread pools spin after a run (ONNX Runtime's intra-op threads for about 30 ms, TBB's under OpenVINO
likewise) so that the next run of the same session starts at once.  When artifacts are timed in alternating rounds
on a machine with as many cores as threads, the session timed last still spins while the next one runs: an int8
session measured 7.8 ms beside an fp32 one and 4.2 ms alone.  Before each artifact's round, ``quiesce`` waits until
this process's threads use no CPU (bounded), so no pool is left spinning; the artifact then re-warms its own threads
with untimed runs (``rewarm_runs``), which is what a plain loop over one session sees.  This works for any runtime,
since it watches the process, not a runtime's settings.

``MachineLoad`` measures, over the timed region, how many cores other processes used (from /proc/stat less this
process's own CPU time), this process's involuntary context switches, and the load average: the evidence that the
machine was busy, which the verdict reports.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

__all__ = ["BUSY_OTHER_CORES", "MachineLoad", "MachineLoadRecord", "process_cpu_seconds", "quiesce", "rewarm_runs"]

log = logging.getLogger(__name__)

BUSY_OTHER_CORES = 0.3
"""Other processes using more than this many cores on average while timing make the machine busy."""
_IDLE_SHARE = 0.1
"""This process is quiet when it uses less than this share of one core over a window."""
_WINDOW_S = 0.005
_QUIET_WINDOWS = 2
_QUIESCE_LIMIT_S = 0.5
_REWARM_BELOW_MS = 25.0
"""A run shorter than this pays for waking its threads (tens of microseconds) visibly: re-warm it after a switch."""
_REWARM_RUNS = 2


def process_cpu_seconds() -> float:
    """User and system CPU time of every thread of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def quiesce(limit: float = _QUIESCE_LIMIT_S) -> float:
    """Wait until this process's threads use no CPU (runtime pools stopped spinning), at most ``limit`` seconds;
    returns the seconds waited.  Two quiet windows in a row: on a busy machine a spinning thread may sit out one
    window preempted."""
    started = time.perf_counter()
    deadline = started + limit
    quiet = 0
    while time.perf_counter() < deadline and quiet < _QUIET_WINDOWS:
        wall, cpu = time.perf_counter(), process_cpu_seconds()
        time.sleep(_WINDOW_S)
        idle = (process_cpu_seconds() - cpu) / max(time.perf_counter() - wall, 1e-6) < _IDLE_SHARE
        quiet = quiet + 1 if idle else 0
    return time.perf_counter() - started


def rewarm_runs(last_median_ms: float | None) -> int:
    """Untimed runs after a switch: enough to wake a short run's threads; none for runs long enough not to care."""
    if last_median_ms is not None and last_median_ms >= _REWARM_BELOW_MS:
        return 0
    return _REWARM_RUNS


def _busy_seconds() -> float | None:
    """CPU seconds every core spent busy since boot (/proc/stat), None where there is no such file."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return None
    ticks = [int(value) for value in fields]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _loadavg() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class MachineLoadRecord(TypedDict, total=False):
    """A row's ``machine_load``: how busy the machine was while timing (``MachineLoad.record``), and the extra
    rounds taken for it (``_rounds.interleaved_rounds``); empty until the rounds ran."""

    other_cores: float | None
    cores: int | None
    seconds: float
    involuntary_switches_per_s: float
    loadavg_before: float | None
    loadavg_after: float | None
    busy: bool
    extra_rounds: int
    extra_rounds_reason: str


@dataclass
class MachineLoad:
    """Started before the timed rounds of one target; ``record`` says how busy the rest of the machine was."""

    wall: float
    busy: float | None
    cpu: float
    switches: int
    load_before: float | None

    @classmethod
    def start(cls) -> MachineLoad:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return cls(time.perf_counter(), _busy_seconds(), usage.ru_utime + usage.ru_stime, usage.ru_nivcsw,
                   _loadavg())

    def record(self) -> MachineLoadRecord:
        """Other processes' cores, this process's involuntary switches per second, load averages, and a verdict."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        wall = max(time.perf_counter() - self.wall, 1e-6)
        busy_now = _busy_seconds()
        others = None
        if self.busy is not None and busy_now is not None:
            ours = usage.ru_utime + usage.ru_stime - self.cpu
            others = max(0.0, (busy_now - self.busy - ours) / wall)
        return {"other_cores": others, "cores": os.cpu_count(), "seconds": wall,
                "involuntary_switches_per_s": (usage.ru_nivcsw - self.switches) / wall,
                "loadavg_before": self.load_before, "loadavg_after": _loadavg(),
                "busy": others is not None and others > BUSY_OTHER_CORES}
