"""Post-training quantization through ONNX Runtime's quantizers, with qdeploy's own calibration.

Static (``ptq``): activation ranges come from ``qdeploy.calibration.activations`` and
``qdeploy.calibration.ranges`` (minmax, percentile, entropy, mse; streamed, one or two
passes), and ONNX Runtime's ``QDQQuantizer`` writes the QDQ model from them (on an indexed graph,
``stages/quantize/ptq/_fast_ort.py``: its own helpers make it quadratic in the node count).
Calibrating once and building many times is what lets the accuracy budget try
several sets of float nodes cheaply.  Dynamic: ``quantize_dynamic``.

Both expose a builder ``build(names of nodes to keep float) -> ModelProto`` on top of the configured
exclusions.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
from collections.abc import Collection, Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.calibration.activations import FeedSource, collect_statistics, float_tensors_of
from qdeploy.calibration.ranges import HISTOGRAM_METHODS, estimate_range
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.external_data import load_weights_from
from qdeploy.graph.recompose import recompose_hardswish
from qdeploy.graph.shape_values import shape_computed_nodes
from qdeploy.stages.quantize.ptq._concat_uint8 import CONCAT_INT8_BUG, moved_convs_note, uint8_before_moved_convs
from qdeploy.stages.quantize.ptq._depthwise import depthwise_inputs, per_channel_at_depthwise
from qdeploy.stages.quantize.ptq._float_concat_inputs import float_concats_read_float
from qdeploy.stages.quantize.ptq._guard import ort_quantizer_step
from qdeploy.stages.quantize.ptq._keep import MOVER_OPS, keep_float, quantized_node_names
from qdeploy.stages.quantize.ptq._mixed_concats import mixed_range_concats
from qdeploy.stages.quantize.ptq._nonfinite import nonfinite_nodes
from qdeploy.stages.quantize.ptq._openvino import (
    SHARED_PARAMETER_OPS,
    activation_matmuls,
    concat_groups,
    drop_exact_requantization,
    float_tail,
    moved_before_quantizing,
    pooled_before_quantizing,
    unify_concat_ranges,
)
from qdeploy.stages.quantize.ptq._preprocess import load_with_shapes, weights_read_on_demand
from qdeploy.stages.quantize.ptq._unshare import unshare_qdq_parameters

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

_TYPES = {"uint8": "QUInt8", "int8": "QInt8"}
_FLOAT_OUTPUT_OPS = ("MatMul", "Gemm")
"""Their outputs are quantized only for a quantized consumer: attention scores stay float before Softmax, and
ONNX Runtime still runs them int8 (MatMulIntegerToFloat, QGemm with an int32 bias)."""
_OPENVINO_FLOAT_OUTPUT_OPS = (*_FLOAT_OUTPUT_OPS, "Conv", "ConvTranspose")
"""For OpenVINO (``runtime: openvino``) convolutions too: it fuses the float chain after a convolution (BatchNorm's
Mul/Add, HardSwish written out, Sigmoid) into the int8 convolution when the next Q sits at the chain's end, and
runs each chain as a separate kernel when a Q/DQ pair cuts it off (PP-OCRv4 rec: 28 such kernels, 2.4 ms of 10).
ONNX Runtime wants the Q right after the Conv instead (QLinearConv)."""
# ConvInteger has no int8-weight kernel in ONNX Runtime's CPU provider: dynamic mode leaves Conv out for int8 weights
_DYNAMIC_INT8_SKIPPED = frozenset({"Conv"})
OPENVINO_UNREADABLE_DYNAMIC = {"Attention": "QAttention", "EmbedLayerNormalization": "QEmbedLayerNormalization"}
"""ONNX Runtime's fused ops (its transformer optimizer's) whose integer form from dynamic mode OpenVINO has no
conversion rule for (2026.4: "No conversion rule found for operations: com.microsoft.QAttention, ..."); their
float forms it reads, and their MatMuls quantize where they are not fused."""


BALANCED_OP_TYPES = (
    "Conv", "ConvTranspose", "MatMul", "Gemm",  # the compute
    "Relu", "Clip", "LeakyRelu",  # activations both runtimes fold into the compute
    "MaxPool", "AveragePool", "GlobalAveragePool", "Concat", "Resize",
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Split", "Slice", "Gather", "Pad",
)
"""Op set 'balanced': elementwise arithmetic (Add, Mul...), normalization and softmax stay float.  OpenVINO runs
Q/DQ around those as extra FakeQuantize layers (slower than float32 on MobileNet-style and transformer models);
ONNX Runtime would fuse some of them (QLinearAdd...), which op set 'onnxruntime' keeps."""


def default_op_types(mode: str, weight_type: str, op_set: str = "balanced", *, openvino: bool = False) -> list[str]:
    """Op types of a mode: the op set's for ptq, ONNX Runtime's integer ops for dynamic (less those OpenVINO cannot
    read in their integer form, where ``openvino`` may run the model)."""
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry, QLinearOpsRegistry

    if mode == "ptq":
        return list(BALANCED_OP_TYPES) if op_set == "balanced" else sorted(set(QDQRegistry) | set(QLinearOpsRegistry))
    skipped = _DYNAMIC_INT8_SKIPPED if weight_type == "int8" else frozenset()
    if openvino:
        skipped |= set(OPENVINO_UNREADABLE_DYNAMIC)
    return sorted(set(IntegerOpsRegistry) - skipped)


@dataclass(frozen=True)
class Calibrated:
    """What calibration did: samples read, tensors calibrated, ranges the method clipped inside the observed ones;
    and the per-channel largest |value| of each depthwise convolution's input (``_depthwise``)."""

    samples: int
    tensors: int
    clipped: int
    channel_peaks: dict[str, list[float]] = field(default_factory=dict)
    nonfinite: list[str] = field(default_factory=list)
    """Tensors that held +-Inf or NaN (masks): their readers and writers stay float (``_nonfinite``)."""


