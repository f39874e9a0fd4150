"""The ONNX backend node tests through qdeploy's simplify and fp16 stages, beside onnxsim and onnxconverter-common.

    python benchmarks/onnx_node_suite.py [--jobs 2] [--match REGEX | --subset] [--tools ...] [--json out.json]

Every case of ``onnx.backend.test.loader.load_model_tests(kind="node")`` whose
expected outputs ONNX Runtime reproduces (CPU provider, the case's own rtol/atol)
goes through each tool; what a tool hands back is then loaded in ONNX Runtime
and run on the case's inputs:

- ``qdeploy-simplify``: ``qdeploy.stages.simplify.run`` with its defaults, then the guard
  the runner applies before it stores an artifact (``qdeploy.pipeline.run.guard``); the
  recipe holds the case's inputs as its validation data when they are tensors.
  Correct: the case's expected outputs within the case's rtol/atol.
- ``onnxsim``: ``onnxsim.simplify(model)`` (its API defaults); a failed check of its
  own counts as refused.  Same verdict as above.
- ``qdeploy-fp16`` and ``onnxconverter-common`` (float cases only: every graph input
  and output a float32 tensor): ``qdeploy.stages.fp16.run`` with the case's inputs as its
  calibration data, and ``convert_float_to_float16(model, keep_io_types=True)``.
  Correct: every element within 1e-2 + 1e-2 * |expected| (float16 keeps about 3
  decimal digits), NaN/Inf where expected has them.

Outcomes: ``correct``; ``wrong`` (published, outputs differ); ``broken`` (published,
loads, fails on the case's inputs); ``unloadable`` (published, ONNX Runtime refuses
it); ``refused`` (a named error: qdeploy's StageError, onnxsim's failed check or
an exception of a peer); ``crash`` (qdeploy raised something other than a
StageError: a bug); ``died``/``timeout`` (the worker process was killed or hung).
"wrong", "broken" and "unloadable" are artifacts a user would have received.

Cases run in worker processes (``--jobs``), each under an address-space limit
(``--memory-gb``) so that a runaway allocation fails instead of taking the
machine; a worker that dies is restarted after the case it died on.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

log = logging.getLogger("benchmarks.onnx_node_suite")

SIMPLIFY_TOOLS = ("qdeploy-simplify", "onnxsim")
FP16_TOOLS = ("qdeploy-fp16", "onnxconverter-common")
TOOLS = (*SIMPLIFY_TOOLS, *FP16_TOOLS)
OUTCOMES = ("correct", "wrong", "broken", "unloadable", "refused", "crash", "died", "timeout")
PUBLISHED_BAD = ("wrong", "broken", "unloadable")
FP16_RTOL = FP16_ATOL = 1e-2
CASE_TIMEOUT_S = 180.0


# ---------------------------------------------------------------- preparation (parent process)

SUBSET_PATTERN = re.compile(r"(_if|loop|scan|sequence|optional|affine_grid|test_size|tile|pad|range|identity"
                            r"|split_to|concat_from)")
"""The subset (``--subset``, the slow test): control flow, sequences/optionals, the size-taking ops, and every
``SUBSET_EVERY``-th other case in name order."""
SUBSET_EVERY = 10


def in_subset(name: str, index: int) -> bool:
    return bool(SUBSET_PATTERN.search(name)) or index % SUBSET_EVERY == 0


def prepare(folder: Path, match: str | None, limit: int | None, *, subset: bool = False) -> list[str]:
    """Write every selected case (model, data, tolerances) to ``folder``/<name>.pkl; their names."""
    import warnings

    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    pattern = re.compile(match) if match else None
    names = []
    for index, case in enumerate(sorted(cases, key=lambda c: c.name)):
        if (pattern and not pattern.search(case.name)) or (subset and not in_subset(case.name, index)):
            continue
        model = case.model if case.model is not None else _model_from_dir(case.model_dir)
        data = case.data_sets if case.data_sets is not None else _data_from_dir(case.model_dir, model)
        payload = {"name": case.name, "model": model.SerializeToString(), "data": data,
                   "rtol": case.rtol, "atol": case.atol}
        (folder / f"{case.name}.pkl").write_bytes(pickle.dumps(payload))
        names.append(case.name)
        if limit and len(names) >= limit:
            break
    return names


def _model_from_dir(model_dir: str) -> Any:
    import onnx

    return onnx.load(os.path.join(model_dir, "model.onnx"))


def _data_from_dir(model_dir: str, model: Any) -> list[tuple[list[Any], list[Any]]]:
    import glob

    from onnx import numpy_helper
    from onnx.onnx_pb import TensorProto

    sets = []
    for folder in sorted(glob.glob(os.path.join(model_dir, "test_data_set_*"))):
        arrays = []
        for kind in ("input", "output"):
            values = []
            for file in sorted(glob.glob(os.path.join(folder, f"{kind}_*.pb"))):
                tensor = TensorProto()
                tensor.ParseFromString(Path(file).read_bytes())
                values.append(numpy_helper.to_array(tensor))
            arrays.append(values)
        sets.append((arrays[0], arrays[1]))
    return sets


# ---------------------------------------------------------------- the workers

def run_workers(folder: Path, names: list[str], tools: list[str], jobs: int, memory_gb: float,
                timeout_s: float) -> list[dict[str, Any]]:
    """Every (case, tool) result, from ``jobs`` worker processes; a dead or hung worker restarts after its case.

    A worker writes a 'started' line before each tool and a result after it; when it dies or hangs, the tool it
    had started gets a 'died'/'timeout' result in its file and a new worker goes on from there.
    """
    chunks = {index: names[index::jobs] for index in range(jobs) if names[index::jobs]}
    outs = {index: folder / f"results-{index}.jsonl" for index in chunks}
    running: dict[int, subprocess.Popen[bytes]] = {}
    progress: dict[int, tuple[int, float]] = {}
    while chunks:
        for index in list(chunks):
            if index not in running:
                running[index] = _start(folder, index, chunks[index], outs[index], tools, memory_gb)
                progress[index] = (len(_read_lines(outs[index])), time.monotonic())
        time.sleep(0.5)
        for index, process in list(running.items()):
            lines = _read_lines(outs[index])
            if len(lines) > progress[index][0]:
                progress[index] = (len(lines), time.monotonic())
            hung = time.monotonic() - progress[index][1] > timeout_s
            if process.poll() is None and not hung:
                continue
            if hung:
                process.kill()
            process.wait()
            del running[index]
            if process.returncode == 0 and not hung:
                del chunks[index]
                continue
            culprit = _last_started(lines)
            if culprit is None:  # died before any case: do not loop forever
                raise RuntimeError(f"worker {index} exited with {process.returncode} before running a case")
            why = "timeout" if hung else "died"
            with outs[index].open("a") as sink:
                sink.write(json.dumps({**culprit, "outcome": why, "detail": f"worker {'hung' if hung else ''}"
                                       f"{'' if hung else f'exited with {process.returncode}'} on this case"}) + "\n")
    return [line for out in outs.values() for line in _read_lines(out) if line["outcome"] != "started"]


def _start(folder: Path, index: int, names: list[str], out: Path, tools: list[str],
           memory_gb: float) -> subprocess.Popen[bytes]:
    names_file = out.with_suffix(".names")
    names_file.write_text("\n".join(names))
    command = [sys.executable, __file__, "--worker", str(folder), "--names-file", str(names_file),
               "--out", str(out), "--tools", *tools, "--memory-gb", str(memory_gb)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    text = path.read_text()
    lines = text.splitlines()
    complete = lines if text.endswith("\n") else lines[:-1]
    return [json.loads(line) for line in complete]


def _last_started(lines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The (case, tool) a worker had started and not finished, if any."""
    finished = {(line["case"], line["tool"]) for line in lines if line["outcome"] != "started"}
    started = [line for line in lines if line["outcome"] == "started" and (line["case"], line["tool"]) not in finished]
    return {"case": started[-1]["case"], "tool": started[-1]["tool"]} if started else None


