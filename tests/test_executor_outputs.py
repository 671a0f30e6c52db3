"""Issue 14: ``Executor.run``/``submit``/``collect`` lend the arrays the heads were read into.

The reference is an executor whose pool holds no set (``hostsets.CAP = 0``): it reads every frame
into its spare set and returns copies, the path every frame took before the pool.
"""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pytest

from boxes import same_detections
from yolo_cl import Detector, hostsets
from yolo_cl.errors import YoloClError
from yolo_cl.preprocess import to_blob

ROOT = Path(__file__).resolve().parents[1]
IMAGES = sorted((ROOT.parent / "shared" / "images").glob("*.jpg")) or sorted((ROOT / "models" / "images").glob("*.jpg"))

SIZE = 96
BATCHES = (1, 2, 4)


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def pair(request):
    """(lending Detector, copying Detector) of one precision."""
    lend = Detector("yolov3-tiny", input_size=SIZE, precision=request.param)
    copy = Detector("yolov3-tiny", input_size=SIZE, precision=request.param)
    return lend, copy


def copying(det: Detector, batch: int, monkeypatch):
    """``det``'s executor for ``batch``, its pool made empty on its first run (so: copies)."""
    ex = det.executor(batch, (SIZE, SIZE))
    with monkeypatch.context() as m:
        m.setattr(hostsets, "CAP", 0)
        ex.run(np.zeros((batch, 3, SIZE, SIZE), np.float32))
    return ex


def frames(batch: int, n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.random((batch, 3, SIZE, SIZE), dtype=np.float32) for _ in range(n)]


def reference(pair, batch, blobs, monkeypatch) -> list:
    ref = copying(pair[1], batch, monkeypatch)
    return [ref.run(b) for b in blobs]


