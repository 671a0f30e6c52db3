"""The yolo-cl command line, called in-process through ``main([...])``."""
from __future__ import annotations

import contextlib
import io
import json
import re
import runpy
import sys
import types
from pathlib import Path

import cv2
import numpy as np
import pytest

from yolo_cl import Detection, draw
from yolo_cl import runtime
from yolo_cl.cli import format_detections, json_frame, main

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DOG = SHARED / "images" / "dog.jpg"
if not DOG.is_file():                       # the same photo ships with the model zoo
    DOG = ROOT / "models" / "images" / "dog.jpg"

LINE = re.compile(r"^([^:\t]+): (\d+)%\t\(left_x: ([ -]{0,3}\d+)   top_y: ([ -]{0,3}\d+)   "
                  r"width: ([ \d]{3}\d)   height: ([ \d]{3}\d)\)$")
HEADER = re.compile(r"^(.+): Predicted in (\d+\.\d{6}) milli-seconds\.$")


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def parse_lines(out: str) -> list:
    """Darknet -ext_output lines -> [(name, percent, left, top, width, height)]."""
    rows = []
    for line in out.splitlines():
        m = LINE.match(line)
        if m:
            rows.append((m.group(1), int(m.group(2))) + tuple(int(g) for g in m.groups()[2:]))
    return rows


@pytest.fixture(scope="module")
def dog_text(tmp_path_factory):
    """One real run on dog.jpg at 416 with --out, shared by the text and image checks."""
    out_dir = tmp_path_factory.mktemp("out") / "nested" / "dir"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["detect", str(DOG), "--size", "416", "--out", str(out_dir)])
    return rc, out.getvalue(), err.getvalue(), out_dir


def test_detect_prints_darknet_ext_output(dog_text):
    rc, out, err, _ = dog_text
    assert rc == 0, err
    lines = out.splitlines()
    m = HEADER.match(lines[0])
    assert m and m.group(1) == str(DOG), lines[0]
    rows = parse_lines(out)
    assert len(rows) == len(lines) - 1, out           # every other line is a detection line
    names = {r[0] for r in rows}
    assert {"dog", "bicycle", "truck"} <= names, out
    img = cv2.imread(str(DOG))
    h, w = img.shape[:2]
    for name, pct, left, top, bw, bh in rows:
        assert 25 <= pct <= 100
        assert 0 <= left < w and 0 <= top < h and 0 < bw <= w and 0 < bh <= h
    dog = next(r for r in rows if r[0] == "dog")
    assert dog[2] + dog[4] / 2 < w / 2 and dog[3] + dog[5] / 2 > h / 2   # the dog sits bottom left
    # Darknet's order: boxes left to right (classes of one box stay together).
    lefts = [r[2] for r in rows]
    assert lefts == sorted(lefts)


def test_fp16_on_a_cpu_without_half_arithmetic_gets_a_note(capsys):
    """fp16 on PoCL without cl_khr_fp16 stores half and computes in float, slower than fp32 there:
    the command says so once, on stderr (a CPU device with half arithmetic: no note); fp32 prints
    no such note, and the detections still come."""
    rc, out, err = run(capsys, "detect", DOG, "--size", "160", "--precision", "fp16")
    assert rc == 0, err
    notes = [l for l in err.splitlines() if "fp16 on " in l]
    if runtime.Runtime().fp16:
        assert notes == [], err
    else:
        assert len(notes) == 1 and notes[0].startswith("yolo-cl: note: ") and "slower than fp32" in notes[0], err
    assert parse_lines(out)
    rc, out, err = run(capsys, "detect", DOG, "--size", "160")
    assert rc == 0 and "fp16 on " not in err, err


def test_detect_out_writes_annotated_image(dog_text):
    rc, _, _, out_dir = dog_text
    assert rc == 0
    files = list(out_dir.iterdir())
    assert [f.name for f in files] == ["dog.jpg"]
    annotated = cv2.imread(str(files[0]))
    original = cv2.imread(str(DOG))
    assert annotated is not None and annotated.shape == original.shape
    changed = np.abs(annotated.astype(int) - original.astype(int)).max(axis=2) > 60
    assert changed.mean() > 0.005                      # boxes and labels were drawn
    assert not any(p.name.endswith(".tmp") for p in out_dir.iterdir())


