"""Tiny, freshly initialised transformers models of many architectures through the whole recipe.

    python benchmarks/transformers_models.py [--models vit wav2vec2 ...] [--work DIR]

No weights are downloaded: each model is built from a small config (``FACTORIES``) with random weights, exported by
the recipe's ``model.torch`` (exporter auto), and run as a user would: ``qdeploy run`` with fp32, fp16 and int8
(ptq, random calibration data) on ort:cpu and openvino:cpu.  One row per model: the exit status, which exporter
wrote it, each variant's status per target, and the warnings qdeploy logged.  Random weights make some outputs
degenerate (a head that starts at zero, activations below float16's range): the rows say so, they are not accuracy
figures.  What it found on 2026-12-05: docs/measurements/2026-12-05-transformers-architectures.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

FACTORIES = '''
import torch
import transformers as T


class Out(torch.nn.Module):
    def __init__(self, model, key, field):
        super().__init__()
        self.m, self.key, self.field = model.eval(), key, field

    def forward(self, x):
        return getattr(self.m(**{self.key: x}), self.field)


def _seeded(build):
    torch.manual_seed(0)
    return build()


def vit():
    return Out(_seeded(lambda: T.ViTForImageClassification(T.ViTConfig(
        image_size=64, patch_size=8, hidden_size=96, num_hidden_layers=3, num_attention_heads=4,
        intermediate_size=192, num_labels=10))), "pixel_values", "logits")


def swin():
    return Out(_seeded(lambda: T.SwinForImageClassification(T.SwinConfig(
        image_size=64, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4,
        num_labels=10))), "pixel_values", "logits")


def convnext():
    return Out(_seeded(lambda: T.ConvNextForImageClassification(T.ConvNextConfig(
        hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], num_labels=10))), "pixel_values", "logits")


def efficientnet():
    return Out(_seeded(lambda: T.EfficientNetForImageClassification(T.EfficientNetConfig(
        image_size=64, num_labels=10))), "pixel_values", "logits")


def mobilevit():
    return Out(_seeded(lambda: T.MobileViTForImageClassification(T.MobileViTConfig(
        image_size=64, hidden_sizes=[48, 64, 80], neck_hidden_sizes=[8, 16, 24, 32, 48, 64, 96],
        num_labels=10))), "pixel_values", "logits")


def levit():
    return Out(_seeded(lambda: T.LevitForImageClassification(T.LevitConfig(
        image_size=64, hidden_sizes=[32, 48, 64], num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
        key_dim=[8, 8, 8], num_labels=10))), "pixel_values", "logits")


def wav2vec2():
    return Out(_seeded(lambda: T.Wav2Vec2ForCTC(T.Wav2Vec2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), vocab_size=32,
        num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4))), "input_values", "logits")


def deberta():
    return Out(_seeded(lambda: T.DebertaV2Model(T.DebertaV2Config(
        vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, relative_attention=True, pos_att_type=["p2c", "c2p"],
        position_buckets=16))), "input_ids", "last_hidden_state")


def albert():
    return Out(_seeded(lambda: T.AlbertModel(T.AlbertConfig(
        vocab_size=300, embedding_size=32, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=64))), "input_ids", "last_hidden_state")
'''
INPUTS = {"vit": ([1, 3, 64, 64], "float32"), "swin": ([1, 3, 64, 64], "float32"),
          "convnext": ([1, 3, 96, 96], "float32"), "efficientnet": ([1, 3, 64, 64], "float32"),
          "mobilevit": ([1, 3, 64, 64], "float32"), "levit": ([1, 3, 64, 64], "float32"),
          "wav2vec2": ([1, 4000], "float32"), "deberta": ([1, 16], "int64"), "albert": ([1, 16], "int64")}
RECIPE = """
name: {name}
model:
  torch: {{factory: ../factories.py:{name}}}
  inputs: [{{name: x, shape: {shape}, dtype: {dtype}}}]
variants:
  fp32: [simplify]
  fp16: [simplify, fp16]
  int8: [simplify, {{quantize: {{mode: ptq}}}}]
targets: [ort:cpu, openvino:cpu]
validate: {{reference: fp32}}
benchmark: {{iterations: 20, warmup: 3}}
"""


def run_model(name: str, work: Path) -> str:
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    shape, dtype = INPUTS[name]
    (folder / "recipe.yaml").write_text(textwrap.dedent(RECIPE.format(name=name, shape=shape, dtype=dtype)))
    done = subprocess.run([sys.executable, "-m", "qdeploy.cli", "run", "recipe.yaml", "-o", "out"], cwd=folder,
                          capture_output=True, text=True, timeout=1800)
    warnings = sorted({line.split(": ", 2)[-1][:90] for line in done.stderr.splitlines()
                       if line.startswith(("WARNING", "ERROR", "error"))})
    report = folder / "out" / "report.json"
    if not report.exists():
        return f"| {name} | {done.returncode} | | | {'; '.join(warnings)} |"
    data = json.loads(report.read_text())
    rows = ", ".join(f"{row['variant']}@{row['target'].split(':')[0]} {row['status']}"
                     for row in data.get("validation", []) if row["target"] != "reference:cpu")
    exporter = next((step["findings"]["exporter"] for artifact in data.get("artifacts", [])
                     for step in artifact.get("lineage", []) if step.get("findings", {}).get("exporter")), "")
    return f"| {name} | {done.returncode} | {exporter} | {rows} | {'; '.join(warnings)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(INPUTS), choices=list(INPUTS))
    parser.add_argument("--work", type=Path, default=None, help="keep each run's folder here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="qdeploy-transformers-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        (work / "factories.py").write_text(FACTORIES)
        lines = ["| model | exit | exporter | validation rows | warnings and errors |", "|---|---|---|---|---|"]
        for name in args.models:
            lines.append(run_model(name, work))
            print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
