"""Export core of a transformers causal language model with a KV cache: one graph, past key/values as inputs.

Prefill is a call with past length 0, decode a call of one token after a past.  Names and symbolic axes are the
ones optimum writes (``kv_io_names``, ``dynamic_axes``):

  inputs   input_ids [batch, sequence_length] int64, attention_mask [batch, total_sequence_length] int64,
           position_ids [batch, sequence_length] int64,
           past_key_values.{i}.key / .value [batch, kv_heads, past_sequence_length, head_dim] float32
  outputs  logits [batch, sequence_length, vocab] float32,
           present.{i}.key / .value [batch, kv_heads, total_sequence_length, head_dim] float32

The TorchScript exporter traces a wrapper that turns the flat past tensors into a transformers ``DynamicCache``
(eager attention: the fused kernels do not trace).  With tied embeddings its constant folding writes the table
twice (the Gather's and the LM head's transposed copy); ``tie_embedding`` makes the head read the Gather's table
through a Transpose, so the artifact stores it once.  Knows nothing of recipes (``_causal_lm_source`` does).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.errors import StageError
from qdeploy.graph.utils import fresh_name, tensor_nbytes

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.stages.export.findings import TiedEmbeddingRecord

__all__ = ["CAUSAL_LM_OPSET", "KvLayout", "dynamic_axes", "example_feeds", "export_kv", "kv_io_names", "kv_layout",
           "kv_wrapper", "tie_embedding"]

log = logging.getLogger(__name__)

CAUSAL_LM_OPSET = 17
"""The TorchScript exporter's opset for decoders where the recipe sets none (optimum's default too)."""


class KvLayout:
    """Layers, key/value heads, head width and vocabulary of a transformers config: the cache's shapes."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, vocab: int) -> None:
        self.layers, self.kv_heads, self.head_dim, self.vocab = layers, kv_heads, head_dim, vocab

    def as_record(self) -> dict[str, int]:
        return {"layers": self.layers, "kv_heads": self.kv_heads, "head_dim": self.head_dim, "vocab": self.vocab}


