"""Peak resident memory of each stage, and of a whole run, on models of 0.5 to 4 GB with external data.

    python benchmarks/large_models.py --sizes 0.5 1 2.2 4 [--stages export simplify fp16 ptq dynamic int4 validate run]
                                      [--work /tmp/qdeploy-large] [--cap-gb 16] [--keep] [--json out.json]

The sibling of ``benchmarks/scaling.py`` (time against node count) for size in bytes.  For each size (GB of
float32 weights, ``tests/helpers/large_models.py``: two d x d MatMuls with a Relu between)
the harness writes a recipe beside the model and runs each stage the way ``qdeploy run`` does
(``qdeploy.pipeline.run.runner``: cache key, the stage, the guard, ``ArtifactStore.put``), each in its own child
process:

- ``export``: the export stage on the ONNX file (external data beside it);
- ``simplify``, ``fp16``, ``ptq``, ``dynamic``, ``int4`` (weight-only, group 128): one variant each, straight
  from the exported model (so a failing simplify does not hide what fp16 or quantize do);
- ``validate:<variant>``: the validate stage on the exported model and that variant, on ort:cpu and openvino:cpu;
- ``run``: a whole ``qdeploy run`` (issue 33) of variants fp32 (simplify), fp16, int8 (dynamic) and int4
  (weight-only) on ort:cpu and openvino:cpu, validated and benchmarked (batch 1, 10 iterations), from an empty
  cache (fp16's reference:cpu check left out: numpy float16 takes minutes at these sizes and holds 1x the
  model); its row names the phase (progress step) where the peak was reached, and each phase's peak goes to the
  JSON.  The child resets no high-water mark of its own but the benchmark's ``MemoryProbe`` does
  (``/proc/self/clear_refs``), so the run's peak comes from the polls (the parent's and the child's, 20 ms).
  ``child_run`` (a recipe's whole run in this process) also charges each rise of ``VmHWM`` to the step in hand:
  a spike shorter than 20 ms still has a step, up to the benchmark's first reset.  Its samples add the private
  memory of the run's own child processes (a large causal LM exports in one) to its own resident memory: pages a
  child shares with the run (a forked copy's) are counted once.

Each child's peak resident memory comes from ``os.wait4`` (``ru_maxrss``: the kernel's high-water mark of the
child, file-backed pages of memory-mapped weights included) and from the child's own ``/proc/self/status``
(``VmHWM``, and the anonymous part sampled by a watchdog thread).  The parent also polls the child's ``VmRSS``
and kills it above ``--cap-gb`` (the machine is shared: a stage that would take the whole machine is stopped and
reported as "killed at the cap", never left to the kernel's OOM killer).  A stage whose parent failed is
"skipped".  The table gives, per stage: status, seconds, peak RSS in GB and as a multiple of the model's size,
the peak of anonymous memory, and the first words of the error.  The goal (issue 19) is a peak under 2.5x the
model's size at every stage, and (issue 33) a whole run's under 2.5x plus 0.6 GB (3.2x with a dynamic int8
variant on OpenVINO); ``pipeline/run/memory_plan.py`` holds the factors a run checks before it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS: dict[str, list[Any]] = {
    "simplify": ["simplify"],
    "fp16": ["fp16"],
    "ptq": [{"quantize": {"mode": "ptq", "calibration": {"data": "calib", "samples": 4}}}],
    "dynamic": [{"quantize": {"mode": "dynamic"}}],
    "int4": [{"quantize": {"mode": "weight_only", "bits": 4, "group_size": 128}}],
}
ALL_STAGES = ["export", "simplify", "fp16", "ptq", "dynamic", "int4", "validate", "run"]
RUN_VARIANTS: dict[str, list[Any]] = {
    "fp32": ["simplify"],
    "fp16": ["fp16"],
    "int8": [{"quantize": {"mode": "dynamic"}}],
    "int4": VARIANTS["int4"],
}
"""The whole run's variants: the issue's fp32, fp16, dynamic int8 and int4 weight-only."""
TARGETS = ["ort:cpu", "openvino:cpu"]




# ---------------------------------------------------------------- child side


def _status_kb(field: str) -> int:
    return _status_fields_kb(field)[field]


def _status_fields_kb(*fields: str) -> dict[str, int]:
    """Fields of /proc/self/status in kB (0 where absent), read in one pass."""
    found = dict.fromkeys(fields, 0)
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in found:
            found[name] = int(rest.split()[0])
    return found


class _AnonPeak:
    """Samples RssAnon every 50 ms: the part of the peak that is not memory-mapped files."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, _status_kb("RssAnon"))
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak_kb, _status_kb("RssAnon"))


