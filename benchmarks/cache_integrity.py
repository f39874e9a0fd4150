"""What the cache's integrity check and the published folder cost: seconds per entry size.

    python benchmarks/cache_integrity.py [--sizes-mb 10 100 500] [--repeat 3]

For each size, a model of one float32 initializer of that size is written to a fresh cache
(``ArtifactStore.put``: save, hash each file, sidecar, rename), then read back ``--repeat`` times
(``ArtifactStore.get``: the sha256 of every file checked against the sidecar, the check every cache read
makes), then published (copied into a new generation of an output folder, each copy hashed, and switched
in with one rename).  ``sha256sum`` on the same file is timed as the floor that any honest check pays.
Medians are printed; the page cache is warm (the file was just written), which is the common case of a
re-run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qdeploy.pipeline.publish.published import begin_generation, commit_generation, publish_artifact
from qdeploy.pipeline.publish.store import ArtifactStore


def _model(size_mb: int) -> object:
    weight = numpy_helper.from_array(np.ones(size_mb * 1024 * 1024 // 4, dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [weight.dims[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [weight.dims[0]])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _timed(action: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(size_mb: int, repeat: int, folder: Path) -> dict[str, float]:
    store = ArtifactStore(folder / "cache")
    model = _model(size_mb)
    start = time.perf_counter()
    artifact = store.put("ab" * 32, model, {"stage": "export", "stages": ["export"]})  # type: ignore[arg-type]
    put = time.perf_counter() - start
    del model
    get = _timed(lambda: store.get("ab" * 32), repeat)
    sha256sum = _timed(lambda: subprocess.run(["sha256sum", str(artifact.path)], check=True,
                                              capture_output=True), repeat)

    def publish() -> None:
        generation = begin_generation(folder / "out")
        publish_artifact(artifact, generation, "v", {})
        commit_generation(folder / "out", generation)

    return {"put": put, "get": get, "sha256sum": sha256sum, "publish": _timed(publish, repeat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| entry MB | put s | get (verify) s | sha256sum s | publish s |")
    print("|---|---|---|---|---|")
    for size in args.sizes_mb:
        folder = Path(tempfile.mkdtemp(prefix="qdeploy-bench-"))
        try:
            row = measure(size, args.repeat, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"| {size} | {row['put']:.2f} | {row['get']:.3f} | {row['sha256sum']:.3f} | {row['publish']:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