def kv_layout(config: Any) -> KvLayout:
    """The cache's shapes from a transformers config (Llama, Mistral, Qwen, GPT-style names alike)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return KvLayout(text.num_hidden_layers, kv_heads, head_dim, text.vocab_size)


def kv_io_names(layers: int) -> tuple[list[str], list[str]]:
    """(input names, output names) as optimum writes them."""
    past = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past], ["logits", *present]


def dynamic_axes(layers: int) -> dict[str, dict[int, str]]:
    """Symbolic axes of every input and output."""
    inputs, outputs = kv_io_names(layers)
    axes = {"input_ids": {0: "batch", 1: "sequence_length"},
            "attention_mask": {0: "batch", 1: "total_sequence_length"},
            "position_ids": {0: "batch", 1: "sequence_length"},
            "logits": {0: "batch", 1: "sequence_length"}}
    axes.update((name, {0: "batch", 2: "past_sequence_length"}) for name in inputs[3:])
    axes.update((name, {0: "batch", 2: "total_sequence_length"}) for name in outputs[1:])
    return axes


def kv_wrapper(model: Any, layers: int) -> Any:
    """An nn.Module taking (input_ids, attention_mask, position_ids, *flat past) and returning (logits, *presents)."""
    import torch
    from transformers import DynamicCache

    class KvCacheWrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, *past: Any) -> tuple[Any, ...]:
            cache = DynamicCache()
            for index in range(layers):
                cache.update(past[2 * index], past[2 * index + 1], index)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            presents = []
            for layer in out.past_key_values.layers:
                presents += [layer.keys, layer.values]
            return (out.logits, *presents)

    return KvCacheWrapper().eval()


def example_feeds(layout: KvLayout, *, batch: int = 1, prompt: int = 4, past: int = 3,
                  seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of one call: ``prompt`` tokens (inside the vocabulary) after ``past`` random cached ones."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(0, layout.vocab, (batch, prompt), dtype=np.int64),
        "attention_mask": np.ones((batch, past + prompt), np.int64),
        "position_ids": np.tile(np.arange(past, past + prompt, dtype=np.int64), (batch, 1)),
    }
    for name in kv_io_names(layout.layers)[0][3:]:
        feeds[name] = rng.standard_normal((batch, layout.kv_heads, past, layout.head_dim)).astype(np.float32)
    return feeds


def export_kv(model: Any, path: Path, *, opset: int | None = None, variant: str = "exported") -> KvLayout:
    """Export ``model`` (a transformers causal LM in eval mode, eager attention) to ``path`` with its KV cache.

    Traced at a past of 3 and 4 new tokens, so that neither length is folded into a constant; the TorchScript
    exporter writes external data beside ``path`` on its own above 2 GB."""
    import torch

    layout = kv_layout(model.config)
    wrapper = kv_wrapper(model, layout.layers)
    inputs, outputs = kv_io_names(layout.layers)
    example = example_feeds(layout)
    args = tuple(torch.from_numpy(example[name]) for name in inputs)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.onnx.export(wrapper, args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=dynamic_axes(layout.layers), opset_version=opset or CAUSAL_LM_OPSET,
                          dynamo=False, do_constant_folding=True)
    except Exception as exc:
        raise StageError("export", variant, f"torch.onnx.export of the causal LM failed: "
                                            f"{type(exc).__name__}: {exc}") from None
    return layout


def tie_embedding(model: onnx.ModelProto) -> TiedEmbeddingRecord | None:
    """Store a tied embedding once: the LM head's transposed copy of the Gather's table becomes
    ``Transpose(table, perm=[1, 0])`` of the table itself.  None when no MatMul reads such a copy."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    tables = [node.input[0] for node in graph.node if node.op_type == "Gather" and node.input[0] in initializers
              and len(initializers[node.input[0]].dims) == 2]
    for table_name in dict.fromkeys(tables):
        table = initializers[table_name]
        transposed_dims = [table.dims[1], table.dims[0]]
        for node in graph.node:
            if node.op_type != "MatMul" or len(node.input) != 2 or node.input[1] not in initializers:
                continue
            copy = initializers[node.input[1]]
            if list(copy.dims) != transposed_dims or copy.data_type != table.data_type:
                continue
            if not np.array_equal(numpy_helper.to_array(copy), numpy_helper.to_array(table).T):
                continue
            return _retie(model, node, table_name, copy.name, helper)
    return None


def _retie(model: onnx.ModelProto, head: onnx.NodeProto, table: str, copy: str, helper: Any) -> TiedEmbeddingRecord:
    """Replace the head's read of ``copy`` by a Transpose of ``table`` placed just before it; drop ``copy`` when
    nothing else reads it."""
    graph = model.graph
    taken = {name for node in graph.node for name in (*node.input, *node.output)} | {n.name for n in graph.node}
    out = fresh_name(f"{table}_transposed", taken)
    transpose = helper.make_node("Transpose", [table], [out], name=fresh_name("lm_head_tied_transpose", taken),
                                 perm=[1, 0])
    position = list(graph.node).index(head)
    graph.node.insert(position, transpose)
    readers = [node for node in graph.node if copy in node.input]
    for node in readers:
        node.input[:] = [out if name == copy else name for name in node.input]
    index = next(i for i, init in enumerate(graph.initializer) if init.name == copy)
    saved = tensor_nbytes(graph.initializer[index])
    del graph.initializer[index]
    log.info("tied embedding: the LM head reads '%s' through a Transpose; %d bytes of copy removed", table, saved)
    return {"table": table, "removed_copy": copy, "bytes_saved": saved, "head": head.name or head.output[0],
            "form": "MatMul(hidden, Transpose(table, perm=[1, 0]))"}

