"""The fewest nodes to keep float32 so that ONNX Runtime loads the float16 model.

Some float16 graphs fail at ONNX Runtime's session creation, with an error or a crash in one of its graph
optimisations (version 1.32's CPU provider crashes on a float16 MatMul fed by a batch Transpose, which a
bidirectional GRU's head exports to).  Instead of failing the variant, the stage looks for nodes that, kept
float32, make the artifact load: delta debugging (Zeller's ddmin) over the converted nodes, each candidate set
converted and loaded in a child process (``qdeploy.targets.ort_probe``).  A set is accepted only after it loaded,
so whatever the search returns loads; the probe limit bounds its cost, not its correctness (it may then keep more
nodes than needed, and says so).

Candidates are ordered by op type, then graph order: a failure is usually one op type's kernel or fusion, and
nodes of one type then fall into one chunk, so the first halvings find it in a few loads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qdeploy.stages.fp16.findings import LoadRepairRecord

__all__ = ["MAX_LOADS", "LoadSearch", "fewest_for_loading"]

MAX_LOADS = 40
"""Loads (each a conversion and a child process) one search may try before it settles for what it has."""


@dataclass(frozen=True)
class LoadSearch:
    """Nodes to keep float32 (the artifact loaded with them), how many loads the search tried, and whether it
    stopped at ``max_loads`` before it could show that no node can be dropped."""

    nodes: list[str]
    loads: int
    exhausted: bool

    def record(self, error: str) -> LoadRepairRecord:
        return {"error": error, "kept_float32": list(self.nodes), "loads": self.loads, "minimal": not self.exhausted}


class _Probe:
    """``loads`` with a count, and an end once ``max_loads`` were tried."""

    def __init__(self, loads: Callable[[list[str]], bool], max_loads: int) -> None:
        self.loads = loads
        self.max_loads = max_loads
        self.count = 0

    @property
    def exhausted(self) -> bool:
        return self.count >= self.max_loads

    def __call__(self, nodes: list[str]) -> bool:
        self.count += 1
        return self.loads(nodes)


def fewest_for_loading(candidates: Sequence[str], loads: Callable[[list[str]], bool],
                       max_loads: int = MAX_LOADS) -> LoadSearch | None:
    """A 1-minimal subset of ``candidates`` whose float32 makes the model load (``loads(nodes)``), or None when
    keeping all of them float32 does not make it load either (the failure is not float16's).  Keeping none is
    known to fail: that is why the search runs."""
    probe = _Probe(loads, max(max_loads, 1))
    keep = list(candidates)
    if not keep or not probe(keep):
        return None
    granularity, minimal = 2, len(keep) < 2
    while not minimal:
        smaller = _reduce(keep, _split(keep, granularity), probe, granularity)
        if smaller is not None:
            keep, granularity = smaller
            minimal = len(keep) < 2
        elif probe.exhausted:
            break
        elif granularity >= len(keep):
            minimal = True  # no single node can go: 1-minimal
        else:
            granularity = min(2 * granularity, len(keep))
    return LoadSearch(keep, probe.count, exhausted=not minimal)


def _reduce(keep: list[str], chunks: list[list[str]], probe: _Probe,
            granularity: int) -> tuple[list[str], int] | None:
    """ddmin's step: a chunk alone that loads, else a chunk whose removal still loads; with the next granularity."""
    for chunk in chunks:
        if probe.exhausted:
            return None
        if probe(chunk):
            return chunk, 2
    if granularity == 2:  # each complement is the other chunk, already tried
        return None
    for chunk in chunks:
        if probe.exhausted:
            return None
        dropped = set(chunk)
        rest = [name for name in keep if name not in dropped]
        if probe(rest):
            return rest, max(granularity - 1, 2)
    return None


def _split(items: list[str], parts: int) -> list[list[str]]:
    """``items`` in ``parts`` contiguous chunks of nearly equal size."""
    size, extra = divmod(len(items), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (index < extra)
        chunks.append(items[start:end])
        start = end
    return [chunk for chunk in chunks if chunk]
