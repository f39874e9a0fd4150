"""onnx's reference evaluator as qdeploy uses it: corrected where it is known to be wrong, honest where it cannot run.

``reference:cpu`` computes every op in its declared precision with numpy, which
is what makes it the true-float16 check.  Its kernels have defects that would
otherwise be blamed on the artifact:

- BatchNormalization before opset 14 picks training mode from the ``momentum``
  attribute, which the schema always supplies (0.9), instead of from the node's
  output count: every one-output (inference) node normalises with the batch's
  own statistics blended into the running ones (onnx/onnx#5799, fixed upstream
  by onnx/onnx#8442, not released).  A Paddle-exported PP-OCRv4 detector then
  disagrees with ONNX Runtime at 28 dB SNR in float32, and in float16 the batch
  variance overflows;
- GlobalMaxPool reduces axes ``(n - 2, n - 1)`` of an input of rank n, right
  only for rank 4: a 1-D or 3-D pool reduces the wrong axes silently;
- MaxPool with ``auto_pad: SAME_LOWER`` gives the wrong output shape (5x6 for an 11x13 input at stride 2, where
  the schema and ONNX Runtime give 6x7), and its Python loop over every output element took about 2 of the fp16
  stage's 7 minutes on PP-OCRv6's tiny detector: ``direct_max_pool`` takes strided slices instead;
- Loop concatenates its scan outputs (``np.vstack``) where the schema stacks them on a new axis: an iteration's
  ``[1, 300]`` came out ``[12, 300]`` (chars2vec's Keras LSTM written as a Loop);
- DequantizeLinear before opset 19 has no kernel (QDQ models at opsets 13-18);
- LogSoftmax is the log of Softmax's output: in float16 a probability below 6e-8 rounds to 0 and its log is -Inf,
  where every float16 kernel that deploys (ONNX Runtime's CUDA kernel, cuDNN, TensorRT) computes ``x - max -
  log(sum(exp(x - max)))`` with a float32 sum and stays finite: atspm-detector's function head failed its float16
  check with 4 -Inf that no runtime computes;
- Softmax, LogSoftmax and Hardmax before opset 13 normalise over one axis, as opset 13 does, instead of over the
  input flattened to 2-D at ``axis``: wrong wherever ``axis`` is not the last;
- LayerNormalization and RMSNormalization compute their statistics in the input's type, where the schema computes
  them in ``stash_type`` (float32 by default) and casts back: in float16 a deviation above 256 squares to Inf, the
  variance is Inf and the output 0 (minimol's fp16 check: cosine 0.01 at a LayerNormalization ONNX Runtime
  computes right).

It is also slow where it need not be: numpy has no float16 BLAS, so a float16 Conv, MatMul or Gemm computes its
product in numpy's element-by-element float16 loops (which accumulate in float32 and round each result once): 75
of 90 s per 640x640 sample of a YOLOv8 segmenter went to its Conv nodes.  Those products are computed in float32
BLAS and rounded to float16 once, the same sums in another order; a bias, alpha and beta follow in float16 as in
onnx's kernels (``FLOAT16_BY_BLAS``).  Its Conv also widens a dilated kernel with zeros before its im2col: at a
dilation of 2048 (brainmaze's spindle detector) it asked for a 29 GiB index array.  Float16 and float32 Convs take
``direct_conv`` instead: one strided slice per kernel offset, one BLAS product per group.

``build_evaluator`` installs corrected kernels for these.  An op the evaluator
has no kernel for, or one whose kernel raises on a model ONNX Runtime runs (a
1-D MaxPool with ``auto_pad: SAME_UPPER`` raises IndexError), is an
``EvaluatorCannotRun`` (a ``TargetUnavailable``) naming the op and the node:
validation reports such a row ``unavailable``, never ``error``, which stays
for qdeploy's own failures.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from qdeploy.core.errors import TargetUnavailable
from qdeploy.graph.utils import default_opset

if TYPE_CHECKING:
    import onnx

__all__ = ["FLOAT16_BY_BLAS", "NORMALIZERS", "EvaluatorCannotRun", "build_evaluator", "corrected_kernels",
           "direct_max_pool", "run_evaluator"]

_UNKNOWN_OP = re.compile(r"Node type '([^']+)' from domain '([^']*)' is unknown")


class EvaluatorCannotRun(TargetUnavailable):
    """onnx.reference has no working kernel for an op of this model; ``op_type`` and ``node`` name it."""

    def __init__(self, message: str, op_type: str, node: str | None = None) -> None:
        super().__init__(message)
        self.op_type = op_type
        self.node = node


def build_evaluator(model: onnx.ModelProto) -> Any:
    """A ReferenceEvaluator with qdeploy's corrected kernels; EvaluatorCannotRun when an op has no kernel or its
    kernel refuses the node.  Other failures (not a model the evaluator can read) propagate."""
    from onnx.reference import ReferenceEvaluator

    try:
        return ReferenceEvaluator(model, new_ops=corrected_kernels(model))
    except NotImplementedError as exc:
        found = _UNKNOWN_OP.search(str(exc))
        if found is None:
            raise _cannot_run(exc) from None
        where = f" (domain {found.group(2)})" if found.group(2) else ""
        raise EvaluatorCannotRun(f"onnx.reference has no kernel for {found.group(1)}{where}: the true-precision "
                                 "check cannot run on this model", found.group(1)) from None
    except Exception as exc:
        if _failing_node(exc) is None:
            raise
        raise _cannot_run(exc) from None


def run_evaluator(evaluator: Any, feeds: dict[str, np.ndarray]) -> list[Any]:
    """The evaluator's outputs; a kernel that raises becomes EvaluatorCannotRun naming its op and node."""
    try:
        with np.errstate(all="ignore"):  # float16 overflow shows as Inf in the outputs, where it is measured
            return evaluator.run(None, feeds)
    except Exception as exc:
        if _failing_node(exc) is None:  # not inside a kernel: the evaluator's bookkeeping or the feeds
            raise
        raise _cannot_run(exc) from None


