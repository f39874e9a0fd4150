"""Validation at each benchmarked batch size.

A model declared with a dynamic batch axis can still break above batch 1: a stage that left a stale static
output shape ([1, 10]) makes ONNX Runtime refuse batch 8 while batch 1 passes.  So when the recipe
benchmarks batch sizes the validation samples do not already cover, each artifact is also run on one batch
of each size, stacked from the validation samples (qdeploy.calibration.batches), and compared with the reference
run on the same batch.  A batch the reference itself cannot take is not validated, and every row says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.calibration.batches import (
    BatchError,
    available_memory_bytes,
    batch_axes,
    explain_batch_failure,
    make_batch,
)
from qdeploy.core.output_store import OutputStore

if TYPE_CHECKING:
    from qdeploy.core.context import StageContext
    from qdeploy.targets import Session

log = logging.getLogger(__name__)

Feed = dict[str, np.ndarray]
RunModel = Callable[[Path, list[Feed]], list[dict[str, np.ndarray]]]


@dataclass
class BatchedFeeds:
    """Feeds added for batch sizes beyond the samples', their reference outputs, and what was not validated."""

    sizes: list[int] = field(default_factory=list)
    feeds: list[Feed] = field(default_factory=list)
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def wanted_batch_sizes(ctx: StageContext) -> list[int]:
    """The benchmark's batch sizes, when the recipe benchmarks at all."""
    return list(ctx.batch_sizes)


def reference_batches(samples: list[Feed], feed_model: Path, reference: Path, sizes: list[int],
                      run_model: RunModel) -> BatchedFeeds:
    """One stacked feed per batch size the samples do not cover, with the reference's outputs on it."""
    result = BatchedFeeds()
    if not samples or not sizes:
        return result
    axes = batch_axes(feed_model)
    covered = {_rows(sample, axes.axes) for sample in samples}
    memory = available_memory_bytes()
    for size in sizes:
        if size in covered:
            continue
        try:
            batch = make_batch(samples, axes, size, max_bytes=int(memory * 0.25) if memory else None)
            outputs = run_model(reference, [batch.feed])
        except BatchError as exc:
            result.warnings.append(f"batch {size} not validated: {exc}")
            continue
        except Exception as exc:  # the reference cannot take this batch: nothing to compare against
            log.debug("reference at batch %d failed", size, exc_info=True)
            result.warnings.append(f"batch {size} not validated: the reference fails at this batch size "
                                   f"({type(exc).__name__}: {exc})")
            continue
        result.sizes.append(size)
        result.feeds.append(batch.feed)
        result.outputs += outputs
    return result


class BatchRunError(RuntimeError):
    """A model that runs the samples but fails on a stacked batch: the message says at which batch size."""


def run_feeds(session: Session, feeds: list[Feed], batches: BatchedFeeds | None,
              spill_dir: Path | None = None) -> list[Mapping[str, np.ndarray]]:
    """Outputs of each feed; a failure on a stacked feed names its batch size and why that size fails.  With a
    ``spill_dir``, outputs past ``KEEP_IN_MEMORY_BYTES`` wait on disk there (``qdeploy.core.output_store``)."""
    base = len(feeds) - (len(batches.feeds) if batches else 0)
    outputs = OutputStore(spill_dir)
    for index, feed in enumerate(feeds):
        try:
            outputs.add(session.run(feed))
        except Exception as exc:
            if batches is None or index < base:
                raise
            size = batches.sizes[index - base]
            why = explain_batch_failure(exc, size) or f"{type(exc).__name__}: {exc}"
            raise BatchRunError(f"at batch {size} (the {base} samples at their own size ran): {why}") from exc
    return outputs.samples


def _rows(sample: Feed, axes: dict[str, int | None]) -> int | None:
    counts = {sample[name].shape[axis] for name, axis in axes.items()
              if axis is not None and name in sample and sample[name].ndim > axis}
    return counts.pop() if len(counts) == 1 else (1 if not counts else None)
