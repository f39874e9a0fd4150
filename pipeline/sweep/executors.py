"""Run a sweep: a scheduler drives each recipe's phases through an executor, on this machine or on Ray.

The scheduler keeps, per recipe, the chain build -> validate -> benchmark -> report, and hands ready work to an
executor:

- ``LocalExecutor``: worker processes of this machine.  Builds, validations and reports of different recipes run
  in parallel, up to ``workers`` (default: the cores); a benchmark runs alone, never beside other work, enforced
  by ``sweep_work.machine_lock`` (shared for other work, exclusive for a benchmark; it holds across processes,
  so two sweeps on one machine also take turns).
- ``RayExecutor`` (``qdeploy.pipeline.sweep.executors_ray``): Ray tasks on an existing cluster or on a Ray started here.

A failed recipe (bad input, a stage error, a worker killed twice) is recorded with its reason and the sweep goes
on.  Every item's start, end, node and pid land in the sweep report's timeline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from qdeploy.core.errors import QdeployError
from qdeploy.core.report import as_report
from qdeploy.pipeline.publish.store import ArtifactStore
from qdeploy.pipeline.results.envinfo import cpu_info
from qdeploy.pipeline.run.runner import RunOptions, RunOutcome, locked_out_dir, plan_run
from qdeploy.pipeline.sweep import SweepEntry, SweepPlan
from qdeploy.pipeline.sweep.jobs import Job
from qdeploy.pipeline.sweep.report_model import ExecutorDescription
from qdeploy.pipeline.sweep.work import WorkItem, WorkRecord, WorkReply, default_lock_path, execute, merge_rows

__all__ = ["WORKER_PRELOAD", "Executor", "LocalExecutor", "Scheduler", "SweepOptions", "SweepResult",
           "init_worker_logging", "make_executor", "run_sweep"]

log = logging.getLogger(__name__)

_PRIORITY = {"benchmark": 0, "report": 1, "validate": 2, "build": 3}
"""Ready work is handed out benchmarks first, builds last: recipes finish early and benchmarks never starve."""
WORKER_PRELOAD = ("qdeploy.pipeline.run.runner", "qdeploy.pipeline.sweep.work", "onnx", "onnxruntime",
                  "onnxruntime.quantization", "onnxruntime.tools", "onnx_ir", "openvino", "matplotlib.figure")
"""Imported once by the server that local workers fork from: seconds each worker would pay again (ONNX Runtime's
quantization tools import torch when it is installed).  A module that is not installed is skipped."""


@dataclass
class SweepOptions:
    """How to run a sweep (the `qdeploy sweep` flags)."""

    out_dir: Path
    cache_dir: Path | None = None
    use_cache: bool = True
    executor: Literal["local", "ray"] = "local"
    workers: int | None = None
    """Local executor: parallel builds and validations; the machine's cores when None."""
    address: str | None = None
    """Ray executor: the cluster ('auto', 'ray://head:10001'); None starts Ray on this machine."""
    ray_num_cpus: int | None = None
    """CPUs of a Ray started here (address None); all cores when None."""
    lock_path: Path | None = None
    """Local executor: the machine's work lock; one per user in the temp folder when None."""
    show_progress: bool = False


@dataclass
class SweepResult:
    report: dict[str, Any]
    out_dir: Path
    exit_code: int


class Executor(Protocol):
    """Where work items run: submit, wait for some to finish, split targets into groups."""

    def describe(self) -> ExecutorDescription: ...

    def target_groups(self, targets: list[str]) -> list[tuple[str, ...] | None]: ...

    def can_submit(self, item: WorkItem, running: list[WorkItem]) -> bool: ...

    def submit(self, item: WorkItem, payload: tuple[Any, ...]) -> None: ...

    def wait(self) -> list[tuple[WorkItem, WorkReply | BaseException]]: ...

    def close(self) -> None: ...


def run_sweep(plan: SweepPlan, options: SweepOptions,
              on_change: Callable[[list[Job], list[WorkItem]], None] | None = None) -> SweepResult:
    """Run every valid recipe of the plan, write the sweep report and return it with the sweep's exit status."""
    # lazy: pulls onnxruntime (import cost)
    from qdeploy.pipeline.sweep.report import build_sweep_report, write_sweep_reports

    out_dir = options.out_dir.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    cache_dir = (options.cache_dir or out_dir / "cache").resolve()
    started = time.time()
    with ExitStack() as stack:
        stack.enter_context(locked_out_dir(out_dir))
        ArtifactStore(cache_dir).sweep_temporaries()  # once, before any worker writes into the cache
        jobs = [_job(entry, out_dir, cache_dir, options, stack) for entry in plan.entries]
        executor = make_executor(options)
        stack.callback(executor.close)
        scheduler = Scheduler(jobs, executor, on_change)
        timeline = scheduler.run()
        report = build_sweep_report(plan.name, jobs, timeline, executor.describe(), out_dir,
                                    started=started, seconds=time.time() - started)
        write_sweep_reports(report, out_dir)
    return SweepResult(report=report.to_json(), out_dir=out_dir, exit_code=report.exit_code)


