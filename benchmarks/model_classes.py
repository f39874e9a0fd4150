"""Classes of model other tools write, each built here, through the whole recipe as a user runs it.

    python benchmarks/model_classes.py [--cases bert-ort-fused-fp16 ...] [--work DIR]

Nothing is downloaded: each model is built from code (tiny random transformers BERT, small hand-made graphs, a
GRU tagger exported by the recipe), then ``qdeploy run`` runs fp32, fp16 and int8 (ptq, dynamic, engine nncf where
NNCF is installed) on ort:cpu and openvino:cpu.  One row per case: the exit status and each variant's validation
status per target, or the variant's build failure.  What it found on 2026-12-05:
docs/measurements/2026-12-05-model-classes.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import onnx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

RECIPE = """\
name: {name}
model: {model}
variants:
  fp32: [simplify]
  fp16: [simplify, fp16]
  int8: [simplify, {{quantize: {{mode: ptq}}}}]
  int8-dyn: [simplify, {{quantize: {{mode: dynamic}}}}]
  int8-nncf: [simplify, {{quantize: {{engine: nncf}}}}]
targets: [ort:cpu, openvino:cpu]
validate: {{samples: 4{validate}}}
benchmark: {{iterations: 10, warmup: 2}}
report: {{formats: [json, md], layers: "off"}}
"""

BERT_INPUTS = ("{onnx: model.onnx, inputs: [{name: input_ids, shape: [1, 32], dtype: int64, low: 0, high: 500}, "
               "{name: attention_mask, shape: [1, 32], dtype: int64, low: 1, high: 2}, "
               "{name: token_type_ids, shape: [1, 32], dtype: int64, low: 0, high: 1}]}")


def _bert(folder: Path, half: bool) -> str:
    """A two-layer random BERT fused by ONNX Runtime's transformer optimizer, float16 inside when ``half``."""
    from tests.helpers.bert import ort_fused_bert

    ort_fused_bert(folder / "model.onnx", layers=2, hidden=128, heads=4, tokens=32, vocab=500, positions=64,
                   half=half)
    return BERT_INPUTS


def _ort_extended(folder: Path) -> str:
    """A small CNN that ONNX Runtime optimized and saved at ORT_ENABLE_EXTENDED (FusedConv)."""
    import onnxruntime as ort

    from tests.helpers.quantize import tiny_conv

    onnx.save(tiny_conv(), folder / "plain.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(folder / "model.onnx")
    ort.InferenceSession(str(folder / "plain.onnx"), options, providers=["CPUExecutionProvider"])
    return "{onnx: model.onnx}"


def _saved(build: Callable[[], onnx.ModelProto]) -> Callable[[Path], str]:
    def write(folder: Path) -> str:
        onnx.save(build(), folder / "model.onnx")
        return "{onnx: model.onnx}"

    return write


def _gru_tagger(folder: Path) -> str:
    from tests.stages.export.test_export_exporter import TAGGER

    (folder / "tagger.py").write_text(TAGGER)
    return "{torch: {factory: tagger.py:build}, inputs: [{name: ids, shape: [1, seq], dtype: int64, low: 0, high: 50}]}"


def _cases() -> dict[str, tuple[Callable[[Path], str], str]]:
    """Case -> (what writes its model and returns the recipe's model section, extra validate settings)."""
    from tests.stages.export.test_export import _with_sparse_weights
    from tests.stages.quantize.ptq.test_passthrough_outputs import passthrough_model
    from tests.stages.validate.test_selection_divergence import nms_model

    return {
        "bert-ort-fused": (lambda folder: _bert(folder, half=False), ""),
        "bert-ort-fused-fp16": (lambda folder: _bert(folder, half=True), ""),
        "cnn-ort-extended": (_ort_extended, ""),
        "sparse-weights": (_saved(_with_sparse_weights), ""),
        "input-passed-out": (_saved(passthrough_model), ""),
        "in-graph-nms": (_saved(nms_model), ", outputs: {selected: {mismatch_max: 0.5}}"),
        "gru-tagger": (_gru_tagger, ""),
    }


def run_case(name: str, write: Callable[[Path], str], validate: str, work: Path) -> str:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model = write(folder)
    (folder / "recipe.yaml").write_text(textwrap.dedent(RECIPE.format(name=name, model=model, validate=validate)))
    done = subprocess.run([sys.executable, "-m", "qdeploy.cli", "run", "recipe.yaml", "-o", "out", "-q"],
                          cwd=folder, capture_output=True, text=True, timeout=1800)
    report = folder / "out" / "report.json"
    if not report.exists():
        return f"| {name} | {done.returncode} | {done.stderr.strip()[-200:]} |"
    data = json.loads(report.read_text())
    cells = [f"{row['variant']}@{row['target'].split(':')[0]} {row['status']}" for row in data.get("validation", [])
             if row["target"] != "reference:cpu"]
    cells += [f"{failure['variant']}: {failure['reason'][:110]}" for failure in data.get("failures", [])]
    return f"| {name} | {done.returncode} | {'; '.join(cells)} |"


def main() -> None:
    cases = _cases()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=list(cases), choices=list(cases))
    parser.add_argument("--work", type=Path, default=None, help="keep each run's folder here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qdeploy-classes-") as tmp:
        work = args.work or Path(tmp)
        lines = ["| case | exit | validation rows; build failures |", "|---|---|---|"]
        for name in args.cases:
            lines.append(run_case(name, *cases[name], work))
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