def _cannot_run(exc: Exception) -> EvaluatorCannotRun:
    """EvaluatorCannotRun naming the node whose kernel raised (or '?' when the traceback holds none)."""
    node = _failing_node(exc)
    op_type, name = (node.op_type, node.name) if node is not None else ("?", "")
    label = f"'{name}'" if name else "(unnamed)"
    message = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return EvaluatorCannotRun(f"onnx.reference cannot run {op_type} node {label}: {message}; an evaluator "
                              "limitation, not a measured error of the artifact", op_type, name or None)


def _failing_node(exc: BaseException) -> onnx.NodeProto | None:
    """The ONNX node whose kernel raised: the innermost OpRun frame in the traceback (subgraphs included)."""
    from onnx.reference.op_run import OpRun

    found = None
    trace = exc.__traceback__
    while trace is not None:
        owner = trace.tb_frame.f_locals.get("self")
        if isinstance(owner, OpRun) and getattr(owner, "onnx_node", None) is not None:
            found = owner.onnx_node
        trace = trace.tb_next
    return found


def corrected_kernels(model: onnx.ModelProto) -> list[type]:
    """Replacement kernels for the evaluator's known defects that this model would meet."""
    opset = default_opset(model)
    ops = _op_types(model)
    kernels = []
    if "BatchNormalization" in ops and opset < 14:
        kernels.append(_batch_normalization_kernel())
    if "GlobalMaxPool" in ops:
        kernels.append(_global_max_pool_kernel())
    if "MaxPool" in ops:
        kernels.append(_max_pool_kernel())
    if "Loop" in ops:
        kernels.append(_loop_kernel())
    if "DequantizeLinear" in ops and opset < 19:
        kernels.append(_dequantize_linear_kernel())
    kernels += [_normalizer_kernel(op, coerced=opset < 13) for op in sorted(NORMALIZERS & ops)
                if op == "LogSoftmax" or opset < 13]
    kernels += [_stashed_kernel(op) for op in sorted(STASHED & ops)]
    kernels += [_float16_by_blas_kernel(op) for op in sorted(FLOAT16_BY_BLAS & ops) if op != "Gemm" or opset >= 7]
    return kernels


FLOAT16_BY_BLAS = frozenset({"Conv", "MatMul", "Gemm"})
"""Ops whose float16 products are computed in float32 BLAS and rounded once (as numpy's float16 loops round them);
what onnx's kernels do after the product (a bias, Gemm's alpha and beta) stays in float16 as there.  A float32 Conv
takes the same ``direct_conv``."""


