"""The export stage: the root of every variant.

Takes an ONNX file (external data included) or builds a PyTorch model from a
user's factory and exports it; applies input shape overrides and an optional
opset conversion; checks the result.  Its config is the recipe's `model`
section.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.calibration.readers import InputInfo, check_sample_fits, inputs_of
from qdeploy.core.context import StageResult
from qdeploy.core.errors import DataError, ModelError
from qdeploy.core.memory import available_memory
from qdeploy.core.usercode import UserCodeError, call_user, import_user_module
from qdeploy.core.userfiles import check_regular_file
from qdeploy.graph.external_data import STREAM_ABOVE_BYTES, check_without_weights, needs_external_data
from qdeploy.graph.names import name_nodes_uniquely
from qdeploy.graph.rewrites import RewriteReport, apply_rewrites, available
from qdeploy.graph.utils import default_opset, model_bytes
from qdeploy.stages.export._causal_lm_child import export_causal_lm_here_or_apart
from qdeploy.stages.export._causal_lm_source import (
    causal_lm_files,
    causal_lm_inputs,
    causal_lm_tokenizer,
)
from qdeploy.stages.export._exporter import example_inputs, export_with_torch
from qdeploy.stages.export._factory import check_factory
from qdeploy.stages.export._freeze import freeze_inputs
from qdeploy.stages.export._inference import check_inferred_types, check_loads_in_onnxruntime
from qdeploy.stages.export._intake import (
    densify_sparse,
    initializers_out_of_inputs,
    inline_functions,
    merge_opset_imports,
    raise_ir_version,
    rename_runtime_names,
)
from qdeploy.stages.export._model import (
    check_declared_shapes,
    check_feedable_inputs,
    check_has_outputs,
    external_data_sources,
    external_slices,
    load_onnx,
    model_size_on_disk,
)
from qdeploy.stages.export._old_opsets import PER_CHANNEL_PRELU_UNTIL, per_channel_prelu_slopes
from qdeploy.stages.export._shapes import reinfer_output_shapes
from qdeploy.stages.export._stft import portable_stft
from qdeploy.stages.export._unfuse import unfuse_runtime_ops
from qdeploy.stages.export._values import frozen_arrays
from qdeploy.stages.export.config import ExportConfig, InputSpec, TorchSource
from qdeploy.stages.export.findings import ExportFindings, ExportRecord, ShapeChangeRecord

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.context import Artifact, StageContext

# what other packages use; the rest of this module is the stage's own
__all__ = ["ExportConfig", "apply_input_overrides", "causal_lm_tokenizer", "check_factory", "export_module",
           "inspect_source", "model_size_on_disk", "run", "source_files"]

log = logging.getLogger(__name__)

def run(artifact: Artifact | None, config: ExportConfig, ctx: StageContext) -> StageResult:
    """The exported model: loaded or exported, shapes overridden, converted to the asked opset, checked."""
    findings: ExportRecord = {}
    if config.onnx is not None:
        model = load_onnx(ctx.resolve(config.onnx), max_bytes=size_cap(config))
        findings["source"] = "onnx"
    elif config.causal_lm is not None:
        model, causal_findings = export_causal_lm_here_or_apart(config, ctx)  # a large one in a child process
        findings.update(causal_findings)
    else:
        assert config.torch is not None
        model, torch_findings = export_torch(config, ctx)
        findings.update(torch_findings)
    source = config.onnx or (config.torch.factory if config.torch else "") or (
        config.causal_lm.label() if config.causal_lm else "")
    try:
        model = _prepare(model, config, findings, ctx.resolve)
    except ModelError as exc:
        raise ModelError(f"model {source}: {exc}") from None
    return StageResult(model=model, changed=True, findings=ExportFindings.model_validate(findings))


def _prepare(model: onnx.ModelProto, config: ExportConfig, findings: ExportRecord,
             resolve: Callable[[str], Path] = Path, *, validate_graph: bool = True,
             confirm_runtime: bool = True) -> onnx.ModelProto:
    """Shape overrides, frozen inputs, opset conversion and the checks every later stage relies on; with
    ``confirm_runtime``, ONNX Runtime must load the result (when it is in memory with its weights)."""
    merge_opset_imports(model, findings)
    densify_sparse(model, findings)
    unfuse_runtime_ops(model, findings)
    rename_runtime_names(model, findings)
    initializers_out_of_inputs(model, {spec.name for spec in config.inputs or []}, findings)
    model = inline_functions(model, findings)
    portable_stft(model, findings)
    findings["opset_in"] = default_opset(model)
    check_has_outputs(model)
    check_feedable_inputs(model)
    if config.inputs and config.torch is None:  # a torch export took its shapes (and dynamic axes) already
        frozen = frozen_arrays(config.inputs, model, resolve)  # checked against the model's declarations first
        findings["output_shapes_reinferred"] = apply_input_overrides(model, config.inputs)
        findings.update(freeze_inputs(model, frozen))
    elif config.torch is not None and torch_dynamic_axes(config):
        # outputs the exporter cannot relate to a named input axis are declared at the example's sizes
        findings["output_shapes_reinferred"] = reinfer_output_shapes(model)
    if config.opset is not None and config.opset != default_opset(model):
        model = convert_opset(model, config.opset, findings)
    raise_ir_version(model, findings)  # the converter keeps the IR version its opset may have outgrown
    findings["opset"] = default_opset(model)
    check_input_ranks(model)
    made_symbolic = check_declared_shapes(model)
    if made_symbolic:
        findings["minus_one_dims_named"] = made_symbolic
    custom_ops = check_known_ops(model)
    findings["custom_ops"] = custom_ops
    _name_nodes(model, findings)
    check_model(model, with_checker=validate_graph)
    if validate_graph and confirm_runtime and not custom_ops:
        check_loads_in_onnxruntime(model)  # what the run's reference needs; custom fake-quant ops wait for lowering
    return model


def _name_nodes(model: onnx.ModelProto, findings: ExportRecord) -> None:
    """Every node named, no name twice, once for every later stage: ONNX Runtime refuses repeated names, and
    qdeploy finds nodes by name (keep-float and block lists, budgets, localisation, reports)."""
    naming = name_nodes_uniquely(model)
    if naming.changed:
        findings["node_names"] = naming.summary()
        log.info("named %d nameless nodes and renamed %d repeated names (e.g. %s)", naming.unnamed,
                 naming.duplicates, "; ".join(naming.examples[:2]))


def inspect_source(config: ExportConfig, resolve: Callable[[str], Path]) -> list[InputInfo]:
    """What `qdeploy check` can know of the model without running anything: the file, its external data's
    places, its interface after the recipe's overrides, its ops and types; or, for torch, the size of the declared
    inputs; for causal_lm, the interface from the checkpoint's config (nothing exported).  Returns the inputs the
    exported model will have (what datasets must fit)."""
    if config.causal_lm is not None:
        return causal_lm_inputs(config.causal_lm, resolve)
    if config.onnx is None:
        check_recipe_inputs_fit(config.inputs)
        return _declared_inputs(config.inputs)
    path = resolve(config.onnx)
    model = load_onnx(path, max_bytes=size_cap(config), external_data=False)
    try:  # onnx's checker needs the external data in memory: without it, the checks before it still run
        opset_kept = config.opset is None or config.opset == default_opset(model)
        model = _prepare(model, config.model_copy(update={"opset": None}), {}, resolve,
                         validate_graph=not external_slices(model, path.parent),
                         confirm_runtime=opset_kept)  # a converted model is only known to the run
    except ModelError as exc:
        raise ModelError(f"model {config.onnx}: {exc}") from None
    return inputs_of(model)


def _declared_inputs(inputs: list[InputSpec]) -> list[InputInfo]:
    """The recipe's input specs as the readers see inputs (named dimensions unknown)."""
    import numpy as np


    return [InputInfo(spec.name, tuple(d if isinstance(d, int) else None for d in spec.shape or ()),
                      np.dtype(spec.dtype)) for spec in inputs]


