"""The tf2onnx text CNN of ``tests/helpers/text_cnn.py`` with trained weights instead of seeded ones.

    python benchmarks/text_cnn_trained.py OUT [--steps 3000] [--seed 0]

Issue 40 measured a real Keras text CNN of this class (two [64, 21] float character-id inputs, Conv1D branches
merged by Max, a Sigmoid head) at cosine 0.937 on ort:cpu with plain int8 where NNCF's int8 gave 0.995, and
seeded weights do not reproduce the gap.  This script trains the same architecture in PyTorch on a synthetic
name-matching task (two strings, a typo'd copy or another name), writes the trained weights into the graph as
tf2onnx lays it out, and writes a recipe with ``int8`` (qdeploy's default ptq) and ``int8-nncf`` beside 24
calibration and 12 validation samples.  Then ``qdeploy run OUT/recipe.yaml --out OUT/run`` compares them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers.text_cnn import EMBED, FILTERS, KERNELS, LENGTH, VOCAB, text_cnn  # noqa: E402

RECIPE = """name: text-cnn-trained
model: {onnx: text_cnn.onnx}
data:
  calib: {reader: npy, path: chars/calib}
  val: {reader: npy, path: chars/val}
variants:
  int8: [{quantize: {mode: ptq, calibration: {data: calib, samples: 24}}}]
  int8-nncf: [{quantize: {mode: ptq, engine: nncf, calibration: {data: calib, samples: 24}}}]
targets: [ort:cpu, openvino:cpu]
validate: {data: val, samples: 12}
"""


def _names(rng: np.random.Generator, count: int) -> np.ndarray:
    """Strings of ids 1..VOCAB-1 drawn Zipf-like (a few letters common, most rare), 0-padded to LENGTH."""
    weights = 1.0 / np.arange(1, VOCAB) ** 1.1
    ids = rng.choice(np.arange(1, VOCAB), (count, LENGTH), p=weights / weights.sum())
    lengths = rng.integers(3, 16, count)
    ids[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    return ids


def _typo(rng: np.random.Generator, names: np.ndarray) -> np.ndarray:
    """Each name with one or two characters replaced (a near match)."""
    out = names.copy()
    for row in out:
        length = int((row > 0).sum())
        for position in rng.integers(0, length, rng.integers(1, 3)):
            row[position] = rng.integers(1, VOCAB)
    return out


def pairs(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a, b, label): half typo'd copies (label 1), half other names (label 0)."""
    a = _names(rng, count)
    same = rng.random(count) < 0.5
    b = np.where(same[:, None], _typo(rng, a), _names(rng, count))
    return a.astype(np.float32), b.astype(np.float32), same.astype(np.float32)


def train(steps: int, seed: int) -> dict[str, np.ndarray]:
    """The architecture in PyTorch, trained with Adam; its weights named as the ONNX graph names them."""
    import torch

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    embedding = torch.nn.Embedding(VOCAB, EMBED)
    convs = {f"{side}_k{k}": torch.nn.Conv1d(EMBED, FILTERS, k) for side in "ab" for k in KERNELS}
    dense1, dense2 = torch.nn.Linear(LENGTH * FILTERS, 32), torch.nn.Linear(32, 1)
    modules = torch.nn.ModuleList([embedding, *convs.values(), dense1, dense2])
    optimizer = torch.optim.Adam(modules.parameters(), 2e-3)

    def forward(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        branches = []
        for side, ids in (("a", a), ("b", b)):
            x = embedding(ids.long()).transpose(1, 2)  # [N, E, L]
            for k in KERNELS:
                padded = torch.nn.functional.pad(x, (k - 1, 0))  # causal: k-1 in front
                branches.append(torch.relu(convs[f"{side}_k{k}"](padded)).transpose(1, 2))
        merged = branches[0]
        for branch in branches[1:]:
            merged = torch.maximum(merged, branch)
        return dense2(torch.relu(dense1(merged.reshape(len(a), -1)))).squeeze(1)

    for step in range(steps):
        a, b, label = (torch.from_numpy(x) for x in pairs(rng, 128))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(forward(a, b), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 500 == 0 or step == steps - 1:
            with torch.no_grad():
                a, b, label = (torch.from_numpy(x) for x in pairs(np.random.default_rng(99), 1024))
                accuracy = ((forward(a, b) > 0).float() == label).float().mean().item()
            print(f"step {step}: loss {loss.item():.4f}, held-out accuracy {accuracy:.3f}")
    weights = {"emb": embedding.weight, "dense1_w": dense1.weight.T, "dense1_b": dense1.bias,
               "dense2_w": dense2.weight.T, "dense2_b": dense2.bias}
    for name, conv in convs.items():
        weights[f"{name}_w"] = conv.weight.unsqueeze(2)  # [F, E, k] -> [F, E, 1, k]
        weights[f"{name}_b"] = conv.bias
    return {name: value.detach().numpy().astype(np.float32) for name, value in weights.items()}


def trained_model(weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    model = text_cnn(64, logits=True)
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name in weights:
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(weights[tensor.name], tensor.name))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    onnx.save(trained_model(train(args.steps, args.seed)), str(args.out / "text_cnn.onnx"))
    rng = np.random.default_rng(args.seed + 1)
    for split, count in (("calib", 24), ("val", 12)):
        (args.out / "chars" / split).mkdir(parents=True, exist_ok=True)
        for index in range(count):
            a, b, _ = pairs(rng, 64)
            np.savez(args.out / "chars" / split / f"s{index:03d}.npz", a=a, b=b)
    (args.out / "recipe.yaml").write_text(RECIPE)
    print(f"qdeploy run {args.out / 'recipe.yaml'} --out {args.out / 'run'}")


if __name__ == "__main__":
    main()
