#!/usr/bin/env bash
# qdeploy on a lent GPU machine (the `device` tool), whose image has PyTorch, onnx and onnxruntime (CPU build) but
# not OpenVINO nor pydantic, and no network.
#   here:  bash benchmarks/gpu_machine.sh prepare   # wheels for Python 3.12 into .gpu_wheels/ (git-ignored, < 64 MiB)
#   there: bash benchmarks/gpu_machine.sh run       # with carry [".gpu_wheels"]: install, probe, the demo recipe
# What it printed on an H200: docs/measurements/2026-12-04-openvino-gpu-nvidia.md
set -u
WHEELS=.gpu_wheels
case "${1:-}" in
prepare)
    mkdir -p "$WHEELS" .git/info && (grep -qx "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >> .git/info/exclude)
    pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_17_x86_64 -d "$WHEELS" -c constraints.txt openvino openvino-telemetry \
        onnxconverter-common onnxoptimizer pydantic pydantic_core annotated-types typing-inspection
    # the frontends and plugins qdeploy never loads, so that the tree travels under the tool's 64 MiB
    zip -q -d "$WHEELS"/openvino-*.whl 'openvino/libs/libopenvino_intel_npu_plugin.so' 'openvino/libs/cache.json' \
        'openvino/libs/libopenvino_tensorflow*' 'openvino/libs/libopenvino_pytorch_frontend*' \
        'openvino/libs/libopenvino_paddle_frontend*' 'openvino/libs/libopenvino_gguf_frontend*' \
        'openvino/frontend/pytorch/*' 'openvino/frontend/tensorflow/*' 'openvino/frontend/paddle/*' \
        'openvino/frontend/jax/*'
    du -sh "$WHEELS" ;;
run)
    export PYTHONUNBUFFERED=1 PATH=/opt/torch/.venv/bin:$PATH OUT="${OUT:-/tmp/out}"
    mkdir -p "$OUT"
    python3 -m pip install --root-user-action=ignore -q --no-index --no-deps "$WHEELS"/*.whl
    python3 -m pip install --root-user-action=ignore -q --no-deps --no-build-isolation -e .
    cat /etc/OpenCL/vendors/*.icd 2>/dev/null
    bash benchmarks/gpu_probe.sh > "$OUT/probe.txt" 2>&1; tail -30 "$OUT/probe.txt"
    # PoCL's kernel compiler writes "N warnings generated." to stderr for every OpenCL kernel it builds
    timeout 300 python3 -m qdeploy run recipes/demo.yaml --out /tmp/demo > "$OUT/demo.txt" 2> /tmp/demo.err
    echo "demo exit $?"; grep -v "warnings generated" /tmp/demo.err | tail -5; cat "$OUT/demo.txt"
    tool() {  # OpenVINO's own tool on the same files, before and after qdeploy's calls
        for variant in fp32 int8@openvino; do
            timeout 60 benchmark_app -m "/tmp/demo/artifacts/$variant.onnx" -d GPU -hint none -nstreams 1 \
                -nireq 1 -api sync -niter 1000 2>&1 | grep -E "Median" | sed "s/^/benchmark_app $variant /"
        done
    }
    tool
    timeout 200 python3 benchmarks/openvino_gpu_probe.py /tmp/demo/artifacts > "$OUT/openvino_gpu.txt" 2>&1
    grep -v "^  GPU" "$OUT/openvino_gpu.txt"
    tool
    cp /tmp/demo/report.json /tmp/demo/report.md "$OUT/" ;;
*)
    echo "usage: bash benchmarks/gpu_machine.sh prepare|run" >&2; exit 2 ;;
esac
