"""Evaluation (``yolo-cl map`` / ``valid``): Darknet's AP against hand-worked examples and against
COCO's own evaluator (pycocotools) on synthetic sets, and the commands end to end on labelled photos."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from yolo_cl import evaluate as ev
from yolo_cl.errors import YoloClError

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
LABELS = Path(__file__).resolve().parent / "data" / "eval" / "labels"


def _rec(dets, truths, path="x.jpg"):
    return ev.ImageRecord(path, np.asarray(dets, float).reshape(-1, 6), np.asarray(truths, float).reshape(-1, 5))


# -- AP by hand -------------------------------------------------------------------------------------
def test_auc_and_eleven_points_by_hand():
    """One class, 3 objects, 5 detections ranked TP, FP, TP, FP, TP.

    precision 1, 1/2, 2/3, 2/4, 3/5 at recall 1/3, 1/3, 2/3, 2/3, 1; the envelope is 1, 2/3, 2/3, 3/5, 3/5.
    AUC: 1/3 * 1 + 1/3 * 2/3 + 1/3 * 3/5 = 0.7555...
    11 points: r = 0, .1, .2, .3 -> 1; .4, .5, .6 -> 2/3; .7, .8, .9, 1 -> 3/5: (4 + 2 + 2.4) / 11.
    """
    t = [(0, 0.2, 0.2, 0.1, 0.1), (0, 0.5, 0.5, 0.1, 0.1), (0, 0.8, 0.8, 0.1, 0.1)]
    d = [(0, 0.9, 0.2, 0.2, 0.1, 0.1), (0, 0.8, 0.5, 0.2, 0.1, 0.1), (0, 0.7, 0.5, 0.5, 0.1, 0.1),
         (0, 0.6, 0.2, 0.8, 0.1, 0.1), (0, 0.5, 0.8, 0.8, 0.1, 0.1)]
    auc = ev.evaluate([_rec(d, t)], 1, points=0)
    assert auc.classes[0].ap == pytest.approx(1 / 3 + 2 / 9 + 1 / 5)
    eleven = ev.evaluate([_rec(d, t)], 1, points=11)
    assert eleven.classes[0].ap == pytest.approx((4 * 1 + 3 * 2 / 3 + 4 * 3 / 5) / 11)
    assert (auc.tp, auc.fp, auc.fn) == (3, 2, 0)


def test_duplicates_other_classes_and_thresh_counts():
    """A second detection of the same object is a false positive; a detection of another class does
    not match; an object nobody finds is a false negative; TP/FP/IoU count only above ``thresh``."""
    t = [(0, 0.3, 0.3, 0.2, 0.2), (1, 0.7, 0.7, 0.2, 0.2), (1, 0.2, 0.8, 0.1, 0.1)]
    d = [(0, 0.9, 0.3, 0.3, 0.2, 0.2),      # TP, IoU 1
         (0, 0.8, 0.31, 0.3, 0.2, 0.2),     # duplicate: FP
         (0, 0.7, 0.7, 0.7, 0.2, 0.2),      # right place, wrong class: FP
         (1, 0.6, 0.72, 0.7, 0.2, 0.2),     # TP, IoU 0.18/0.22
         (1, 0.1, 0.5, 0.5, 0.1, 0.1)]      # below thresh: FP in the ranking, not in the counts
    r = ev.evaluate([_rec(d, t)], 2, names=["a", "b"], thresh=0.25)
    assert [c.ap for c in r.classes] == pytest.approx([1.0, 0.5])
    assert (r.tp, r.fp, r.fn) == (2, 2, 1)
    assert r.avg_iou == pytest.approx((1.0 + 0.18 / 0.22) / 4)
    assert [(c.tp, c.fp, c.objects) for c in r.classes] == [(1, 2, 1), (1, 0, 2)]


def test_iou_must_exceed_the_threshold_and_empty_sets():
    t = [(0, 0.5, 0.5, 0.5, 0.5)]
    half = [(0, 0.9, 0.5, 0.5, 0.5, 0.25)]                     # IoU exactly 0.5: not a match (Darknet's >)
    assert ev.evaluate([_rec(half, t)], 1).map == 0.0
    assert ev.evaluate([_rec(half, t)], 1, iou_thresh=0.45).map == pytest.approx(1.0)
    empty = ev.evaluate([_rec([], []), _rec([], t)], 1)
    assert (empty.map, empty.fn, empty.detections) == (0.0, 1, 0)


# -- against pycocotools ------------------------------------------------------------------------------
def _synthetic(seed: int, classes: int = 3):
    """Images with disjoint objects (so Darknet's and COCO's matching rules agree), jittered and
    duplicated detections, false positives, an empty image, a crowded one, one without detections."""
    rng = np.random.default_rng(seed)
    records, gt_images, gt_anns, dts = [], [], [], []
    W, H = 640, 480
    for img_id in range(1, 13):
        n = {1: 0, 2: 30}.get(img_id, int(rng.integers(1, 7)))
        cells = rng.permutation(48)[:n]                          # 8 x 6 grid of 80 x 80 cells: disjoint boxes
        truths = []
        for c in cells:
            cx, cy = (c % 8) * 80 + 40 + rng.uniform(-8, 8), (c // 8) * 80 + 40 + rng.uniform(-8, 8)
            w, h = rng.uniform(30, 60), rng.uniform(30, 60)
            truths.append((int(rng.integers(classes)), cx / W, cy / H, w / W, h / H))
        dets = []
        if img_id != 3:
            for k, cx, cy, w, h in truths:
                for _ in range(int(rng.integers(0, 3))):           # 0-2 detections of each object
                    j = rng.uniform(-0.15, 0.15, 4)
                    dets.append((k if rng.random() > 0.15 else (k + 1) % classes, rng.random(),
                                 cx + j[0] * w, cy + j[1] * h, w * (1 + j[2]), h * (1 + j[3])))
            for _ in range(int(rng.integers(0, 4))):               # false positives anywhere
                dets.append((int(rng.integers(classes)), rng.random() * 0.5, rng.uniform(0.1, 0.9),
                             rng.uniform(0.1, 0.9), rng.uniform(0.02, 0.2), rng.uniform(0.02, 0.2)))
        records.append(_rec(dets, truths, f"img_{img_id}.jpg"))
        gt_images.append({"id": img_id, "width": W, "height": H, "file_name": f"img_{img_id}.jpg"})
        for k, cx, cy, w, h in truths:
            gt_anns.append({"id": len(gt_anns) + 1, "image_id": img_id, "category_id": k + 1, "iscrowd": 0,
                            "bbox": [(cx - w / 2) * W, (cy - h / 2) * H, w * W, h * H], "area": w * W * h * H})
        for k, p, cx, cy, w, h in dets:
            dts.append({"image_id": img_id, "category_id": int(k) + 1, "score": float(p),
                        "bbox": [(cx - w / 2) * W, (cy - h / 2) * H, w * W, h * H]})
    gt = {"images": gt_images, "annotations": gt_anns,
          "categories": [{"id": k + 1, "name": str(k)} for k in range(classes)]}
    return records, gt, dts


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_points_101_equals_pycocotools(tmp_path, seed):
    records, gt, dts = _synthetic(seed)
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(gt))
    stats = ev.coco_eval(str(path), dts)
    ours = ev.evaluate_all(records, 3, points=101)
    assert ours.map == pytest.approx(stats[1], abs=1e-9)       # AP at IoU 0.50
    assert ours.map50_95 == pytest.approx(stats[0], abs=1e-9)   # AP at IoU 0.50:0.95
    assert 0.05 < ours.map < 0.99                                # a set that tests something


def test_coco_ids_and_image_ids():
    assert len(ev.COCO_IDS) == 80 and ev.COCO_IDS[0] == 1 and ev.COCO_IDS[-1] == 90 and 12 not in ev.COCO_IDS
    assert ev.coco_image_id("val/COCO_val2014_000000000139.jpg") == 139
    assert ev.coco_image_id("my_set/000000000285.jpg") == 285
    with pytest.raises(YoloClError, match="no COCO image id"):
        ev.coco_image_id("images/dog.jpg")


def test_label_paths_and_bad_labels(tmp_path):
    assert ev.label_path("/d/images/a.b.JPG") == "/d/labels/a.b.txt"
    assert ev.label_path("VOC/JPEGImages/x.png") == "VOC/labels/x.txt"
    lab = tmp_path / "l.txt"
    for text, msg in (("0 0.5 0.5 0.2\n", ":1: expected 'class cx cy w h'"),
                      ("0 0.5 0.5 0.2 0.2\n5 0.5 0.5 0.2 0.2\n", ":2: class 5 is not in 0..2"),
                      ("1 0.5 1.5 0.2 0.2\n", ":1: box .* is outside the image"),
                      ("1 nan 0.5 0.2 0.2\n", ":1: box .* is outside the image")):
        lab.write_text(text)
        with pytest.raises(YoloClError, match=msg):
            ev.read_labels(str(lab), 3)
    assert ev.read_labels(str(tmp_path / "none.txt"), 3) is None


# -- the commands ------------------------------------------------------------------------------------
def _dataset(tmp_path: Path) -> Path:
    """The five shared photos with hand-made labels (tests/data/eval/labels), named with COCO-style ids."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    lines = []
    for i, name in enumerate(("dog", "eagle", "giraffe", "horses", "person"), 1):
        img = tmp_path / "images" / f"set_{i:06d}.jpg"
        shutil.copy(SHARED / "images" / f"{name}.jpg", img)
        shutil.copy(LABELS / f"{name}.txt", tmp_path / "labels" / f"set_{i:06d}.txt")
        lines.append(str(img))
    (tmp_path / "valid.txt").write_text("\n".join(lines) + "\n")
    data = tmp_path / "obj.data"
    data.write_text(f"classes = 80\ntrain = nowhere.txt\nvalid = {tmp_path / 'valid.txt'}\n"
                    f"names = {SHARED / 'models' / 'coco.names'}\n")
    return data