def make_executor(options: SweepOptions) -> Executor:
    if options.executor == "ray":
        # lazy: pulls onnxruntime (import cost)
        from qdeploy.pipeline.sweep.executors_ray import RayExecutor

        return RayExecutor(address=options.address, num_cpus=options.ray_num_cpus)
    return LocalExecutor(workers=options.workers, lock_path=options.lock_path or default_lock_path())


def _job(entry: SweepEntry, out_dir: Path, cache_dir: Path, options: SweepOptions, stack: ExitStack) -> Job:
    job = Job(entry=entry, folder=out_dir / entry.name)
    if entry.recipe is None:
        job.status, job.reason = "invalid", entry.error
        return job
    try:
        job.plan = plan_run(entry.recipe, RunOptions(out_dir=job.folder, cache_dir=cache_dir,
                                                     use_cache=options.use_cache))
        stack.enter_context(locked_out_dir(job.plan.out_dir))
    except QdeployError as exc:  # its folder is held by another run: this recipe only
        job.status, job.reason = "error", str(exc)
    except OSError as exc:
        job.status, job.reason = "error", f"cannot prepare {job.folder}: {exc}"
    return job


class Scheduler:
    """Moves each recipe through build -> validate -> benchmark -> report on an executor."""

    def __init__(self, jobs: list[Job], executor: Executor,
                 on_change: Callable[[list[Job], list[WorkItem]], None] | None = None) -> None:
        self.jobs = {job.entry.name: job for job in jobs}
        self.executor = executor
        self.on_change = on_change or (lambda jobs, running: None)
        self.ready: list[tuple[WorkItem, tuple[Any, ...]]] = []
        self.running: list[WorkItem] = []
        self.timeline: list[WorkRecord] = []

    def run(self) -> list[WorkRecord]:
        """Run until every recipe is finished; returns the timeline of the work items."""
        for job in self.jobs.values():
            if job.plan is not None and not job.finished:
                self._queue(WorkItem("build", job.entry.name), (job.plan,))
        self._notify()
        while self.ready or self.running:
            self._submit_ready()
            for item, reply in self.executor.wait():
                self.running.remove(item)
                self._handle(item, reply)
            self._notify()
        return sorted(self.timeline, key=lambda record: record["start"])

    def _notify(self) -> None:
        self.on_change(list(self.jobs.values()), list(self.running))

    def _queue(self, item: WorkItem, payload: tuple[Any, ...]) -> None:
        self.ready.append((item, payload))
        self.ready.sort(key=lambda entry: _PRIORITY[entry[0].kind])

    def _submit_ready(self) -> None:
        for entry in list(self.ready):
            item, payload = entry
            if self.executor.can_submit(item, self.running):
                self.ready.remove(entry)
                self.running.append(item)
                job = self.jobs[item.recipe]
                job.status = "running"
                job.started = job.started or time.time()
                self.executor.submit(item, payload)

    def _handle(self, item: WorkItem, reply: WorkReply | BaseException) -> None:
        job = self.jobs[item.recipe]
        if isinstance(reply, BaseException):
            self._lost(job, item, reply)
            return
        self.timeline.append(reply.record)
        if job.finished:
            return  # another item of this recipe failed first
        if reply.error is not None:
            job.status = "invalid" if reply.input_error else "error"
            job.reason = f"{item.kind} failed: {reply.error}"
            return
        job.last_node = reply.record.get("node")
        job.outstanding -= 1
        self._advance(job, item, reply.value)

    def _lost(self, job: Job, item: WorkItem, error: BaseException) -> None:
        """The worker died under the item (killed, out of memory): try once more, then fail the recipe."""
        if job.finished:
            return
        if item.attempt == 1:
            log.warning("recipe %s: the worker running %s died (%s); running it again", item.recipe, item.kind,
                        error)
            retry = WorkItem(item.kind, item.recipe, item.targets, attempt=2)
            self._queue(retry, self._payload(job, item.kind))
            return
        job.status = "error"
        job.reason = f"{item.kind}: the worker died twice ({type(error).__name__}: {error})"

    def _advance(self, job: Job, item: WorkItem, value: Any) -> None:
        assert job.plan is not None
        if item.kind == "build":
            job.outcome = value
            self._fan_out(job, "validate")
        elif item.kind == "validate":
            job.validation.append(value)
            if job.outstanding == 0:
                if job.plan.recipe.benchmark.enabled:
                    self._fan_out(job, "benchmark")
                else:
                    self._report(job)
        elif item.kind == "benchmark":
            job.benchmarks.append(value)
            if job.outstanding == 0:
                self._report(job)
        else:
            job.result = value
            job.status = {0: "passed", 1: "failed"}.get(value.exit_code, "invalid")
            job.reason = _result_reason(value)

    def _fan_out(self, job: Job, kind: Literal["validate", "benchmark"]) -> None:
        assert job.plan is not None
        groups = self.executor.target_groups(job.plan.targets)
        job.outstanding = len(groups)
        for group in groups:
            self._queue(WorkItem(kind, job.entry.name, group), self._payload(job, kind))

    def _report(self, job: Job) -> None:
        job.outstanding = 1
        self._queue(WorkItem("report", job.entry.name, None), self._payload(job, "report"))

    def _payload(self, job: Job, kind: str) -> tuple[Any, ...]:
        plan = job.plan
        assert plan is not None
        if kind == "build":
            return (plan,)
        variants = list(job.outcome.evaluated) if job.outcome else []
        batches = plan.recipe.benchmark.batch_sizes
        validation = merge_rows(job.validation, variants, plan.targets, batches)
        if kind == "validate":
            return (plan, job.outcome)
        if kind == "benchmark":  # a pair validation ships at a pinned precision is timed at that precision
            return (plan, job.outcome, validation)
        benchmarks = merge_rows(job.benchmarks, variants, plan.targets, batches)
        return (plan, job.outcome, validation, benchmarks, time.time() - (job.started or time.time()))