def calibrate(prepared: Path, op_types: list[str], feeds: FeedSource, work_dir: Path, method: str,
              percentile: float) -> tuple[dict[str, tuple[float, float]], Calibrated]:
    """Activation ranges of every float tensor around the op types to quantize, and what calibration did."""
    tensors = float_tensors_of(prepared, op_types)
    depthwise = depthwise_inputs(load_model(prepared, load_external_data=False)) & set(tensors)
    stats, samples = collect_statistics(prepared, tensors, feeds, work_dir, histogram=method in HISTOGRAM_METHODS,
                                        per_channel=depthwise)
    ranges = {name: estimate_range(item, method, percentile=percentile) for name, item in stats.items()}
    clipped = sum(1 for name, (low, high) in ranges.items()
                  if stats[name].count and (low > stats[name].minimum or high < stats[name].maximum))
    peaks = {name: [float(value) for value in stats[name].channel_peak] for name in sorted(depthwise)
             if stats[name].channel_peak is not None and stats[name].channel_peak.size}
    nonfinite = sorted(name for name, item in stats.items() if item.nonfinite)
    return ranges, Calibrated(samples=samples, tensors=len(tensors), clipped=clipped, channel_peaks=peaks,
                              nonfinite=nonfinite)


class StaticBuilder:
    """QDQ models of one prepared float model from fixed activation ranges.

    ONNX Runtime's quantizer runs once, with the configured exclusions; ``build(kept)`` then keeps more nodes
    float by feeding them their float inputs again (the tensor before its QuantizeLinear, the float weight
    or bias), and drops the Q/DQ nodes nobody reads any more.  Excluding a node in ORT's quantizer would not
    do this: a tensor quantized for one consumer reaches every consumer through its DequantizeLinear.
    """

    def __init__(self, prepared: Path, ranges: dict[str, tuple[float, float]], excluded: list[str], *,
                 per_channel: bool, activation_type: str, weight_type: str, symmetric_activations: bool,
                 symmetric_weights: bool, op_types: list[str], seven_bit: str = "none",
                 runtime: str | None = None, signed_int8: float = 0.0, openvino_runs: bool | None = None,
                 channel_peaks: dict[str, list[float]] | None = None, nonfinite: Collection[str] = ()) -> None:
        from onnxruntime.quantization import QuantType
        from onnxruntime.quantization.calibrate import CalibrationMethod, TensorData, TensorsData
        from onnxruntime.quantization.quant_utils import update_opset_version

        # lazy: pulls onnxruntime (import cost)
        from qdeploy.stages.quantize.ptq._fast_ort import (
            FastQDQQuantizer as QDQQuantizer,  # ORT's, without its O(n^2) steps
        )

        self._prepared = prepared
        self._float: onnx.ModelProto | None = None  # read when a node is first kept float, not before
        weights, activations = (getattr(QuantType, _TYPES[kind]) for kind in (weight_type, activation_type))
        model = update_opset_version(load_with_shapes(prepared), weights, activations)
        self._openvino = runtime == "openvino"
        self.float_concats = mixed_range_concats(model, ranges, op_types, excluded)
        """Concats left float: one scale would leave an input fewer than 16 levels (name -> its levels)."""
        self.shape_computed = shape_computed_nodes(model)
        """Nodes left float: they write or read values computed from the inputs' shapes alone (an anchor grid)."""
        self.nonfinite = nonfinite_nodes(model, nonfinite, op_types, prepared.parent)
        """Nodes left float: they read or write +-Inf or NaN (node -> that tensor or constant; ``_nonfinite``)."""
        excluded = [*excluded, *self.float_concats, *self.shape_computed, *self.nonfinite]
        if self._openvino:  # no requantization that OpenVINO would run as a kernel of its own (_openvino.py)
            ranges = unify_concat_ranges(model, ranges, op_types, skip=self.float_concats)
            excluded = [*excluded, *activation_matmuls(model)]
            excluded = [*excluded, *float_tail(model, op_types, excluded)]
        # beside 7-bit activations only a convolution's input may take 8 signed bits (_common.openvino_only);
        # never what a Concat reads or writes (:func:`concatenated`)
        at_concats = concatenated(model, op_types, skip=self.float_concats)
        self.signable = (convolution_inputs(model) if seven_bit == "activations" else set(ranges)) - at_concats
        """The activations ``signed_int8`` may put on int8."""
        tensors = TensorsData(CalibrationMethod.MinMax, {
            name: TensorData(lowest=np.float32(low), highest=np.float32(high)) for name, (low, high) in ranges.items()})
        extra = {"ActivationSymmetric": symmetric_activations, "WeightSymmetric": symmetric_weights,
                 "OpTypesToExcludeOutputQuantization": list(
                     _OPENVINO_FLOAT_OUTPUT_OPS if runtime == "openvino" else _FLOAT_OUTPUT_OPS)}
        overrides: dict[str, list[dict[str, Any]]] = {}
        if signed_int8 and not symmetric_activations:
            # beside 7-bit activations only a convolution's input may take 8 signed bits (_common.openvino_only)
            overrides = signed_int8_overrides(
                {name: bounds for name, bounds in ranges.items() if name in self.signable}, QuantType.QInt8,
                signed_int8)
        if per_channel:  # a batched constant B has no per-channel form ORT's int8 MatMul takes: per tensor
            overrides.update({name: [{"symmetric": symmetric_weights}] for name in batched_matmuls(model).values()})
        self.uint8_concats: set[str] = set()
        """Tensors put back on uint8 under ``activation_type: int8`` because OpenVINO runs the graph."""
        on_openvino = runtime == "openvino" if openvino_runs is None else openvino_runs
        self._on_openvino = on_openvino
        if activation_type == "int8" and on_openvino:
            self.uint8_concats = at_concats & set(ranges)
            overrides.update({name: [{"quant_type": QuantType.QUInt8, "symmetric": symmetric_activations}]
                              for name in self.uint8_concats})
        if overrides:
            extra["TensorQuantOverrides"] = overrides
        quantizer_class = _seven_bit_activations_quantizer() if seven_bit == "activations" else QDQQuantizer
        if self._openvino:
            quantizer_class = _inputs_forced(quantizer_class, pooled_before_quantizing(model, op_types, excluded)
                                             | moved_before_quantizing(model, op_types, excluded))
        quantizer = quantizer_class(model, per_channel, seven_bit == "weights", weights, activations, tensors, [],
                                    list(excluded), op_types, extra)
        # the float weights are read one at a time from the prepared model's files, never held all at once
        with quiet(), ort_quantizer_step("ONNX Runtime's QDQ quantizer"), weights_read_on_demand(prepared.parent):
            quantizer.quantize_model()
        quantizer.model.topological_sort()  # as ORT's quantize_static does when saving: Q/DQ are appended last
        # protobuf frees what the quantizer replaced only with the whole message: keep a copy
        self._quantized = _compact(quantizer.model.model)
        # OpenVINO rewrites a zero point shared along a Gather/Pad/Transpose chain for all its readers at once
        unshare_qdq_parameters(self._quantized)
        self.uint8_moved_convs = 0
        """Int8 pairs before convolutions reached through data movement moved to uint8 by the builds so far
        (``_concat_uint8``), the most of any build."""
        load_weights_from(self._quantized, prepared.parent)  # what it left float (biases, excluded weights)
        self.float_recurrent = _reading_dequantized(self._quantized, RECURRENT_OPS)
        """Recurrent nodes fed their float inputs again (:data:`RECURRENT_OPS`)."""
        if self.float_recurrent:
            keep_float(self._quantized, self._float_model(), set(self.float_recurrent))
            log.info("%d recurrent node(s) read their inputs float: %s", len(self.float_recurrent),
                     ", ".join(self.float_recurrent[:5]))
        self.per_channel_depthwise: list[str] = []
        """Depthwise Conv nodes whose input is rescaled to one scale per channel in effect where OpenVINO runs the
        graph (``_depthwise``)."""
        if on_openvino and channel_peaks:
            self.per_channel_depthwise = per_channel_at_depthwise(
                self._quantized, {name: np.asarray(peak, np.float32) for name, peak in channel_peaks.items()},
                seven_bit=seven_bit == "activations", int8_only=activation_type == "int8", skip=at_concats)

    def _float_model(self) -> onnx.ModelProto:
        if self._float is None:
            self._float = load_model(self._prepared)
        return self._float

    def quantized_tensors(self) -> set[str]:
        """The float tensors a QuantizeLinear of this build reads (with nothing kept float)."""
        return {node.input[0] for node in self._quantized.graph.node if node.op_type == "QuantizeLinear"}

    def candidates(self, quantized: onnx.ModelProto) -> dict[str, str]:
        """Quantized nodes that add rounding of their own (data movement does not): name -> op type."""
        return {name: op for name, op in quantized_node_names(quantized).items() if op not in MOVER_OPS}

    def __call__(self, kept: list[str]) -> onnx.ModelProto:
        model = copy.deepcopy(self._quantized)
        if kept:
            keep_float(model, self._float_model(), set(kept))
        if self._on_openvino:  # after keep_float, which leaves more Concats float; before the exact pairs go
            float_concats_read_float(model)
        if self._openvino:  # after keep_float: a kept node reads its float input, not a bypassed pair
            drop_exact_requantization(model)
        if self._on_openvino:  # pre-processing wrote HardSwish out; OpenVINO runs it fused only as one op
            recompose_hardswish(model)
            # last: dropping requantizations and keeping nodes float leave dequantizations before other movers
            self.uint8_moved_convs = max(self.uint8_moved_convs, uint8_before_moved_convs(model))
        return model

    def uint8_notes(self) -> dict[str, str]:
        """The report's words for the tensors the builds keep off int8 for OpenVINO (``SignedActivationsRecord``)."""
        notes = {}
        if self.uint8_concats:
            notes["uint8_at_concats"] = (f"{len(self.uint8_concats)} tensors a Concat reads or writes stay uint8 "
                                         f"despite activation_type int8: {CONCAT_INT8_BUG}")
        if self.uint8_moved_convs:
            notes["uint8_before_moved_convs"] = moved_convs_note(self.uint8_moved_convs)
        return notes


RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})
"""Ops no quantizer here runs in int8, whose inputs stay float: a DequantizeLinear in front of one only rounds, and
OpenVINO 2026.4's CPU plugin crashed (SIGSEGV in ``compile_model``) on an LSTM reading one in a PyTorch 1.8
attention decoder (PyThaiNLP's thai2rom), which killed the whole run."""


def _reading_dequantized(model: onnx.ModelProto, op_types: frozenset[str]) -> list[str]:
    """Nodes of ``op_types`` that read a DequantizeLinear's output."""
    dequantized = {node.output[0] for node in model.graph.node if node.op_type == "DequantizeLinear"}
    return [node.name for node in model.graph.node
            if node.op_type in op_types and any(name in dequantized for name in node.input)]


CENTRED = 1.1
"""``signed_int8`` for ranges nearly centred on zero only: int8 costs them at most 0.8 dB of their own SNR."""
EVERY_SIGNED = 2.0
"""``signed_int8`` for every range with negative values (the lopsidedness is 2 at most)."""


def lopsidedness(low: float, high: float) -> float:
    """2 max(-low, high) / (high - low): 1 for a range centred on zero, 2 at most; how much coarser the int8 grid
    with zero point 0 is than uint8's with a zero point over the range."""
    return 2 * max(-low, high) / (high - low)