def _instances(tmp_path: Path) -> Path:
    """COCO instances JSON of the same labels, for pycocotools."""
    import cv2
    images, anns = [], []
    for line in (tmp_path / "valid.txt").read_text().split():
        img_id = ev.coco_image_id(line)
        h, w = cv2.imread(line).shape[:2]
        images.append({"id": img_id, "width": w, "height": h, "file_name": os.path.basename(line)})
        for k, cx, cy, bw, bh in ev.read_labels(ev.label_path(line), 80):
            anns.append({"id": len(anns) + 1, "image_id": img_id, "category_id": ev.COCO_IDS[int(k)], "iscrowd": 0,
                         "bbox": [(cx - bw / 2) * w, (cy - bh / 2) * h, bw * w, bh * h], "area": bw * w * bh * h})
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": c, "name": str(c)} for c in ev.COCO_IDS]}))
    return path


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "yolo_cl", *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


def test_map_and_valid_end_to_end(tmp_path):
    data = _dataset(tmp_path)
    instances = _instances(tmp_path)
    os.remove(tmp_path / "labels" / "set_000002.txt")          # the eagle: no label file
    r = _cli("map", data, "--json", "--batch", 2, "--coco", instances, "--plot", tmp_path / "plots")
    assert r.returncode == 0, r.stderr
    assert "1 of 5 images have no label file" in r.stderr and "set_000002.txt" in r.stderr
    out = json.loads(r.stdout)
    by_name = {c["name"]: c for c in out["classes"]}
    assert by_name["person"]["ap"] == 1.0 and by_name["bicycle"]["ap"] == 1.0 and by_name["giraffe"]["ap"] == 1.0
    assert by_name["horse"]["objects"] == 6 and by_name["bird"]["objects"] == 0 and by_name["bird"]["fp"] >= 1
    assert out["objects"] == 14 and out["images"] == 5 and not out["partial"]
    assert out["tp"] + out["fn"] == 14 and 0 < out["map50_95"] < out["map50"] < 1
    assert set(out["coco"]) == set(ev.COCO_STAT_NAMES) and 0 < out["coco"]["AP50"] <= 1
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert "pr_000_person.png" in pngs and all(p.startswith("pr_") for p in pngs)
    assert (tmp_path / "plots" / "pr_000_person.png").read_bytes()[:4] == b"\x89PNG"

    res = tmp_path / "results.json"
    r = _cli("valid", data, "--out", res)
    assert r.returncode == 0, r.stderr
    entries = json.loads(res.read_text())
    assert {e["image_id"] for e in entries} == {1, 2, 3, 4, 5}
    assert all(e["category_id"] in ev.COCO_IDS and e["score"] > 0.005 and len(e["bbox"]) == 4 for e in entries)
    dog = max((e for e in entries if e["category_id"] == 18 and e["image_id"] == 1), key=lambda e: e["score"])
    assert dog["bbox"][0] == pytest.approx(124, abs=6) and dog["bbox"][2] == pytest.approx(258, abs=12)


