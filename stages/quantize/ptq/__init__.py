"""Post-training int8 (ptq, dynamic, nncf): preparing, calibrating, placing Q/DQ per runtime, verifying kernels."""

__all__: list[str] = []