def signed_int8_overrides(ranges: dict[str, tuple[float, float]], int8: Any,
                          most_lopsided: float) -> dict[str, list[dict[str, Any]]]:
    """ORT quantizer overrides that put activations with negative values on int8 with zero point 0, those whose
    :func:`lopsidedness` is at most ``most_lopsided``.  Why OpenVINO wants it:
    ``stages/quantize/ptq/_signed.py``."""
    return {name: [{"quant_type": int8, "symmetric": True}] for name, (low, high) in ranges.items()
            if low < 0 and lopsidedness(low, high) <= most_lopsided}


def convolution_inputs(model: onnx.ModelProto) -> set[str]:
    """Tensors that only Conv nodes read, as their data input.  On x86 CPUs without VNNI, oneDNN (OpenVINO's
    kernels) halves a convolution's weights when its input is int8 rather than saturate
    (``jit_uni_x8s8s32x``'s ``wei_adj_scale``); its other int8 kernels are not known to."""
    readers: dict[str, list[tuple[str, int]]] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, []).append((node.op_type, position))
    return {name for name, read in readers.items() if all(read_by == ("Conv", 0) for read_by in read)}


def batched_matmuls(model: onnx.ModelProto) -> dict[str, str]:
    """MatMul node -> the initializer it reads as B, where B's rank is above 2 (DeBERTa's relative-position keys,
    [heads, K, N] once simplify folds them).  ORT's quantizers quantize B per channel along axis 1, which for such a
    B is K, and its int8 MatMul then refuses the zero point's shape ("IsBQuantParamSupported ... was false"): every
    build failed.  One axis cannot hold B's [heads, 1, N] channels: static builds quantize these per tensor,
    dynamic ones (whose quantizer takes no per-tensor override) leave those MatMuls float."""
    ranks = {init.name: len(init.dims) for init in model.graph.initializer}
    return {node.name: node.input[1] for node in model.graph.node
            if node.op_type == "MatMul" and len(node.input) > 1 and ranks.get(node.input[1], 0) > 2}