def test_map_text_report_and_bad_inputs(tmp_path):
    data = _dataset(tmp_path)
    (tmp_path / "labels" / "set_000003.txt").write_text("22 0.5 0.5 0.4 0.4\n23 0.5 0.5 oops 0.3\n")
    r = _cli("map", data)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "set_000003.txt:2: expected 'class cx cy w h'" in r.stderr and "Traceback" not in r.stderr
    for text, msg in (("classes = 80\n", "no 'valid =' line"),
                      (f"classes = 80\nvalid = {tmp_path / 'missing.txt'}\n", "valid = .*missing.txt: no such file"),
                      (f"classes = 0\nvalid = {tmp_path / 'valid.txt'}\n", "'classes =' must be a positive"),
                      (f"classes = 20\nvalid = {tmp_path / 'valid.txt'}\n", "classes = 20, but the model has 80")):
        bad = tmp_path / "bad.data"
        bad.write_text(text)
        r = _cli("map", bad)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "yolo-cl: error:" in r.stderr and "bad.data" in r.stderr, r.stderr
        assert __import__("re").search(msg, r.stderr), r.stderr
    r = _cli("valid", data, "--out", tmp_path)
    assert r.returncode == 2 and "is a folder" in r.stderr


def test_map_interrupted_prints_partial_metrics(tmp_path, monkeypatch, capsys):
    """Ctrl-C during ``map`` prints the metrics of the images done so far, marked partial, and exits 130."""
    from yolo_cl import cli
    from yolo_cl.detector import Detector
    data = _dataset(tmp_path)
    real, calls = Detector.detect_batch, []

    def interrupting(self, images, *a, **k):
        calls.append(len(images))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, images, *a, **k)

    monkeypatch.setattr(Detector, "detect_batch", interrupting)
    assert cli.main(["map", str(data), "--json"]) == 130
    out = json.loads(capsys.readouterr().out)
    assert out["partial"] is True and out["images"] == 2 and out["objects"] == 5   # dog (4) + eagle (1)
