"""Many streams and many requests over several Detectors (yolo_cl.fleet, detect --devices).

PoCL offers one device, so the scheduling is tested with two Detectors on it: two contexts,
two queues, as two GPUs would be.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

import yolo_cl
from yolo_cl.darknet_json import json_frame
from yolo_cl.fleet import Fleet, QueueFull, device_specs

from boxes import same_detections
from clips import read_frames

ROOT = Path(__file__).resolve().parents[1]
CLIP = ROOT.parent / "shared" / "videos" / "library1.mp4"
IMAGES = ROOT.parent / "shared" / "images"
SIZE = 128
FRAMES = 6


@pytest.fixture(scope="module")
def dets():
    """Two Detectors on the default device: two OpenCL contexts."""
    return [yolo_cl.Detector("yolov3-tiny", input_size=SIZE) for _ in range(2)]


@pytest.fixture(scope="module")
def frames():
    frames = read_frames(CLIP, FRAMES)
    assert len(frames) == FRAMES, f"cannot read {CLIP}"
    return [cv2.resize(f, (180, 320)) for f in frames]


@pytest.fixture(scope="module")
def clips(tmp_path_factory, frames):
    """Three short video files of FRAMES frames each (distinct content: rotated copies)."""
    d = tmp_path_factory.mktemp("clips")
    paths = []
    for k in range(3):
        p = d / f"clip{k}.avi"
        w = cv2.VideoWriter(str(p), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (180, 320))
        assert w.isOpened()
        for f in frames:
            w.write(np.ascontiguousarray(np.flip(f, 1) if k % 2 else f))
        w.release()
        paths.append(p)
    return paths


def test_device_specs():
    assert device_specs(None) == [None]
    assert device_specs("0,0") == ["0", "0"]
    assert device_specs("0:0, 1") == ["0:0", "1"]
    every = device_specs("all")
    assert every and all(":" in s for s in every)
    with pytest.raises(yolo_cl.YoloClError, match="empty device"):
        device_specs("0,,1")


def test_streams_spread_over_devices_and_keep_every_frame(dets, clips, tmp_path):
    with Fleet(dets) as fleet:
        runs = [fleet.add_stream(str(p), jsonl=tmp_path / f"{p.stem}.jsonl") for p in clips]
        assert fleet.wait_streams(timeout=120)
    # least-loaded placement: 0, 1, then 0 again (both had one running, or the first ended)
    assert runs[0].device == 0 and runs[1].device == 1
    for run, clip in zip(runs, clips):
        assert run.error is None
        assert run.stats.frames == FRAMES, run.summary()
        lines = (tmp_path / f"{clip.stem}.jsonl").read_text().splitlines()
        assert [json.loads(x)["frame_id"] for x in lines] == list(range(FRAMES))
        # the stream's detections are the single-image detector's, frame by frame
        decoded = read_frames(clip)
        for line, img in zip(lines, decoded):
            want = [d.to_dict() for d in dets[0].detect(img)]
            assert json.loads(line)["objects"] == want
    assert runs[1].events_since(0)[-1][1]["frame_id"] == FRAMES - 1


def test_requests_batch_across_threads_on_both_devices(dets, frames):
    sizes: list = []
    with Fleet(dets, max_batch=2, max_wait_ms=50, max_queue=64) as fleet:
        for b in fleet.batchers:
            b.on_batch = lambda n, s: sizes.append(n)
        imgs = frames * 2
        results: list = [None] * len(imgs)

        def ask(i: int) -> None:
            results[i] = fleet.detect(imgs[i], 0.25, 0.45, timeout=60)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(imgs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for img, got in zip(imgs, results):
        assert got is not None
        assert [d.to_dict() for d in got] == [d.to_dict() for d in dets[0].detect(img)]
    assert sum(sizes) == len(imgs)
    assert max(sizes) > 1, f"requests were never batched: {sizes}"


def test_full_queue_refuses_at_once(dets, frames):
    fleet = Fleet(dets[:1], max_batch=2, max_wait_ms=2000, max_queue=1)
    try:
        futures = [fleet.submit(frames[0])]
        with pytest.raises(QueueFull, match="queue is full"):
            fleet.submit(frames[0])
        for f in futures:
            assert isinstance(f.result(60), list)
    finally:
        fleet.close()


def test_idle_device_answers_inline_the_same_as_a_batch(dets, frames):
    with Fleet(dets[:1], max_batch=2, max_wait_ms=1000) as fleet:
        assert fleet.batchers[0].ready.wait(120)
        alone = fleet.enqueue(frames[0], inline=True)
        assert alone.inline and alone.future.done() and alone.batch == 1      # ran on this thread
        first = fleet.enqueue(frames[1])                  # the worker waits up to 1 s for a second
        second = fleet.enqueue(frames[0], inline=True)    # not idle: queued and batched with it
        got, _ = second.future.result(60), first.future.result(60)
        assert not second.inline and second.batch == 2
        assert fleet.detect(frames[2], timeout=60) is not None                 # idle again
    want = [d.to_dict() for d in dets[0].detect(frames[0])]
    assert [d.to_dict() for d in alone.future.result()] == want == [d.to_dict() for d in got]


def test_different_thresholds_in_one_batch(dets, frames):
    with Fleet(dets[:1], max_batch=2, max_wait_ms=500) as fleet:
        low, high = fleet.submit(frames[0], 0.05), fleet.submit(frames[0], 0.6)
        low, high = low.result(60), high.result(60)
    assert [d.to_dict() for d in low] == [d.to_dict() for d in dets[0].detect(frames[0], 0.05)]
    assert [d.to_dict() for d in high] == [d.to_dict() for d in dets[0].detect(frames[0], 0.6)]
    assert len(low) > len(high)


def test_stream_that_cannot_open_does_not_stop_the_others(dets, clips, tmp_path):
    with Fleet(dets) as fleet:
        bad = fleet.add_stream(str(tmp_path / "missing.mp4"))
        good = fleet.add_stream(str(clips[0]))
        assert fleet.wait_streams(timeout=120)
    assert bad.error and "missing.mp4" in bad.error
    assert good.error is None and good.stats.frames == FRAMES


def cli_two_contexts(clips, out_dir: Path, *extra: str) -> tuple:
    """``detect`` of three clips over two contexts of the one device: (completed process, JSONL texts)."""
    r = subprocess.run([sys.executable, "-m", "yolo_cl", "detect", *map(str, clips), "--devices", "0,0",
                        "--jsonl-dir", str(out_dir / "jsonl"), "--size", str(SIZE), "--out", str(out_dir / "vid"),
                        *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    texts = []
    for clip in clips:
        texts.append((out_dir / "jsonl" / f"{clip.stem}.jsonl").read_text())
        assert len(texts[-1].splitlines()) == FRAMES
        assert len(read_frames(out_dir / "vid" / f"{clip.stem}.avi")) == FRAMES
    assert "on device 0" in r.stderr and "on device 1" in r.stderr
    assert f"total: {3 * FRAMES} frames from 3 sources on 2 device(s)" in r.stderr
    return r, texts


def test_cli_many_sources_two_contexts(clips, tmp_path):
    cli_two_contexts(clips, tmp_path)


def test_cli_one_process_per_device_writes_the_same(clips, tmp_path):
    _, shared = cli_two_contexts(clips, tmp_path / "one")
    r, apart = cli_two_contexts(clips, tmp_path / "apart", "--device-processes")
    assert apart == shared
    assert re.search(r"\[0 on device 0\].*clip0", r.stderr) and re.search(r"\[1 on device 1\].*clip1", r.stderr)
    assert re.search(r"\[2 on device 0\].*clip2", r.stderr)


def test_cli_many_sources_refuses_images(tmp_path):
    r = subprocess.run([sys.executable, "-m", "yolo_cl", "detect", str(IMAGES / "dog.jpg"), "--jsonl-dir",
                        str(tmp_path), "--size", str(SIZE)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "detect images in a separate run" in r.stderr and "Traceback" not in r.stderr


def test_json_frame_layout():
    d = yolo_cl.Detection(16, "dog", 0.9, (10.0, 20.0, 50.0, 40.0), (5.0, 20.0, 50.0, 40.0))
    f = json_frame(7, "x.jpg", [d], 100, 100, "stretch")
    assert f["frame_id"] == 7 and f["filename"] == "x.jpg" and f["resize"] == "stretch"
    assert f["objects"][0]["relative_coordinates"] == {"center_x": 0.275, "center_y": 0.3, "width": 0.45,
                                                       "height": 0.2}


# -- streams on the device path: frames of several streams merged into one batch ---------------
@pytest.fixture(scope="module")
def device_det():
    """A Detector on the device path (resize and decode in kernels), as on a GPU."""
    return yolo_cl.Detector("yolov3-tiny", input_size=SIZE, device_preprocess=True, device_decode=True)


def test_shared_device_merges_waiting_submissions_into_one_batch(device_det, frames):
    from yolo_cl.fleet import SharedDevice
    shared = SharedDevice(device_det, max_batch=8, start=False)
    try:
        groups = [frames[0:1], frames[1:3], frames[3:4]]
        shares = [shared.submit(g) for g in groups]        # all waiting before the threads start
        shared.start()
        got = [shared.result(s) for s in shares]
    finally:
        shared.close()
    assert (shared.batches, shared.frames) == (1, 4)       # one Detector.submit for the three
    for g, dets_ in zip(groups, got):
        assert len(dets_) == len(g)
        for img, d in zip(g, dets_):
            assert same_detections(d, device_det.detect(img))


def test_shared_device_keeps_a_bad_frame_to_its_own_stream(device_det, frames):
    from yolo_cl.fleet import SharedDevice
    shared = SharedDevice(device_det, max_batch=8, start=False)
    try:
        good, bad = shared.submit([frames[0]]), shared.submit([np.zeros((4, 4, 7), np.uint8)])
        late = shared.submit([frames[1]])
        shared.start()
        with pytest.raises(yolo_cl.YoloClError):
            shared.result(bad)
        assert same_detections(shared.result(good)[0], device_det.detect(frames[0]))
        assert same_detections(shared.result(late)[0], device_det.detect(frames[1]))
    finally:
        shared.close()


def test_streams_on_one_device_path_share_batches_and_keep_every_frame(device_det, clips, tmp_path):
    with Fleet([device_det]) as fleet:
        runs = [fleet.add_stream(str(p), jsonl=tmp_path / f"{p.stem}.jsonl") for p in clips]
        assert fleet.wait_streams(timeout=120)
        shared = fleet.shared[0]
        assert shared is not None and shared.frames == len(clips) * FRAMES
    for run, clip in zip(runs, clips):
        assert run.error is None and run.stats.frames == FRAMES, run.summary()
        lines = (tmp_path / f"{clip.stem}.jsonl").read_text().splitlines()
        assert [json.loads(x)["frame_id"] for x in lines] == list(range(FRAMES))
        for line, img in zip(lines, read_frames(clip)):     # the single-frame detections, frame by frame
            got, want = json.loads(line)["objects"], [d.to_dict() for d in device_det.detect(img)]
            assert [g["class_id"] for g in got] == [w["class_id"] for w in want]
            for g, w in zip(got, want):
                assert abs(g["confidence"] - w["confidence"]) < 1e-3
                assert np.abs(np.subtract(g["box"], w["box"])).max() < 0.05      # pixels, rounded to 0.01
