"""Export core of a transformers causal language model with a KV cache: one graph, past key/values as inputs.

Prefill is a call with past length 0, decode a call of one token after a past.  Names and symbolic axes are the
ones optimum writes (``kv_io_names``, ``dynamic_axes``):

  inputs   input_ids [batch, sequence_length] int64, attention_mask [batch, total_sequence_length] int64,
           position_ids [batch, sequence_length] int64,
           past_key_values.{i}.key / .value [batch, kv_heads, past_sequence_length, head_dim] float32
  outputs  logits [batch, sequence_length, vocab] float32,
           present.{i}.key / .value [batch, kv_heads, total_sequence_length, head_dim] float32

The TorchScript exporter traces a wrapper that turns the flat past tensors into a transformers ``DynamicCache``
(eager attention: the fused kernels do not trace).  It writes the graph only (``export_params=False``, no
constant folding): the weights go to a data file straight from torch's tensors, each Linear's transposed as the
exporter's folding would (``attach_weights``).  With the weights in its call, the exporter holds several copies
of them at once: 2.89 GB at the peak for SmolLM2's 539 MB against 1.65 GB (``benchmarks/export_memory.py``).
Simplify folds the rest (shape computations).  A tied table is one tensor to torch, read by the Gather and by
the LM head's Transpose, so it is stored once (``tie_embedding`` says so).  Knows nothing of recipes
(``_causal_lm_source`` does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.core.errors import StageError
from qdeploy.graph.external_data import append_external
from qdeploy.graph.utils import tensor_nbytes

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from qdeploy.stages.export.findings import TiedEmbeddingRecord

__all__ = ["CAUSAL_LM_OPSET", "KvLayout", "attach_weights", "dynamic_axes", "example_feeds", "export_kv",
           "kv_io_names", "kv_layout", "kv_wrapper", "tie_embedding"]

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
    """Export ``model`` (a transformers causal LM in eval mode, eager attention) to ``path`` with its KV cache, its
    weights in ``<name>.data`` beside it.

    Traced at a past of 3 and 4 new tokens, so that neither length is folded into a constant."""
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
                          dynamo=False, do_constant_folding=False, export_params=False)
    except Exception as exc:
        raise StageError("export", variant, f"torch.onnx.export of the causal LM failed: "
                                            f"{type(exc).__name__}: {exc}") from None
    # the exporter names the weight inputs after this dict (its own call), shared tensors once
    attach_weights(path, torch.jit._unique_state_dict(wrapper), set(inputs), variant)
    return layout


def attach_weights(path: Path, weights: Mapping[str, Any], interface: set[str], variant: str) -> None:
    """Make the graph inputs of ``path`` named in ``weights`` (torch tensors) initializers, their bytes written to
    ``<name>.data`` one tensor at a time from torch's own memory.  A weight read only by a ``Transpose`` (each
    Linear's) is written transposed in its place, as the exporter's folding would, one tensor's copy at a time; a
    weight with other readers too (a tied table) stays once.  An input left that is not in ``interface`` would be
    a weight without a value: the export fails, naming it."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    transposes = _sole_transposes(graph)
    location = f"{path.name}.data"
    kept = []
    with (path.parent / location).open("wb") as data:
        for value in graph.input:
            tensor = weights.get(value.name)
            if tensor is None:
                kept.append(value)
                continue
            array = tensor.detach().cpu().numpy()
            node = transposes.get(value.name)
            if node is None:
                append_external(graph, value.name, array, data, location)
            else:
                append_external(graph, node.output[0], array.transpose(_perm(node)), data, location)
                graph.node.remove(node)
    missing = [value.name for value in kept if value.name not in interface]
    if missing:
        raise StageError("export", variant, f"the exported graph reads {len(missing)} input(s) that are neither the "
                                            f"decoder's interface nor a weight of the model: {missing[:5]}")
    del graph.input[:]
    graph.input.extend(kept)
    path.write_bytes(model.SerializeToString())  # the graph only: the weights are in the data file


def _sole_transposes(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Graph input -> the Transpose (with a perm) that is its only reader."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in set(node.input):
            readers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    sole = {}
    for value in graph.input:
        nodes = readers.get(value.name, [])
        if len(nodes) == 1 and nodes[0].op_type == "Transpose" and _perm(nodes[0]) is not None \
                and value.name not in outputs:
            sole[value.name] = nodes[0]
    return sole


def tie_embedding(model: onnx.ModelProto) -> TiedEmbeddingRecord | None:
    """The LM head reading the Gather's 2-D table through ``Transpose(table, perm=[1, 0])``: a tied embedding,
    stored once.  None when no MatMul reads a Gather's table so."""
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    tables = {node.input[0] for node in graph.node if node.op_type == "Gather" and node.input[0] in initializers
              and len(initializers[node.input[0]].dims) == 2}
    transposed = {node.output[0]: node.input[0] for node in graph.node if node.op_type == "Transpose"
                  and node.input[0] in tables and _perm(node) == [1, 0]}
    for node in graph.node:
        if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in transposed:
            table = transposed[node.input[1]]
            saved = tensor_nbytes(initializers[table])
            log.info("tied embedding: the LM head reads '%s' through a Transpose (%d bytes not stored twice)",
                     table, saved)
            return {"table": table, "bytes_saved": saved, "head": node.name or node.output[0],
                    "form": "MatMul(hidden, Transpose(table, perm=[1, 0]))"}
    return None


def _perm(node: onnx.NodeProto) -> list[int] | None:
    return next((list(attr.ints) for attr in node.attribute if attr.name == "perm"), None)
