"""How much memory this machine has available now (``QDEPLOY_AVAILABLE_MEMORY`` overrides it, for tests and for
machines that share their memory)."""

from __future__ import annotations

import functools
import os
import re
from typing import Any

from qdeploy.core.errors import QdeployInputError

__all__ = ["MEMORY_ENV", "available_memory", "memory_override", "parse_bytes", "release_memory"]

MEMORY_ENV = "QDEPLOY_AVAILABLE_MEMORY"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text: str) -> int:
    """'8G', '512M', '1.5G' or a plain number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.I)
    if not match:
        raise QdeployInputError(f"{MEMORY_ENV}={text!r} is not a size: write bytes or a number with K, M or G "
                                "(e.g. 8G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def memory_override() -> int | None:
    """Bytes set by QDEPLOY_AVAILABLE_MEMORY, or None."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    return parse_bytes(text) if text else None


def available_memory() -> int:
    """Bytes available now: the override, else MemAvailable, else physical memory."""
    override = memory_override()
    if override is not None:
        return override
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def release_memory() -> None:
    """Collect garbage and hand freed heap pages back to the system.

    Called between sessions of large models: glibc may keep freed chunks in its heap (its mmap threshold grows
    after each large free), and a cycle may hold a closed session until the collector runs; the next session
    should find that memory free, not be added on top of it."""
    import gc

    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, looked up once: ``find_library`` runs a program (fork and exec) on every call, and a
    forked copy of a process holding gigabytes costs time and shows as a second, as large process."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc: nothing to trim
        return None
