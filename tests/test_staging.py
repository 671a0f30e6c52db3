"""Issue 14: large host arrays reach the device in chunks through pinned memory, each chunk's
DMA overlapping the next one's copy.

``YOLO_CL_STAGING=on`` forces the path GPUs take by default (PoCL, a CPU device, keeps one
plain copy), and small ``staging.CHUNK`` / ``MIN_BYTES`` make small arrays take many chunks:
every result must equal the plain copy's bit for bit.
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from boxes import same_detections
from yolo_cl import Detector, staging
from yolo_cl.runtime import Runtime

ROOT = Path(__file__).resolve().parents[1]
DOG = ROOT / "models" / "images" / "dog.jpg"
SIZE = 96


@pytest.fixture(scope="module")
def rt():
    return Runtime()


def chunked(m) -> None:
    """The GPUs' path on anything over 2000 bytes, in chunks of 1000 (not a multiple of any element size)."""
    m.setenv("YOLO_CL_STAGING", "on")
    m.setattr(staging, "CHUNK", 1000)
    m.setattr(staging, "MIN_BYTES", 2000)


@pytest.fixture
def chunks(monkeypatch):
    chunked(monkeypatch)


def test_mode_follows_the_device_and_the_switch(rt, monkeypatch):
    monkeypatch.delenv("YOLO_CL_STAGING", raising=False)
    assert staging.wanted(rt) is (not rt.is_cpu)
    for value, want in (("on", True), ("off", False), ("OFF", False), ("bogus", not rt.is_cpu)):
        monkeypatch.setenv("YOLO_CL_STAGING", value)
        assert staging.wanted(rt) is want


def test_pinned_arrays_are_recognised(rt):
    _, host = staging.pinned(rt, (4, 1000), np.float32)
    assert staging.is_pinned(host) and staging.is_pinned(host[2:]) and staging.is_pinned(host[1, 10:20])
    assert not staging.is_pinned(np.empty((4, 1000), np.float32))
    tail = np.empty(10, np.float32)
    assert not staging.is_pinned(tail)


def test_many_pinned_arrays_each_found_and_forgotten_when_dropped(rt):
    """Among a hundred pinned arrays each one and its views are found, a plain array is not, a
    span that runs past one array's end is not, and a dropped array leaves the registry."""
    import gc
    arrays = [staging.pinned(rt, (1000 + 37 * k,), np.uint8)[1] for k in range(100)]
    assert all(staging.is_pinned(a) and staging.is_pinned(a[5:17]) and staging.is_pinned(a[-1:]) for a in arrays)
    first = min(arrays, key=lambda a: a.ctypes.data)
    past_end = np.lib.stride_tricks.as_strided(first, shape=(first.nbytes + 1,), strides=(1,))
    assert not staging.is_pinned(past_end) and not staging.is_pinned(np.empty(5000, np.uint8))
    gone = arrays[50].ctypes.data
    del arrays[50], first, past_end
    gc.collect()
    assert gone not in staging._pinned and all(staging.is_pinned(a) for a in arrays)


@pytest.mark.parametrize("nbytes", [7, 1999, 2000, 2001, 12345, 50_000])
def test_upload_lands_every_byte(rt, chunks, nbytes):
    cl = rt.cl
    src = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    _, host = staging.pinned(rt, (nbytes,), np.uint8)
    dst = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, nbytes + 64)
    cl.enqueue_fill_buffer(rt.queue, dst, np.uint8(0xAB), 0, nbytes + 64)
    staging.upload(rt, dst, src, host, dst_offset=32)[-1].wait()
    back = np.empty(nbytes + 64, np.uint8)
    cl.enqueue_copy(rt.queue, back, dst)
    assert np.array_equal(back[32:32 + nbytes], src)
    assert np.all(back[:32] == 0xAB) and np.all(back[32 + nbytes:] == 0xAB)


