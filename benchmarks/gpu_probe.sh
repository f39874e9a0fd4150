#!/usr/bin/env bash
# What a lent GPU machine's image allows for qdeploy's GPU targets (run through the `device` tool).
# Prints facts only; installs nothing from the network (the machine has none).
set -u
echo "== nvidia-smi"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | head -5
echo "== python"; command -v python3; python3 --version
echo "== packages"; python3 -m pip list 2>/dev/null | grep -iE "onnx|openvino|torch|tensorrt|cuda|numpy|pydantic|typer|nncf|polygraphy" | head -40
echo "== libraries"; ldconfig -p 2>/dev/null | grep -E "libcudart|libcublas|libcudnn|libnvinfer|libOpenCL" | head -10
python3 - <<'PY'
import importlib
for name in ("onnxruntime", "openvino", "torch", "tensorrt", "onnx", "pydantic", "typer"):
    try:
        mod = importlib.import_module(name)
        print(f"{name} {getattr(mod, '__version__', '?')}")
    except Exception as exc:  # a probe: report, never stop
        print(f"{name}: not importable ({type(exc).__name__}: {exc})"[:200])
try:
    import onnxruntime as ort
    print("ort providers:", ort.get_available_providers())
except Exception as exc:
    print("ort providers: -", exc)
try:
    import openvino as ov
    core = ov.Core()
    print("openvino devices:", core.available_devices)
    for device in core.available_devices:
        print(" ", device, core.get_property(device, "FULL_DEVICE_NAME"))
except Exception as exc:
    print("openvino devices: -", exc)
try:
    import torch
    print("torch cuda:", torch.cuda.is_available(), torch.version.cuda)
except Exception as exc:
    print("torch: -", exc)
PY
echo "== qdeploy doctor (if its dependencies are in the image)"
python3 -c "import sys; sys.path.insert(0, '.')" 2>/dev/null
python3 -m pip install --no-deps --no-build-isolation -q -e . >/dev/null 2>&1 && python3 -m qdeploy doctor 2>&1 | tail -40 || echo "qdeploy not installable here without network"