def concatenated(model: onnx.ModelProto, op_types: list[str], skip: Container[str] = ()) -> set[str]:
    """Tensors a Concat reads or writes, and those that share their quantization through data movement (ORT's
    quantizer gives a MaxPool's or Resize's output its input's parameters).  They stay uint8 with a zero point:
    OpenVINO 2026.4's CPU plugin computes a convolution that reads a Concat of int8 tensors wrongly on an
    AVX512-VNNI CPU without AMX, whatever their zero point (cosine 0.65-0.85 against ONNX Runtime on the same QDQ
    graph; PP-OCRv4 det's output 0.05), and right with uint8 (docs/int8-kernels.md); under ``activation_type: int8``
    they go back on uint8 wherever OpenVINO runs the graph."""
    return {name for group in concat_groups(model, op_types, SHARED_PARAMETER_OPS, skip=skip) for name in group}


def _compact(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnx

    copy_ = onnx.ModelProto()
    copy_.CopyFrom(model)
    return copy_


def _seven_bit_activations_quantizer() -> type:
    """ORT's QDQ quantizer with activations on 7 bits (uint8 0..127), as PyTorch's fbgemm ``reduce_range`` does.

    ORT accepts ``reduce_range`` overrides for initializers only; every activation's parameters go through
    ``calc_quant_params``, so asking it there covers them all, and bias scales (input scale x weight scale) follow.
    An activation put on int8 (``signed_int8_overrides``: a convolution's input in OpenVINO-only builds) keeps its
    8 bits: oneDNN's convolutions halve the weights for an int8 input on CPUs without VNNI, so they never saturate
    (:func:`convolution_inputs`).
    """
    from onnxruntime.quantization import QuantType

    # lazy: pulls onnxruntime (import cost)
    from qdeploy.stages.quantize.ptq._fast_ort import FastQDQQuantizer

    class SevenBitActivations(FastQDQQuantizer):  # type: ignore[misc]
        def calc_quant_params(self, tensor_data: Any, quant_overrides: dict[str, Any]) -> Any:
            # explicit parameters are the user's; an int8 activation keeps 8 bits (above)
            if "scale" in quant_overrides or quant_overrides.get("quant_type") == QuantType.QInt8:
                return super().calc_quant_params(tensor_data, quant_overrides)
            return super().calc_quant_params(tensor_data, {**quant_overrides, "reduce_range": True})

    return SevenBitActivations


def _inputs_forced(base: type, nodes: set[str]) -> type:
    """``base`` quantizing the input of each node in ``nodes`` even where nothing quantized it before.

    ORT's data-movement op quantizers (MaxPool, Reshape...) read the quantizer's ``force_quantize_no_input_check``
    while quantizing one node; this answers it per node, so the graph's other movers keep ORT's rule.
    """
    if not nodes:
        return base

    class InputsForced(base):  # type: ignore[misc, valid-type]
        _current = ""
        _forced_everywhere = False

        @property  # type: ignore[override]
        def force_quantize_no_input_check(self) -> bool:
            return self._forced_everywhere or self._current in nodes

        @force_quantize_no_input_check.setter
        def force_quantize_no_input_check(self, value: bool) -> None:  # ORT's __init__ sets the global option
            self._forced_everywhere = bool(value)

        def should_quantize_node(self, node: Any) -> bool:
            self._current = node.name  # ORT quantizes the node right after asking
            return bool(super().should_quantize_node(node))

    return InputsForced


class DynamicBuilder:
    """Dynamically quantized models (int8 weights, activations quantized at run time); ``build(kept)`` runs
    ``quantize_dynamic`` with the kept nodes excluded (each node quantizes its own input there)."""

    def __init__(self, prepared: Path, excluded: list[str], work_dir: Path, *, per_channel: bool, weight_type: str,
                 op_types: list[str], reduce_range: bool = False) -> None:
        self._prepared = prepared
        self._excluded = list(excluded)
        self._work_dir = work_dir
        self._settings = {"per_channel": per_channel, "weight_type": weight_type, "op_types": op_types,
                          "reduce_range": reduce_range}
        if per_channel:  # per-channel B of rank above 2 breaks ORT's int8 MatMul (batched_matmuls)
            self._excluded += list(batched_matmuls(load_model(prepared, load_external_data=False)))
        self._count = 0

    def candidates(self, quantized: onnx.ModelProto) -> dict[str, str]:
        """Float-model nodes that quantize_dynamic quantized (it renames node X to X_quant)."""

        bases = set()  # every prefix of a node name that ends where "_quant" starts
        for node in quantized.graph.node:
            start = node.name.find("_quant")
            while start > 0:
                bases.add(node.name[:start])
                start = node.name.find("_quant", start + 1)
        return {node.name: node.op_type for node in load_model(self._prepared, load_external_data=False).graph.node
                if node.name in bases}

    def __call__(self, kept: list[str]) -> onnx.ModelProto:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        # lazy: pulls onnxruntime (import cost)
        from qdeploy.stages.quantize.ptq._fast_ort import fast_quantize_dynamic

        self._count += 1
        output = self._work_dir / f"dynamic_{self._count}.onnx"
        with quiet(), ort_quantizer_step("ONNX Runtime's quantize_dynamic"), fast_quantize_dynamic(), \
                weights_read_on_demand(self._prepared.parent):
            quantize_dynamic(str(self._prepared), str(output),
                             weight_type=getattr(QuantType, _TYPES[self._settings["weight_type"]]),
                             per_channel=self._settings["per_channel"], reduce_range=self._settings["reduce_range"],
                             nodes_to_exclude=[*self._excluded, *kept],
                             op_types_to_quantize=self._settings["op_types"])
        model = load_model(output)
        output.unlink()
        return model


class _RootRecordsToDebug(logging.Filter):
    """ORT's quantizers warn through the root logger (``logging.warning``) about what only its own callers can act
    on ("Bias of Gemm node ... is not constant. Please exclude this node"): into qdeploy's debug log instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        log.debug("onnxruntime.quantization %s: %s", record.levelname.lower(), record.getMessage())
        return False


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """ORT's quantizers print progress to stdout and warnings to the root logger; keep both out of the user's
    terminal, in the log.  (A logger's filters see only records logged on it: qdeploy's own pass.)"""
    captured, root, to_debug = io.StringIO(), logging.getLogger(), _RootRecordsToDebug()
    root.addFilter(to_debug)
    try:
        with contextlib.redirect_stdout(captured):
            yield
    finally:
        root.removeFilter(to_debug)
        if captured.getvalue().strip():
            log.debug("onnxruntime.quantization: %s", captured.getvalue().strip())
