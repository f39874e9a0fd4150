"""Decode benchmark of language models with a KV cache: prefill latency, then per-token decode on a growing cache.

For each artifact whose interface has a cache (``_cache_layout``), on the session the latency rows timed:
- a prompt of ``benchmark.decode.prompt`` token ids (the benchmark's dataset's ``input_ids``, repeated to length
  if short; seeded random ids below the vocabulary, the logits' last dimension, when the data is random or has
  none), stacked to the row's batch size;
- one untimed warm-up generation, then generations in repeats interleaved with the other artifacts (as the
  latency rounds are): each is one timed prefill call (the prompt, an empty cache) and ``decode.tokens`` timed
  single-token steps, each fed the greedy next token of the step before and that step's real presents as past;
- timed: the runtime call only (``_decode_steps``); token choice, the mask and positions of the next step and
  binding the past by reference happen between the timed calls.
Repeats: ``benchmark.rounds`` of them, or as many as ``duration_seconds`` allows; with neither iterations nor
duration_seconds set, no new repeat starts after ``DEFAULT_TIMED_SECONDS`` timed seconds.  ``max_seconds`` bounds
warm-up and repeats of each row apart from its latency runs: a generation stops mid-way when it is spent (after at
least one step) and the record says so (``bounded_by`` "max_seconds", ``steps_run``, ``repeats``).
"""

from __future__ import annotations

import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal, TypedDict

import numpy as np

from qdeploy.stages.benchmark._cache_layout import CacheLayout, NotDecodable, layout_of
from qdeploy.stages.benchmark._decode_steps import Stepper, checked_stepper, next_ids
from qdeploy.stages.benchmark._machine import quiesce
from qdeploy.stages.benchmark._rounds import median_confidence_interval
from qdeploy.stages.benchmark.config import DEFAULT_TIMED_SECONDS, BenchmarkConfig, DecodeConfig

if TYPE_CHECKING:
    from pathlib import Path

    from qdeploy.core.context import StageContext
    from qdeploy.stages.benchmark._data import BenchData
    from qdeploy.targets import Session

__all__ = ["BoundedBy", "DecodeOutcome", "DecodeRecord", "DecodeRecordDict", "decode_layouts", "measure_decode"]

log = logging.getLogger(__name__)

BoundedBy = Literal["count", "time", "max_seconds"]
_SEED = 0


class DecodeRecordDict(TypedDict):
    """A benchmark row's ``decode`` (``DecodeRecord.to_dict()``; see ``DecodeRecord`` for each key)."""

    prompt: int
    tokens: int
    batch_size: int
    prefill_ms: float
    prefill_ci95_ms: list[float]
    decode_ms_per_token: float
    decode_ci95_ms: list[float]
    tokens_per_s: float
    cache_length: int
    steps_run: int
    repeats: int
    steps_timed: int
    bounded_by: str
    max_seconds: float
    seconds_spent: float
    timed_call: str
    ids: str
    layout: str
    speedup: float | None


@dataclass
class DecodeRecord:
    """Prefill and decode speed of one artifact on one target.

    ``prefill_ms``: median of the timed prefill calls (``prompt`` tokens, empty cache), ``prefill_ci95_ms`` a 95%
    interval of that median; ``decode_ms_per_token``: median over every timed step of every repeat (the cache grows
    from ``prompt`` to ``prompt + steps_run``), ``decode_ci95_ms`` its interval; ``tokens_per_s``: 1000 /
    ``decode_ms_per_token``, per sequence; ``cache_length``: the longest cache reached, read from the presents;
    ``steps_run``: decode steps of the longest repeat (``tokens`` unless the time budget cut it); ``repeats``:
    timed generations; ``steps_timed``: steps over all of them; ``bounded_by``: "count" (the planned repeats ran),
    "time" (duration_seconds, or the default time cap, ended the repeats), "max_seconds" (the row's budget stopped
    a generation mid-way); ``seconds_spent``: warm-up and repeats; ``ids``: where the prompt came from;
    ``speedup``: decode ms per token of the reference over this one's, on the same target (set by the report).
    """

    prompt: int
    tokens: int
    batch_size: int
    prefill_ms: float
    prefill_ci95_ms: list[float]
    decode_ms_per_token: float
    decode_ci95_ms: list[float]
    tokens_per_s: float
    cache_length: int
    steps_run: int
    repeats: int
    steps_timed: int
    bounded_by: str
    max_seconds: float
    seconds_spent: float
    timed_call: str
    ids: str
    layout: str
    speedup: float | None = None

    def to_dict(self) -> DecodeRecordDict:
        return DecodeRecordDict(**asdict(self))


