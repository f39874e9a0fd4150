"""The check data of a run's packages: a few validation samples and the run's reference outputs on them.

Written once per run as ``packages/reference-check.npz`` (its sha256 in ``report.json`` under
``packages.check_data``), so that ``qdeploy package`` never needs the recipe's data folder again.  The samples
are the ones validation compared (all of them, as far as they fit under ``CHECK_MAX_BYTES``) and the outputs
are computed as validation computes its reference (the reference model on ort:cpu, float32 pinned), so a
package is held to its limits on the very samples and numbers its validation was.  A subset would not do: the
metrics are aggregates (SNR, cosine over every element), and those of a few samples can fall below the whole
set's where validation passed.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.stages.validate import REFERENCE_TARGET, feed_caster, reference_source
from qdeploy.targets import get_target

if TYPE_CHECKING:
    from qdeploy.core.context import Artifact
    from qdeploy.pipeline.recipe.schema import Recipe

__all__ = ["CHECK_FILE", "CHECK_MAX_BYTES", "CheckData", "Samples", "compute_check_data",
           "read_check_data", "save_samples", "write_check_data"]

log = logging.getLogger(__name__)

CHECK_FILE = "reference-check.npz"
CHECK_MAX_BYTES = 16 * 2**20
"""Check data is the longest prefix of the validation samples under this (inputs plus reference outputs); when
not even one sample fits, it is left out and packages say 'unchecked'."""
Samples = list[dict[str, np.ndarray]]


@dataclass
class CheckData:
    """Feeds and the reference's outputs on them, or why there are none."""

    feeds: Samples = field(default_factory=list)
    reference: Samples = field(default_factory=list)
    left_out: str = ""
    source: str = ""
    """What the reference outputs are: "variant 'fp32' on ort:cpu"."""

    @property
    def samples(self) -> int:
        return len(self.feeds)


def compute_check_data(recipe: Recipe, evaluated: dict[str, Artifact], samples: int | None = None) -> CheckData:
    """The validation samples (the first ``samples`` when given) and the reference's outputs on them, as many as
    fit under ``CHECK_MAX_BYTES``; never raises (the reason is kept)."""
    config = recipe.validate_
    wanted = config.samples if samples is None else min(samples, config.samples)
    try:
        with tempfile.TemporaryDirectory(prefix="qdeploy-check-") as work:
            ctx = recipe.stage_context("*", Path(work))
            source = reference_source(evaluated, config, ctx)
            label = f"{source.label} on {REFERENCE_TARGET}"
            feeds = list(ctx.samples(config.data, source.feed_model, limit=wanted))
            cast = feed_caster(source.path)
            with get_target(REFERENCE_TARGET).load(source.path, pin_f32=True) as session:
                data, first_size = _fitting(feeds, lambda feed: session.run(cast(feed)), label)
    except Exception as exc:  # no check data makes packages 'unchecked', never the run fail
        log.warning("package check data could not be computed: %s", exc)
        return CheckData(left_out=f"the reference outputs could not be computed: {type(exc).__name__}: {exc}")
    if not data.samples:
        return CheckData(left_out=f"one sample and its reference outputs take {first_size} bytes (more than "
                                  f"{CHECK_MAX_BYTES})", source=label)
    unstorable = [name for sample in data.feeds + data.reference for name, value in sample.items()
                  if not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf"]
    if unstorable:
        return CheckData(left_out=f"values that are not numeric tensors cannot be stored: {sorted(set(unstorable))}",
                         source=label)
    if data.samples < len(feeds):
        # the cap is by design (packages stay small), not a problem: said at info, recorded with the data
        log.info("package check data: %d of the %d validation samples fit in %.0f MiB with their reference outputs; "
                 "packages are checked on those", data.samples, len(feeds), CHECK_MAX_BYTES / 2**20)
    return data


def _fitting(feeds: Samples, reference: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
             label: str) -> tuple[CheckData, int]:
    """The longest prefix of ``feeds`` whose inputs and reference outputs fit under the cap; the first one's size."""
    data, total, first_size = CheckData(source=label), 0, 0
    for feed in feeds:
        outputs = reference(feed)
        size = _nbytes([feed]) + _nbytes([outputs])
        first_size = first_size or size
        if total + size > CHECK_MAX_BYTES:
            break
        total += size
        data.feeds.append(feed)
        data.reference.append(outputs)
    return data, first_size


def _nbytes(samples: Samples) -> int:
    return sum(int(np.asarray(value).nbytes) for sample in samples for value in sample.values())


def write_check_data(path: Path, data: CheckData) -> None:
    """One .npz: 'input/<i>/<name>' and 'reference/<i>/<name>' arrays, plus why it is empty when it is."""
    arrays: dict[str, np.ndarray] = {"meta/source": np.array(data.source), "meta/left_out": np.array(data.left_out)}
    for kind, samples in (("input", data.feeds), ("reference", data.reference)):
        for index, sample in enumerate(samples):
            arrays.update({f"{kind}/{index}/{name}": value for name, value in sample.items()})
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("wb") as handle:
        np.savez(handle, **arrays)
    temporary.replace(path)


def read_check_data(path: Path) -> CheckData:
    feeds: dict[int, dict[str, np.ndarray]] = {}
    reference: dict[int, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as stored:
        data = CheckData(source=str(stored["meta/source"]), left_out=str(stored["meta/left_out"]))
        for key in stored.files:
            kind, _, rest = key.partition("/")
            if kind in ("input", "reference"):
                index, name = rest.split("/", 1)
                (feeds if kind == "input" else reference).setdefault(int(index), {})[name] = stored[key]
    data.feeds = [feeds[i] for i in sorted(feeds)]
    data.reference = [reference[i] for i in sorted(reference)]
    return data


def save_samples(path: Path, samples: Samples) -> None:
    """The package's form: '<index>/<name>' arrays (what check.py's load_samples reads)."""
    np.savez(path, **{f"{index}/{name}": value for index, sample in enumerate(samples)
                      for name, value in sample.items()})