def same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(g.dtype == np.float32 and np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("batch", BATCHES)
def test_lent_outputs_equal_copies_over_frames(pair, batch, monkeypatch):
    blobs = frames(batch, 6, batch)
    want = reference(pair, batch, blobs, monkeypatch)
    ex = pair[0].executor(batch, (SIZE, SIZE))
    for b, w in zip(blobs + blobs[::-1], want + want[::-1]):
        assert same(ex.run(b), w)
    assert same(pair[0].forward(blobs[2]), want[2])


@pytest.mark.parametrize("batch", (1, 2))
def test_a_kept_result_or_view_never_changes(pair, batch, monkeypatch):
    blobs = frames(batch, 2 * hostsets.CAP + 2, 10 + batch)
    want = reference(pair, batch, blobs, monkeypatch)
    ex = pair[0].executor(batch, (SIZE, SIZE))
    kept = ex.run(blobs[0])
    view = ex.run(blobs[1])[-1][0, 3:]             # only a view of one head of the second result is kept
    later = [ex.run(b) for b in blobs[2:]]         # more results kept than the pool has sets
    assert same(kept, want[0])
    assert np.array_equal(view, want[1][-1][0, 3:])
    for got, w in zip(later, want[2:]):
        assert same(got, w)
    buffers = [o.ctypes.data for r in [kept] + later for o in r]
    assert len(set(buffers)) == len(buffers)       # no two kept results share memory


@pytest.mark.parametrize("batch", (1, 4))
def test_dropped_results_reuse_the_same_memory(pair, batch):
    ex = pair[0].executor(batch, (SIZE, SIZE))
    blobs = frames(batch, 3, 20 + batch)
    outs = None
    for b in blobs:                                # warm-up: the two sets the loop below needs exist
        outs = ex.run(b)
    head_bytes = sum(o.nbytes for o in outs)
    pointers = set()
    tracemalloc.start()
    try:
        for i in range(12):
            outs = ex.run(blobs[i % 3])            # the previous result is still held during the call
            pointers.add(tuple(o.ctypes.data for o in outs))
        for i in range(6):
            pointers.add(tuple(o.ctypes.data for o in ex.run(blobs[i % 3])))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(pointers) <= 2
    assert peak < head_bytes / 4                   # a copy of the heads would be head_bytes


def test_all_sets_held_returns_copies_then_reuses_again(pair, monkeypatch):
    blobs = frames(1, hostsets.CAP + 2, 30)
    want = reference(pair, 1, blobs, monkeypatch)
    ex = pair[0].executor(1, (SIZE, SIZE))
    held = [ex.run(b) for b in blobs[:hostsets.CAP]]
    lent = {o.ctypes.data for r in held for o in r}
    extra = ex.run(blobs[-1])
    assert same(extra, want[-1]) and not lent & {o.ctypes.data for o in extra}
    assert all(same(h, w) for h, w in zip(held, want))
    del held[0]
    again = ex.run(blobs[-2])
    assert same(again, want[-2]) and {o.ctypes.data for o in again} <= lent


@pytest.mark.parametrize("batch", (1, 2))
def test_submit_collect_overlapping_slots_equal_one_at_a_time(pair, batch, monkeypatch):
    blobs = frames(batch, 7, 40 + batch)
    want = reference(pair, batch, blobs, monkeypatch)
    ex = pair[0].executor(batch, (SIZE, SIZE))
    got, first = [], None
    ex.submit(blobs[0], 0)
    for i in range(1, len(blobs)):
        ex.submit(blobs[i], i % 2)                 # two passes in flight
        outs = ex.collect((i - 1) % 2)
        if first is None:
            first = outs                           # kept while the slots go round
        got.append([o.copy() for o in outs])
    got.append(ex.collect((len(blobs) - 1) % 2))
    for g, w in zip(got, want):
        assert same(g, w)
    assert same(first, want[0])
    ex.submit(blobs[3], 0)
    ex.submit(blobs[4], 0)                         # resubmitting a slot drops its uncollected result
    assert same(ex.collect(0), want[4])


def test_collect_without_submit_is_a_clear_error(pair):
    ex = pair[0].executor(1, (SIZE, SIZE))
    with pytest.raises(YoloClError, match="nothing was submitted"):
        ex.collect(7)


def test_run_steps_returns_what_run_does_and_every_step(pair, monkeypatch):
    blobs = frames(2, 2, 50)
    want = reference(pair, 2, blobs, monkeypatch)
    ex = pair[0].executor(2, (SIZE, SIZE))
    for b, w in zip(blobs, want):
        outs, ms = ex.run_steps(b)
        assert same(outs, w)
        assert list(ms) == ["upload", "enqueue", "device", "read", "return"] and all(v >= 0 for v in ms.values())


def test_input_array_is_lent_like_the_outputs(pair):
    ex = pair[0].executor(2, (SIZE, SIZE))
    a, b = ex.input_array(), ex.input_array()
    assert a.shape == (2, 3, SIZE, SIZE) and a.dtype == np.float32
    assert not np.shares_memory(a, b)                     # both held: two arrays
    c = ex.input_array()
    assert not np.shares_memory(c, a) and not np.shares_memory(c, b)
    where = a.ctypes.data
    del a, c
    assert ex.input_array().ctypes.data == where          # dropped: lent again


@pytest.mark.parametrize("batch", (1, 2))
def test_a_half_input_array_goes_as_it_is(pair, batch):
    """A half-storage plan lends a float16 pinned input too: ``run`` sends it by DMA as it is, no
    float32 staging or conversion launch made, and its heads equal those of the float32 blob it
    rounds; float32 plans refuse it, and no plan lends other types."""
    det = pair[0]
    ex = det.executor(batch, (SIZE, SIZE))
    blob = frames(batch, 1, 70 + batch)[0]
    if not ex.half:
        with pytest.raises(YoloClError, match="float16"):
            ex.input_array(np.float16)
        return
    with pytest.raises(YoloClError, match="float64"):
        ex.input_array(np.float64)
    fresh = Detector("yolov3-tiny", input_size=SIZE, precision="fp16").executor(batch, (SIZE, SIZE))
    h = fresh.input_array(np.float16)
    assert h.dtype == np.float16 and h.shape == blob.shape
    h[...] = blob
    got = [o.copy() for o in fresh.run(h)]
    assert fresh._f32_input is None                      # the half blob needed no float32 staging
    want = ex.run(h.astype(np.float32))                  # the same values, converted on the device
    assert same(got, want)


@pytest.mark.parametrize("batch", (1, 2))
def test_half_heads_are_the_float32_heads_as_the_plan_holds_them(pair, batch):
    """``outputs_as(np.float16)`` on a half-storage plan: ``run`` and ``submit``/``collect`` hand
    out float16 heads, each the float32 head's value (which was that half, converted), over
    several frames and back to float32; a float32 plan, other types and a pass not collected yet
    are refused by name."""
    det = pair[0]
    ex = Detector("yolov3-tiny", input_size=SIZE, precision=det.precision.name).executor(batch, (SIZE, SIZE))
    blobs = frames(batch, 3, 90 + batch)
    if not ex.half:
        with pytest.raises(YoloClError, match="float16"):
            ex.outputs_as(np.float16)
        return
    with pytest.raises(YoloClError, match="float64"):
        ex.outputs_as(np.float64)
    want = [[o.copy() for o in ex.run(b)] for b in blobs]
    ex.outputs_as(np.float16)
    for b, w in zip(blobs, want):
        got = ex.run(b)
        assert all(g.dtype == np.float16 for g in got)
        assert same([g.astype(np.float32) for g in got], w)
    ex.submit(blobs[0])
    with pytest.raises(YoloClError, match="not collected"):
        ex.outputs_as(np.float32)
    assert same([g.astype(np.float32) for g in ex.collect()], want[0])
    ex.outputs_as(np.float32)
    assert same(ex.run(blobs[1]), want[1])


def test_host_path_detect_batch_through_the_pinned_input(pair, monkeypatch):
    """detect_batch writes the blob into ``input_array`` (left dirty by an earlier user here) and
    pads the batch; each image's detections equal detecting it from a blob of its own."""
    det = pair[0]
    monkeypatch.setattr(det, "device_preprocess", False)
    images = [cv2.imread(str(p)) for p in IMAGES[:3]]
    assert len(images) == 3 and all(im is not None for im in images)
    for n in (1, 4):
        dirty = det.executor(n, det.net_size_for(*images[0].shape[1::-1])).input_array()
        dirty[:] = np.nan
        del dirty
    alone = []
    for im in images:
        place = det.placement(im.shape[1], im.shape[0])
        heads = det.forward(to_blob(im, place.net_w, place.net_h, place=place)[None])
        alone.append(det.postprocess([h[0] for h in heads], im.shape[1], im.shape[0], 0.1, 0.45, place))
    assert any(alone)
    got = det.detect_batch(images, thresh=0.1)
    for g, a in zip(got, alone):
        assert same_detections(g, a)
    assert all(same_detections(det.detect(im, thresh=0.1), a) for im, a in zip(images, alone))


def test_threads_forwarding_at_once_keep_their_own_results(pair, monkeypatch):
    """Two threads call ``forward`` in turn on one Detector, each keeping its last two results
    while the other's runs take sets: every kept result stays its own blob's."""
    import threading

    blobs = frames(1, 6, 60)
    want = reference(pair, 1, blobs, monkeypatch)
    det, bad = pair[0], []

    def work(order: list) -> None:
        kept: list = []
        for i in order:
            kept = (kept + [(i, det.forward(blobs[i]))])[-2:]
            bad.extend(j for j, outs in kept if not same(outs, want[j]))

    threads = [threading.Thread(target=work, args=(order,)) for order in ([0, 1, 2, 3, 4, 5] * 3, [5, 3, 1, 4, 2, 0] * 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def test_heads_read_as_they_complete_equal_heads_read_at_the_end(monkeypatch):
    """Half storage converts the heads into float32 staging buffers; each is converted right after
    the launch that completes it and read on a second queue while the network goes on. The same
    heads as converting and reading all of them after the last launch, for ``run`` and for passes
    in flight (``submit``: a slot's conversion waits for the other slot's read of its buffer).
    Early reads cut the launch list: a device offering command buffers would record it whole."""
    monkeypatch.setenv("YOLO_CL_COMMAND_BUFFER", "0")
    early = Detector("yolov3-tiny", input_size=SIZE, precision="fp16").executor(2, (SIZE, SIZE))
    late = Detector("yolov3-tiny", input_size=SIZE, precision="fp16").executor(2, (SIZE, SIZE))
    late.early_reads = False
    assert early.early_reads
    marks = sorted(early._read_marks)
    assert sorted(o for m in marks for o in early._read_marks[m]) == [0, 1]
    assert marks[0] < len(early.launches) - 1        # the first head leaves before the network ends
    blobs = frames(2, 4, 21)
    want = [[h.copy() for h in late.run(b)] for b in blobs]
    for b, w in zip(blobs, want):
        assert same(early.run(b), w)
    early.submit(blobs[0], 0)
    early.submit(blobs[1], 1)
    assert same(early.collect(0), want[0])
    early.submit(blobs[2], 0)
    assert same(early.collect(1), want[1])
    assert same(early.collect(0), want[2])