def _result_reason(result: RunOutcome) -> str | None:
    """Why a finished recipe did not pass: its failures and missed gates, briefly."""
    report = as_report(result.report, f"{result.out_dir / 'report.json'}")
    reasons = [f"variant {failure.variant} failed at {failure.stage}: {failure.reason}" for failure in report.failures]
    reasons += [f"gate {gate.variant} on {gate.target}: {gate.metric} = {gate.value} "
                f"(min {gate.min}, max {gate.max}) {gate.reason or ''}".rstrip()
                for gate in report.gates if gate.passed is False]
    return "; ".join(reasons) or None


class LocalExecutor:
    """Worker processes on this machine; benchmarks alone under the machine lock."""

    def __init__(self, workers: int | None = None, lock_path: Path | None = None) -> None:
        self.workers = max(1, workers or cpu_info()["cores"])
        self.lock_path = lock_path or default_lock_path()
        self._pool: Any = None
        self._futures: dict[Any, WorkItem] = {}

    def describe(self) -> ExecutorDescription:
        import socket

        return {"kind": "local", "workers": self.workers, "lock": str(self.lock_path),
                "nodes": [{"node": socket.gethostname(), "cpus": self.workers}]}

    def target_groups(self, targets: list[str]) -> list[tuple[str, ...] | None]:
        return [None]  # one machine: every target of a recipe in one item

    def can_submit(self, item: WorkItem, running: list[WorkItem]) -> bool:
        # one process per worker; a benchmark takes the next free one and waits there for the others to drain
        if len(running) >= self.workers:
            return False
        return item.kind != "benchmark" or not any(other.kind == "benchmark" for other in running)

    def submit(self, item: WorkItem, payload: tuple[Any, ...]) -> None:
        future = self._ensure_pool().submit(execute, item, payload, self.lock_path)
        self._futures[future] = item

    def wait(self) -> list[tuple[WorkItem, WorkReply | BaseException]]:
        from concurrent.futures import FIRST_COMPLETED
        from concurrent.futures import wait as wait_futures
        from concurrent.futures.process import BrokenProcessPool

        done, _ = wait_futures(list(self._futures), return_when=FIRST_COMPLETED)
        replies: list[tuple[WorkItem, WorkReply | BaseException]] = []
        broken = False
        for future in done:
            item = self._futures.pop(future)
            try:
                replies.append((item, future.result()))
            except BrokenProcessPool as exc:
                broken = True
                replies.append((item, exc))
        if broken:  # every item of a broken pool is lost; a fresh pool takes the retries
            replies += [(item, BrokenProcessPool("a worker process died")) for item in self._futures.values()]
            self._futures.clear()
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        return replies

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _ensure_pool(self) -> Any:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        if self._pool is None:
            # workers fork from a clean server process that imported the heavy libraries once; forking this
            # process, which runs threads (rich's display), could deadlock, and spawning pays the imports per worker
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(list(WORKER_PRELOAD))
            self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=context,
                                             initializer=init_worker_logging,
                                             initargs=(logging.getLogger("qdeploy").getEffectiveLevel(),))
        return self._pool


def init_worker_logging(level: int) -> None:
    """Workers log like the CLI: plain lines on stderr at the driver's level."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("qdeploy",):
        logging.getLogger(name).setLevel(level)
