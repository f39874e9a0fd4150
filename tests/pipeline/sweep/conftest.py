"""Fixtures the sweep tests share."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture
def keep_logging() -> Iterator[None]:
    """The CLI points logging at CliRunner's stream, which closes after the run: put the handlers back."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    yield
    root.handlers[:] = handlers
