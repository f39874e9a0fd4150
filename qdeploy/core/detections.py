"""Detections compared as detections: boxes matched by IoU, not element by element.

A detector that runs NonMaxSuppression inside its graph returns as many boxes as survive it, and a box near the
score threshold or a near-tie between two overlapping boxes comes out differently at reduced precision: the
outputs' lengths differ, so an elementwise comparison can only fail.  Here each image's candidate detections are
matched greedily (highest score first) to the reference's unmatched detection of the same label with the largest
IoU, if it reaches ``iou_min``; ``recall`` is the share of the reference's detections matched, ``precision`` the
share of the candidate's.

The spec is a plain dict (``validate.detections`` dumped): ``boxes``, ``scores`` and ``labels`` name an output,
or columns of its last axis (``det[0:4]``, ``det[4]``).  Boxes of shape ``[N, 4]`` are one image per sample,
``[B, N, 4]`` one image per batch row.

Numpy and the standard library only: this file is copied into every package as ``detections.py``, which its
check.py loads; keep it so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["BOX_FORMATS", "DETECTION_KEYS", "IOU_MIN", "MATCH_MIN", "SCORE_THRESHOLD", "consumed_outputs",
           "match_detections", "output_of", "parse_column"]

BOX_FORMATS = ("xyxy", "xywh", "cxcywh")
DETECTION_KEYS = ("boxes", "scores", "labels")
IOU_MIN, SCORE_THRESHOLD, MATCH_MIN = 0.5, 0.0, 0.9
"""The defaults of validate.detections (``stages.validate.config.Detections``), also where a spec omits them."""
_COLUMNS = re.compile(r"^(?P<name>.+)\[(?P<start>-?\d+)(?::(?P<stop>-?\d+))?\]$")

Image = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]
"""One image's boxes [N, 4] (x1, y1, x2, y2), scores [N] and labels [N] (None where the spec names none)."""


def parse_column(text: str) -> tuple[str, slice | int | None]:
    """``'det[0:4]'`` -> ('det', slice(0, 4)); ``'det[4]'`` -> ('det', 4); ``'boxes'`` -> ('boxes', None)."""
    found = _COLUMNS.match(text)
    if found is None:
        return text, None
    start = int(found["start"])
    return found["name"], start if found["stop"] is None else slice(start, int(found["stop"]))


def output_of(text: str) -> str:
    """The output a spec entry reads."""
    return parse_column(text)[0]


def consumed_outputs(spec: Mapping[str, Any] | None) -> set[str]:
    """The outputs the detection match reads, which are not also compared element by element."""
    return {output_of(spec[key]) for key in DETECTION_KEYS if spec and spec.get(key)}


def _read(sample: Mapping[str, Any], text: str) -> np.ndarray:
    name, columns = parse_column(text)
    if name not in sample:
        raise ValueError(f"output '{name}' is missing; the model's outputs: {', '.join(sorted(sample))}")
    array = np.asarray(sample[name])
    if columns is None:
        return array
    if array.ndim == 0 or not _fits(columns, array.shape[-1]):
        raise ValueError(f"'{text}': output '{name}' has shape {list(array.shape)}, no such columns on its last axis")
    return array[..., columns]


def _fits(columns: slice | int, width: int) -> bool:
    if isinstance(columns, int):
        return -width <= columns < width
    return len(range(*columns.indices(width))) > 0


def _images(spec: Mapping[str, Any], sample: Mapping[str, Any]) -> list[Image]:
    """The sample's detections per image, in the spec's box format made xyxy."""
    boxes = _read(sample, spec["boxes"]).astype(np.float64)
    if boxes.ndim not in (2, 3) or boxes.shape[-1] != 4:
        raise ValueError(f"boxes '{spec['boxes']}' have shape {list(boxes.shape)}; expected [N, 4] or [B, N, 4] "
                         "(name the four box columns of a packed output: 'det[0:4]')")
    lead = boxes.shape[:-1]
    extra = [None if not spec.get(key) else _per_box(_read(sample, spec[key]), lead, spec[key]) for key in
             ("scores", "labels")]
    boxes = _to_xyxy(boxes, spec.get("box_format", "xyxy"))
    if boxes.ndim == 2:
        return [(boxes, extra[0], extra[1])]
    return [(boxes[row], *(None if part is None else part[row] for part in extra)) for row in range(len(boxes))]


def _per_box(values: np.ndarray, lead: tuple[int, ...], text: str) -> np.ndarray:
    """Scores or labels, one per box ([N, 1] read as [N])."""
    if values.size != int(np.prod(lead)) or values.shape[:len(lead)] != lead:
        raise ValueError(f"'{text}' has shape {list(values.shape)}, not one value per box {list(lead)}")
    return values.reshape(lead)


def _to_xyxy(boxes: np.ndarray, box_format: str) -> np.ndarray:
    if box_format == "xyxy":
        return boxes
    first, size = boxes[..., :2], boxes[..., 2:]
    if box_format == "cxcywh":
        first = first - size / 2
    return np.concatenate([first, first + size], axis=-1)


