"""A real detector with NonMaxSuppression inside, through the recipe: validated element by element, then with its
boxes matched by IoU (validate.detections).

    python benchmarks/detector_nms.py [--work DIR] [--images N]

The model is ddddocr's YOLOX click-captcha detector (``tests.real_models``, from the ddddocr==1.6.1 wheel) with
what YOLOX's and Ultralytics' exports append when asked for NMS inside: the grid decoded to centre-size boxes in
pixels, score = objectness x class, ``NonMaxSuppression`` (center_point_box=1, IoU 0.45, score 0.3, 100 boxes)
and the kept boxes, scores and labels gathered.  Its data: rendered 416x416 click captchas (calibration seed 1,
validation seed 2), BGR pixels 0..255 as ddddocr feeds them.  ``qdeploy run`` builds fp16, int8 (ptq) and an
int8 accuracy budget for ort:cpu and openvino:cpu, once without ``validate.detections`` and once with it; the
table says per row the status, the boxes (reference / candidate / matched), recall, precision and mean IoU.
What it found: docs/measurements/2026-12-05-detector-nms.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SIZE, STRIDES = 416, (8, 16, 32)
RECIPE = """\
name: yolox-nms
model: {{onnx: model.onnx}}
data:
  calib: {{reader: images, path: calib, resize: [416, 416], color: BGR, scale: 1.0}}
  val: {{reader: images, path: val, resize: [416, 416], color: BGR, scale: 1.0}}
variants:
  fp16: [fp16]
  int8: [{{quantize: {{mode: ptq, calibration: {{data: calib}}}}}}]
  int8-budget: [{{quantize: {{mode: ptq, calibration: {{data: calib}}, tolerance: {{cosine_min: 0.99}}}}}}]