def worker(folder: Path, names: list[str], out: Path, tools: list[str], memory_gb: float) -> None:
    """Run ``tools`` on each case; one JSON line per (case, tool), flushed at once; skip what is already there."""
    import resource

    limit = int(memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    logging.disable(logging.CRITICAL)
    done = {(line["case"], line["tool"]): line["outcome"] for line in _read_lines(out) if line["outcome"] != "started"}
    with out.open("a") as sink:
        for name in filter(None, names):
            case = pickle.loads((folder / f"{name}.pkl").read_bytes())
            for line in _run_case(case, tools, folder / "work" / name, done):
                sink.write(json.dumps(line, default=str) + "\n")
                sink.flush()


def _run_case(case: dict[str, Any], tools: list[str], work: Path, done: dict[tuple[str, str], str]) -> Any:
    from benchmarks.onnx_node_suite_tools import baseline, is_float_case, run_tool

    name = case["name"]
    if (name, "baseline") not in done:
        problem = baseline(case)
        yield {"case": name, "tool": "baseline", "outcome": "ok" if not problem else "excluded", "detail": problem,
               "float": is_float_case(case)}
        if problem:
            return
    elif done[(name, "baseline")] != "ok":
        return
    for tool in tools:
        if (name, tool) in done or (tool in FP16_TOOLS and not is_float_case(case)):
            continue
        yield {"case": name, "tool": tool, "outcome": "started"}
        started = time.perf_counter()
        outcome, detail = run_tool(tool, case, work / tool)
        yield {"case": name, "tool": tool, "outcome": outcome, "detail": detail,
               "seconds": round(time.perf_counter() - started, 3)}


# ---------------------------------------------------------------- the table

def summarize(results: list[dict[str, Any]], tools: list[str]) -> tuple[str, dict[str, Counter[str]]]:
    """The table of outcome counts per tool, and the counts."""
    baseline = [line for line in results if line["tool"] == "baseline"]
    kept = {line["case"] for line in baseline if line["outcome"] == "ok"}
    floats = {line["case"] for line in baseline if line["outcome"] == "ok" and line.get("float")}
    counts = {tool: Counter(line["outcome"] for line in results if line["tool"] == tool and line["case"] in kept)
              for tool in tools}
    header = f"{'tool':<22}{'cases':>7}" + "".join(f"{outcome:>12}" for outcome in OUTCOMES)
    rows = [f"node cases: {len(baseline)}; ONNX Runtime reproduces {len(kept)} ({len(floats)} float cases)",
            header]
    for tool in tools:
        total = sum(counts[tool].values())
        rows.append(f"{tool:<22}{total:>7}" + "".join(f"{counts[tool][outcome]:>12}" for outcome in OUTCOMES))
    return "\n".join(rows), counts


def details(results: list[dict[str, Any]], tools: list[str]) -> str:
    """Every case that is not correct, per tool: the outcome and its reason (first 160 characters)."""
    rows = []
    for tool in tools:
        for line in sorted((r for r in results if r["tool"] == tool and r["outcome"] != "correct"),
                           key=lambda r: (r["outcome"], r["case"])):
            rows.append(f"{tool:<22} {line['outcome']:<11} {line['case']:<50} {str(line['detail'])[:160]}")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--match", help="regular expression on the case names (default: all)")
    parser.add_argument("--limit", type=int, help="first N matching cases only")
    parser.add_argument("--subset", action="store_true", help="the slow test's deterministic subset (see in_subset)")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--memory-gb", type=float, default=6.0, help="address-space limit of each worker")
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds one tool may take on a case")
    parser.add_argument("--json", type=Path, help="write every (case, tool) result here")
    parser.add_argument("--details", action="store_true", help="list every case that is not correct")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--names-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.names_file.read_text().split("\n"), args.out, args.tools, args.memory_gb)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qdeploy-node-suite-") as tmp:
        names = prepare(Path(tmp), args.match, args.limit, subset=args.subset)
        log.info("%d cases; running %s with %d worker(s)", len(names), ", ".join(args.tools), args.jobs)
        results = run_workers(Path(tmp), names, args.tools, args.jobs, args.memory_gb, args.timeout)
    table, _ = summarize(results, args.tools)
    print(table)
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.details:
        print(details(results, args.tools))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