def check_recipe_inputs_fit(inputs: list[InputSpec]) -> None:
    """One sample of the recipe's declared inputs (named dimensions as 1) must fit in memory."""
    try:
        check_sample_fits(_declared_inputs(inputs), "model.inputs")
    except DataError as exc:
        raise ModelError(str(exc)) from None


def source_files(config: ExportConfig, ctx: StageContext) -> list[Path]:
    """Files whose contents decide the export (they enter its cache key): frozen inputs' .npy values included."""
    if config.onnx is not None:
        model_file = check_regular_file(ctx.resolve(config.onnx), "model file")  # hashed next: never a FIFO or device
        values = [check_regular_file(ctx.resolve(spec.value), f"value file of input '{spec.name}'")
                  for spec in config.inputs if isinstance(spec.value, str)]
        return [model_file, *external_data_sources(model_file), *values]
    if config.causal_lm is not None:
        return causal_lm_files(config.causal_lm, ctx.resolve)
    assert config.torch is not None
    files = []
    module_part = config.torch.factory.rsplit(":", 1)[0]
    if module_part.endswith(".py"):
        files.append(check_regular_file(ctx.resolve(module_part), "factory file"))
    if config.torch.weights:
        files.append(check_regular_file(ctx.resolve(config.torch.weights), "weights file"))
    return files


