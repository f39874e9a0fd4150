"""A small Llama-style decoder built with ``transformers`` from a config (seeded random weights, no hub), exported
to ONNX with past key/value inputs and outputs the way exporters (optimum, onnxruntime-genai's builder) write them.

    python -m tests.helpers.decoder OUT.onnx [--layers 6] [--hidden 512] [--vocab 32000] [--seed 0] [--data DIR]

Interface (names and symbolic axes as optimum writes them):
  inputs   input_ids [batch, sequence_length] int64, attention_mask [batch, past_sequence_length +
           sequence_length] int64, position_ids [batch, sequence_length] int64,
           past_key_values.{i}.key / .value [batch, kv_heads, past_sequence_length, head_dim] float32
  outputs  logits [batch, sequence_length, vocab] float32, present.{i}.key / .value
           [batch, kv_heads, past_sequence_length + sequence_length, head_dim] float32

Exported by the package's export core (``qdeploy.stages.export._causal_lm``: TorchScript exporter, opset 17,
dynamic axes, a wrapper that turns the flat past tensors into a transformers DynamicCache).  Weights are seeded
normal(0, 0.02) like transformers' init, then the RMSNorm weights are jittered so no layer is an exact identity.
``write_prompts`` writes prompt samples (token ids inside the vocabulary, an empty cache) for a recipe's npz
dataset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from qdeploy.stages.export._causal_lm import export_kv, kv_io_names, kv_wrapper

__all__ = ["build_config", "build_model", "export", "feeds", "io_names", "write_prompts"]


def build_config(layers: int = 6, hidden: int = 512, vocab: int = 32000, heads: int = 8, kv_heads: int = 4) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=-(-hidden * 8 // 3 // 128) * 128,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=2048, tie_word_embeddings=False, attn_implementation="eager")


def build_model(config: Any, seed: int = 0) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _wrapper(model: Any, layers: int) -> Any:
    return kv_wrapper(model, layers)


def io_names(layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) as optimum writes them."""
    return kv_io_names(layers)


def feeds(config: Any, *, batch: int = 1, prompt: int = 32, past: int = 0, seed: int = 0,
          past_values: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Inputs of one call: ``prompt`` new tokens after ``past`` cached ones; token ids inside the vocabulary."""
    rng = np.random.default_rng(seed)
    head_dim = config.hidden_size // config.num_attention_heads
    result: dict[str, np.ndarray] = {
        "input_ids": rng.integers(0, config.vocab_size, (batch, prompt), dtype=np.int64),
        "attention_mask": np.ones((batch, past + prompt), np.int64),
        "position_ids": np.tile(np.arange(past, past + prompt, dtype=np.int64), (batch, 1)),
    }
    for index in range(config.num_hidden_layers):
        for kind in ("key", "value"):
            name = f"past_key_values.{index}.{kind}"
            if past_values is not None:
                result[name] = past_values[f"present.{index}.{kind}"]
            else:
                result[name] = np.zeros((batch, config.num_key_value_heads, past, head_dim), np.float32)
    return result


def export(out: Path, *, layers: int = 6, hidden: int = 512, vocab: int = 32000, seed: int = 0) -> tuple[Path, Any]:
    """Export the decoder; returns the path and its config.  Checks ORT's logits against PyTorch's."""
    config = build_config(layers, hidden, vocab)
    model = build_model(config, seed)
    export_kv(model, out)
    inputs, _ = io_names(layers)
    example = feeds(config, batch=1, prompt=4, past=3, seed=seed)
    example = {k: (v if k.startswith("input") or k.endswith(("mask", "ids")) else
                   np.random.default_rng(1).standard_normal(v.shape).astype(np.float32)) for k, v in example.items()}
    _check_against_torch(out, kv_wrapper(model, layers), inputs, example)
    return out, config


def _check_against_torch(path: Path, wrapper: Any, inputs: list[str], example: dict[str, np.ndarray]) -> None:
    import onnxruntime as ort
    import torch

    with torch.no_grad():
        expected = wrapper(*(torch.from_numpy(example[name]) for name in inputs))[0].numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], example)[0]
    error = float(np.abs(got - expected).max())
    if error > 1e-3:
        raise RuntimeError(f"exported decoder differs from PyTorch: max abs error {error}")


def write_prompts(folder: Path, config: Any, count: int, *, prompt: int = 16, seed: int = 0) -> Path:
    """``count`` prefill samples as .npz files (token ids inside the vocabulary, an empty past) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        np.savez(folder / f"{index:03d}.npz", **feeds(config, prompt=prompt, seed=seed * 1000 + index))
    return folder


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, help="also write 8 prompt samples (.npz) into this folder")
    args = parser.parse_args()
    path, config = export(args.out, layers=args.layers, hidden=args.hidden, vocab=args.vocab, seed=args.seed)
    if args.data is not None:
        write_prompts(args.data, config, 8, seed=args.seed + 1)
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