def _iou(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """IoU of every reference box [N, 4] with every candidate box [M, 4]: [N, M]; equal boxes are 1 even when they
    have no area."""
    low = np.maximum(ref[:, None, :2], cand[None, :, :2])
    high = np.minimum(ref[:, None, 2:], cand[None, :, 2:])
    inter = np.prod(np.clip(high - low, 0.0, None), axis=-1)
    area_ref = np.prod(np.clip(ref[:, 2:] - ref[:, :2], 0.0, None), axis=-1)
    area_cand = np.prod(np.clip(cand[:, 2:] - cand[:, :2], 0.0, None), axis=-1)
    union = area_ref[:, None] + area_cand[None, :] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
    return np.where(np.all(ref[:, None, :] == cand[None, :, :], axis=-1), 1.0, iou)


def _kept(image: Image, threshold: float | None) -> Image:
    """Detections scoring above ``score_threshold`` (padding rows score 0), all when the spec names no scores."""
    boxes, scores, labels = image
    if scores is None or threshold is None:
        return image
    keep = scores.astype(np.float64) > threshold
    return boxes[keep], scores[keep], None if labels is None else labels[keep]


class _Tally:
    def __init__(self) -> None:
        self.ref = self.cand = self.matched = self.nonfinite = 0
        self.ious: list[float] = []
        self.score_diffs: list[float] = []

    def add(self, ref: Image, cand: Image, iou_min: float) -> None:
        self.nonfinite += sum(int(np.count_nonzero(~np.isfinite(part.astype(np.float64))))
                              for part in cand if part is not None)
        self.ref, self.cand = self.ref + len(ref[0]), self.cand + len(cand[0])
        if not len(ref[0]) or not len(cand[0]):
            return
        iou = _iou(ref[0], cand[0])
        if ref[2] is not None and cand[2] is not None:
            iou = np.where(ref[2][:, None] == cand[2][None, :], iou, 0.0)
        order = np.argsort(-cand[1], kind="stable") if cand[1] is not None else range(len(cand[0]))
        free = np.ones(len(ref[0]), bool)
        for column in order:
            overlaps = np.where(free, np.nan_to_num(iou[:, column], nan=0.0), -1.0)
            best = int(np.argmax(overlaps))
            if overlaps[best] >= iou_min:
                free[best] = False
                self.matched += 1
                self.ious.append(float(overlaps[best]))
                if ref[1] is not None and cand[1] is not None:
                    self.score_diffs.append(abs(float(cand[1][column]) - float(ref[1][best])))


def match_detections(spec: Mapping[str, Any], references: Sequence[Mapping[str, Any]],
                     candidates: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Match every sample's candidate detections to the reference's; the metrics and the limits they break."""
    tally = _Tally()
    threshold = spec.get("score_threshold", SCORE_THRESHOLD)  # null keeps every row
    try:
        for index, (ref_sample, cand_sample) in enumerate(zip(references, candidates, strict=True)):
            ref_images, cand_images = _images(spec, ref_sample), _images(spec, cand_sample)
            if len(ref_images) != len(cand_images):
                return {}, [f"sample {index}: {len(ref_images)} images in the reference, {len(cand_images)} in the "
                            "candidate"]
            for ref, cand in zip(ref_images, cand_images, strict=True):
                tally.add(_kept(ref, threshold), _kept(cand, threshold), spec.get("iou_min", IOU_MIN))
    except ValueError as error:
        return {}, [str(error)]
    metrics = _metrics(tally)
    return metrics, _broken(metrics, spec)


def _metrics(tally: _Tally) -> dict[str, Any]:
    return {"reference_detections": tally.ref, "candidate_detections": tally.cand, "matched": tally.matched,
            "recall": tally.matched / tally.ref if tally.ref else 1.0,
            "precision": tally.matched / tally.cand if tally.cand else 1.0,
            "mean_iou": float(np.mean(tally.ious)) if tally.ious else None,
            "max_score_diff": max(tally.score_diffs) if tally.score_diffs else None,
            "nonfinite": tally.nonfinite}


def _broken(metrics: Mapping[str, Any], spec: Mapping[str, Any]) -> list[str]:
    problems = [f"candidate holds {metrics['nonfinite']} NaN/Inf values"] if metrics["nonfinite"] else []
    match_min = spec.get("match_min", MATCH_MIN)
    counts = f"{metrics['matched']} matched of {metrics['reference_detections']} reference and " \
             f"{metrics['candidate_detections']} candidate detections at IoU >= {spec.get('iou_min', IOU_MIN):g}"
    low = [f"{key} {metrics[key]:.4g}" for key in ("recall", "precision") if metrics[key] < match_min]
    if low:
        problems.append(f"{' and '.join(low)} < match_min {match_min:g} ({counts})")
    score_atol = spec.get("score_atol")
    if score_atol is not None and metrics["max_score_diff"] is not None and metrics["max_score_diff"] > score_atol:
        problems.append(f"a matched detection's score differs by {metrics['max_score_diff']:.4g} > score_atol "
                        f"{score_atol:g}")
    return problems
