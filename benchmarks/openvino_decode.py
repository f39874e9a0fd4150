"""OpenVINO decode settings for a language model with a KV cache: which compile settings and which model form make
its per-token decode fast on this CPU.

    python -m benchmarks.openvino_decode ARTIFACT.onnx [ARTIFACT.onnx ...] [--prompt 128] [--tokens 16] [--ort]

For each artifact (an export with past/present pairs, such as a run's ``artifacts/int4.onnx``) and each setting:
INFERENCE_PRECISION_HINT f32 or the device default (bf16 on AMX/AVX512-BF16 CPUs), with OpenVINO's dynamic
quantization of activations (DYNAMIC_QUANTIZATION_GROUP_SIZE, its default 32) or without it (0), and the model as
qdeploy times it (stateless: the cache fed back as inputs) or made stateful (``apply_make_stateful_transformation``,
as optimum-intel does: the cache kept in the request's state).  Prints prefill ms and the median decode ms per
token over 3 generations of ``--tokens`` greedy steps after a ``--prompt``-token prefill of seeded random ids.
``--ort`` adds, per artifact, ONNX Runtime's plain loop (one session, defaults, ``session.run`` with the returned
presents fed back): the runtime's own figure that qdeploy's decode benchmark is checked against.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from qdeploy.stages.benchmark._cache_layout import CacheLayout, layout_of
from qdeploy.stages.benchmark._decode_steps import OpenVinoStepper, next_ids

SETTINGS = [("f32", 32, False), ("f32", 0, False), ("default", 32, False), ("f32", 32, True)]


def _stateful(model: Any, layout: CacheLayout) -> None:
    """The past inputs become the request's state; each state starts empty with the batch of input_ids."""
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    apply_make_stateful_transformation(model, {pair.past: pair.present for pair in layout.pairs})
    batch = ops.gather(ops.shape_of(model.input(layout.input_ids), output_type="i64"), ops.constant([0]),
                       ops.constant(0))
    for node in model.get_ops():
        if node.get_type_name() == "ReadValue":
            dims = [dim.min_length for dim in node.get_output_partial_shape(0)]
            shape = [batch if axis == 0 else ops.constant(np.array([dim], np.int64)) for axis, dim in enumerate(dims)]
            zero = ops.constant(0.0, dtype=node.get_output_element_type(0))
            node.set_arguments([ops.broadcast(zero, ops.concat(shape, axis=0))])
    model.validate_nodes_and_infer_types()


def _generation(path: Path, hint: str, dynamic: int, stateful: bool, prompt: int, tokens: int
                ) -> tuple[float, float]:
    import openvino as ov

    layout = layout_of(path)
    assert layout is not None, f"{path} has no KV cache"
    core = ov.Core()
    model = core.read_model(str(path))
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "DYNAMIC_QUANTIZATION_GROUP_SIZE": dynamic}
    if hint != "default":
        config["INFERENCE_PRECISION_HINT"] = hint
    if stateful:
        _stateful(model, layout)
    compiled = core.compile_model(model, "CPU", config)
    ids = np.random.default_rng(0).integers(0, layout.vocab or 1000, (1, prompt))
    prefills, steps = [], []
    for _ in range(4):  # the first generation warms up
        first, times = _stateful_run(compiled, layout, ids, tokens) if stateful else \
            _stateless_run(compiled, layout, ids, tokens)
        prefills.append(first)
        steps.append(times)
    return float(np.median(prefills[1:])) * 1e3, float(np.median(np.concatenate(steps[1:]))) * 1e3


def _stateless_run(compiled: Any, layout: CacheLayout, ids: np.ndarray, tokens: int) -> tuple[float, np.ndarray]:
    stepper = OpenVinoStepper(compiled, layout)
    stepper.bind_prefill({**layout.step_inputs(ids, 0), **{pair.past: pair.empty(1) for pair in layout.pairs}})
    start = time.perf_counter()
    stepper.call()
    first, times = time.perf_counter() - start, []
    for step in range(tokens):
        stepper.bind_step(layout.step_inputs(next_ids(stepper.logits()), ids.shape[1] + step))
        start = time.perf_counter()
        stepper.call()
        times.append(time.perf_counter() - start)
    return first, np.array(times)


def _stateful_run(compiled: Any, layout: CacheLayout, ids: np.ndarray, tokens: int) -> tuple[float, np.ndarray]:
    request = compiled.create_infer_request()
    request.reset_state()
    start = time.perf_counter()
    request.infer(layout.step_inputs(ids, 0))
    first, times = time.perf_counter() - start, []
    for step in range(tokens):
        token = next_ids(request.get_tensor(layout.logits).data)
        feeds = layout.step_inputs(token, ids.shape[1] + step)
        start = time.perf_counter()
        request.infer(feeds)
        times.append(time.perf_counter() - start)
    return first, np.array(times)


def _ort_plain(path: Path, prompt: int, tokens: int) -> tuple[float, float]:
    import onnxruntime as ort

    layout = layout_of(path)
    assert layout is not None, f"{path} has no KV cache"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    ids = np.random.default_rng(0).integers(0, layout.vocab or 1000, (1, prompt))
    prefills, steps = [], []
    for repeat in range(4):  # the first generation warms up
        feeds = {**layout.step_inputs(ids, 0), **{pair.past: pair.empty(1) for pair in layout.pairs}}
        start = time.perf_counter()
        out = dict(zip(names, session.run(None, feeds), strict=True))
        prefills.append(time.perf_counter() - start)
        for step in range(tokens):
            feeds = {**layout.step_inputs(next_ids(out[layout.logits]), prompt + step),
                     **{pair.past: out[pair.present] for pair in layout.pairs}}
            start = time.perf_counter()
            out = dict(zip(names, session.run(None, feeds), strict=True))
            if repeat:
                steps.append(time.perf_counter() - start)
    return float(np.median(prefills[1:])) * 1e3, float(np.median(steps)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--ort", action="store_true", help="also ONNX Runtime's plain loop per artifact")
    args = parser.parse_args()
    print("| artifact | precision | dynamic quantization | model | prefill ms | decode ms/token |")
    print("|---|---|---|---|---|---|")
    for path in args.artifacts:
        for hint, dynamic, stateful in SETTINGS:
            prefill, decode = _generation(path, hint, dynamic, stateful, args.prompt, args.tokens)
            print(f"| {path.stem} | {hint} | {dynamic or 'off'} | {'stateful' if stateful else 'stateless'} "
                  f"| {prefill:.1f} | {decode:.2f} |", flush=True)
        if args.ort:
            prefill, decode = _ort_plain(path, args.prompt, args.tokens)
            print(f"| {path.stem} | onnxruntime, plain loop | - | stateless | {prefill:.1f} | {decode:.2f} |",
                  flush=True)
    print(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
