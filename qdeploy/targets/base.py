"""What every target adapter is: availability, a ``Session`` that runs feeds and records what really ran."""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypedDict

import numpy as np

from qdeploy.core.errors import DataError, ModelError, TargetUnavailable
from qdeploy.core.onnx_wire import load_model
from qdeploy.graph.utils import graph_inputs
from qdeploy.targets.bound import BoundCall

__all__ = ["INT8_ORT_OPS", "ExecutionInfo", "ExecutionInfoDict", "Session", "TargetAdapter", "TargetFellBack",
           "check_feeds", "not_here", "onnx_io_names", "short_message"]

log = logging.getLogger(__name__)

_MAX_MESSAGE = 700

INT8_ORT_OPS = frozenset({
    "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm", "QLinearAdd", "QLinearMul",
    "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearConcat", "QLinearSigmoid", "QLinearLeakyRelu",
    "QLinearSoftmax", "QLinearWhere", "QLinearReduceMean", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
    "QAttention", "DynamicQuantizeLSTM", "QLinearConvTranspose"})
"""ONNX Runtime kernels that compute in int8 (the QDQ fusions and the integer ops)."""




class TargetFellBack(TargetUnavailable):
    """The target exists but the runtime ran the model elsewhere (e.g. CUDA fell back to the CPU provider).

    A failure of that target, not a missing one: validation reports it as ``failed``.  It derives from
    ``TargetUnavailable`` so that callers that only know that class still never report a substitute.
    """


class ExecutionInfoDict(TypedDict):
    """``ExecutionInfo.to_dict()``: a row's ``execution`` (see ``ExecutionInfo`` for each key)."""

    target: str
    runtime: str
    device: str
    providers: list[str]
    precision: str | None
    node_counts: dict[str, int]
    notes: list[str]
    op_types: dict[str, int]
    precisions: dict[str, int]
    unsupported_ops: list[str]


@dataclass
class ExecutionInfo:
    """What really ran; JSON-serialisable through ``to_dict``.

    ``node_counts``: ORT: distinct kernels (nodes of the optimized graph) per
    execution provider, read from the profile of the session's first run (empty
    until then); OpenVINO: compute layers of the runtime model per runtime
    precision, named "FP32", "BF16", "FP16", "I8", "U8", ...  (inputs, outputs
    and constants are not counted); reference: nodes.
    ``op_types``: ORT: kernels per op type of the first run (e.g. "QLinearConv");
    OpenVINO: runtime layers per layer type; reference: nodes per op type.
    ``precisions``: what the compute ran in, in OpenVINO's names: ORT: kernels
    per element type of their first input (an fp16 graph on ORT's CPU provider
    shows "FP32" where ORT inserted casts around ops it has no fp16 kernel for);
    OpenVINO: layers per runtime precision; reference: empty (declared types).
    ``unsupported_ops``: OpenVINO: ops ``query_model`` says the device lacks.
    """

    target: str
    runtime: str
    device: str
    providers: list[str]
    precision: str | None
    node_counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    op_types: dict[str, int] = field(default_factory=dict)
    precisions: dict[str, int] = field(default_factory=dict)
    unsupported_ops: list[str] = field(default_factory=list)

    def to_dict(self) -> ExecutionInfoDict:
        return ExecutionInfoDict(**asdict(self))


class Session:
    """A loaded model on one target: ``run(feeds) -> outputs by ONNX output name``."""

    target: str
    input_names: list[str]
    output_names: list[str]
    executed: ExecutionInfo

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def bind(self, feeds: dict[str, np.ndarray]) -> BoundCall:
        """The call with `feeds` bound once, for timing; see ``BoundCall``."""
        check_feeds(self.target, self.input_names, feeds)
        return BoundCall(self, feeds)

    def runtime_settings(self) -> dict[str, Any]:
        """Threads, streams and hints the runtime really uses, read back from the loaded model; {} when unknown."""
        return {}

    def close(self) -> None:
        """Release what the session holds; the default holds nothing extra."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TargetAdapter:
    """One runtime's way to check, load and run models on one device."""

    runtime: ClassVar[str] = ""
    benchmarkable: ClassVar[bool] = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.device = name.split(":", 1)[1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def availability(self) -> tuple[bool, str]:
        """(True, "") when the target can run here, else (False, reason). Never raises."""
        raise NotImplementedError

    def load(self, model_path: Path, *, threads: int | None = None, pin_f32: bool = True) -> Session:
        raise NotImplementedError

    def _require_available(self, model_path: Path) -> None:
        ok, reason = self.availability()
        if not ok:
            raise TargetUnavailable(reason)
        if not Path(model_path).is_file():
            raise ModelError(f"model file not found: {model_path}")


_SOURCE_LOCATIONS = re.compile(r"(Exception from|[Cc]heck '[^']*' failed at|failed at) \S+\.(?:cpp|hpp|h|cc):\d+:\s*")
"""Where in a runtime's C++ sources an error was raised (OpenVINO prefixes every level with one): noise to a user,
and it pushes the cause ("The input data tensor's rank has to be known") past any length limit."""


def not_here(target: str, cause: str) -> str:
    """Why ``target`` cannot run on this machine, true whoever asks: a recipe that names it, or `qdeploy doctor`
    listing every known target (never "requested").  The reports show the part after "; " (verdict.short_reason)."""
    return f"target {target} is not available here; {cause}"


def short_message(exc: BaseException) -> str:
    """An exception's message on one line without C++ source locations; a long one keeps its start and its end
    (where runtimes put the cause and their summary)."""
    text = _SOURCE_LOCATIONS.sub("", " ".join(str(exc).split())).strip() or type(exc).__name__
    if len(text) <= _MAX_MESSAGE:
        return text
    half = (_MAX_MESSAGE - 5) // 2
    return f"{text[:half]} ... {text[-half:]}"


def check_feeds(target: str, input_names: list[str], feeds: dict[str, np.ndarray]) -> None:
    missing = [name for name in input_names if name not in feeds]
    unknown = sorted(set(feeds) - set(input_names))
    if missing or unknown:
        raise DataError(f"target {target}: feeds {sorted(feeds)} do not match the model inputs {input_names}"
                        f" (missing {missing}, unknown {unknown})")


def onnx_io_names(model_path: Path) -> tuple[list[str], list[str]]:
    """Real input names (initializers excluded) and output names as the ONNX graph declares them."""

    try:
        model = load_model(model_path, load_external_data=False)
    except Exception as exc:
        raise ModelError(f"{Path(model_path).name}: not a readable ONNX model: {short_message(exc)}") from None
    inputs = [value.name for value in graph_inputs(model.graph)]
    return inputs, [value.name for value in model.graph.output]
