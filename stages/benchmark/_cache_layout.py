"""Whether a model is a decoder with a KV cache, read from its interface alone: which past input each present output
feeds, along which axis the cache grows, and which inputs carry the tokens, the mask and the positions.

Exporters spell the cache differently (optimum: ``past_key_values.{i}.key`` -> ``present.{i}.key``; older GPT-2
exports: ``past.{i}`` -> ``present.{i}``, key and value stacked; others ``present_key_values.{i}.key``).  So the
pairing is by name, general: the names are split into words at ``. _ - / :``, and each past input pairs with the
present output whose words end the same way for longest (``0 key`` of ``past_key_values.0.key`` and
``present.0.key``).  The past-length axis is the one whose symbol differs between the past input and its present
output (``past_sequence_length`` / ``total_sequence_length``), else the only symbolic axis that is not the batch.
Anything unclear (a tie, an input paired twice, an unknown extra input, a dimension neither static nor the batch)
raises ``NotDecodable`` with the reason: the benchmark then keeps its plain rows and says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from qdeploy.core.onnx_wire import load_model

if TYPE_CHECKING:
    import onnx

__all__ = ["CacheLayout", "CachePair", "Declared", "NotDecodable", "declared_io", "find_layout", "layout_of",
           "pair_names"]

Dim = int | str | None
"""A declared dimension: a size, a symbol, or unknown."""

_WORDS = re.compile(r"[._\-/:]+")
_PAST, _PRESENT = "past", "present"
_INPUT_IDS = "input_ids"
_MASK = "attention_mask"
_POSITIONS = ("position_ids", "cache_position")
_INT64 = np.dtype(np.int64)


class NotDecodable(ValueError):
    """The model has cache-like inputs or outputs, but how to drive a generation with them is not clear."""


@dataclass(frozen=True)
class Declared:
    """One input or output as the graph declares it."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]


@dataclass(frozen=True)
class CachePair:
    """A past input, the present output that feeds it on the next step, and the axis along which it grows."""

    past: str
    present: str
    axis: int
    dtype: np.dtype
    shape: tuple[Dim, ...]
    batch_axis: int | None

    def empty(self, batch: int) -> np.ndarray:
        """The past of a first call: nothing cached (length 0 on the past axis), the declared element type."""
        dims = [0 if axis == self.axis else batch if axis == self.batch_axis else dim
                for axis, dim in enumerate(self.shape)]
        return np.zeros([int(dim) for dim in dims if isinstance(dim, int)], self.dtype)


@dataclass(frozen=True)
class CacheLayout:
    """How to drive one generation step of the model."""

    input_ids: str
    ids_dtype: np.dtype
    logits: str
    pairs: tuple[CachePair, ...]
    attention_mask: str | None = None
    mask_dtype: np.dtype = _INT64
    positions: tuple[tuple[str, np.dtype, int], ...] = ()
    """(name, element type, rank) of position_ids / cache_position inputs."""
    vocab: int | None = None
    """The logits' last dimension when it is declared static."""

    def step_inputs(self, ids: np.ndarray, past: int) -> dict[str, np.ndarray]:
        """Token ids, mask and positions of a call with ``past`` cached tokens (the cache inputs aside)."""
        batch, count = ids.shape
        feeds = {self.input_ids: ids.astype(self.ids_dtype, copy=False)}
        if self.attention_mask is not None:
            feeds[self.attention_mask] = np.ones((batch, past + count), self.mask_dtype)
        for name, dtype, rank in self.positions:
            positions = np.arange(past, past + count, dtype=dtype)
            feeds[name] = np.tile(positions, (batch, 1)) if rank == 2 else positions
        return feeds

    def describe(self) -> str:
        first = self.pairs[0]
        return (f"{len(self.pairs)} past/present pairs ({first.past} <- {first.present}, ...), past axis "
                f"{first.axis}, {first.dtype}")


def declared_io(model: onnx.ModelProto) -> tuple[list[Declared], list[Declared]]:
    """The graph's inputs (initializers aside) and outputs as declared."""
    from onnx.helper import tensor_dtype_to_np_dtype

    initializers = {tensor.name for tensor in model.graph.initializer}

    def declared(value: onnx.ValueInfoProto) -> Declared:
        tensor = value.type.tensor_type
        dtype = np.dtype(tensor_dtype_to_np_dtype(tensor.elem_type)) if tensor.elem_type else np.dtype(np.float32)
        shape = tuple(dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None)
                      for dim in tensor.shape.dim)
        return Declared(value.name, dtype, shape)

    inputs = [declared(value) for value in model.graph.input if value.name not in initializers]
    return inputs, [declared(value) for value in model.graph.output]


def layout_of(path: Path) -> CacheLayout | None:
    """The cache layout of the ONNX file at ``path``; None when it has no cache; ``NotDecodable`` when unclear."""
    return find_layout(*declared_io(load_model(path, load_external_data=False)))


def _words(name: str) -> list[str]:
    return [word for word in _WORDS.split(name.lower()) if word]


def _is(marker: str, name: str) -> bool:
    return any(word.startswith(marker) for word in _words(name))