def _state(recipe_path: Path, cache: Path, work: Path) -> Any:
    from qdeploy.pipeline.publish.store import ArtifactStore
    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run.progress import Progress
    from qdeploy.pipeline.run.runner import _RunState

    recipe = load_recipe_file(recipe_path)
    return _RunState(recipe, ArtifactStore(cache), True, Progress(0, enabled=False), work)


def _ctx(state: Any, variant: str) -> Any:
    from qdeploy.pipeline.run.runner import _context

    return _context(state, variant, variant)


def child(stage: str, recipe_path: Path, cache: Path, result_path: Path) -> None:
    """Run one stage as the runner does; write a JSON result (status, error, peaks, artifact size)."""
    import logging
    import tempfile

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    anon = _AnonPeak()
    result: dict[str, Any] = {"stage": stage}
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="qdeploy-harness-") as work:
            state = _state(recipe_path, cache, Path(work))
            from qdeploy.pipeline.run.runner import _build_export, _build_step

            baseline = _status_kb("VmRSS")
            exported = _build_export(state)
            artifact = exported
            if stage in VARIANTS:
                artifact = _build_step(state, stage, state.recipe.variants[stage][0], exported)
            elif stage.startswith("validate:"):
                result["rows"] = _validate(state, exported, stage.split(":", 1)[1])
            result.update(status="ok", size_bytes=artifact.size_bytes, baseline_kb=baseline,
                          external=[name for name, _, _ in artifact.external_data], cached=artifact.cached)
    except BaseException as exc:  # the table reports it
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:600],
                      trace=traceback.format_exc()[-3000:])
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["anon_peak_kb"] = anon.stop()
    result["vmhwm_kb"] = _status_kb("VmHWM")
    result_path.write_text(json.dumps(result, default=str))


def _validate(state: Any, exported: Any, variant: str) -> list[dict[str, Any]]:
    from qdeploy.pipeline.run.runner import _build_step, _evaluate

    artifact = _build_step(state, variant, state.recipe.variants[variant][0], exported)
    if not artifact.cached:
        raise RuntimeError(f"variant {variant} was not built by its own stage run first")
    rows = _evaluate(state, "validate", {"exported": exported, variant: artifact}, TARGETS)
    keep = ("variant", "target", "status", "reason", "metrics")
    plain = [row.to_json() for row in rows]  # typed ValidationRows
    return [{key: row.get(key) for key in keep if key in row} for row in plain]


def child_run(recipe_path: Path, out: Path, result_path: Path) -> None:
    """``qdeploy run`` in this process, its resident memory sampled every 20 ms and charged to the progress step
    in hand; writes the peak, the step where it was reached and each step's peak."""
    import logging

    from qdeploy.pipeline.recipe.loader import load_recipe_file
    from qdeploy.pipeline.run import progress as progress_module
    from qdeploy.pipeline.run.runner import RunOptions, run_recipe

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sampler = _StepPeaks()
    original_phase, original_detail = progress_module.Progress.phase, progress_module.Progress.detail

    def phase(self: Any, description: str) -> None:
        sampler.step = description
        original_phase(self, description)

    def detail(self: Any, message: str) -> None:
        sampler.step = f"{self._phase} › {message}"
        original_detail(self, message)

    progress_module.Progress.phase, progress_module.Progress.detail = phase, detail  # type: ignore[method-assign]
    result: dict[str, Any] = {"stage": "run"}
    started = time.perf_counter()
    try:
        outcome = run_recipe(load_recipe_file(recipe_path), RunOptions(out_dir=out, show_progress=False))
        report = outcome.report
        result.update(status="ok", exit_code=outcome.exit_code,
                      rows=[{key: row.get(key) for key in ("variant", "target", "status", "reason")}
                            for row in report["validation"]],
                      benchmarks=sum(1 for row in report.get("benchmarks", []) if row.get("status") == "ok"),
                      failures=report.get("failures", []))
    except BaseException as exc:  # the table reports it
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:600],
                      trace=traceback.format_exc()[-3000:])
    result["seconds"] = round(time.perf_counter() - started, 1)
    result.update(sampler.stop())
    result_path.write_text(json.dumps(result, default=str))