def size_cap(config: ExportConfig) -> int:
    """Bytes of model qdeploy will load: the recipe's cap, or 70% of the memory available now."""
    if config.max_size_mb is not None:
        return int(config.max_size_mb * 1e6)
    return int(0.7 * available_memory())


RUNTIME_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.preview.training"})
"""Op domains ONNX Runtime implements (the standard ones and its contrib ops)."""
ORT_LAYOUT_DOMAINS = frozenset({"com.microsoft.nchwc", "com.ms.internal.nhwc"})
"""ONNX Runtime's internal layout domains (NCHWc blocked convolutions, NHWC kernels): hardware-specific."""
LOWERABLE_OPS = frozenset({"FakeQuantize", "fake_quantization", "min_max_observer", "moving_average_min_max_observer"})
"""Custom fake-quant ops that `quantize: {mode: lower}` turns into QuantizeLinear/DequantizeLinear."""


def check_known_ops(model: onnx.ModelProto) -> list[dict[str, str]]:
    """Refuse ops no runtime knows (naming the node); list the custom fake-quant ops that lowering handles."""
    import onnx

    local_functions = {(function.domain, function.name) for function in model.functions}
    lowerable = []
    for node in _all_nodes(model.graph):
        if not all(isinstance(text, str) for text in (node.name, node.op_type, node.domain)):
            # protobuf hands back bytes for strings that are not valid UTF-8: a damaged file
            raise ModelError(f"a node's name, op type or domain is not valid text ({node.op_type!r}); "
                             "the file is damaged")
        known = (node.domain, node.op_type) in local_functions or (
            node.domain in RUNTIME_DOMAINS and (node.domain == "com.microsoft" or onnx.defs.has(node.op_type,
                                                                                                 node.domain)))
        if known:
            continue
        entry = {"node": node.name, "op_type": node.op_type, "domain": node.domain or "ai.onnx"}
        if node.op_type in LOWERABLE_OPS:
            lowerable.append(entry)
            continue
        if node.domain in ORT_LAYOUT_DOMAINS:
            raise ModelError(f"node '{node.name}' is op '{node.op_type}' of domain '{node.domain}', a layout op "
                             "ONNX Runtime writes into a model it saves at ORT_ENABLE_ALL, for the CPU that saved "
                             "it and read by no other runtime: give qdeploy the model before ONNX Runtime "
                             "optimized it (or one saved at ORT_ENABLE_EXTENDED)")
        raise ModelError(f"node '{node.name}' is op '{node.op_type}' of domain '{entry['domain']}', which neither "
                         "ONNX Runtime nor OpenVINO knows; replace it in the exporter or decompose it into standard "
                         "ops before qdeploy")
    return lowerable