def test_detect_json_layout_matches_text(capsys, dog_text):
    rc, out, err = run(capsys, "detect", DOG, "--size", "416", "--json")
    assert rc == 0, err
    doc = json.loads(out)                               # one document, nothing else on stdout
    assert isinstance(doc, list) and len(doc) == 1
    frame = doc[0]
    assert frame["frame_id"] == 1 and frame["filename"] == str(DOG) and frame["resize"] == "stretch"
    img = cv2.imread(str(DOG))
    h, w = img.shape[:2]
    text_rows = parse_lines(dog_text[1])
    assert len(frame["objects"]) == len(text_rows)
    for obj in frame["objects"]:
        assert set(obj) == {"class_id", "name", "relative_coordinates", "confidence"}
        rc_ = obj["relative_coordinates"]
        assert set(rc_) == {"center_x", "center_y", "width", "height"}
        assert all(0.0 <= v <= 1.0 for v in rc_.values())
        left = (rc_["center_x"] - rc_["width"] / 2) * w
        top = (rc_["center_y"] - rc_["height"] / 2) * h
        match = [r for r in text_rows if r[0] == obj["name"] and r[1] == round(obj["confidence"] * 100)
                 and abs(r[2] - left) <= 1 and abs(r[3] - top) <= 1
                 and abs(r[4] - rc_["width"] * w) <= 1 and abs(r[5] - rc_["height"] * h) <= 1]
        assert match, obj


def test_detect_missing_and_corrupt_images_do_not_stop_the_rest(capsys, tmp_path):
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not a jpeg at all")
    missing = tmp_path / "missing.jpg"
    rc, out, err = run(capsys, "detect", missing, bad, DOG, "--size", "160", "--thresh", "0.05")
    assert rc == 1
    err_lines = err.strip().splitlines()
    assert len(err_lines) == 2, err
    assert str(missing) in err_lines[0] and str(bad) in err_lines[1]
    assert all(line.startswith("yolo-cl: error: ") for line in err_lines)
    assert "Traceback" not in err
    assert HEADER.match(out.splitlines()[0]).group(1) == str(DOG)


def test_detect_folder_and_glob(capsys, tmp_path):
    for name in ("b.jpg", "a.png"):
        cv2.imwrite(str(tmp_path / name), np.full((64, 96, 3), 128, np.uint8))
    (tmp_path / "notes.txt").write_text("skip me")
    rc, out, _ = run(capsys, "detect", tmp_path, str(tmp_path / "*.jpg"), "--size", "96", "--json")
    assert rc == 0
    assert [f["filename"] for f in json.loads(out)] == [str(tmp_path / "a.png"), str(tmp_path / "b.jpg"),
                                                       str(tmp_path / "b.jpg")]
    assert [f["frame_id"] for f in json.loads(out)] == [1, 2, 3]


def test_bad_cfg_is_one_error_line_and_exit_2(capsys, tmp_path):
    cfg = tmp_path / "bad.cfg"
    cfg.write_text("[net]\nwidth=416\nheight=416\n\n[convolutional]\nfilters=lots\n")
    for argv in (["info", cfg], ["detect", DOG, "--cfg", cfg, "--weights", cfg]):
        rc, out, err = run(capsys, *argv)
        assert rc == 2
        assert err.startswith("yolo-cl: error: ") and err.count("\n") == 1, err
        assert "bad.cfg" in err and "Traceback" not in err


def test_usage_errors_exit_2(capsys):
    assert run(capsys, "detect")[0] == 2
    assert run(capsys, "detect", DOG, "--size", "big")[0] == 2
    assert run(capsys, "detect", DOG, "--thresh", "2")[0] == 2
    assert run(capsys, "info", "no-such-model")[0] == 2
    rc, _, err = run(capsys, "detect", DOG, "--letterbox", "--fit", "stretch")
    assert rc == 2 and err.startswith("yolo-cl: error:")


def test_info_yolov4_pool_smaller_than_naive_without_a_device(capsys, monkeypatch):
    def no_opencl():
        raise AssertionError("info must not touch OpenCL")
    monkeypatch.setattr(runtime, "_cl", no_opencl)
    rc, out, err = run(capsys, "info", "yolov4")
    assert rc == 0, err
    assert "608x608" in out and "resize: stretch" in out
    m = re.search(r"activation pool peak ([\d.]+) MiB vs naive ([\d.]+) MiB", out)
    assert m, out
    peak, naive = float(m.group(1)), float(m.group(2))
    assert 0 < peak < naive
    node_lines = [l for l in out.splitlines() if re.match(r"^\s*\d+  \d", l)]
    assert len(node_lines) > 100
    assert any("+add" in l for l in node_lines)                  # fused shortcuts
    assert any(re.search(r"-> route \d+ \[\d+:\d+\]", l) for l in node_lines)   # concat slices
    assert any(re.search(r"-> yolo \d+", l) for l in node_lines)
    fused = int(re.search(r"(\d+) shortcuts fused", out).group(1))
    assert fused == sum("+add" in l for l in node_lines)
    gflops = float(re.search(r"total: ([\d.]+) GFLOPs", out).group(1))
    column = [float(re.search(r" -> \S+\s+([\d.]+)", l).group(1)) for l in node_lines]
    assert gflops > 100 and sum(column) == pytest.approx(gflops, rel=0.01)


