"""STFT nodes written in the form the ONNX specification gives, which every runtime reads.

The specification's STFT takes a signal of rank 3 (``[batch, length, 1]`` real, ``[batch, length, 2]`` complex) and
an optional ``frame_length`` that defaults to the window's length.  ONNX Runtime also runs a rank-2 real signal
``[batch, length]``, and onnxscript's audio front ends (onnx-asr's Whisper, Kaldi and NeMo log-mel preprocessors)
are written that way with no ``frame_length``: onnx's reference evaluator then failed ("need at least one array to
concatenate": the fp16 check could not run) and OpenVINO could not read the model at all (its ONNX frontend wants
rank 3 and a ``frame_length`` equal to the window's length).  Such a node gets an Unsqueeze of its signal on a last
axis of 1 and ``frame_length`` as a constant: the same function, by the specification's own definition.
OpenVINO also needs the signal's length static: the recipe's ``model.inputs`` sets it.  With static shapes, onnx's
shape inference (1.23) read an absent ``onesided`` as 0 where the schema's default is 1, inferred 400 frequency
bins for Whisper's 201, and the simplified model's shapes made ONNX Runtime refuse it ("Incompatible dimensions for
matrix multiplication"): the default is written out.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.graph.light import light_copy
from qdeploy.graph.names import NodeNames, tensor_names
from qdeploy.graph.utils import fresh_name

if TYPE_CHECKING:
    import onnx

    from qdeploy.stages.export.findings import ExportRecord

__all__ = ["portable_stft"]

log = logging.getLogger(__name__)


def portable_stft(model: onnx.ModelProto, findings: ExportRecord) -> None:
    """Main-graph STFT nodes with a rank-2 signal or no ``frame_length`` beside a window, rewritten as above."""
    stfts = [node for node in model.graph.node if node.op_type == "STFT" and node.domain in ("", "ai.onnx")]
    if not stfts:
        return
    ranks, lengths = _ranks_and_lengths(model)
    taken, node_names = tensor_names(model.graph), NodeNames.of(model.graph)
    changed = []
    for stft in stfts:
        said = [*_signal_rank_three(model, stft, ranks, taken, node_names),
                *_frame_length(model, stft, lengths, taken),
                *_onesided(stft)]
        if said:
            changed.append(f"{stft.name or stft.output[0]}: {', '.join(said)}")
    if changed:
        findings["stft_made_portable"] = changed
        log.info("STFT written in the specification's form (rank-3 signal, explicit frame_length): %s",
                 "; ".join(changed))


def _ranks_and_lengths(model: onnx.ModelProto) -> tuple[dict[str, int], dict[str, int]]:
    """Tensor name -> rank, and -> length of a static rank-1 tensor, from onnx shape inference on a light copy."""
    import onnx

    light = light_copy(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(light.model).graph
    except Exception as exc:  # nothing known: the nodes stay as they are
        log.debug("shape inference for STFT failed: %s", exc)
        return {}, {}
    ranks, lengths = {}, {}
    for value in (*inferred.input, *inferred.value_info, *inferred.output):
        if value.type.tensor_type.HasField("shape"):
            dims = value.type.tensor_type.shape.dim
            ranks[value.name] = len(dims)
            if len(dims) == 1 and dims[0].HasField("dim_value"):
                lengths[value.name] = dims[0].dim_value
    for init in model.graph.initializer:
        ranks[init.name] = len(init.dims)
        if len(init.dims) == 1:
            lengths[init.name] = init.dims[0]
    return ranks, lengths


def _signal_rank_three(model: onnx.ModelProto, stft: onnx.NodeProto, ranks: dict[str, int],
                       taken: set[str], node_names: NodeNames) -> list[str]:
    from onnx import helper, numpy_helper

    if ranks.get(stft.input[0]) != 2:
        return []
    axes = fresh_name(f"{stft.name or 'stft'}_signal_axes", taken)
    signal = fresh_name(f"{stft.input[0]}_frames_axis", taken)
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), axes))
    position = list(model.graph.node).index(stft)
    model.graph.node.insert(position, helper.make_node("Unsqueeze", [stft.input[0], axes], [signal],
                                                       name=node_names.fresh(f"{stft.name or 'stft'}_signal_rank3")))
    stft.input[0] = signal
    return ["signal [batch, length] unsqueezed to [batch, length, 1]"]


def _frame_length(model: onnx.ModelProto, stft: onnx.NodeProto, lengths: dict[str, int],
                  taken: set[str]) -> list[str]:
    from onnx import TensorProto, numpy_helper

    inputs = list(stft.input)
    has_window = len(inputs) > 2 and inputs[2]
    if not has_window or (len(inputs) > 3 and inputs[3]) or inputs[2] not in lengths:
        return []
    step = next((init for init in model.graph.initializer if init.name == inputs[1]), None)
    dtype = np.int32 if step is not None and step.data_type == TensorProto.INT32 else np.int64
    name = fresh_name(f"{stft.name or 'stft'}_frame_length", taken)
    model.graph.initializer.append(numpy_helper.from_array(np.array(lengths[inputs[2]], dtype), name))
    if len(inputs) == 3:
        stft.input.append(name)
    else:
        stft.input[3] = name
    return [f"frame_length {lengths[inputs[2]]} (the window's length) given"]


def _onesided(stft: onnx.NodeProto) -> list[str]:
    from onnx import helper

    if any(attribute.name == "onesided" for attribute in stft.attribute):
        return []
    stft.attribute.append(helper.make_attribute("onesided", 1))
    return ["onesided 1 (the default) written out"]
