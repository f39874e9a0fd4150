"""The int8 accuracy budget: rank quantized nodes, keep the harmful ones float, confirm on every target."""

__all__: list[str] = []
