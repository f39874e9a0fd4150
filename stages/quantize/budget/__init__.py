"""The int8 accuracy budget: what quantize supplies to the one budget engine (``qdeploy.stages.accuracy_budget``):
its builders (``ptq``: the model with some nodes kept float, and its candidates), its ranking signal (the error
each quantized node adds, ``_shadow``) and its options (task metric, time bound, timing sources, ``_options``)."""

__all__: list[str] = []
