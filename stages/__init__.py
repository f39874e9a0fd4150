"""The stages, one subpackage each: export, simplify, fp16, quantize, validate, benchmark (docs/design.md)."""

__all__: list[str] = []