def _float16_by_blas_kernel(op_type: str) -> type:
    """onnx's kernel for ``op_type``, its float16 product computed by ``_product``."""
    from onnx.reference.ops.op_conv import Conv
    from onnx.reference.ops.op_gemm import Gemm_7
    from onnx.reference.ops.op_matmul import MatMul

    base: type = {"Conv": Conv, "MatMul": MatMul, "Gemm": Gemm_7}[op_type]
    finish = {"Conv": _conv_after_product, "MatMul": _matmul_after_product, "Gemm": _gemm_after_product}[op_type]

    own = (np.float16, np.float32) if op_type == "Conv" else (np.float16,)

    def run(self: Any, *inputs: Any, **attributes: Any) -> tuple[Any, ...]:
        if getattr(inputs[0], "dtype", None) not in own:
            return base._run(self, *inputs, **attributes)
        return finish(self, base, *inputs, **attributes)

    return type(op_type, (base,), {"op_domain": "", "_run": run, "__module__": __name__})


def _product(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


def _conv_after_product(self: Any, base: type, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
                        **attributes: Any) -> tuple[np.ndarray]:
    """The convolution in float32 (``direct_conv``), rounded to float16 for a float16 one, then its bias added in
    the input's type (as onnx's kernel adds it)."""
    out = direct_conv(x.astype(np.float32), w.astype(np.float32), **attributes)
    out = _product(out) if x.dtype == np.float16 else out
    if b is None:
        return (out,)
    return (out + b if b.size == 1 else out + b.reshape((1, -1) + (1,) * (out.ndim - 2)),)


def direct_conv(x: np.ndarray, w: np.ndarray, *, auto_pad: str | None = None, dilations: list[int] | None = None,
                group: int | None = None, kernel_shape: list[int] | None = None, pads: list[int] | None = None,
                strides: list[int] | None = None) -> np.ndarray:
    """ONNX Conv without a bias, as one BLAS product per group: the input's window at each kernel offset is a
    strided slice, so a dilated kernel is never widened with zeros.  onnx's kernel widens it: a dilation of 2048
    (brainmaze's spindle detector) asked it for a 29 GiB index array."""
    kernel = tuple(w.shape[2:]) if not kernel_shape else tuple(kernel_shape)
    rank = len(kernel)
    dilation, stride = list(dilations or [1] * rank), list(strides or [1] * rank)
    before, after = _conv_pads(x.shape[2:], kernel, dilation, stride, auto_pad, pads)
    padded = np.pad(x, [(0, 0), (0, 0), *zip(before, after, strict=True)])
    out = [(size - d * (k - 1) - 1) // s + 1 for size, k, d, s in zip(padded.shape[2:], kernel, dilation, stride,
                                                                        strict=True)]
    columns = np.empty(x.shape[:2] + kernel + tuple(out), x.dtype)
    for offset in np.ndindex(*kernel):
        window = tuple(slice(o * d, o * d + s * (n - 1) + 1, s) for o, d, s, n in zip(offset, dilation, stride, out,
                                                                                       strict=True))
        columns[(slice(None), slice(None), *offset)] = padded[(slice(None), slice(None), *window)]
    groups, batch = group or 1, x.shape[0]
    columns = columns.reshape(batch, groups, -1, int(np.prod(out, dtype=np.int64)))
    product = np.matmul(w.reshape(groups, w.shape[0] // groups, -1)[None], columns)
    return product.reshape((batch, w.shape[0], *out))


def _conv_pads(spatial: tuple[int, ...], kernel: tuple[int, ...], dilation: list[int], stride: list[int],
               auto_pad: str | None, pads: list[int] | None) -> tuple[list[int], list[int]]:
    """(pads before, pads after) per spatial axis, ``auto_pad`` SAME_UPPER/SAME_LOWER/VALID resolved."""
    rank = len(kernel)
    if auto_pad in (None, "", "NOTSET"):
        explicit = list(pads or [0] * (2 * rank))
        return explicit[:rank], explicit[rank:]
    if auto_pad == "VALID":
        return [0] * rank, [0] * rank
    total = [max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
             for size, k, d, s in zip(spatial, kernel, dilation, stride, strict=True)]
    small = [t // 2 for t in total]
    large = [t - t // 2 for t in total]
    return (small, large) if auto_pad == "SAME_UPPER" else (large, small)


def _matmul_after_product(self: Any, base: type, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray]:
    return (_product(np.matmul(a.astype(np.float32), b.astype(np.float32))),)


def _gemm_after_product(self: Any, base: type, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None,
                        alpha: float | None = None, beta: float | None = None, transA: int | None = None,
                        transB: int | None = None) -> tuple[np.ndarray]:
    """onnx's ``dot(a, b) * alpha + c * beta`` with the dot in float32 rounded to float16, the rest in float16."""
    left, right = (a.T if transA else a), (b.T if transB else b)
    out = _product(np.dot(left.astype(np.float32), right.astype(np.float32))) * alpha
    if c is not None and beta != 0:
        out += c * beta
    return (out.astype(a.dtype),)


def _op_types(model: onnx.ModelProto) -> set[str]:
    """Op types of the default domain anywhere in the model, subgraphs included."""
    found: set[str] = set()
    pending = [model.graph]
    while pending:
        graph = pending.pop()
        for node in graph.node:
            if node.domain in ("", "ai.onnx"):
                found.add(node.op_type)
            for attr in node.attribute:
                pending.extend([attr.g] if attr.HasField("g") else [])
                pending.extend(attr.graphs)
    return found


def _batch_normalization_kernel() -> type:
    """Opsets 6-13: a node with one output is inference; Y = scale * (x - mean) / sqrt(var + eps) + B."""
    from onnx.reference.op_run import OpRun

    def run(self: Any, x: np.ndarray, scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray,
            epsilon: float | None = None, **_: Any) -> tuple[np.ndarray]:
        if len(self.onnx_node.output) > 1:
            raise NotImplementedError("training-mode BatchNormalization (more than one output) before opset 14")
        shape = (-1,) + (1,) * (x.ndim - 2)  # per channel, broadcast over the spatial axes
        eps = 1e-5 if epsilon is None else epsilon
        y = scale.reshape(shape) * (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) + bias.reshape(shape)
        return (y.astype(x.dtype),)

    # onnx.reference takes a replacement kernel by its class name and op_domain, for every opset version
    return type("BatchNormalization", (OpRun,), {"op_domain": "", "_run": run})


def _global_max_pool_kernel() -> type:
    """Max over every spatial axis (2 .. rank - 1), keeping them as 1."""
    from onnx.reference.op_run import OpRun

    def run(self: Any, x: np.ndarray) -> tuple[np.ndarray]:
        return (x.max(axis=tuple(range(2, x.ndim)), keepdims=True),)

    return type("GlobalMaxPool", (OpRun,), {"op_domain": "", "_run": run})


def _max_pool_kernel() -> type:
    """MaxPool as one ``np.maximum`` per kernel offset over strided slices of the padded input (``direct_max_pool``):
    onnx's kernel loops over every output element in Python: PP-OCRv6's tiny detector (one 2x2 MaxPool at 480x640)
    spent about 2 of its fp16 stage's 7 minutes there.  A maximum is exact in any precision: the same values.  The
    Indices output, ceil_mode and integer inputs stay with onnx's kernel."""
    from onnx.reference.ops.op_max_pool import MaxPool

    def run(self: Any, x: np.ndarray, **attributes: Any) -> tuple[np.ndarray, ...]:
        if attributes.get("ceil_mode") or len([out for out in self.onnx_node.output if out]) > 1 \
                or x.dtype.kind != "f":
            return MaxPool._run(self, x, **attributes)
        return (direct_max_pool(x, **{key: value for key, value in attributes.items()
                                     if key not in ("ceil_mode", "storage_order")}),)

    return type("MaxPool", (MaxPool,), {"op_domain": "", "_run": run, "__module__": __name__})


def direct_max_pool(x: np.ndarray, *, kernel_shape: list[int], auto_pad: str | None = None,
                    dilations: list[int] | None = None, pads: list[int] | None = None,
                    strides: list[int] | None = None) -> np.ndarray:
    """ONNX MaxPool (floor mode): the maximum over each window, padding never chosen."""
    kernel = tuple(kernel_shape)
    rank = len(kernel)
    dilation, stride = list(dilations or [1] * rank), list(strides or [1] * rank)
    before, after = _conv_pads(x.shape[2:], kernel, dilation, stride, auto_pad, pads)
    padded = np.pad(x, [(0, 0), (0, 0), *zip(before, after, strict=True)], constant_values=-np.inf)
    out = [(size - d * (k - 1) - 1) // s + 1 for size, k, d, s in zip(padded.shape[2:], kernel, dilation, stride,
                                                                        strict=True)]
    result = np.full(x.shape[:2] + tuple(out), -np.inf, x.dtype)
    for offset in np.ndindex(*kernel):
        window = tuple(slice(o * d, o * d + s * (n - 1) + 1, s) for o, d, s, n in zip(offset, dilation, stride, out,
                                                                                       strict=True))
        np.maximum(result, padded[(slice(None), slice(None), *window)], out=result)
    return result


def _loop_kernel() -> type:
    """onnx's Loop with its scan outputs stacked on a new first axis, as the schema says, not ``np.vstack``ed: an
    iteration's ``[1, 300]`` became rows of ``[12, 300]`` instead of ``[12, 1, 300]`` (chars2vec's Keras LSTM as a
    Loop: the Transpose after it failed, and the fp16 row was unavailable).  Each iteration's scan values are
    recorded as the body returns them and stacked after onnx's loop."""
    from onnx.reference.ops.op_loop import Loop

    def run(self: Any, *inputs: Any, **attributes: Any) -> tuple[Any, ...]:
        if not self.K:
            return Loop._run(self, *inputs, **attributes)
        body, scans = self._run_body, []

        def recording(*args: Any, **kwargs: Any) -> Any:
            outputs = body(*args, **kwargs)
            scans.append(outputs[-self.K:])
            return outputs

        self._run_body = recording
        try:
            results = list(Loop._run(self, *inputs, **attributes))
        finally:
            self._run_body = body
        for k in range(self.K):
            results[self.N + k] = np.stack([values[k] for values in scans])
        return tuple(results)

    return type("Loop", (Loop,), {"op_domain": "", "_run": run, "__module__": __name__})


NORMALIZERS = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
"""Ops normalising over ``axis``: before opset 13 over the input flattened to 2-D there, from 13 over one axis."""


def _normalizer_kernel(op_type: str, *, coerced: bool) -> type:
    """``op_type`` over the input's axis (opset 13 on) or its trailing axes from ``axis`` (``coerced``, before 13);
    LogSoftmax as ``x - max - log(sum(exp(x - max)))`` with the sum in float32, rounded once to the input's type."""
    from onnx.reference.op_run import OpRun

    def run(self: Any, x: np.ndarray, **_: Any) -> tuple[np.ndarray]:
        if x.size == 0:
            return (x,)
        # the node's own attribute: onnx fills a missing one with the newest schema's default (-1), not its opset's
        axis = next((attr.i for attr in self.onnx_node.attribute if attr.name == "axis"), 1 if coerced else -1)
        axis = axis + x.ndim if axis < 0 else axis
        values = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1) if coerced else x
        last = 1 if coerced else axis
        return (_normalize(op_type, values, last).reshape(x.shape),)

    return type(op_type, (OpRun,), {"op_domain": "", "_run": run, "__module__": __name__})


def _normalize(op_type: str, x: np.ndarray, axis: int) -> np.ndarray:
    if op_type == "Hardmax":
        chosen = np.expand_dims(np.argmax(x, axis=axis), axis)
        out = np.zeros_like(x)
        np.put_along_axis(out, chosen, 1, axis=axis)
        return out
    shifted = x.astype(np.float32) - x.max(axis=axis, keepdims=True).astype(np.float32)
    total = np.exp(shifted).sum(axis=axis, keepdims=True)
    return (shifted - np.log(total) if op_type == "LogSoftmax" else np.exp(shifted) / total).astype(x.dtype)


STASHED = frozenset({"LayerNormalization", "RMSNormalization"})
"""Normalisations whose statistics the schema computes in ``stash_type`` (float32 by default), not the input's type."""


def _stashed_kernel(op_type: str) -> type:
    """onnx's kernel for ``op_type`` run on float32 copies of float16 inputs (the schema's function casts to
    ``stash_type``, float32, the only one onnx's kernels take), its outputs cast back to float16."""
    from onnx.reference.ops._op_list import load_op

    base: type = load_op("", op_type)

    def run(self: Any, *inputs: Any, **attributes: Any) -> tuple[Any, ...]:
        if attributes.get("stash_type") not in (None, 1) or getattr(inputs[0], "dtype", None) != np.float16:
            return base._run(self, *inputs, **attributes)
        wide = base._run(self, *(None if item is None else item.astype(np.float32) for item in inputs), **attributes)
        return tuple(out.astype(np.float16) for out in wide)

    return type(op_type, (base,), {"op_domain": "", "_run": run, "__module__": __name__})


def _dequantize_linear_kernel() -> type:
    """DequantizeLinear-10/13 compute what -19 does for the types they allow, so the -19 kernel serves them."""
    from onnx.reference.ops.op_dequantize_linear import DequantizeLinear_19

    def run(self: Any, x: Any, x_scale: Any, x_zero_point: Any = None, axis: int = 1, **_: Any) -> Any:
        return DequantizeLinear_19._run(self, x, x_scale, x_zero_point, axis=axis)

    return type("DequantizeLinear", (DequantizeLinear_19,), {"op_domain": "", "_run": run})