def test_info_fp16_halves_memory_and_size_override(capsys):
    _, out32, _ = run(capsys, "info", "yolov3-tiny", "--size", "320x192")
    _, out16, _ = run(capsys, "info", "yolov3-tiny", "--size", "320x192", "--precision", "fp16")
    pat = r"activation pool peak ([\d.]+) MiB"
    assert "320x192" in out32
    p32, p16 = (float(re.search(pat, o).group(1)) for o in (out32, out16))
    assert p16 == pytest.approx(p32 / 2, rel=0.02)


def test_devices_lists_pocl_and_marks_default(capsys):
    rc, out, err = run(capsys, "devices")
    assert rc == 0, err
    rows = [l for l in out.splitlines() if re.match(r"^[* ] \d+:\d+ ", l)]
    assert rows, out
    assert sum(l.startswith("*") for l in rows) == 1
    assert any("Portable Computing Language" in l or "pthread" in l.lower() or "cpu" in l.lower() for l in rows)


def test_devices_says_which_device_builds_no_kernel_and_why(capsys, monkeypatch):
    """A PoCL that cannot target this CPU (pip's 3.0 on a Zen 5) is listed with its compiler's line
    and what to install; a device that builds gets no such line."""
    devices = runtime.list_devices()
    broken = devices[-1][3]
    monkeypatch.setattr(runtime, "build_error", lambda d: "error: unknown target CPU 'generic' (install "
                        "a newer PoCL)" if d == broken else None)
    rc, out, err = run(capsys, "devices")
    assert rc == 0, err
    notes = [l for l in out.splitlines() if "builds no kernel" in l]
    p, d = devices[-1][:2]
    assert notes == [f"  {p}:{d} builds no kernel: error: unknown target CPU 'generic' (install a newer PoCL)"]
    monkeypatch.setattr(runtime, "build_error", lambda d: None)
    rc, out, _ = run(capsys, "devices")
    assert rc == 0 and "builds no kernel" not in out


def test_devices_without_opencl_explains_how_to_install(capsys, monkeypatch):
    monkeypatch.setattr(runtime, "list_devices", lambda: [])
    rc, out, err = run(capsys, "devices")
    assert rc == 1 and out == ""
    assert err.startswith("yolo-cl: error: ") and "pocl" in err.lower() and err.count("\n") == 1


def test_stream_sources_go_to_the_video_module(capsys, monkeypatch, tmp_path):
    calls = []
    fake = types.ModuleType("yolo_cl.video_cli")
    fake.run_detect_stream = lambda det, src, args: calls.append((det, src, args)) or 0
    monkeypatch.setitem(sys.modules, "yolo_cl.video_cli", fake)
    rc, _, err = run(capsys, "detect", "0", "rtsp://cam/live", "--size", "96", "--batch", "2",
                     "--out", tmp_path, "--reconnect", "3")
    assert rc == 0, err
    assert [c[1] for c in calls] == ["0", "rtsp://cam/live"]
    args = calls[0][2]
    assert args.batch == 2 and args.reconnect == 3 and args.jsonl is None
    assert args.show is False and args.live is None
    assert Path(calls[0][2].out) == tmp_path / "camera0.mp4" and Path(calls[1][2].out) == tmp_path / "stream.mp4"
    assert calls[0][0].input_size == (96, 96)
    rc, _, err = run(capsys, "detect", "rtsp://cam/live", "--size", "96", "--jsonl", tmp_path / "f.jsonl")
    assert rc == 0, err
    assert calls[-1][1] == "rtsp://cam/live" and calls[-1][2].jsonl == str(tmp_path / "f.jsonl")


def test_format_detections_follows_darknet():
    box_a, box_b = (10.5, 20.0, 40.5, 60.0), (2.0, 3.0, 7.0, 9.5)
    dets = [Detection(7, "truck", 0.40, box_a), Detection(2, "car", 0.736, box_a),
            Detection(0, "person", 0.5, box_b), Detection(5, "dont_show_bus", 0.9, box_b)]
    assert format_detections(dets) == [
        "person: 50%\t(left_x:    2   top_y:    3   width:    5   height:    7)",
        "car: 74%\t(left_x:   11   top_y:   20   width:   30   height:   40)",
        "truck: 40%\t(left_x:   11   top_y:   20   width:   30   height:   40)",
    ]
    frame = json_frame(3, "x.jpg", dets, 100, 50, "letterbox")
    assert frame["frame_id"] == 3 and frame["resize"] == "letterbox"
    person = frame["objects"][0]
    assert person["name"] == "person"
    assert person["relative_coordinates"] == {"center_x": 0.045, "center_y": 0.125, "width": 0.05, "height": 0.13}


