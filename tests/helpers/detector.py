"""A tiny detector with NonMaxSuppression inside, as torchvision and PaddleDetection export them: how many boxes it
returns depends on the image."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

GRID, CLASSES, SIZE = 8, 3, 32
ANCHORS = GRID * GRID


def detector_model(score_threshold: float = 0.5, seed: int = 0) -> onnx.ModelProto:
    """image [1, 3, 32, 32] -> two convolutions -> per cell of an 8x8 grid four box offsets and three class scores
    -> boxes decoded around the cells -> NonMaxSuppression (IoU 0.5, ``score_threshold``, 20 per class) ->
    boxes [N, 4] (x1, y1, x2, y2), scores [N], labels [N] of the N boxes it keeps."""
    rng = np.random.default_rng(seed)
    step = SIZE / GRID
    centers = (np.arange(GRID, dtype=np.float32) + 0.5) * step
    cy, cx = np.meshgrid(centers, centers, indexing="ij")
    anchors = np.stack([cx - step, cy - step, cx + step, cy + step], -1).reshape(1, ANCHORS, 4)
    weights = {
        "w1": rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.4, "b1": np.zeros(8, np.float32),
        "w2": rng.standard_normal((4 + CLASSES, 8, 4, 4)).astype(np.float32) * 0.1,
        "b2": np.array([0, 0, 0, 0, -1.0, -1.5, -2.0], np.float32),
        "anchors": anchors.astype(np.float32), "offset_scale": np.array(2.0, np.float32),
        "box_shape": np.array([1, 4, ANCHORS], np.int64), "score_shape": np.array([1, CLASSES, ANCHORS], np.int64),
        "keep": np.array([20], np.int64), "iou": np.array([0.5], np.float32),
        "threshold": np.array([score_threshold], np.float32), "box_col": np.array([2], np.int64),
        "label_col": np.array([1], np.int64), "score_cols": np.array([1, 2], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["head"], strides=[4, 4], name="head"),  # [1, 7, 8, 8]
        helper.make_node("Split", ["head"], ["raw_boxes", "raw_scores"], axis=1, num_outputs=2, name="split"),
        helper.make_node("Reshape", ["raw_boxes", "box_shape"], ["box_cols"], name="boxes_flat"),
        helper.make_node("Transpose", ["box_cols"], ["offsets"], perm=[0, 2, 1], name="boxes_rows"),
        helper.make_node("Mul", ["offsets", "offset_scale"], ["scaled"], name="scale_offsets"),
        helper.make_node("Add", ["anchors", "scaled"], ["decoded"], name="decode"),  # [1, 64, 4]
        helper.make_node("Reshape", ["raw_scores", "score_shape"], ["logits"], name="scores_flat"),
        helper.make_node("Sigmoid", ["logits"], ["class_scores"], name="sigmoid"),  # [1, 3, 64]
        helper.make_node("NonMaxSuppression", ["decoded", "class_scores", "keep", "iou", "threshold"],
                         ["selected"], center_point_box=0, name="nms"),  # [N, 3]: batch, class, box
        helper.make_node("Gather", ["selected", "box_col"], ["box_index"], axis=1, name="box_index"),
        helper.make_node("Squeeze", ["box_index"], ["box_ids"], name="box_ids"),
        helper.make_node("Squeeze", ["decoded"], ["all_boxes"], name="image_boxes"),
        helper.make_node("Gather", ["all_boxes", "box_ids"], ["boxes"], axis=0, name="pick_boxes"),
        helper.make_node("Gather", ["selected", "label_col"], ["label_index"], axis=1, name="label_index"),
        helper.make_node("Squeeze", ["label_index"], ["labels"], name="labels"),
        helper.make_node("Squeeze", ["class_scores"], ["image_scores"], name="image_scores"),
        helper.make_node("Gather", ["selected", "score_cols"], ["score_index"], axis=1, name="score_index"),
        helper.make_node("GatherND", ["image_scores", "score_index"], ["scores"], name="pick_scores"),
    ]
    for node in nodes:
        if node.op_type == "Squeeze" and node.name in ("box_ids", "labels"):
            node.input.append("one")
        elif node.op_type == "Squeeze":
            node.input.append("zero")
    weights.update(one=np.array([1], np.int64), zero=np.array([0], np.int64))
    outputs = [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["detections", 4]),
               helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["detections"]),
               helper.make_tensor_value_info("labels", TensorProto.INT64, ["detections"])]
    graph = helper.make_graph(nodes, "detector", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                                  [1, 3, SIZE, SIZE])],
                              outputs, [numpy_helper.from_array(value, name) for name, value in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model
