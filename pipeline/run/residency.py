"""What a run holds resident at once after the build: the budget of the sessions loaded side by side.

The build runs one stage at a time, and validation one session at a time (each closed before the next is
created); the benchmark interleaves every artifact of a target in its rounds, which holds all their sessions
at once.  For large models that sum was the run's peak (a 0.5 GB model with four variants on ONNX Runtime
and OpenVINO: 5.9 GB, 11.8x the model, where every stage alone stayed under 3.9x; docs/large-models.md).
This module gives the benchmark a budget: the sessions held at once may take ``SESSION_BUDGET_FACTOR`` times
the largest model's size (each session's estimate: ``qdeploy.stages.benchmark.session_bytes``), at least
``MIN_SESSION_BUDGET`` so that small models keep every artifact in one interleaved round.
``pipeline/run/memory_plan.py`` counts the same budget in the whole run's estimate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qdeploy.core.memory import release_memory

if TYPE_CHECKING:
    from qdeploy.core.context import Artifact

__all__ = ["MIN_SESSION_BUDGET", "RELEASE_FROM_BYTES", "SESSION_BUDGET_FACTOR", "between_phases", "largest_model_bytes",
           "session_budget"]

SESSION_BUDGET_FACTOR = 2.0
"""Sessions held at once, over the largest model's bytes: one OpenVINO session of a float32 model (2.1x), or two
ONNX Runtime sessions of it."""
MIN_SESSION_BUDGET = 1_000_000_000
"""Below this every artifact of a target is loaded at once, as before (models up to about 200 MB)."""
RELEASE_FROM_BYTES = 256_000_000
"""Models from this size get freed memory handed back between phases."""


def largest_model_bytes(artifacts: dict[str, Artifact]) -> int:
    """The largest evaluated model's bytes on disk, external data included (the exported model, usually)."""
    return max((artifact.size_bytes for artifact in artifacts.values()), default=0)


def session_budget(artifacts: dict[str, Artifact]) -> int:
    """Bytes the benchmark's sessions may hold at once."""
    return max(int(SESSION_BUDGET_FACTOR * largest_model_bytes(artifacts)), MIN_SESSION_BUDGET)


def between_phases(artifacts: dict[str, Artifact]) -> None:
    """What the last phase freed goes back to the system before the next one loads sessions of large models
    (a full collection costs tens of milliseconds: not spent on small ones)."""
    if largest_model_bytes(artifacts) >= RELEASE_FROM_BYTES:
        release_memory()