def _common_tail(a: list[str], b: list[str]) -> int:
    count = 0
    while count < min(len(a), len(b)) and a[-1 - count] == b[-1 - count]:
        count += 1
    return count


def pair_names(pasts: list[str], presents: list[str]) -> dict[str, str]:
    """Past input -> present output, by the longest shared tail of words; ``NotDecodable`` when not one to one."""
    pairs: dict[str, str] = {}
    for past in pasts:
        scores = {present: _common_tail(_words(past), _words(present)) for present in presents}
        best = max(scores.values(), default=0)
        winners = [present for present, score in scores.items() if score == best]
        if best == 0:
            raise NotDecodable(f"past input '{past}' shares no name suffix with any present output {presents}")
        if len(winners) > 1:
            raise NotDecodable(f"past input '{past}' pairs equally well with {winners}")
        pairs[past] = winners[0]
    taken: dict[str, list[str]] = {}
    for past, present in pairs.items():
        taken.setdefault(present, []).append(past)
    twice = {present: named for present, named in taken.items() if len(named) > 1}
    if twice:
        raise NotDecodable(f"present outputs pair with several past inputs: {twice}")
    unpaired = [present for present in presents if present not in taken]
    if unpaired:
        raise NotDecodable(f"present outputs {unpaired} feed no past input")
    return pairs


def _past_axis(past: Declared, present: Declared, batch: Dim) -> int:
    """The axis along which the cache grows: the one whose declared symbol differs between past and present, else
    the only symbolic axis that is not the batch."""
    if len(past.shape) != len(present.shape):
        raise NotDecodable(f"'{past.name}' has rank {len(past.shape)}, '{present.name}' rank {len(present.shape)}")
    differ = [axis for axis, (a, b) in enumerate(zip(past.shape, present.shape, strict=True))
              if isinstance(a, str) and a != b]
    if len(differ) == 1:
        return differ[0]
    symbolic = [axis for axis, dim in enumerate(past.shape) if not isinstance(dim, int) or dim <= 0]
    growing = [axis for axis in symbolic if past.shape[axis] is None or past.shape[axis] != batch]
    if len(growing) == 1:
        return growing[0]
    raise NotDecodable(f"cannot tell the past-length axis of '{past.name}' {list(past.shape)} from "
                       f"'{present.name}' {list(present.shape)}")


def _batch_axis(shape: tuple[Dim, ...], axis: int, batch: Dim) -> int | None:
    """The batch axis of a cache tensor (same symbol as input_ids' first axis); every other axis must be static."""
    found = None
    for index, dim in enumerate(shape):
        if index == axis or (isinstance(dim, int) and dim > 0):
            continue
        if found is None and dim is not None and dim == batch:
            found = index
        else:
            raise NotDecodable(f"cache dimension {index} ({dim}) is neither static, the batch nor the past length")
    return found


def find_layout(inputs: list[Declared], outputs: list[Declared]) -> CacheLayout | None:
    """The cache layout of a model with these inputs and outputs; None when none is past/present-like."""
    pasts = [value for value in inputs if _is(_PAST, value.name)]
    presents = [value for value in outputs if _is(_PRESENT, value.name)]
    if not pasts and not presents:
        return None
    if not pasts or not presents:
        raise NotDecodable(f"cache-like {'outputs' if presents else 'inputs'} "
                           f"{[value.name for value in presents or pasts]} without their counterparts")
    by_name = {value.name: value for value in [*inputs, *outputs]}
    ids = by_name.get(_INPUT_IDS) or next((v for v in inputs if v.name.endswith(_INPUT_IDS)), None)
    if ids is None:
        raise NotDecodable("no input_ids input")
    batch = ids.shape[0] if ids.shape else None
    names = pair_names([value.name for value in pasts], [value.name for value in presents])
    pairs = []
    for past in pasts:
        present = by_name[names[past.name]]
        axis = _past_axis(past, present, batch)
        pairs.append(CachePair(past.name, present.name, axis, past.dtype, past.shape,
                               _batch_axis(past.shape, axis, batch)))
    mask = next((value for value in inputs if value.name.endswith(_MASK)), None)
    positions = tuple((value.name, value.dtype, len(value.shape)) for value in inputs
                      if value.name.endswith(_POSITIONS))
    known = {ids.name, *(value.name for value in pasts), *(name for name, _, _ in positions)}
    known |= {mask.name} if mask is not None else set()
    unknown = [value.name for value in inputs if value.name not in known]
    if unknown:
        raise NotDecodable(f"inputs {unknown} are not token ids, attention mask, positions or cache")
    rest = [value for value in outputs if value.name not in set(names.values())]
    logits = next((value for value in rest if value.name.endswith("logits")), rest[0] if len(rest) == 1 else None)
    if logits is None:
        raise NotDecodable(f"cannot tell the logits among the outputs {[value.name for value in rest]}")
    vocab = logits.shape[-1] if logits.shape and isinstance(logits.shape[-1], int) and logits.shape[-1] > 0 else None
    return CacheLayout(ids.name, ids.dtype, logits.name, tuple(pairs), mask.name if mask is not None else None,
                       mask.dtype if mask is not None else _INT64, positions, vocab)