class _StepPeaks:
    """Resident memory sampled every 20 ms, the peak kept per progress step.

    A spike shorter than the interval escapes the samples, so the kernel's high-water mark (``VmHWM``) is read
    too: each time it rises, the rise is charged to the step in hand over that interval (both steps' names when
    the step changed within it), which places the true peak even when no sample saw it."""

    def __init__(self) -> None:
        self.step = "starting"
        self.peaks: dict[str, int] = {}
        self.split: dict[str, tuple[int, int]] = {}
        """Step -> (RssAnon, RssFile) at its largest sample: memory-mapped weights count in the file part."""
        self.hwm_rises: dict[str, int] = {}
        self.children_peak = 0
        """The largest sample of child processes' private memory (the export of a large causal LM), kB."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_hwm, last_step = 0, self.step
        while not self._stop.is_set():
            status, step = _status_fields_kb("VmRSS", "VmHWM", "RssAnon", "RssFile"), self.step
            # a child process's own memory is the run's too; its pages shared with this process are counted here
            children = sum(_private_kb(pid) for pid in _descendants(os.getpid()))
            rss, hwm = status["VmRSS"] + children, status["VmHWM"]
            self.children_peak = max(self.children_peak, children)
            if rss > self.peaks.get(step, 0):
                self.peaks[step] = rss
                self.split[step] = (status["RssAnon"], status["RssFile"] + children)
            if hwm > last_hwm:
                interval = step if step == last_step else f"{last_step} → {step}"
                self.hwm_rises[interval] = hwm
            last_hwm, last_step = hwm, step
            time.sleep(0.02)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        worst = max(self.peaks, key=lambda step: self.peaks[step])
        hwm_step = max(self.hwm_rises, key=lambda step: self.hwm_rises[step]) if self.hwm_rises else ""
        return {"sampled_peak_kb": self.peaks[worst], "peak_step": worst, "step_peaks_kb": self.peaks,
                "step_anon_file_kb": self.split, "children_private_peak_kb": self.children_peak,
                "hwm_kb": self.hwm_rises.get(hwm_step, 0), "hwm_step": hwm_step, "hwm_rises_kb": self.hwm_rises}


# ---------------------------------------------------------------- parent side


def run_child(stage: str, recipe: Path, cache: Path, cap_bytes: int, timeout: float) -> dict[str, Any]:
    result_path = recipe.parent / f"result-{stage.replace(':', '_')}.json"
    result_path.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, __file__, "--child", stage, "--recipe", str(recipe),
                                "--cache", str(cache), "--result", str(result_path)], env=env)
    polled_peak, killed = 0, ""
    started = time.monotonic()
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            break
        rss = _rss_of(process.pid)
        polled_peak = max(polled_peak, rss)
        if rss > cap_bytes and not killed:
            killed = f"killed at the cap: {rss / 1e9:.1f} GB resident after {time.monotonic() - started:.0f} s"
            os.kill(process.pid, signal.SIGKILL)
        elif time.monotonic() - started > timeout and not killed:
            killed = f"killed after the timeout of {timeout:.0f} s"
            os.kill(process.pid, signal.SIGKILL)
        time.sleep(0.05)
    result = json.loads(result_path.read_text()) if result_path.is_file() else {"stage": stage}
    result["maxrss_kb"] = usage.ru_maxrss
    result["polled_peak_kb"] = polled_peak // 1024
    if killed:
        result.update(status="killed", error=killed)
    elif "status" not in result:
        result.update(status="crashed", error=f"exit status {status}")
    result.setdefault("seconds", round(time.monotonic() - started, 1))
    return result


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (children of every thread, and theirs)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(child) for child in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


def _private_kb(pid: int) -> int:
    """A process's private resident memory (smaps_rollup's Private_Clean + Private_Dirty), kB: what it holds
    beyond the pages it shares with others (a forked copy of this process shares nearly all of them)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                      if line.startswith("Private_"))
    except (OSError, ValueError):
        return 0
    return sum(int(value.split()[0]) for value in fields.values())


def _rss_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _model_for(size_gb: float, work: Path) -> Path:
    from tests.helpers.large_models import dim_for, make_model, recipe_text

    folder = work / f"g{size_gb:g}"
    model = folder / "model.onnx"
    if not model.is_file():
        make_model(folder, dim=dim_for(size_gb, 2), layers=2)
    (folder / "recipe.yaml").write_text(recipe_text(model, VARIANTS, TARGETS))
    (folder / "recipe-run.yaml").write_text(recipe_text(model, RUN_VARIANTS, TARGETS, benchmark=True,
                                                        validate_extra=", fp16_reference: never").replace(
        "benchmark: {enabled: true}", "benchmark: {enabled: true, batch_sizes: [1], iterations: 10}"))
    return model


def _stage_list(stages: list[str]) -> list[str]:
    ordered = []
    for stage in stages:
        if stage == "validate":
            ordered += [f"validate:{name}" for name in VARIANTS if name in stages]
        else:
            ordered.append(stage)
    return ordered


def _free_disk_gb(path: Path) -> float:
    usage = shutil.disk_usage(path)
    return usage.free / 1e9


