"""Frames in flight give what one frame at a time gives.

``submit`` enqueues a frame's whole device path and returns; ``result`` waits for it. With
more frames submitted than there are buffer slots, results collected in any order, frames of
different sizes, batches, and the threaded video pipeline, every frame's detections equal
those of a lone ``detect`` call.
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from yolo_cl import Detector
from yolo_cl.inflight import SLOTS

from boxes import same_detections
from clips import read_frames

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
IMAGES = sorted((SHARED / "images").glob("*.jpg")) or sorted((ROOT / "models" / "images").glob("*.jpg"))
VIDEO = SHARED / "videos" / "library1.mp4"
SIZE = 160


def key(dets: list) -> list:
    return [(d.class_id, round(d.confidence, 5), tuple(np.round(d.box, 2))) for d in dets]


@pytest.fixture(scope="module")
def det():
    return Detector("yolov3-tiny", input_size=SIZE, fit="crop", device_preprocess=True, device_decode=True)


def test_default_path_follows_the_device_type(monkeypatch):
    d = Detector("yolov3-tiny", input_size=64)
    assert d.device_preprocess == d.device_decode == (not d.runtime.is_cpu)
    monkeypatch.setenv("YOLO_CL_HOST_PREPOST", "0")
    assert Detector("yolov3-tiny", input_size=64).device_preprocess
    monkeypatch.setenv("YOLO_CL_HOST_PREPOST", "1")
    assert not Detector("yolov3-tiny", input_size=64).device_preprocess


@pytest.fixture(scope="module")
def frames():
    imgs = [cv2.imread(str(p)) for p in IMAGES]
    imgs += [cv2.resize(imgs[0], (301, 199)), np.ascontiguousarray(imgs[1][::2, ::3])]
    return imgs


@pytest.fixture(scope="module")
def alone_dets(det, frames):
    out = [det.detect(im, thresh=0.1) for im in frames]
    assert sum(map(len, out)) > 0
    return out


@pytest.fixture(scope="module")
def alone(alone_dets):
    return [key(d) for d in alone_dets]


def test_more_submissions_than_slots_collected_out_of_order(det, frames, alone):
    handles = [det.submit(im, thresh=0.1) for im in frames]
    assert len(handles) > SLOTS
    got = [None] * len(frames)
    for i in list(range(1, len(frames), 2)) + list(range(0, len(frames), 2)):
        got[i] = key(det.result(handles[i]))
    assert got == alone


def test_interleaved_submit_and_result(det, frames, alone):
    """The pattern of a video loop: submit N+1, then collect N."""
    got, prev = [], None
    for im in frames:
        h = det.submit(im, thresh=0.1)
        if prev is not None:
            got.append(key(det.result(prev)))
        prev = h
    got.append(key(det.result(prev)))
    assert got == alone


def same_as_alone(batches: list, singles: list) -> bool:
    """Batched detections equal one-at-a-time ones within 1e-3 (confidence, pixels): a batch runs
    its own executor, whose tuned kernels may sum in another order on a GPU (an H100 gave 0.33476
    alone and 0.33475 in a batch of 4); on PoCL they are the same kernels and agree exactly."""
    return len(batches) == len(singles) and all(same_detections(got, one) for got, one in zip(batches, singles))


def test_batch_of_mixed_sizes(det, frames, alone_dets):
    assert same_as_alone(det.detect_batch(frames, thresh=0.1), alone_dets)
    assert same_as_alone(det.result(det.submit(frames, thresh=0.1)), alone_dets)


def test_host_path_submit_equals_device_path(det, frames):
    host = Detector("yolov3-tiny", input_size=SIZE, fit="crop", device_preprocess=False, device_decode=False)
    dev = [det.detect(im, thresh=0.1) for im in frames]
    handles = [host.submit(im, thresh=0.1) for im in frames]
    assert all(same_detections(host.result(h), d) for h, d in zip(handles, dev))


@pytest.mark.parametrize("batch", [1, 3])
def test_stream_equals_one_at_a_time(det, batch):
    video = read_frames(VIDEO, 8)
    assert len(video) == 8
    ref = [key(det.detect(f, thresh=0.1)) for f in video]
    got = [(i, key(d)) for i, _, d in det.stream(iter(video), thresh=0.1, batch=batch)]
    assert got == list(enumerate(ref))
    size = det.net_size_for(video[0].shape[1], video[0].shape[0])
    assert (8 % 3, size) not in det._executors      # the last, short batch was padded


def test_output_stages_write_in_order_what_drawing_inline_gives(frames):
    from yolo_cl.draw import draw
    from yolo_cl.postprocess import Detection
    from yolo_cl.video import OutputStages, Result, StageTimes

    results = [Result(i, f, [Detection(i % 3, "x", 0.5, (10.0, 20.0, 60.0 + i, 90.0))], i / 30, 0.0)
               for i, f in enumerate(frames * 3)]
    written = []
    times = StageTimes()
    out = OutputStages(lambda r, a: written.append((r.index, a)), None, True, times, depth=2)
    for r in results:
        assert out.put(r)
    out.close()
    assert [i for i, _ in written] == list(range(len(results)))
    assert all(np.array_equal(a, draw(r.frame, r.detections)) for (_, a), r in zip(written, results))
    assert times.count == len(results)


def test_output_stages_report_a_failed_write(frames):
    from yolo_cl.video import OutputStages, Result

    def write(r, a):
        if r.index == 2:
            raise OSError("disk full")

    out = OutputStages(write, None, False, depth=1)
    accepted = [out.put(Result(i, frames[0], [], 0.0, 0.0)) for i in range(40)]
    with pytest.raises(OSError, match="disk full"):
        out.close()
    assert not all(accepted)


def test_forward_iter_equals_forward_one_at_a_time(det):
    rng = np.random.default_rng(5)
    blobs = [rng.random((1, 3, SIZE, SIZE), dtype=np.float32) for _ in range(5)]
    blobs.insert(2, rng.random((2, 3, 96, 128), dtype=np.float32))     # another batch and size
    ref = [det.forward(b) for b in blobs]
    got = list(det.forward_iter(iter(blobs)))
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert len(g) == len(r) and all(np.array_equal(x, y) for x, y in zip(g, r))


def test_an_executor_dropped_from_the_cache_takes_its_device_state_along(det, frames, alone_dets):
    """Device-path state is held weakly per executor: a cache that evicts an executor frees it,
    and a new executor never meets state bound to the old one's arena."""
    import gc
    import weakref

    det.detect_batch(frames[:1] * 4, thresh=0.1)
    key4 = next(k for k in det._executors if k[0] == 4 and k[1] == det.net_size_for(*frames[0].shape[1::-1]))
    ex = det._executors[key4]
    gone = weakref.ref(ex)
    assert ex in det.device_path._decoders and ex in det.device_path.prep._kernels
    del det._executors[key4], ex
    gc.collect()
    assert gone() is None              # neither its decoder nor its preprocessing state kept it alive
    assert same_as_alone(det.detect_batch(frames[:1] * 4, thresh=0.1)[3:], alone_dets[:1])


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_uploads_on_the_copy_queue_equal_uploads_in_line(monkeypatch, frames, precision):
    """With a copy queue (``Runtime.copy_queue``, forced here on a CPU device) a frame's DMA is
    enqueued there, waiting only for the kernel that last read its staging buffer, so it can run
    beside the previous frame's network; frames in flight and ``forward_iter``'s blobs (half
    storage: the float32 staging buffer) give exactly what uploads on the kernels' queue give."""
    monkeypatch.setenv("YOLO_CL_COPY_QUEUE", "0")
    inline = Detector("yolov3-tiny", input_size=SIZE, fit="crop", precision=precision,
                      device_preprocess=True, device_decode=True)
    monkeypatch.setenv("YOLO_CL_COPY_QUEUE", "1")
    beside = Detector("yolov3-tiny", input_size=SIZE, fit="crop", precision=precision,
                      device_preprocess=True, device_decode=True)
    assert inline.runtime.copy_queue is None and beside.runtime.copy_queue is not None
    want = [inline.detect(im, thresh=0.1) for im in frames]
    assert sum(map(len, want)) > 0
    handles = [beside.submit(im, thresh=0.1) for im in frames * 2]      # more frames than slots
    got = [beside.result(h) for h in handles]
    assert all(key(g) == key(w) for g, w in zip(got, want * 2))
    stages = beside.device_path.prep._stages.values()
    assert stages and all(st.copied[0].command_queue == beside.runtime.copy_queue and st.read for st in stages)
    rng = np.random.default_rng(7)
    blobs = [rng.random((1, 3, SIZE, SIZE), dtype=np.float32) for _ in range(4)]
    ref = [inline.forward(b) for b in blobs]
    for g, r in zip(beside.forward_iter(iter(blobs)), ref):
        assert all(np.array_equal(x, y) for x, y in zip(g, r))
