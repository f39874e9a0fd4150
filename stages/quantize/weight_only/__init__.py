"""Weight-only int4/int8 (``mode: weight_only``): block packing, GPTQ and the data-aware plan."""

__all__: list[str] = []