def test_draw_returns_annotated_copy_with_stable_colours():
    img = np.zeros((120, 160, 3), np.uint8)
    dets = [Detection(3, "motorbike", 0.87, (20.0, 40.0, 100.0, 110.0))]
    out = draw(img, dets)
    assert img.max() == 0                                   # the input is untouched
    assert out.shape == img.shape and out.dtype == np.uint8
    assert out[75, 20].any() and out[75, 100].any()         # left and right edges of the box
    assert not out[75, 60].any()                            # the inside stays clear
    assert np.array_equal(out, draw(img, dets))             # deterministic
    other = draw(img, [Detection(4, "motorbike", 0.87, (20.0, 40.0, 100.0, 110.0))])
    assert not np.array_equal(out[75, 20], other[75, 20])   # another class, another colour
    renamed = draw(img, dets, names=["a", "b", "c", "a much longer label"])
    assert not np.array_equal(renamed, out)


def test_python_dash_m_runs_the_cli(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["yolo_cl", "--version"])
    with pytest.raises(SystemExit) as e:
        runpy.run_module("yolo_cl", run_name="__main__")
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("yolo-cl ")


def test_detect_video_to_named_file_and_jsonl(capsys, tmp_path):
    """The issue's command: --out FILE.mp4 --jsonl FILE on the portrait clip."""
    out, jsonl = tmp_path / "out.mp4", tmp_path / "dets.jsonl"
    rc, _, err = run(capsys, "detect", SHARED / "videos" / "library1.mp4", "--size", "128",
                         "--out", out, "--jsonl", jsonl)
    assert rc == 0, err
    cap = cv2.VideoCapture(str(out))
    n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    size = (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)))
    cap.release()
    assert (n, size) == (69, (720, 1280))
    lines = [json.loads(l) for l in jsonl.read_text().splitlines()]
    assert [l["frame_id"] for l in lines] == list(range(len(lines))) or \
        [l["frame_id"] for l in lines] == list(range(1, len(lines) + 1))
    assert len(lines) == 69


def test_video_file_out_needs_one_stream_source(capsys, tmp_path):
    rc, _, err = run(capsys, "detect", DOG, "--out", tmp_path / "x.mp4")
    assert rc == 2 and "needs exactly one video" in err


def test_jsonl_file_takes_one_stream_and_says_images_are_not_in_it(capsys, tmp_path):
    """One --jsonl file for two videos: each would rewrite it and only the last video's lines would
    stay, so the run stops before any frame and names --jsonl-dir; images with --jsonl get a note
    (their detections print, the file is not theirs)."""
    jsonl = tmp_path / "dets.jsonl"
    video = SHARED / "videos" / "library1.mp4"
    rc, out, err = run(capsys, "detect", video, video, "--size", "64", "--jsonl", jsonl)
    assert rc == 2 and "--jsonl-dir" in err and "2 of them" in err and not out
    assert not jsonl.exists()
    rc, out, err = run(capsys, "detect", DOG, "--size", "64", "--jsonl", jsonl)
    assert rc == 0 and "note: --jsonl applies to video and camera sources only (images: --json)" in err
    assert "Predicted in" in out and not jsonl.exists()


def test_draw_keeps_labels_of_overlapping_boxes_apart():
    """Tags of boxes that share their top edge do not cover each other (the best keeps the top spot)."""
    from yolo_cl.draw import _overlaps, _place_tag
    taken = []
    boxes = [(20, 40, 140, 110), (30, 40, 150, 110), (25, 42, 145, 100)]
    for x1, y1, x2, y2 in boxes:
        taken.append(_place_tag(x1, y1, x2, y2, 60, 12, 160, 120, taken))
    assert taken[0] == (20, 28, 80, 40)                       # above the best box
    assert not any(_overlaps(a, b) for i, a in enumerate(taken) for b in taken[i + 1:])
    assert all(0 <= x1 and x2 <= 160 and 0 <= y1 and y2 <= 120 for x1, y1, x2, y2 in taken)
    img = np.zeros((120, 160, 3), np.uint8)
    dets = [Detection(k, f"c{k}", 0.9 - 0.1 * k, tuple(map(float, b))) for k, b in enumerate(boxes)]
    out = draw(img, dets)
    assert np.array_equal(out, draw(img, list(reversed(dets))))   # placement follows confidence, not order
