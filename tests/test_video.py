"""Video files, live sources and the streaming pipeline (yolo_cl.video, Detector.stream)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import cv2
import numpy as np
import pytest

import yolo_cl
from yolo_cl import video, video_cli
from yolo_cl.errors import ImageError, YoloClError

from clips import read_frames
from interrupt import interrupt_when

ROOT = Path(__file__).resolve().parents[1]
CLIP = ROOT.parent / "shared" / "videos" / "library1.mp4"
SIZE = 128


@pytest.fixture(scope="module")
def det():
    return yolo_cl.Detector("yolov3-tiny", input_size=SIZE)


@pytest.fixture(scope="module")
def clip_frames():
    """The first 12 frames of the clip (or synthetic frames where the clip is missing)."""
    frames = read_frames(CLIP, 12) if CLIP.is_file() else []
    if not frames:
        rng = np.random.default_rng(0)
        frames = [rng.integers(0, 255, (240, 320, 3), np.uint8) for _ in range(12)]
    return frames


def args(**kw):
    base = dict(out=None, jsonl=None, show=False, batch=1, live=None, reconnect=None, thresh=0.25, nms=0.45,
                quiet=True)
    base.update(kw)
    return types.SimpleNamespace(**base)


def dicts(dets) -> list:
    return [d.to_dict() for d in dets]


# -- files ---------------------------------------------------------------------------------------
def test_clip_to_video_and_jsonl(det, tmp_path):
    """The whole clip: same frame count and size in the output video, one JSON line per frame,
    boxes inside the frame, and the detections of each line belong to that frame."""
    cap = cv2.VideoCapture(str(CLIP))
    count, w, h = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), int(cap.get(3)), int(cap.get(4))
    cap.release()
    out, jl = tmp_path / "out.mp4", tmp_path / "dets.jsonl"
    assert video_cli.run_detect_stream(det, str(CLIP), args(out=str(out), jsonl=str(jl), batch=2)) == 0

    frames = read_frames(out)
    assert len(frames) == count == 69
    assert all(f.shape == (h, w, 3) for f in frames)
    records = [json.loads(line) for line in jl.read_text().splitlines()]
    assert [r["frame_id"] for r in records] == list(range(count))
    stamps = [r["timestamp"] for r in records]
    assert stamps[0] == 0.0 and all(b > a for a, b in zip(stamps, stamps[1:]))
    assert 2.0 < stamps[-1] < 2.5                    # 69 frames at ~29.7 fps
    boxes = [o["box"] for r in records for o in r["objects"]]
    assert len(boxes) > count                        # the clip has people and bicycles in most frames
    for x1, y1, x2, y2 in boxes:
        assert 0 <= x1 <= x2 <= w and 0 <= y1 <= y2 <= h
    # Frames in a batch (and the padded last batch) map to their own detections.
    cap = cv2.VideoCapture(str(CLIP))
    for i in range(count):
        frame = cap.read()[1]
        if i in (0, 1, 37, 68):
            assert records[i]["objects"] == dicts(det.detect(frame)), f"frame {i}"
    cap.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dets.jsonl", "out.mp4"]   # no temp files left


@pytest.mark.parametrize("delay", [0.0, 0.05], ids=["source-faster", "source-slower"])
def test_file_mode_keeps_every_frame_in_order(det, clip_frames, delay):
    frames = clip_frames[:8]

    def source():
        for f in frames:
            time.sleep(delay)
            yield f

    stats = []
    out = list(det.stream(source(), batch=2, stats=stats))
    assert [i for i, _, _ in out] == list(range(len(frames)))
    assert all(f is frames[i] for i, f, _ in out)
    st = stats[0]
    assert (st.frames, st.dropped, st.corrupt, st.end) == (len(frames), 0, 0, "end of frames")
    for i in (0, 7):
        assert dicts(out[i][2]) == dicts(det.detect(frames[i]))


def test_corrupt_frames_are_skipped_and_counted(det, clip_frames):
    good = clip_frames[:3]
    items = [good[0], None, np.zeros((0, 0, 3), np.uint8), good[1], "not an image", np.zeros((4, 4, 7)), good[2]]
    stats = []
    out = list(det.stream(items, stats=stats))
    assert [i for i, _, _ in out] == [0, 1, 2]
    assert all(f is g for (_, f, _), g in zip(out, good))
    assert stats[0].corrupt == 4 and stats[0].frames == 3


# -- live sources --------------------------------------------------------------------------------
def test_live_source_faster_than_inference_drops_stale_frames(det, clip_frames, monkeypatch):
    """A 200 fps live source: inference always takes (nearly) the newest frame, stale ones are
    dropped and counted, indices increase, and the last frame produced is the last one out."""
    n = 120
    frames = [clip_frames[i % len(clip_frames)].copy() for i in range(n)]
    newest = [-1]
    lag = []
    forward = det.forward

    def source():
        for i, f in enumerate(frames):
            newest[0] = i
            yield f
            time.sleep(0.005)

    def spying_forward(blob):
        lag.append(newest[0])          # the newest frame the camera has made when inference starts
        time.sleep(0.02)               # inference slower than the camera on any machine: the premise
        return forward(blob)

    def spying_submit(*a, **k):        # the device path submits frames instead of forwarding blobs
        lag.append(newest[0])
        time.sleep(0.02)
        return submit(*a, **k)

    submit = det.submit
    monkeypatch.setattr(det, "forward", spying_forward)
    monkeypatch.setattr(det, "submit", spying_submit)
    stats = []
    out = list(det.stream(source(), live=True, batch=4, stats=stats))
    idx = [i for i, _, _ in out]
    st = stats[0]
    assert all(b > a for a, b in zip(idx, idx[1:]))
    assert all(f is frames[i] for i, f, _ in out)
    assert idx[-1] == n - 1                            # the newest frame wins, also at the end
    assert 0 < len(out) < n and st.dropped == n - len(out) > 0
    assert st.frames == len(out) and st.batch == 1     # live sources are never batched
    # Lag between the newest frame and the one inferred stays small; a queue would let it grow.
    lags = [newest_at - i for newest_at, i in zip(lag, idx)]
    assert max(lags) <= 4 and sorted(lags)[len(lags) // 2] <= 2, lags


def test_live_source_slower_than_inference_keeps_every_frame(det, clip_frames):
    """A live source that only makes a frame once the last one came out never has stale frames."""
    frames = clip_frames[:6]
    taken = threading.Semaphore(0)

    def source():
        for i, f in enumerate(frames):
            if i:
                assert taken.acquire(timeout=30)
            yield f

    stats = []
    out = []
    for r in det.stream(source(), live=True, stats=stats):
        out.append(r)
        taken.release()
    assert [i for i, _, _ in out] == list(range(len(frames)))
    assert stats[0].dropped == 0


class FakeCapture:
    """A live stream that delivers ``n`` frames and then stalls."""

    def __init__(self, n: int) -> None:
        self.n, self.released = n, False

    def isOpened(self) -> bool:
        return True

    def get(self, prop):
        return {cv2.CAP_PROP_FPS: 25.0, cv2.CAP_PROP_FRAME_WIDTH: 64, cv2.CAP_PROP_FRAME_HEIGHT: 48}.get(prop, 0.0)

    def grab(self) -> bool:
        self.n -= 1
        return self.n >= 0

    def retrieve(self):
        return True, np.full((48, 64, 3), 7, np.uint8)

    def release(self) -> None:
        self.released = True


def test_stream_reconnects_with_backoff_then_ends(monkeypatch, caplog):
    # open, drop; attempt 1 fails, attempt 2 reconnects; drop; attempts 1..3 fail -> end.
    opens = iter([FakeCapture(3), None, FakeCapture(2), None, None, None])
    monkeypatch.setattr(video, "_open_capture", lambda target, kind, timeout: next(opens))
    caplog.set_level(logging.WARNING, logger="yolo_cl.video")
    src = video.open_source("rtsp://camera.invalid/stream", reconnect=3, backoff=0.01)
    assert src.live and src.size == (64, 48) and src.fps == 25.0
    got = []
    while (f := src.read()) is not None:
        got.append(f.index)
    assert got == [0, 1, 2, 3, 4]
    assert src.reconnects == 1
    assert src.end_reason == "stream lost: no frames after 3 reconnect attempts"
    delays = [r.args[1] for r in caplog.records]
    assert delays == pytest.approx([0.01, 0.02, 0.01, 0.02, 0.04])   # doubling, reset by a good frame


# -- interruption and errors ---------------------------------------------------------------------
SIGINT_SCRIPT = """
import sys, types, yolo_cl
from yolo_cl.video_cli import run_detect_stream
det = yolo_cl.Detector("yolov3-tiny", input_size={size})
a = types.SimpleNamespace(out=sys.argv[2], jsonl=sys.argv[3], batch=1, quiet=True)
sys.exit(run_detect_stream(det, sys.argv[1], a))
"""


def test_sigint_leaves_a_playable_video(tmp_path):
    out, jl = tmp_path / "out.mp4", tmp_path / "dets.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(yolo_cl.__file__).parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_SCRIPT.format(size=SIZE), str(CLIP), str(out), str(jl)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def started() -> bool:
        parts = list(tmp_path.glob(".dets.jsonl.*"))
        return bool(parts) and parts[0].read_text().count("\n") >= 5

    err = interrupt_when(proc, started)
    assert proc.returncode == 130, err
    lines = jl.read_text().splitlines()
    frames = read_frames(out)
    assert 5 <= len(frames) < 69
    assert len(lines) == len(frames)
    assert [json.loads(x)["frame_id"] for x in lines] == list(range(len(frames)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dets.jsonl", "out.mp4"]


def test_unwritable_output_fails_before_any_work(det, clip_frames, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    pulled = []

    def source():
        pulled.append(1)
        yield clip_frames[0]

    calls = []
    monkeypatch.setattr(det, "forward", lambda blob: calls.append(1))
    for kw in (dict(out=str(blocker / "out.mp4")), dict(jsonl=str(blocker / "dets.jsonl")),
               dict(out=str(tmp_path / "ok.mp4"), jsonl=str(blocker / "dets.jsonl"))):
        with pytest.raises(YoloClError) as e:
            video_cli.run_detect_stream(det, source(), args(**kw))
        msg = str(e.value)
        assert "\n" not in msg and str(blocker) in msg
    assert not pulled and not calls
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]      # no temp files left behind


def test_unwritable_video_format_fails_before_any_work(det, tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(det, "forward", lambda blob: calls.append(1))
    with pytest.raises(YoloClError, match="cannot write this video"):
        video_cli.run_detect_stream(det, str(CLIP), args(out=str(tmp_path / "out.unknownext")))
    assert not calls and list(tmp_path.iterdir()) == []


def test_missing_sources_give_one_line_errors(det, tmp_path):
    missing = tmp_path / "nope.mp4"
    with pytest.raises(ImageError) as e:
        video.open_source(str(missing))
    assert str(missing) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ImageError) as e:
        next(iter(det.stream(str(missing))))
    assert str(missing) in str(e.value)
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(b"this is not a video" * 100)
    with pytest.raises(ImageError) as e:
        video.open_source(str(garbage))
    assert str(garbage) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ImageError) as e:
        video.open_source("63")
    assert "camera 63" in str(e.value) and "\n" not in str(e.value)


def test_source_kinds():
    assert video.source_kind("0") == video.source_kind(2) == "camera"
    assert video.source_kind("rtsp://host/cam") == video.source_kind("https://x/y.mp4") == "url"
    assert video.source_kind("clip.mp4") == "file" and video.source_kind([]) == "frames"
    assert video.is_stream_source("a/b.MP4") and video.is_stream_source("1")
    assert not video.is_stream_source("dog.jpg")


# -- channels ------------------------------------------------------------------------------------
def test_channel_drop_stale_keeps_newest_and_end_follows_items():
    dropped = []
    ch = video.Channel(1, drop_stale=True, on_drop=dropped.append)
    for i in range(4):
        assert ch.put(i)
    ch.close()
    assert ch.get() == 3 and ch.get() is video._END and dropped == [0, 1, 2]


def test_channel_blocks_when_full_until_read():
    ch = video.Channel(2)
    ch.put(0)
    ch.put(1)
    done = threading.Event()
    t = threading.Thread(target=lambda: (ch.put(2), done.set()))
    t.start()
    assert not done.wait(0.3)           # full: the producer waits instead of dropping
    assert ch.get() == 0
    assert done.wait(5)
    t.join()
    ch.close()
    assert [ch.get(), ch.get(), ch.get()] == [1, 2, video._END]


def test_interrupt_ends_iteration_without_waiting_for_a_stalled_source(det, clip_frames):
    """Pipeline.interrupt (what Ctrl-C calls) ends the run at once even when no further frame comes."""
    release = threading.Event()

    def source():
        yield clip_frames[0]
        release.wait(20)                 # a camera that stalls after one frame
        yield clip_frames[1]

    pipe = video.Pipeline(det, video.open_source(source(), live=True))
    got = []
    t0 = None
    try:
        for r in pipe:
            got.append(r.index)
            t0 = time.monotonic()
            threading.Timer(0.2, pipe.interrupt).start()
        waited = time.monotonic() - t0
    finally:
        release.set()
    assert got == [0] and waited < 5
    assert pipe.stats.end == "interrupted" and pipe.stats.frames == 1
