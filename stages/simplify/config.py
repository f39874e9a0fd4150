"""Settings of the simplify stage (the recipe's ``simplify`` section); the recipe imports this module only."""

from __future__ import annotations

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from qdeploy.core.stage_config import StageConfig
from qdeploy.graph.rewrites import available, default_names

__all__ = ["CHECK_FROM_FILE_BYTES", "DEFAULT_PASSES", "INTERFACE_PASSES", "MAX_FOLD_ROUNDS", "STAGE", "SimplifyConfig"]


STAGE = "simplify"
# Deployment defaults: every pass keeps the model's interface and its numerics (up to float reassociation).
DEFAULT_PASSES = (
    "eliminate_identity",
    "eliminate_nop_transpose",
    "eliminate_nop_pad",
    "eliminate_nop_dropout",
    "eliminate_nop_cast",
    "eliminate_nop_reshape",
    "eliminate_shape_gather",  # Shape -> Gather of dimensions that are static even when others are not
    "eliminate_slice_after_shape",
    "eliminate_shape_op",
    "eliminate_if_with_const_cond",  # an If whose condition folded to a constant becomes its branch
    "fuse_consecutive_transposes",
    "fuse_bn_into_conv",
    "fuse_pad_into_conv",
    "fuse_add_bias_into_conv",
    "fuse_matmul_add_bias_into_gemm",
    "extract_constant_to_initializer",
    "eliminate_common_subexpression",
    "eliminate_deadend",
    "eliminate_unused_initializer",
    "eliminate_duplicate_initializer",
)
# onnxoptimizer passes that change a model's inputs/outputs or split it: never part of a simplification.
INTERFACE_PASSES = frozenset({"rename_input_output", "rewrite_input_dtype", "split_init", "split_predict"})
CHECK_FROM_FILE_BYTES = 256_000_000
"""Above this the simplified model is saved with external data and checked from that file (a serialised copy in
memory would be one more copy of the weights); the store writes it as one file again below 1.8 GB."""
MAX_FOLD_ROUNDS = 8
"""Rounds of shape inference and folding within one iteration (each can make more shapes static)."""


def _default_rewrites() -> list[str]:
    return default_names()


class SimplifyConfig(StageConfig):
    """Settings of the simplify stage."""

    model_config = ConfigDict(extra="forbid")

    check_n: int = Field(default=3, ge=0, description="Seeded random inputs on which the simplified model must "
                         "agree with the original in ONNX Runtime; 0 disables the check.")
    check_atol: float = Field(default=1e-4, ge=0.0, description="Absolute part of the check's elementwise "
                              "limit atol + rtol * |original| on float outputs.")
    check_rtol: float = Field(default=1e-3, ge=0.0, description="Relative part of the check's elementwise limit; "
                              "fusing BatchNormalization reassociates float32 arithmetic.")
    check_noise_factor: float = Field(default=10.0, ge=0.0, description="When an output misses check_atol, the "
                                      "check measures the original's own noise there (ONNX Runtime without and "
                                      "with its optimizations, on the same inputs) and allows max(check_atol, "
                                      "check_noise_factor x that noise floor); 0 keeps check_atol alone.")
    skip_fuse_bn: bool = Field(default=False, description="Keep BatchNormalization nodes apart from Conv.")
    skipped_passes: list[str] = Field(default_factory=list, description="onnxoptimizer passes to leave out of "
                                      "the default list.")
    extra_passes: list[str] = Field(default_factory=list, description="onnxoptimizer passes to run besides the "
                                    "default list.")
    fold_size_limit_mb: float = Field(default=16.0, gt=0.0, description="Largest tensor (MiB) that constant "
                                      "folding may add; larger ones (Tile, Expand, ConstantOfShape) stay computed.")
    max_iterations: int = Field(default=10, ge=1, description="Most rounds of inference, folding and passes "
                                "before stopping short of a fixed point.")
    fold_constants: bool = Field(default=True, description="Evaluate constant subgraphs into initializers; "
                                 "Constant nodes become initializers either way. Off, BatchNormalization is not "
                                 "fused and no rewrite that computes new weights runs.")
    fold_subgraphs: bool = Field(default=True, description="Fold constants inside If/Loop/Scan bodies too "
                                 "(onnxoptimizer's passes enter them either way).")
    rewrites: list[str] = Field(default_factory=lambda: _default_rewrites(), description="Named graph rewrites "
                                "(qdeploy.graph.rewrites), applied in this order; the default fuses per-channel "
                                "scales, shifts and BatchNormalization into convolutions. Add e.g. prelu_to_relu, "
                                "hardswish_to_hardsigmoid, gelu_to_erf, layernorm_to_primitives.")

    @field_validator("skipped_passes", "extra_passes")
    @classmethod
    def _known_passes(cls, names: list[str], info: ValidationInfo) -> list[str]:
        import onnxoptimizer

        available = set(onnxoptimizer.get_available_passes())
        unknown = [name for name in names if name not in available]
        if unknown:
            raise ValueError(f"unknown onnxoptimizer pass(es) {unknown} in '{info.field_name}'; onnxoptimizer "
                             f"{onnxoptimizer.__version__} has: {', '.join(sorted(available))}")
        return names

    @field_validator("rewrites")
    @classmethod
    def _known_rewrites(cls, names: list[str]) -> list[str]:
        known = available()
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ValueError(f"unknown rewrite(s) {unknown}; known rewrites: {', '.join(sorted(known))}")
        if len(set(names)) != len(names):
            raise ValueError(f"rewrites repeat: {names}")
        return names

    @model_validator(mode="after")
    def _consistent_passes(self) -> SimplifyConfig:
        both = sorted(set(self.skipped_passes) & set(self.extra_passes))
        if both:
            raise ValueError(f"passes {both} are in both 'skipped_passes' and 'extra_passes'")
        if (self.skip_fuse_bn or not self.fold_constants) and "fuse_bn_into_conv" in self.extra_passes:
            raise ValueError("'extra_passes' asks for fuse_bn_into_conv, but 'skip_fuse_bn' is true or "
                             "'fold_constants' is false (the fused weights need folding)")
        interface = sorted(INTERFACE_PASSES & set(self.extra_passes))
        if interface:
            raise ValueError(f"passes {interface} change the model's inputs or outputs; simplify cannot run them")
        return self

    def passes(self) -> list[str]:
        """The onnxoptimizer passes this config runs, in order."""
        # fuse_bn_into_conv leaves the fused weights as a constant subgraph that only folding turns into tensors.
        no_bn = self.skip_fuse_bn or not self.fold_constants
        skipped = set(self.skipped_passes) | ({"fuse_bn_into_conv"} if no_bn else set())
        chosen = [name for name in DEFAULT_PASSES if name not in skipped]
        return chosen + [name for name in self.extra_passes if name not in chosen]

    def active_rewrites(self) -> list[str]:
        """The rewrites this config runs: BatchNormalization fusion obeys skip_fuse_bn, weight-computing ones
        fold_constants."""
        known = available()
        return [name for name in self.rewrites
                if not (self.skip_fuse_bn and "batchnorm" in name)
                and not (not self.fold_constants and known[name].computes_constants)]

    @property
    def fold_limit_bytes(self) -> int:
        return int(self.fold_size_limit_mb * 2**20)