def _all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes of a graph and of every subgraph inside it (If/Loop/Scan bodies)."""
    import onnx

    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                nodes += _all_nodes(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    nodes += _all_nodes(subgraph)
    return nodes


def check_input_ranks(model: onnx.ModelProto) -> None:
    """Every real input needs a known rank: later stages shape data and calibration from it."""
    initializers = {init.name for init in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            raise ModelError(f"input '{value.name}' has an unknown rank; give its shape in the recipe's model.inputs "
                             f"(e.g. - {{name: {value.name}, shape: [1, 3, 224, 224]}})")


def apply_input_overrides(model: onnx.ModelProto, inputs: list[InputSpec]) -> dict[str, ShapeChangeRecord]:
    """Fix or name input dimensions as the recipe says; output shapes are inferred again (those changed returned)."""
    from onnx import helper


    by_name = {value.name: value for value in model.graph.input}
    for spec in inputs:
        if spec.name not in by_name:
            raise ModelError(f"model.inputs names '{spec.name}'; the model's inputs are {sorted(by_name)}")
        tensor_type = by_name[spec.name].type.tensor_type
        declared = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name if tensor_type.elem_type else None
        # a frozen input takes the model's type unless the recipe says one (its value is cast to it)
        said = spec.value is None or "dtype" in spec.model_fields_set
        if declared and said and declared != spec.dtype:
            raise ModelError(f"model.inputs '{spec.name}' says dtype {spec.dtype}; the model declares {declared}")
        if spec.shape is None or spec.value is not None:  # a frozen input's shape is its value's
            continue
        if tensor_type.HasField("shape") and len(tensor_type.shape.dim) not in (0, len(spec.shape)):
            raise ModelError(f"model.inputs '{spec.name}' has rank {len(spec.shape)}; "
                             f"the model's input has rank {len(tensor_type.shape.dim)}")
        tensor_type.shape.Clear()
        for dim in spec.shape:
            entry = tensor_type.shape.dim.add()
            if isinstance(dim, int):
                entry.dim_value = dim
            else:
                entry.dim_param = dim
    overridden = any(spec.shape is not None and spec.value is None for spec in inputs)
    return reinfer_output_shapes(model) if overridden else {}


def convert_opset(model: onnx.ModelProto, opset: int, findings: ExportRecord | None = None) -> onnx.ModelProto:
    """Convert to another opset through onnx's version converter; name the node that cannot be converted.

    Going down, ops that do not exist yet at ``opset`` and that a rewrite of ``qdeploy.graph.rewrites`` decomposes
    (Gelu, HardSwish, LayerNormalization) are decomposed first, as an exporter's op mapper would.
    """
    from onnx import version_converter

    if opset < default_opset(model):
        decomposed = decompose_for_opset(model, opset)
        if findings is not None and decomposed:
            findings["decomposed_for_opset"] = decomposed
    mended = per_channel_prelu_slopes(model) if default_opset(model) <= PER_CHANNEL_PRELU_UNTIL < opset else []
    if findings is not None and mended:
        findings["prelu_slopes_per_channel"] = mended
    try:
        return version_converter.convert_version(model, opset)
    except Exception as exc:
        raise ModelError(_conversion_failure(model, opset, exc)) from None


def decompose_for_opset(model: onnx.ModelProto, opset: int) -> dict[str, int]:
    """Apply the decompositions of ops that ``opset`` lacks; {rewrite: nodes rewritten}."""
    present = {node.op_type for node in model.graph.node if node.domain in ("", "ai.onnx")}
    wanted = [name for name, rule in available().items() if not rule.default
              and any(anchor in present and not _exists_at(anchor, opset) for anchor in rule.anchors)]
    if not wanted:
        return {}
    report = RewriteReport()
    apply_rewrites(model, wanted, report)
    return {name: count for name, count in report.applied.items() if count}


def _exists_at(op_type: str, opset: int) -> bool:
    import onnx

    try:
        onnx.defs.get_schema(op_type, max_inclusive_version=opset)
    except onnx.defs.SchemaError:
        return False
    return True


def _conversion_failure(model: onnx.ModelProto, opset: int, exc: Exception) -> str:
    """What failed in a conversion: the op and its nodes when the converter's message names an op."""
    import re

    text = " ".join(str(exc).split())
    detail = text.split("failed: ", 1)[-1] if "failed: " in text else text
    ops = {node.op_type for node in model.graph.node}
    named = [op for op in re.findall(r"(?:of|for|op_type:)\s*([A-Za-z_][A-Za-z0-9_]*)", text) if op in ops]
    where = ""
    if named:
        nodes = [node.name or node.output[0] for node in model.graph.node if node.op_type == named[0]]
        shown = ", ".join(f"'{name}'" for name in nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
        where = f"op {named[0]} (node {shown}) cannot be converted: "
        if not _exists_at(named[0], opset):
            where = f"op {named[0]} (node {shown}) does not exist at opset {opset}: "
    return (f"cannot convert from opset {default_opset(model)} to {opset}: {where}{detail}. Remove 'model.opset', "
            f"choose an opset the ops support, or re-export the model at that opset")


def check_model(model: onnx.ModelProto, *, with_checker: bool = True) -> None:
    """The opset known to onnx, onnx's checker (``with_checker``: it needs the weights in memory), then strict type
    and shape inference (never the weights)."""
    import onnx

    supported = onnx.defs.onnx_opset_version()
    if default_opset(model) > supported:
        raise ModelError(f"the model uses opset {default_opset(model)}; the installed onnx {onnx.__version__} knows "
                         f"opsets up to {supported}: set model.opset to {supported} or lower, or upgrade onnx")
    if not with_checker:
        pass
    elif needs_external_data(model):
        pass  # the in-memory checker refuses >2 GB protos: the runner checks the saved file (check_saved_model)
    elif model_bytes(model) > STREAM_ABOVE_BYTES:
        check_without_weights(model)  # in memory, the checker would hold two more copies of every weight
    else:
        _check_in_memory(model)
    # the checker passes graphs ONNX Runtime refuses (types that do not match their ops): full_check's inference
    check_inferred_types(model)


def _check_in_memory(model: onnx.ModelProto) -> None:
    import onnx

    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise ModelError(f"the model is not a valid ONNX graph: {first}") from None
    except UnicodeDecodeError as exc:  # a damaged file whose names or strings are not UTF-8
        raise ModelError(f"the model holds text that is not UTF-8 ({exc.reason} at byte {exc.start}); "
                         "the file is damaged or not an ONNX model") from None


def export_torch(config: ExportConfig, ctx: StageContext) -> tuple[onnx.ModelProto, ExportRecord]:
    """Build the user's nn.Module, export it and compare the export with PyTorch's own outputs."""
    assert config.torch is not None
    module = build_torch_module(config.torch, ctx)
    # tracing runs the user's forward: an exit there is the user's code failing (qdeploy.core.usercode)
    return call_user(f"the forward of model.torch.factory {config.torch.factory} (exporting it)", export_module,
                     module, config, ctx.work_dir, ctx.variant)


def export_module(module: Any, config: ExportConfig, work_dir: Path,
                  variant: str = "exported") -> tuple[onnx.ModelProto, ExportRecord]:
    """Export an nn.Module with the config's inputs (names, shapes, symbolic axes, opset) and compare the
    export with PyTorch's own outputs.  ``config.torch`` sets the exporter (``auto`` when absent)."""
    torch = _import_torch()
    source = config.torch or TorchSource(factory="<in-memory>:module")
    example = tuple(torch.from_numpy(array) for array in example_inputs(config.inputs).values())
    path = work_dir / "exported.onnx"
    names = [spec.name for spec in config.inputs]
    dynamic_axes = torch_dynamic_axes(config.model_copy(update={"torch": source})) or None

    exported = export_with_torch(torch, module, example, path, names=names, opset=config.opset,
                                 dynamic_axes=dynamic_axes, exporter=source.exporter, variant=variant)
    model = load_onnx(path)
    max_err = _compare_with_torch(module, example, path)
    return model, {"source": "torch", **exported, "torch_version": torch.__version__, "max_abs_err_vs_torch": max_err}


def torch_dynamic_axes(config: ExportConfig) -> dict[str, dict[int, str]]:
    """Symbolic axes of a torch export: ``torch.dynamic`` plus the named dimensions of ``inputs`` shapes."""
    assert config.torch is not None
    axes = {name: dict(dims) for name, dims in config.torch.dynamic.items()}
    for spec in config.inputs:
        for axis, dim in enumerate(spec.shape or []):
            if isinstance(dim, str):
                axes.setdefault(spec.name, {})[axis] = dim
    return axes


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ModelError("model.torch needs PyTorch: pip install torch==2.13.0 (the CPU build), "
                         "or export the model to ONNX and use model.onnx") from None
    return torch


def build_torch_module(source: TorchSource, ctx: StageContext) -> Any:
    """Call the factory ('file.py:fn' or 'pkg.mod:fn'); load weights with weights_only=True."""
    torch = _import_torch()
    module_part, function = source.factory.rsplit(":", 1)
    python_module = _import_factory_module(module_part, ctx)
    if not hasattr(python_module, function):
        raise ModelError(f"model.torch.factory: '{module_part}' has no callable '{function}'")
    try:
        module = call_user(f"model.torch.factory {source.factory}", getattr(python_module, function))
    except UserCodeError:  # it exited or timed out: already said whose
        raise
    except Exception as exc:  # the user's code failing, not qdeploy: say whose and what
        log.debug("model.torch.factory %s raised", source.factory, exc_info=True)
        raise ModelError(f"model.torch.factory {source.factory} raised {type(exc).__name__}: {exc} (the factory "
                         "failed before qdeploy exported anything: fix it and run again)") from None
    if source.weights:
        try:
            state = torch.load(ctx.resolve(source.weights), map_location="cpu", weights_only=True)
            module.load_state_dict(state)
        except Exception as exc:
            raise ModelError(f"model.torch.weights '{source.weights}': cannot load a state_dict with "
                             f"weights_only=True: {exc}") from None
    return module.eval()


def _import_factory_module(module_part: str, ctx: StageContext) -> Any:
    try:
        path = ctx.resolve(module_part) if module_part.endswith(".py") else None
        return import_user_module(module_part, path, label="factory")
    except Exception as exc:
        raise ModelError(f"model.torch.factory: cannot import '{module_part}': {type(exc).__name__}: {exc}") from None


def _compare_with_torch(module: Any, example: tuple[Any, ...], path: Path) -> float:
    import numpy as np
    import onnxruntime as ort
    import torch

    with torch.no_grad():
        expected = module(*example)
    expected_list = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {info.name: tensor.numpy() for info, tensor in zip(session.get_inputs(), example, strict=True)}
    got = session.run(None, feeds)
    return max(float(np.max(np.abs(e.numpy().astype(np.float64) - g.astype(np.float64))))
               for e, g in zip(expected_list, got, strict=True))