@dataclass
class DecodeOutcome:
    """What the decode benchmark says of one row: its record (None when not measured) and notes."""

    record: DecodeRecord | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class _Generations:
    """One artifact's decode state over its repeats."""

    stepper: Stepper
    prefill: dict[str, np.ndarray]
    prompt: int
    ids: str
    prefill_ms: list[float] = field(default_factory=list)
    steps_ms: list[list[float]] = field(default_factory=list)
    cache_length: int = 0
    spent: float = 0.0
    done: BoundedBy | None = None
    error: str = ""

    @property
    def timed_seconds(self) -> float:
        return (sum(self.prefill_ms) + sum(map(sum, self.steps_ms))) / 1e3


def decode_layouts(artifacts: dict[str, Path]) -> tuple[dict[str, CacheLayout], dict[str, str]]:
    """Artifact -> its cache layout (models with a cache only), and artifact -> why a cache-like one is not run."""
    layouts: dict[str, CacheLayout] = {}
    skipped: dict[str, str] = {}
    for name, path in artifacts.items():
        try:
            layout = layout_of(path)
        except NotDecodable as exc:
            skipped[name] = f"decode benchmark skipped, plain benchmark only: {exc}"
            continue
        except Exception as exc:  # an interface that cannot be read costs the decode record, not the row
            skipped[name] = f"decode benchmark skipped: cannot read the interface: {type(exc).__name__}: {exc}"
            continue
        if layout is not None:
            layouts[name] = layout
    return layouts, skipped


def measure_decode(sessions: dict[str, tuple[Session, Path]], config: BenchmarkConfig, plan: DecodeConfig,
                   batch: int, data: BenchData, ctx: StageContext, label: str) -> dict[str, DecodeOutcome]:
    """Decode records of the artifacts that have a KV cache; others get nothing (or a note why not)."""
    layouts, skipped = decode_layouts({name: path for name, (_, path) in sessions.items()})
    outcomes = {name: DecodeOutcome(notes=[reason]) for name, reason in skipped.items()}
    runs: dict[str, _Generations] = {}
    for name, layout in layouts.items():
        session = sessions[name][0]
        ctx.on_progress(f"{name} · {label}: decode warm-up")
        try:
            runs[name], notes = _start(session, layout, plan, batch, data)
            outcomes[name] = DecodeOutcome(notes=notes)
            _warm_up(runs[name], plan, config.row_budget)
        except Exception as exc:  # the latency row stands; decode says why it is missing
            log.debug("decode benchmark of %s failed", name, exc_info=True)
            runs.pop(name, None)
            outcomes[name] = DecodeOutcome(notes=[f"decode benchmark failed: {type(exc).__name__}: {exc}"])
    _repeats(runs, config, plan, ctx, label)
    for name, run in runs.items():
        if run.error:
            outcomes[name].notes.append(f"decode benchmark failed: {run.error}")
            continue
        record = _record(run, plan, batch, config.row_budget, layouts[name])
        outcomes[name].record = record
        if record.bounded_by == "max_seconds":
            outcomes[name].notes.append(
                f"decode stopped early: the row's time budget (max_seconds {config.row_budget:g} s) was spent after "
                f"{record.repeats} timed generation(s), {record.steps_run} of {plan.tokens} steps in the longest")
    return outcomes


def _start(session: Session, layout: CacheLayout, plan: DecodeConfig, batch: int,
           data: BenchData) -> tuple[_Generations, list[str]]:
    """The prompt, the prefill feeds and the stepper to time (checked against ``Session.run``)."""
    empty = {pair.past: pair.empty(batch) for pair in layout.pairs}
    vocab = layout.vocab
    if vocab is None:  # one untimed call with token 0, valid for any embedding, tells the logits' width
        probe = session.run({**layout.step_inputs(np.zeros((batch, 1), np.int64), 0), **empty})
        vocab = int(probe[layout.logits].shape[-1])
    ids, source = _prompt_ids(data, layout.input_ids, plan.prompt, vocab)
    prefill = {**layout.step_inputs(np.tile(ids, (batch, 1)), 0), **empty}
    stepper, notes = checked_stepper(session, layout, prefill, plan.prompt)
    return _Generations(stepper, prefill, plan.prompt, source), notes


def _prompt_ids(data: BenchData, name: str, prompt: int, vocab: int) -> tuple[np.ndarray, str]:
    """``prompt`` token ids from the data, else seeded random ids inside the vocabulary."""
    seen = [np.asarray(sample[name]).ravel() for sample in data.samples if name in sample] if not data.random else []
    tokens = np.concatenate(seen).astype(np.int64) if seen else np.zeros(0, np.int64)
    if tokens.size:
        if tokens.min() < 0 or tokens.max() >= vocab:
            raise ValueError(f"the data's {name} range from {tokens.min()} to {tokens.max()}, outside the "
                             f"vocabulary of {vocab} (the logits' last dimension)")
        repeated = tokens.size < prompt
        source = (f"{data.source}: {name} of {len(seen)} sample(s)"
                  + (f", {tokens.size} ids repeated to {prompt}" if repeated else ""))
        return np.resize(tokens, prompt), source
    ids = np.random.default_rng(_SEED).integers(0, vocab, prompt, dtype=np.int64)
    return ids, f"seeded random ids below {vocab} (the logits' last dimension; the data has no {name})"


