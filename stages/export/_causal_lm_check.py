"""A causal LM export checked against PyTorch on real tokens: a prefill (past length 0) of the check text's
tokens, then one decode step (the token PyTorch predicts next, after the prefill's own past).

Both runs compare logits and every present key/value.  The bound is relative to the logits' magnitude: float32
through tens of layers reassociates sums differently in ONNX Runtime and PyTorch (about 1e-5 of the logits'
range on SmolLM2-135M), while a wrong graph (a mask, a position or a cache slot off by one) is off by whole units.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qdeploy.core.errors import StageError
from qdeploy.stages.export._causal_lm import kv_io_names, kv_layout, kv_wrapper

__all__ = ["ABS_BOUND", "REL_BOUND", "TorchReference", "check_against_torch", "decode_feeds", "prefill_feeds",
           "torch_reference"]

log = logging.getLogger(__name__)

REL_BOUND = 1e-4
"""Largest error accepted, as a fraction of the largest |logit| of the prefill (floored at 1)."""
ABS_BOUND = 1e-4
"""Added to the relative part: tiny models' logits are near zero."""


@dataclass
class TorchReference:
    """PyTorch's feeds and outputs of the prefill and the decode step (numpy arrays by ONNX name)."""

    prefill_feeds: dict[str, Any]
    prefill_outputs: dict[str, Any]
    decode_feeds: dict[str, Any]
    decode_outputs: dict[str, Any]


def prefill_feeds(tokens: list[int], layers: int, kv_heads: int, head_dim: int) -> dict[str, Any]:
    """Feeds of a prefill: the tokens, a mask of ones, positions from 0, an empty past."""
    import numpy as np

    count = len(tokens)
    feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, count), np.int64),
             "position_ids": np.arange(count, dtype=np.int64)[None, :]}
    for name in kv_io_names(layers)[0][3:]:
        feeds[name] = np.zeros((1, kv_heads, 0, head_dim), np.float32)
    return feeds


def decode_feeds(token: int, past: dict[str, Any], layers: int) -> dict[str, Any]:
    """Feeds of one decode step after ``past`` (present.* outputs of the call before)."""
    import numpy as np

    length = past["present.0.key"].shape[2]
    feeds = {"input_ids": np.array([[token]], np.int64), "attention_mask": np.ones((1, length + 1), np.int64),
             "position_ids": np.array([[length]], np.int64)}
    for name in kv_io_names(layers)[0][3:]:
        feeds[name] = past[name.replace("past_key_values", "present")]
    return feeds


def torch_reference(model: Any, tokens: list[int]) -> TorchReference:
    """PyTorch's prefill of ``tokens`` and its decode step of the token it predicts next."""
    import torch

    layout = kv_layout(model.config)
    wrapper = kv_wrapper(model, layout.layers)
    inputs, outputs = kv_io_names(layout.layers)

    def call(feeds: dict[str, Any]) -> dict[str, Any]:
        with torch.no_grad():
            got = wrapper(*(torch.from_numpy(feeds[name]) for name in inputs))
        return {name: tensor.numpy() for name, tensor in zip(outputs, got, strict=True)}

    prefill = prefill_feeds(tokens, layout.layers, layout.kv_heads, layout.head_dim)
    prefill_out = call(prefill)
    following = int(prefill_out["logits"][0, -1].argmax())
    decode = decode_feeds(following, prefill_out, layout.layers)
    return TorchReference(prefill, prefill_out, decode, call(decode))


def check_against_torch(path: Path, reference: TorchReference, text: str, tokens: str,
                        variant: str = "exported") -> dict[str, Any]:
    """Run the saved export in ONNX Runtime on PyTorch's feeds; the errors, or a StageError beyond the bound."""
    import numpy as np
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    errors: dict[str, float] = {}
    for step, feeds, expected in (("prefill", reference.prefill_feeds, reference.prefill_outputs),
                                  ("decode", reference.decode_feeds, reference.decode_outputs)):
        got = dict(zip(names, session.run(names, feeds), strict=True))
        differences = {name: float(np.max(np.abs(got[name].astype(np.float64) - value))) if value.size else 0.0
                       for name, value in expected.items()}
        errors[f"{step}_logits"] = differences.pop("logits")
        errors[f"{step}_presents"] = max(differences.values(), default=0.0)
    scale = max(1.0, float(np.max(np.abs(reference.prefill_outputs["logits"]))))
    bound = ABS_BOUND + REL_BOUND * scale
    record = {"text": text, "tokens": tokens, "prefill_tokens": int(reference.prefill_feeds["input_ids"].shape[1]),
              **errors, "bound": bound}
    worst = max(errors, key=lambda key: errors[key])
    if errors[worst] > bound:
        said = ", ".join(f"{key} {value:.3g}" for key, value in errors.items())
        raise StageError("export", variant, f"the exported causal LM differs from PyTorch on real tokens: "
                         f"{worst.replace('_', ' ')} max abs error {errors[worst]:.3g} > {bound:.3g} ({said}); the "
                         "export is wrong for this architecture (report it with the checkpoint's config.json)")
    log.info("causal LM export matches PyTorch: %s (bound %.3g)", ", ".join(f"{k} {v:.3g}" for k, v in errors.items()),
             bound)
    return record
