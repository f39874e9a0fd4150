"""Reading what a logger said in a test, whatever other tests did to logging before it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Said", "said_by"]


class Said(logging.Handler):
    """The messages of the logger it is added to, at WARNING and above."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def said_by(name: str) -> Iterator[Said]:
    """What the logger ``name`` says at WARNING and above meanwhile, on a handler of its own, at its own level and
    enabled for the while: in the single-process suite an earlier test (CLI tests reset the root's handlers and the
    qdeploy logger's level) left such warnings unseen by caplog."""
    logger, said = logging.getLogger(name), Said()
    level, disabled = logger.level, logger.disabled
    logger.setLevel(logging.WARNING)
    logger.disabled = False
    logger.addHandler(said)
    try:
        yield said
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
        logger.disabled = disabled
