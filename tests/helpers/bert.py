"""A tiny random BERT exported by torch and fused by ONNX Runtime's transformer optimizer, as users bring one."""

from __future__ import annotations

from pathlib import Path

__all__ = ["INPUT_NAMES", "ort_fused_bert"]

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def ort_fused_bert(path: Path, *, layers: int, hidden: int, heads: int, tokens: int, vocab: int, positions: int,
                   half: bool = False) -> Path:
    """A seeded BertModel of this size exported by torch (TorchScript, static shapes [1, tokens]) and fused by
    onnxruntime.transformers' optimizer (Attention, EmbedLayerNormalization, SkipLayerNormalization, BiasGelu,
    Gemm); converted to float16 with float32 inputs and outputs when ``half``.  Written to ``path``."""
    import torch
    import transformers
    from onnxruntime.transformers import optimizer

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=2 * hidden,
                                     max_position_embeddings=positions, attn_implementation="eager")

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel(config).eval()

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state

    ones = torch.ones(1, tokens, dtype=torch.int64)
    plain = path.with_name(f"{path.stem}_plain.onnx")
    torch.onnx.export(Encoder(), (ones, ones, torch.zeros_like(ones)), str(plain), opset_version=17, dynamo=False,
                      input_names=list(INPUT_NAMES), output_names=["hidden"])
    fused = optimizer.optimize_model(str(plain), model_type="bert", num_heads=heads, hidden_size=hidden)
    if half:
        fused.convert_float_to_float16(keep_io_types=True)
    fused.save_model_to_file(str(path))
    return path