def _generate(run: _Generations, tokens: int, deadline: float) -> tuple[float, list[float]]:
    """One generation: (prefill ms, ms of each step); stops once ``deadline`` has passed, after one step at least."""
    stepper = run.stepper
    stepper.bind_prefill(run.prefill)
    start = time.perf_counter_ns()
    stepper.call()
    prefill = (time.perf_counter_ns() - start) / 1e6
    length = stepper.cache_length()
    if length != run.prompt:  # the axis taken for the past must be the one that grows
        first = stepper.layout.pairs[0]
        raise NotDecodable(f"'{first.present}' has length {length} on axis {first.axis} after a prefill of "
                           f"{run.prompt} tokens: that axis is not the cache length")
    steps: list[float] = []
    while len(steps) < tokens and (not steps or time.perf_counter() < deadline):
        stepper.bind_step(stepper.layout.step_inputs(next_ids(stepper.logits()), length))
        start = time.perf_counter_ns()
        stepper.call()
        steps.append((time.perf_counter_ns() - start) / 1e6)
        length += 1
    run.cache_length = max(run.cache_length, stepper.cache_length())
    return prefill, steps


def _warm_up(run: _Generations, plan: DecodeConfig, budget: float) -> None:
    """One untimed generation (the runtime meets every cache length once), within the row's budget."""
    started = time.perf_counter()
    _generate(run, plan.tokens, started + budget)
    run.spent += time.perf_counter() - started
    run.cache_length = 0


def _repeats(runs: dict[str, _Generations], config: BenchmarkConfig, plan: DecodeConfig, ctx: StageContext,
             label: str) -> None:
    """Timed generations, the artifacts interleaved, until each one's plan or budget ends."""
    planned = None if config.duration_seconds is not None else config.rounds
    seconds = config.duration_seconds or (DEFAULT_TIMED_SECONDS if config.round_seconds_cap is not None else None)
    repeat = 0
    while any(run.done is None for run in runs.values()):
        for name, run in runs.items():
            if run.done is None:
                run.done = _finished(run, repeat, planned, seconds, config.row_budget)
            if run.done is not None:
                continue
            ctx.on_progress(f"{name} · {label}: decode repeat {repeat + 1}")
            quiesce()  # no runtime pool of the artifact timed before is still spinning
            started = time.perf_counter()
            try:
                prefill, steps = _generate(run, plan.tokens, started + max(config.row_budget - run.spent, 0.0))
            except Exception as exc:  # one artifact failing mid-generation must not lose the others
                log.debug("decode of %s failed", name, exc_info=True)
                run.error, run.done = f"{type(exc).__name__}: {exc}", "count"
                continue
            finally:
                run.spent += time.perf_counter() - started
            run.prefill_ms.append(prefill)
            run.steps_ms.append(steps)
            if len(steps) < plan.tokens:
                run.done = "max_seconds"
        repeat += 1


def _finished(run: _Generations, repeat: int, planned: int | None, seconds: float | None,
              budget: float) -> BoundedBy | None:
    """Why an artifact takes no more repeats (None: it takes another); the first repeat always runs."""
    if not run.prefill_ms:
        return None
    if planned is not None and repeat >= planned:
        return "count"
    if run.spent >= budget:
        return "max_seconds"
    if seconds is not None and run.timed_seconds >= seconds:
        return "time"
    return None


def _record(run: _Generations, plan: DecodeConfig, batch: int, budget: float, layout: CacheLayout) -> DecodeRecord:
    prefill = sorted(run.prefill_ms)
    steps = sorted(value for repeat in run.steps_ms for value in repeat)
    decode_ms = statistics.median(steps)
    return DecodeRecord(
        prompt=plan.prompt, tokens=plan.tokens, batch_size=batch, prefill_ms=statistics.median(prefill),
        prefill_ci95_ms=list(median_confidence_interval(prefill)), decode_ms_per_token=decode_ms,
        decode_ci95_ms=list(median_confidence_interval(steps)),
        tokens_per_s=1e3 / decode_ms if decode_ms > 0 else 0.0, cache_length=run.cache_length,
        steps_run=max(len(repeat) for repeat in run.steps_ms), repeats=len(run.steps_ms), steps_timed=len(steps),
        bounded_by=run.done or "count", max_seconds=budget, seconds_spent=run.spent,
        timed_call=run.stepper.description, ids=run.ids, layout=layout.describe())