@pytest.mark.parametrize("staged", [False, True])
def test_upload_rows_lands_the_rows_packed(rt, monkeypatch, staged):
    """The rows named, in order, one after another from the buffer's start: in one piece, and
    (``staged``) in chunks of whole rows, each chunk's DMA enqueued as it is gathered."""
    if staged:
        chunked(monkeypatch)
    cl = rt.cl
    frame = np.random.default_rng(8).integers(0, 256, (90, 37, 3), dtype=np.uint8)   # 111-byte rows
    rows = np.flatnonzero(np.arange(90) % 3 != 2).astype(np.int32)                    # 60 rows, 6660 bytes
    _, host = staging.pinned(rt, (frame.nbytes,), np.uint8)
    dst = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, frame.nbytes)
    cl.enqueue_fill_buffer(rt.queue, dst, np.uint8(0xAB), 0, frame.nbytes)
    events = staging.upload_rows(rt, dst, frame, rows, host)
    assert len(events) == (1 if not staged else -(-len(rows) // (1000 // 111)))
    events[-1].wait()
    back = np.empty(frame.nbytes, np.uint8)
    cl.enqueue_copy(rt.queue, back, dst)
    n = len(rows) * 111
    assert np.array_equal(back[:n].reshape(len(rows), 37, 3), frame[rows]) and np.all(back[n:] == 0xAB)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_executor_run_and_submit_equal_the_plain_copy(precision, monkeypatch):
    det = Detector("yolov3-tiny", input_size=SIZE, precision=precision)
    ex = det.executor(2, (SIZE, SIZE))
    blobs = [np.random.default_rng(k).random((2, 3, SIZE, SIZE), dtype=np.float32) for k in range(3)]
    monkeypatch.setenv("YOLO_CL_STAGING", "off")
    want = [[h.copy() for h in ex.run(b)] for b in blobs]
    chunked(monkeypatch)
    for b, w in zip(blobs, want):
        got = ex.run(b)
        assert all(np.array_equal(g, x) for g, x in zip(got, w))
    ex.submit(blobs[1], slot=0)
    ex.submit(blobs[2], slot=1)
    for slot, w in ((0, want[1]), (1, want[2])):
        assert all(np.array_equal(g, x) for g, x in zip(ex.collect(slot), w))
    pinned_blob = ex.input_array()
    pinned_blob[...] = blobs[0]
    assert staging.is_pinned(pinned_blob)
    assert all(np.array_equal(g, x) for g, x in zip(ex.run(pinned_blob), want[0]))


def test_detect_on_the_device_path_equals_the_plain_copy(chunks, monkeypatch):
    monkeypatch.setenv("YOLO_CL_HOST_PREPOST", "0")     # the device's preprocessing, as on a GPU
    image = cv2.imread(str(DOG))
    frame = cv2.resize(image, (1280, 720))
    det = Detector("yolov3-tiny", input_size=160)
    assert det.device_preprocess
    got = [det.detect(image), det.detect(frame)]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("YOLO_CL_STAGING", "off")
        want = [det.detect(image), det.detect(frame)]
    assert all(same_detections(g, w) for g, w in zip(got, want))
    assert got[0]


def test_frames_in_pinned_memory_go_without_a_host_copy(monkeypatch):
    monkeypatch.setenv("YOLO_CL_HOST_PREPOST", "0")     # the device's preprocessing, as on a GPU
    image = cv2.resize(cv2.imread(str(DOG)), (640, 360))
    det = Detector("yolov3-tiny", input_size=160)
    want = det.detect(image)
    frame = det.frame_array(360, 640)
    assert frame.shape == (360, 640, 3) and frame.dtype == np.uint8 and staging.is_pinned(frame)
    frame[...] = image

    real, calls = staging.upload, []

    def no_copy(rt, dst, src, host, dst_offset=0, src_pinned=None, **queue):
        """The upload, failing if it copied the frame into the staging buffer."""
        host[:] = 0xAB           # the stage's previous DMA has completed: _stage waited for it
        events = real(rt, dst, src, host, dst_offset, src_pinned, **queue)
        assert np.all(host == 0xAB), "a pinned frame was copied on the host"
        calls.append(src.shape)
        return events
    monkeypatch.setattr(staging, "upload", no_copy)
    assert same_detections(det.detect(frame), want, tol=0) and want
    frames = [det.frame_array(360, 640) for _ in range(3)]       # in flight: each its own pinned array
    assert len({f.ctypes.data for f in frames + [frame]}) == 4
    for f in frames:
        f[...] = image
    handles = [det.submit(f) for f in frames]
    assert all(same_detections(det.result(h), want, tol=0) for h in handles)
    assert calls == [(360, 640, 3)] * 4
    with pytest.raises(Exception, match="positive"):
        det.frame_array(0, 640)


def test_many_frames_held_at_once_are_all_pinned():
    """Eight streams on one detector hold a few frames each: frame_array keeps lending pinned
    frames past the old 8 (as many as PINNED_FRAME_BYTES hold), each its own, then plain ones."""
    from yolo_cl.detector import PINNED_FRAME_BYTES
    det = Detector("yolov3-tiny", input_size=160)
    held = [det.frame_array(360, 640) for _ in range(24)]
    assert all(staging.is_pinned(f) for f in held) and len({f.ctypes.data for f in held}) == 24
    h, w = 1200, 1600                                        # 5.76 MB frames: the byte budget binds
    cap = max(8, PINNED_FRAME_BYTES // (h * w * 3))
    big = [det.frame_array(h, w) for _ in range(cap + 2)]
    assert [staging.is_pinned(f) for f in big] == [True] * cap + [False, False]


def test_frame_array_does_not_wait_for_the_queue_lock():
    """A stream's decode thread asks frame_array for its next frame while another thread holds
    the detector's queue lock to enqueue a batch: it gets the frame at once."""
    import threading
    det = Detector("yolov3-tiny", input_size=160)
    det.frame_array(360, 640)                           # the pinned pool made beforehand
    got: list = []
    with det._lock:                                     # as DevicePath.submit holds it
        t = threading.Thread(target=lambda: got.append(det.frame_array(360, 640)), daemon=True)
        t.start()
        t.join(5)
        lent_while_held = bool(got)
    t.join(30)
    assert lent_while_held and staging.is_pinned(got[0])


def test_a_video_on_the_device_path_decodes_into_pinned_frames(monkeypatch, tmp_path):
    from yolo_cl.video import CaptureSource, Pipeline
    monkeypatch.setenv("YOLO_CL_HOST_PREPOST", "0")
    clip = tmp_path / "clip.avi"
    image = cv2.resize(cv2.imread(str(DOG)), (320, 240))
    out = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 10, (320, 240))
    for k in range(6):
        out.write(np.roll(image, 8 * k, axis=1))
    out.release()
    det = Detector("yolov3-tiny", input_size=160)
    plain = [f.image for f in iter(CaptureSource(str(clip), "file", "clip").read, None)]
    source = CaptureSource(str(clip), "file", "clip")
    results = list(Pipeline(det, source))
    assert source.frame_array == det.frame_array and [r.index for r in results] == list(range(6))
    for r in results:
        assert np.array_equal(r.frame, plain[r.index])
        assert same_detections(r.detections, det.detect(plain[r.index].copy()), tol=0)
    assert any(staging.is_pinned(r.frame) for r in results)
