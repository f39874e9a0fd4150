"""A tiny seeded Llama with tied embeddings, saved as ``save_pretrained`` writes it, with a word-level tokenizer
of its own: a ``model.causal_lm`` checkpoint built in a test's folder (never downloaded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "it", "runs", "back", "home",
         "to", "sleep", "a", "cat", "sees", "bird", ".", ",", "hello", "world")
VOCAB = 8192
HIDDEN = 64
"""8192 x 64 float32: a 2 MiB table, above simplify's shared-fold size (1 MiB)."""


def tiny_llama(folder: Path, *, layers: int = 2, tied: bool = True, tokenizer: bool = True, seed: int = 0) -> Path:
    """Write the checkpoint (config.json, model.safetensors, tokenizer files) into ``folder``; returns it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=tied)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms jittered: no layer is an exact identity
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    if tokenizer:
        word_tokenizer().save_pretrained(folder)
    return folder


def word_tokenizer() -> Any:
    """A word-level tokenizer over ``WORDS`` (lower-cased, split on whitespace and punctuation)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, **{word: index + 2 for index, word in enumerate(dict.fromkeys(WORDS))}}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>")