targets: [ort:cpu, openvino:cpu]
validate: {{data: val, samples: {samples}{detections}}}
benchmark: {{enabled: false}}
report: {{formats: [json], layers: "off", packages: {{enabled: false}}}}
"""
DETECTIONS = ", detections: {boxes: boxes, scores: scores, labels: labels, box_format: cxcywh}"


def _grid() -> tuple[np.ndarray, np.ndarray]:
    """YOLOX's decoding constants for 416x416: each anchor's cell (x, y) and its stride, strides 8, 16, 32."""
    cells, strides = [], []
    for stride in STRIDES:
        side = SIZE // stride
        xs, ys = np.meshgrid(np.arange(side), np.arange(side))
        cells.append(np.stack([xs, ys], -1).reshape(-1, 2))
        strides.append(np.full((side * side, 1), stride))
    return (np.concatenate(cells)[None].astype(np.float32), np.concatenate(strides)[None].astype(np.float32))


def with_nms(model: onnx.ModelProto) -> onnx.ModelProto:
    """The detector's raw [1, 3549, 6] (x, y, log w, log h, objectness, class) decoded, NMS'ed and gathered into
    boxes [N, 4] (centre x, centre y, w, h in pixels), scores [N], labels [N]."""
    raw = model.graph.output[0].name
    cells, strides = _grid()
    constants = {"nms_cells": cells, "nms_strides": strides, "nms_keep": np.array([100], np.int64),
                 "nms_iou": np.array([0.45], np.float32), "nms_score": np.array([0.3], np.float32),
                 "nms_box_col": np.array([2], np.int64), "nms_label_col": np.array([1], np.int64),
                 "nms_score_cols": np.array([1, 2], np.int64)}
    for index, (start, end) in enumerate(((0, 2), (2, 4), (4, 5), (5, 6))):
        constants[f"nms_s{index}"] = np.array([start], np.int64)
        constants[f"nms_e{index}"] = np.array([end], np.int64)
    axis = numpy_helper.from_array(np.array([2], np.int64), "nms_axis")
    node = helper.make_node
    nodes = [node("Slice", [raw, f"nms_s{i}", f"nms_e{i}", "nms_axis"], [f"nms_part{i}"]) for i in range(4)]
    nodes += [node("Add", ["nms_part0", "nms_cells"], ["nms_xy_cells"]),
              node("Mul", ["nms_xy_cells", "nms_strides"], ["nms_xy"]),
              node("Exp", ["nms_part1"], ["nms_wh_cells"]),
              node("Mul", ["nms_wh_cells", "nms_strides"], ["nms_wh"]),
              node("Concat", ["nms_xy", "nms_wh"], ["nms_boxes"], axis=2),
              node("Mul", ["nms_part2", "nms_part3"], ["nms_score_rows"]),
              node("Transpose", ["nms_score_rows"], ["nms_scores"], perm=[0, 2, 1]),
              node("NonMaxSuppression", ["nms_boxes", "nms_scores", "nms_keep", "nms_iou", "nms_score"],
                   ["nms_selected"], center_point_box=1, name="nms"),
              node("Gather", ["nms_selected", "nms_box_col"], ["nms_box_index"], axis=1),
              node("Squeeze", ["nms_box_index"], ["nms_box_ids"], axes=[1]),
              node("Squeeze", ["nms_boxes"], ["nms_image_boxes"], axes=[0]),
              node("Gather", ["nms_image_boxes", "nms_box_ids"], ["boxes"], axis=0),
              node("Gather", ["nms_selected", "nms_label_col"], ["nms_label_index"], axis=1),
              node("Squeeze", ["nms_label_index"], ["labels"], axes=[1]),
              node("Squeeze", ["nms_scores"], ["nms_image_scores"], axes=[0]),
              node("Gather", ["nms_selected", "nms_score_cols"], ["nms_score_index"], axis=1),
              node("GatherND", ["nms_image_scores", "nms_score_index"], ["scores"])]
    graph = model.graph
    graph.node.extend(nodes)
    graph.initializer.extend([axis, *(numpy_helper.from_array(value, name) for name, value in constants.items())])
    del graph.output[:]
    graph.output.extend([helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["detections", 4]),
                         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["detections"]),
                         helper.make_tensor_value_info("labels", TensorProto.INT64, ["detections"])])
    assert model.opset_import[0].version == 11  # the detector's own opset: Squeeze's axes are an attribute
    onnx.checker.check_model(model)
    return model


def prepare(folder: Path, images: int) -> None:
    from tests import real_models as rm
    from tests.real_recipes.data import click_captcha_images

    source = rm.ensure(rm.DDDDOCR_DET)
    onnx.save(with_nms(onnx.load(str(source))), str(folder / "model.onnx"))
    click_captcha_images(folder / "calib", images, SIZE, 1)
    click_captcha_images(folder / "val", images, SIZE, 2)


def run(folder: Path, detections: bool, samples: int) -> tuple[int, dict[str, Any]]:
    recipe = folder / ("with.yaml" if detections else "without.yaml")
    recipe.write_text(RECIPE.format(samples=samples, detections=DETECTIONS if detections else ""))
    out = folder / ("out-with" if detections else "out-without")
    done = subprocess.run([sys.executable, "-m", "qdeploy", "run", str(recipe), "--out", str(out), "-q"],
                          cwd=folder, capture_output=True, text=True, timeout=3600)
    return done.returncode, json.loads((out / "report.json").read_text())


def rows(report: dict[str, Any]) -> list[str]:
    lines = []
    for row in report["validation"]:
        found = next((out["detections"] for out in row.get("outputs") or [] if out.get("detections")), None)
        counts = (f"{found['reference_detections']} / {found['candidate_detections']} / {found['matched']} | "
                  f"{found['recall']:.3f} | {found['precision']:.3f} | {found['mean_iou'] or 0:.3f}"
                  if found else "– | – | – | –")
        reason = textwrap.shorten(row.get("reason") or "", 90, placeholder=" ...")
        lines.append(f"| {row['variant']} | {row['target']} | {row['status']} | {counts} | {reason} |")
    for failure in report.get("failures") or []:
        lines.append(f"| {failure['variant']} | (build) | {failure['stage']} failed | – | – | – | – | "
                     f"{textwrap.shorten(failure['reason'], 90, placeholder=' ...')} |")
    return lines


def budgets(out: Path) -> list[str]:
    """What each int8 accuracy budget decided: met or not, nodes kept float, its held-back confirmation."""
    lines = []
    for sidecar in sorted((out / "artifacts").glob("int8-budget*.json")):
        found = json.loads(sidecar.read_text())["findings"]
        budget = found.get("budget") or {}
        lines.append(f"- {sidecar.stem}: met {budget.get('met')}, {len(budget.get('kept_float') or [])} nodes kept "
                     f"float, {sum((found.get('quantized_nodes') or {}).values())} quantized; "
                     f"{budget.get('confirmed')}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None, help="keep the runs' folders here")
    parser.add_argument("--images", type=int, default=16, help="captchas per dataset (calibration, validation)")
    args = parser.parse_args()
    print(f"CPU: {platform.processor() or platform.machine()}; qdeploy run on {args.images} validation captchas")
    with tempfile.TemporaryDirectory(prefix="qdeploy-nms-") as tmp:
        folder = args.work or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        prepare(folder, args.images)
        for detections in (False, True):
            code, report = run(folder, detections, args.images)
            print(f"\n{'with' if detections else 'without'} validate.detections: exit {code}\n")
            print("| variant | target | status | boxes ref / cand / matched | recall | precision | mean IoU | reason |")
            print("|---|---|---|---|---|---|---|---|")
            print("\n".join(rows(report)))
            print("\n".join(["", *budgets(folder / ("out-with" if detections else "out-without"))]), flush=True)


if __name__ == "__main__":
    main()
