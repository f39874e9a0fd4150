"""The block each weight-only weight is quantized in: ``group_size`` where it fits, else the largest that does.

OpenVINO's ONNX reader refuses blocked weights (MatMulNBits' K, GatherBlockQuantized's quantized axis, a blocked
DequantizeLinear's axis) whose length is not a multiple of the block; ONNX Runtime pads the last block and runs
them, so an artifact that passes on one runtime fails on the other (a 576-wide embedding in blocks of 128).  The
rule, per weight:

- ``group_size`` when it divides the quantized axis (and, for MatMulNBits, is at most 256: the largest block
  ONNX Runtime's block quantizer writes);
- else the largest power of two from 16 up to that which divides it (64 for 576 at group_size 128; the axis
  itself when it is a power of two shorter than ``group_size``);
- else (no such power of two divides it, e.g. 200): ``weight_format: matmulnbits`` keeps that weight int8 with
  one scale per output channel; ``dequantize_linear`` (opset 21) takes one block per channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from qdeploy.stages.quantize.weight_only._pack import MATMULNBITS_MAX_BLOCK, MIN_BLOCK, dividing_block

if TYPE_CHECKING:
    from qdeploy.stages.quantize.config import WeightOnlyConfig

__all__ = ["Block", "block_for"]


@dataclass(frozen=True)
class Block:
    """The block of one weight: ``size`` None keeps it int8 with one scale per output channel; ``why`` is empty
    when the block is ``group_size``."""

    size: int | None
    axis_length: int
    why: str = ""


def block_for(kind: str, dims: list[int], config: WeightOnlyConfig) -> Block:
    """The block of a 2-D weight read by a MatMul (``kind`` "matmul": blocks along K, its first axis) or a Gather
    (blocks along the table's width, its second axis)."""
    length = dims[0] if kind == "matmul" else dims[1]
    wanted = config.group_size
    largest = MATMULNBITS_MAX_BLOCK if kind == "matmul" and config.weight_format == "matmulnbits" else None
    block = dividing_block(length, wanted, largest)
    if block == wanted:
        return Block(block, length)
    reason = _why_not(length, wanted, largest)
    if block is not None:
        return Block(block, length, f"{reason}: block {block}, the largest power of two dividing it")
    top = min(wanted, largest) if largest else wanted
    none = f"{reason} and no power of two from {MIN_BLOCK} to {top} divides it"
    if config.weight_format == "dequantize_linear":
        return Block(length, length, f"{none}: one block per channel")
    return Block(None, length, f"{none}: int8 with one scale per output channel")


def _why_not(length: int, wanted: int, largest: int | None) -> str:
    if largest and wanted > largest and length % largest == 0:
        return f"group_size {wanted} is above {largest}, the largest MatMulNBits block ONNX Runtime writes"
    if length < wanted:
        return f"the axis ({length}) is shorter than group_size {wanted}"
    return f"the axis ({length}) is not a multiple of group_size {wanted}"
