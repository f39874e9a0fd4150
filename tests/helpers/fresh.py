"""Functions that tests/core/test_fresh_python.py calls in a fresh interpreter."""

from __future__ import annotations

import sys
from typing import Any


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return {"got": payload, "numpy_loaded": "numpy" in sys.modules}


def crash(payload: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"asked to fail: {payload['why']}")
