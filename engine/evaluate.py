"""Evaluate a detector on a labelled image set as Darknet users do: ``detector map`` and ``detector valid``.

The data set is described by a Darknet ``.data`` file (``classes=``, ``valid=`` a text file of
image paths, ``names=``). Each image's labels sit where Darknet looks for them: the image path
with ``/images/`` (or ``/JPEGImages/``) replaced by ``/labels/`` and the extension by ``.txt``,
one ``class cx cy w h`` line per object, coordinates relative to the image.

Matching and AP follow AlexeyAB's ``validate_detector_map``: every (box, class) above the 0.005
threshold is one detection; it belongs to the labelled object of its class it overlaps most
(IoU strictly above ``iou_thresh``); ranked by confidence over the whole set, the first
detection of an object is a true positive and later ones are false positives. AP is the area
under the precision envelope (``points=0``, Darknet's default), or the mean of the envelope at
11 (VOC2007) or 101 (COCO) recall points. COCO's official evaluator is :func:`coco_eval`
(``pycocotools``), run on the results :func:`coco_detections` writes.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from . import userfiles
from .errors import YoloClError

DARKNET_THRESH = 0.005      # validate_detector_map's detection threshold
DARKNET_NMS = 0.45          # and its NMS threshold (do_nms_sort)
IOU_RANGE = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))   # COCO's 0.50:0.95
MAX_LIST_BYTES = 64 << 20   # a .data file, an image list or a label file larger than this is refused
# COCO's 91 category ids of the 80 classes Darknet's coco.names lists (detector.c: coco_ids).
COCO_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 27, 28, 31, 32,
            33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
            60, 61, 62, 63, 64, 65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90)
_IMAGE_DIRS = (("/images/", "/labels/"), ("/JPEGImages/", "/labels/"), ("\\images\\", "\\labels\\"),
               ("\\JPEGImages\\", "\\labels\\"))
_IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".tif", ".tiff", ".webp")


class EvalError(YoloClError):
    """A data set file (``.data``, image list, label file) that cannot be used, named with its line."""


# -- the data set ---------------------------------------------------------------------------------
def read_text(path, what: str, limit: int = MAX_LIST_BYTES) -> str:
    """A data set text file (bounded, regular files only: :func:`yolo_cl.userfiles.read_text`)."""
    return userfiles.read_text(path, what, limit, EvalError)


@dataclass
class DataSpec:
    """A Darknet ``.data`` file: class count, the list of validation images, the names file."""

    path: Path
    classes: int
    valid: Path
    names: Optional[Path] = None


def _resolve(value: str, data_path: Path) -> Path:
    """Darknet opens paths relative to the working directory; failing that, try beside the .data file."""
    p = Path(value)
    if p.is_absolute() or p.exists():
        return p
    beside = data_path.parent / p
    return beside if beside.exists() else p


def read_data(path) -> DataSpec:
    """Parse a ``.data`` file (``key = value`` lines, ``#`` comments; unknown keys such as ``train`` ignored)."""
    path = Path(path)
    opts: dict = {}
    for n, line in enumerate(read_text(path, "data file").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, eq, value = line.partition("=")
        if not eq:
            raise EvalError(f"{path}:{n}: expected 'key = value', got '{line[:60]}'")
        opts.setdefault(key.strip(), value.strip())      # Darknet's option_find takes the first
    if "valid" not in opts:
        raise EvalError(f"{path}: no 'valid =' line naming the list of validation images")
    try:
        classes = int(opts.get("classes", ""))
    except ValueError:
        raise EvalError(f"{path}: 'classes =' must be a positive integer") from None
    if classes < 1:
        raise EvalError(f"{path}: 'classes =' must be a positive integer")
    valid = _resolve(opts["valid"], path)
    if not valid.is_file():
        raise EvalError(f"{path}: valid = {opts['valid']}: no such file")
    names = _resolve(opts["names"], path) if opts.get("names") else None
    if names is not None and not names.is_file():
        raise EvalError(f"{path}: names = {opts['names']}: no such file")
    return DataSpec(path, classes, valid, names)


def image_paths(spec: DataSpec) -> list:
    """The validation images, one path per non-blank line of the ``valid`` list (relative ones as Darknet)."""
    lines = [line.strip() for line in read_text(spec.valid, "image list").splitlines()]
    paths = [str(_resolve(line, spec.valid)) for line in lines if line]
    if not paths:
        raise EvalError(f"{spec.valid}: the image list is empty")
    return paths


def label_path(image_path: str) -> str:
    """Darknet's replace_image_to_label: ``.../images/x.jpg`` -> ``.../labels/x.txt``."""
    out = image_path
    for a, b in _IMAGE_DIRS:
        out = out.replace(a, b)
    root, ext = os.path.splitext(out)
    return root + ".txt" if ext.lower() in _IMAGE_EXTS else out + ".txt"


def read_labels(path: str, classes: int) -> Optional[np.ndarray]:
    """(n, 5) float64 rows ``class cx cy w h`` of a YOLO label file, or None if there is none."""
    if not os.path.exists(path):
        return None
    rows = []
    for n, line in enumerate(read_text(path, "label file").splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        try:
            if len(fields) != 5:
                raise ValueError
            cls = int(fields[0])
            cx, cy, w, h = (float(v) for v in fields[1:])
        except ValueError:
            raise EvalError(f"{path}:{n}: expected 'class cx cy w h', got '{line.strip()[:60]}'") from None
        if not 0 <= cls < classes:
            raise EvalError(f"{path}:{n}: class {cls} is not in 0..{classes - 1} (classes = {classes})")
        if not (0 <= cx <= 1 and 0 <= cy <= 1 and 0 < w <= 1 and 0 < h <= 1):
            raise EvalError(f"{path}:{n}: box {cx:g} {cy:g} {w:g} {h:g} is outside the image "
                            "(relative coordinates: centre in [0, 1], size in (0, 1])")
        rows.append((cls, cx, cy, w, h))
    return np.asarray(rows, np.float64).reshape(-1, 5)


# -- matching and AP -------------------------------------------------------------------------------
@dataclass
class ImageRecord:
    """One evaluated image: detections ``(class, prob, cx, cy, w, h)`` and labels ``(class, cx, cy, w, h)``,
    boxes relative to the image."""

    path: str
    detections: np.ndarray
    truths: np.ndarray


def detection_rows(detections: Iterable, img_w: int, img_h: int) -> np.ndarray:
    """``Detection`` objects -> (n, 6) rows ``class prob cx cy w h`` relative to the image (Darknet's
    unclipped box), in the order given."""
    rows = []
    for d in detections:
        x1, y1, x2, y2 = d.unclipped if d.unclipped is not None else d.box
        rows.append((d.class_id, d.confidence, (x1 + x2) / 2 / img_w, (y1 + y2) / 2 / img_h,
                     (x2 - x1) / img_w, (y2 - y1) / img_h))
    return np.asarray(rows, np.float64).reshape(-1, 6)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of each ``cx cy w h`` row of ``a`` with each of ``b``: (len(a), len(b))."""
    a, b = a[:, None, :], b[None, :, :]
    iw = np.minimum(a[..., 0] + a[..., 2] / 2, b[..., 0] + b[..., 2] / 2) - \
        np.maximum(a[..., 0] - a[..., 2] / 2, b[..., 0] - b[..., 2] / 2)
    ih = np.minimum(a[..., 1] + a[..., 3] / 2, b[..., 1] + b[..., 3] / 2) - \
        np.maximum(a[..., 1] - a[..., 3] / 2, b[..., 1] - b[..., 3] / 2)
    inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
    union = a[..., 2] * a[..., 3] + b[..., 2] * b[..., 3] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


@dataclass
class ClassResult:
    """One class: AP, its labelled objects, and TP/FP at the reporting threshold."""

    class_id: int
    name: str
    ap: float
    objects: int
    tp: int
    fp: int
    precision: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))
    recall: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0))


@dataclass
class MapResult:
    """What ``yolo-cl map`` prints: per-class AP and the set's precision/recall/F1 at ``thresh``."""

    classes: list
    map: float
    iou_thresh: float
    points: int
    thresh: float
    tp: int
    fp: int
    fn: int
    avg_iou: float
    images: int
    detections: int
    objects: int
    map50_95: Optional[float] = None
    partial: bool = False
    coco: Optional[list] = None

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def as_dict(self) -> dict:
        """The result as plain data (``yolo-cl map --json``)."""
        out = {"map50" if self.iou_thresh == 0.5 else "map": self.map, "map50_95": self.map50_95,
               "iou_thresh": self.iou_thresh, "points": self.points, "thresh": self.thresh,
               "precision": self.precision, "recall": self.recall, "f1": self.f1, "tp": self.tp, "fp": self.fp,
               "fn": self.fn, "avg_iou": self.avg_iou, "images": self.images, "detections": self.detections,
               "objects": self.objects, "partial": self.partial,
               "classes": [{"class_id": c.class_id, "name": c.name, "ap": c.ap, "objects": c.objects, "tp": c.tp,
                            "fp": c.fp} for c in self.classes]}
        if self.iou_thresh != 0.5:
            out["map50"] = None
        if self.coco is not None:
            out["coco"] = dict(zip(COCO_STAT_NAMES, self.coco))
        return out


def average_precision(precision: np.ndarray, recall: np.ndarray, points: int = 0) -> float:
    """AP of one class from its precision/recall at every rank of the whole set, as Darknet computes it.

    ``points=0``: the area under the precision envelope (the best precision at this rank or a
    later one), summed over the recall steps from recall 0; Darknet's loop walks the same steps but
    starts at the first rank's recall, so its AP misses ``recall[0] * envelope[0]``: nothing, unless
    the most confident detection of the whole set is a true positive, whose class then loses
    precision x 1/objects (on a large set a rounding; on a tiny one the whole AP of a class with a
    single object). ``points=N``: the mean over N evenly spaced recall levels r of the best
    precision at any rank with recall >= r (101: COCO's levels, bit for bit).
    """
    if len(precision) == 0:
        return 0.0
    env = np.maximum.accumulate(precision[::-1])[::-1]          # best precision at this rank or later
    if points == 0:
        steps = np.diff(recall, prepend=0.0)
        return float(np.sum(steps * env))
    total = 0.0
    # Darknet's levels are point / (N - 1); pycocotools' 101 are np.linspace's, a few of which sit an ulp
    # above k/100, so a recall of exactly k/100 reaches one and not the other: 101 follows COCO.
    levels = np.linspace(0.0, 1.0, points) if points == 101 else np.arange(points) / (points - 1)
    for level in levels:
        reached = np.flatnonzero(recall >= level)
        total += float(env[reached[0]]) if len(reached) else 0.0
    return total / points


def evaluate(records: list, classes: int, names: Optional[list] = None, iou_thresh: float = 0.5,
             points: int = 0, thresh: float = 0.25) -> MapResult:
    """Darknet's mAP over ``records`` (a list of :class:`ImageRecord`)."""
    cls_l, prob_l, img_l, truth_l, iou_l = [], [], [], [], []
    objects = np.zeros(classes, np.int64)
    tp_t = np.zeros(classes, np.int64)
    fp_t = np.zeros(classes, np.int64)
    iou_sum, base = 0.0, 0
    for i, rec in enumerate(records):
        d, t = rec.detections, rec.truths
        np.add.at(objects, t[:, 0].astype(np.int64), 1)
        if len(d):
            iou = box_iou(d[:, 2:6], t[:, 1:5]) if len(t) else np.zeros((len(d), 0))
            same = d[:, 0:1].astype(np.int64) == t[None, :, 0].astype(np.int64)
            iou = np.where(same & (iou > iou_thresh), iou, 0.0)
            best = np.argmax(iou, axis=1) if len(t) else np.zeros(len(d), np.int64)
            best_iou = iou[np.arange(len(d)), best] if len(t) else np.zeros(len(d))
            truth = np.where(best_iou > 0, base + best, -1)
            claimed: set = set()
            for j in range(len(d)):      # TP/FP at ``thresh``: an object already matched by an earlier
                k = int(d[j, 0])         # detection of this image (any confidence) makes it an FP
                if d[j, 1] > thresh:
                    if truth[j] >= 0 and truth[j] not in claimed:
                        tp_t[k] += 1
                        iou_sum += best_iou[j]
                    else:
                        fp_t[k] += 1
                claimed.add(int(truth[j]))
            cls_l.append(d[:, 0].astype(np.int64))
            prob_l.append(d[:, 1])
            img_l.append(np.full(len(d), i))
            truth_l.append(truth)
            iou_l.append(best_iou)
        base += len(t)
    cls = np.concatenate(cls_l) if cls_l else np.zeros(0, np.int64)
    prob = np.concatenate(prob_l) if prob_l else np.zeros(0)
    truth = np.concatenate(truth_l) if truth_l else np.zeros(0, np.int64)
    order = np.argsort(-prob, kind="stable")
    cls, truth = cls[order], truth[order]
    first = np.zeros(len(truth), bool)                # the first (best) detection of each object
    hit = np.flatnonzero(truth >= 0)
    _, first_idx = np.unique(truth[hit], return_index=True)
    first[hit[first_idx]] = True
    results = []
    for k in range(classes):
        mine = cls == k
        tp = np.cumsum(mine & first)
        fp = np.cumsum(mine & ~first)
        n = int(objects[k])
        precision = np.where(tp + fp > 0, tp / np.maximum(tp + fp, 1), 0.0)
        recall = tp / n if n else np.zeros(len(tp))
        ap = average_precision(precision, recall, points)
        name = names[k] if names and k < len(names) else str(k)
        results.append(ClassResult(k, name, ap, n, int(tp_t[k]), int(fp_t[k]), precision[mine], recall[mine]))
    tp_all, fp_all = int(tp_t.sum()), int(fp_t.sum())
    return MapResult(results, float(np.mean([c.ap for c in results])), iou_thresh, points, thresh, tp_all, fp_all,
                     int(objects.sum()) - tp_all, iou_sum / (tp_all + fp_all) if tp_all + fp_all else 0.0,
                     len(records), len(cls), int(objects.sum()))


def evaluate_all(records: list, classes: int, names: Optional[list] = None, iou_thresh: float = 0.5,
                 points: int = 0, thresh: float = 0.25) -> MapResult:
    """:func:`evaluate` at ``iou_thresh``, plus the mean of mAP over IoU 0.50:0.95 (same AP method)."""
    result = evaluate(records, classes, names, iou_thresh, points, thresh)
    result.map50_95 = float(np.mean([evaluate(records, classes, None, t, points, thresh).map for t in IOU_RANGE]))
    return result


def format_report(result: MapResult) -> str:
    """Darknet's ``detector map`` summary: one line per class, then P/R/F1, TP/FP/FN, IoU and mAP."""
    lines = []
    if result.partial:
        lines.append(f"(interrupted: partial results over the first {result.images} images)")
    lines.append(f" detections_count = {result.detections}, unique_truth_count = {result.objects}")
    for c in result.classes:
        lines.append(f"class_id = {c.class_id}, name = {c.name}, ap = {c.ap * 100:.2f}%   \t "
                     f"(TP = {c.tp}, FP = {c.fp}) ")
    t = result.thresh
    lines += ["", f" for conf_thresh = {t:.2f}, precision = {result.precision:.2f}, recall = {result.recall:.2f}, "
                  f"F1-score = {result.f1:.2f} ",
              f" for conf_thresh = {t:.2f}, TP = {result.tp}, FP = {result.fp}, FN = {result.fn}, "
              f"average IoU = {result.avg_iou * 100:.2f} % ", "",
              f" IoU threshold = {result.iou_thresh * 100:.0f} %, "
              + (f"used {result.points} Recall-points " if result.points else
                 "used Area-Under-Curve for each unique Recall "),
              f" mean average precision (mAP@{result.iou_thresh:.2f}) = {result.map:f}, or {result.map * 100:.2f} % "]
    if result.map50_95 is not None:
        lines.append(f" mean average precision (mAP@0.50:0.95) = {result.map50_95:f}, or "
                     f"{result.map50_95 * 100:.2f} % ")
    if result.coco is not None:
        lines += ["", "COCO evaluator (pycocotools):"]
        lines += [f" {name:<44} = {v:.3f}" for name, v in zip(COCO_STAT_TITLES, result.coco)]
    return "\n".join(lines)


# -- COCO ------------------------------------------------------------------------------------------
COCO_STAT_NAMES = ("AP", "AP50", "AP75", "AP_small", "AP_medium", "AP_large",
                   "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large")
COCO_STAT_TITLES = tuple(f"{'Average Precision' if i < 6 else 'Average Recall'} ({name})"
                         for i, name in enumerate(("IoU=0.50:0.95", "IoU=0.50", "IoU=0.75", "small", "medium",
                                                   "large", "maxDets=1", "maxDets=10", "maxDets=100", "small",
                                                   "medium", "large")))


def coco_image_id(path: str) -> int:
    """Darknet's get_coco_image_id: the number after the last ``_`` of the file name (else its start);
    ``COCO_val2014_000000000139.jpg`` -> 139. Only the file name is looked at (Darknet also
    looks at underscores in folder names, and then reads 0)."""
    name = os.path.basename(path.replace("\\", "/"))
    m = re.match(r"\d+", name.rsplit("_", 1)[-1])
    if m is None:
        raise EvalError(f"{path}: no COCO image id in the file name (expected a number after the last '_')")
    return int(m.group(0))


def coco_detections(path: str, detections: Iterable, img_w: int, img_h: int, classes: int) -> list:
    """COCO result entries (``image_id``, ``category_id``, ``bbox`` [x, y, w, h] pixels clipped to the
    image, ``score``) for one image, as Darknet's ``print_cocos`` writes them; the 80 COCO classes
    map to COCO's category ids, other class counts keep their class id."""
    image_id = coco_image_id(path)
    out = []
    for d in detections:
        x1, y1, x2, y2 = d.unclipped if d.unclipped is not None else d.box
        x1, y1 = max(0.0, x1), max(0.0, y1)
        x2, y2 = min(float(img_w), x2), min(float(img_h), y2)
        cat = COCO_IDS[d.class_id] if classes == 80 else d.class_id
        out.append({"image_id": image_id, "category_id": cat,
                    "bbox": [round(x1, 4), round(y1, 4), round(x2 - x1, 4), round(y2 - y1, 4)],
                    "score": round(float(d.confidence), 6)})
    return out


def coco_eval(annotations: str, results: list, image_ids: Optional[list] = None) -> list:
    """COCO's twelve bbox numbers from ``pycocotools`` for ``results`` against an instances JSON file."""
    try:
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    except ImportError:
        raise YoloClError("--coco needs pycocotools: pip install 'yolo-cl[eval]'") from None
    import contextlib
    import io
    import json
    text = read_text(annotations, "COCO annotations file", limit=2 << 30)
    with contextlib.redirect_stdout(io.StringIO()):   # pycocotools prints its progress
        try:
            gt = COCO()
            gt.dataset = json.loads(text)
            gt.createIndex()
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise EvalError(f"{annotations}: not a COCO instances file ({e})") from None
        if not results:
            return [0.0] * 12
        try:
            dt = gt.loadRes(results)
        except (AssertionError, KeyError, IndexError) as e:
            raise EvalError(f"{annotations}: the results do not belong to these annotations "
                            f"({e or 'image ids not in the file'})") from None
        ev = COCOeval(gt, dt, "bbox")
        if image_ids is not None:
            ev.params.imgIds = sorted(set(image_ids))
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return [float(v) for v in ev.stats]