def measure(sizes: list[float], stages: list[str], work: Path, cap_bytes: int, timeout: float,
            keep: bool) -> list[dict[str, Any]]:
    rows = []
    work.mkdir(parents=True, exist_ok=True)
    for size in sizes:
        need = (7.5 if "run" in stages else 4.5) * size + 2  # a run: its cache and published copies
        if _free_disk_gb(work) < need:
            rows.append({"size_gb": size, "stage": "*", "status": "skipped",
                         "error": f"{_free_disk_gb(work):.0f} GB free on disk, about {need:.0f} GB needed"})
            continue
        model = _model_for(size, work)
        model_bytes = model.stat().st_size + (model.parent / "model.onnx.data").stat().st_size
        cache = model.parent / "cache"
        failed: set[str] = set()
        for stage in _stage_list(stages):
            parent = "export" if not stage.startswith("validate:") else stage.split(":", 1)[1]
            if stage != "run" and (parent in failed or (stage != "export" and "export" in failed)):
                rows.append({"size_gb": size, "stage": stage, "status": "skipped", "error": f"{parent} failed",
                             "model_bytes": model_bytes})
                continue
            print(f"[{size:g} GB] {stage} ...", file=sys.stderr, flush=True)
            if stage == "run":  # a whole run from an empty cache of its own, into its own folder
                shutil.rmtree(model.parent / "run", ignore_errors=True)
                result = run_child(stage, model.parent / "recipe-run.yaml", model.parent / "run", cap_bytes, timeout)
                shutil.rmtree(model.parent / "run", ignore_errors=True)
            else:
                result = run_child(stage, model.parent / "recipe.yaml", cache, cap_bytes, timeout)
            result.update(size_gb=size, model_bytes=model_bytes)
            if result["status"] != "ok":
                failed.add(stage)
            rows.append(result)
            print(format_row(result), file=sys.stderr, flush=True)
        if not keep:
            shutil.rmtree(model.parent, ignore_errors=True)
    return rows


HEADER = (f"| {'model':>6} | {'stage':<22} | {'status':<8} | {'s':>6} | {'peak RSS GB':>11} | {'x model':>7} | "
          f"{'anon GB':>7} | note")


def format_row(row: dict[str, Any]) -> str:
    peak = max(row.get("maxrss_kb", 0), row.get("vmhwm_kb", 0), row.get("polled_peak_kb", 0),
               row.get("sampled_peak_kb", 0)) * 1024
    size = row.get("model_bytes") or 1
    note = row.get("error", "")
    if row.get("stage") == "run" and row.get("status") == "ok":
        statuses = sorted({f"{r.get('status')}" for r in row.get("rows", [])})
        note = (f"peak in '{row.get('peak_step')}'; exit {row.get('exit_code')}; validation "
                f"{'/'.join(statuses)} ({len(row.get('rows', []))} rows); {row.get('benchmarks')} benchmark rows ok"
                + (f"; failures {[f.get('variant') for f in row.get('failures', [])]}" if row.get("failures") else ""))
    elif row.get("status") == "ok" and row.get("rows"):
        note = "; ".join(f"{r.get('variant')}@{r.get('target')}: {r.get('status')}"
                         + (f" cos {r['cosine']:.5f}" if isinstance(r.get("cosine"), float) else "")
                         + (f" ({str(r.get('reason'))[:60]})" if r.get("status") not in ("passed", "pass")
                            and r.get("reason") else "")
                         for r in row["rows"])
    elif row.get("status") == "ok":
        note = f"artifact {row.get('size_bytes', 0) / 1e9:.2f} GB" + (
            f", external data {row['external']}" if row.get("external") else ", no external data")
    return (f"| {row.get('size_gb', 0):>4g}GB | {row['stage']:<22} | {row['status']:<8} | "
            f"{row.get('seconds', 0):>6} | {peak / 1e9:>11.2f} | {peak / size:>7.2f} | "
            f"{row.get('anon_peak_kb', 0) * 1024 / 1e9:>7.2f} | {' '.join(str(note).split())[:160]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.5, 1, 2.2, 4])
    parser.add_argument("--stages", nargs="+", default=["export", "simplify", "fp16", "ptq", "dynamic", "int4",
                                                          "validate", "run"],
                        choices=ALL_STAGES)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "qdeploy-large-models")
    parser.add_argument("--cap-gb", type=float, default=None, help="kill a stage above this RSS "
                        "(default: 80%% of the memory available at the start, at most 18 GB)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--keep", action="store_true", help="keep models and caches")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--recipe", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "run":
        child_run(args.recipe, args.cache, args.result)
        return
    if args.child:
        child(args.child, args.recipe, args.cache, args.result)
        return
    available = _available_bytes()
    cap = int(args.cap_gb * 1e9) if args.cap_gb else int(min(0.8 * available, 18e9))
    print(f"memory available {available / 1e9:.1f} GB; a stage is killed above {cap / 1e9:.1f} GB", file=sys.stderr)
    rows = measure(args.sizes, args.stages, args.work, cap, args.timeout, args.keep)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (machine shared)")
    print(HEADER)
    print("|" + "|".join("-" * (len(part)) for part in HEADER.split("|")[1:-1]) + "|---|")
    for row in rows:
        print(format_row(row))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


if __name__ == "__main__":
    main()
