"""Device preprocessing and [yolo] decode against the host path (the reference).

The resize tables reproduce cv2.resize(INTER_LINEAR) on uint8; the preprocessing kernel's
blob matches ``to_blob`` within 2/255 for every fit, odd sizes, fp32 and half; the decode
kernel's candidates match ``decode_yolo`` on synthetic heads (logistic and new_coords,
scale_x_y, two heads); and the real yolov3-tiny gives the same detections on every shared
image through either path.
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from yolo_cl import Detector
from yolo_cl import postprocess as post
from yolo_cl.kernels.decode import DeviceDecoder
from yolo_cl.kernels.preprocess import packed_rows, resize_tables
from yolo_cl.preprocess import FITS, to_blob

from boxes import same_detections
from darknet_io import write_random_weights
from tiny_cfgs import conv, maxpool, net_header, route, yolo

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
IMAGES = sorted((SHARED / "images").glob("*.jpg")) or sorted((ROOT / "models" / "images").glob("*.jpg"))
SIZES = [(576, 768), (720, 1280), (101, 37), (417, 333), (5, 3), (1, 640), (480, 640), (96, 96)]


def table_resize(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """The kernel's arithmetic in NumPy, driven by the same tables."""
    xt, yt = resize_tables(img.shape[1], w).astype(np.int64), resize_tables(img.shape[0], h).astype(np.int64)
    im = img.astype(np.int64)
    rows = [im[yt[:, k]][:, xt[:, 0]] * xt[None, :, 2, None] + im[yt[:, k]][:, xt[:, 1]] * xt[None, :, 3, None]
            for k in (0, 1)]
    v = (((yt[:, 2, None, None] * (rows[0] >> 4)) >> 16) + ((yt[:, 3, None, None] * (rows[1] >> 4)) >> 16) + 2) >> 2
    return np.clip(v, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("src,dst", [((576, 768), (416, 416)), ((720, 1280), (234, 416)), ((417, 333), (256, 416)),
                                     ((101, 37), (416, 416)), ((480, 640), (240, 320))])
def test_tables_reproduce_cv2_resize(src, dst):
    img = np.random.default_rng(1).integers(0, 256, src + (3,), dtype=np.uint8)
    ref = cv2.resize(img, (dst[1], dst[0]), interpolation=cv2.INTER_LINEAR).astype(int)
    diff = np.abs(table_resize(img, dst[1], dst[0]).astype(int) - ref)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


@pytest.mark.parametrize("src,dst", [(720, 234), (1080, 234), (3024, 312), (417, 96), (100, 60), (5, 3)])
def test_packed_rows_read_what_the_whole_frame_gives(src, dst):
    """The rows a resize reads, packed, with the renumbered table: the same pixels as the whole
    frame with the plain table."""
    img = np.random.default_rng(src).integers(0, 256, (src, 7, 3), dtype=np.uint8)
    rows, table = packed_rows(src, dst)
    full = resize_tables(src, dst)
    assert (np.diff(rows) > 0).all() and len(rows) <= min(src, 2 * dst)
    np.testing.assert_array_equal(rows[table[:, :2]], full[:, :2])
    np.testing.assert_array_equal(table[:, 2:], full[:, 2:])


@pytest.fixture(scope="module", params=["fp32", "fp16"])
def tiny(request):
    return Detector("yolov3-tiny", input_size=96, precision=request.param, fit="stretch", device_preprocess=True)


def device_blob(det, img, place, index=0, batch=1):
    ex = det.executor(batch, (place.net_w, place.net_h))
    det.device_path.prep.enqueue(ex, img, place, index, 0)
    g = ex.graph.input
    out = np.empty((batch, 3, g.h, g.w), np.float16 if ex.half else np.float32)
    det.runtime.cl.enqueue_copy(det.runtime.queue, out, ex.arena, src_offset=ex.plan.offset(g) * out.itemsize)
    det.runtime.queue.finish()
    return out[index].astype(np.float32)


@pytest.mark.parametrize("fit", FITS)
def test_blob_matches_host_path(tiny, fit):
    rng = np.random.default_rng(2)
    tiny.fit = fit
    try:
        for h, w in SIZES:
            img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            place = tiny.placement(w, h)
            ref = to_blob(img, place.net_w, place.net_h, place=place)
            if tiny.precision.half:
                ref = ref.astype(np.float16).astype(np.float32)
            got = device_blob(tiny, img, place)
            assert got.shape == ref.shape
            assert np.abs(got - ref).max() <= 2 / 255, (fit, h, w)
    finally:
        tiny.fit = "stretch"


def test_tall_plain_frames_send_only_the_rows_the_resize_reads(tiny, monkeypatch):
    """A plain frame resized to at most half its rows goes packed (only the rows read), and the
    blob is bit-equal to sending the whole frame; a pinned frame and a short one go whole."""
    import yolo_cl.kernels.preprocess as prep_mod
    from yolo_cl import staging
    sent = []
    real = staging.upload_rows
    monkeypatch.setattr(staging, "upload_rows", lambda rt, dst, src, rows, host, **queue: sent.append(len(rows))
                        or real(rt, dst, src, rows, host, **queue))
    rng = np.random.default_rng(5)
    tall = rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    short = rng.integers(0, 256, (101, 37, 3), dtype=np.uint8)
    pinned = tiny.frame_array(720, 1280)
    pinned[...] = tall
    place, short_place = tiny.placement(1280, 720), tiny.placement(37, 101)
    packed = device_blob(tiny, tall, place)
    assert sent == [len(packed_rows(720, place.new_h)[0])] and sent[0] <= 2 * place.new_h
    whole = device_blob(tiny, pinned, place)
    device_blob(tiny, short, short_place)
    assert len(sent) == 1                              # neither the pinned nor the short frame
    np.testing.assert_array_equal(packed, whole)
    monkeypatch.setattr(prep_mod, "ROWS_SHARE_CPU", 0.0)     # packing off: a fresh stager sends it whole
    monkeypatch.setattr(prep_mod, "ROWS_SHARE_GPU", 0.0)
    tiny.device_path.prep._packed.clear()
    np.testing.assert_array_equal(device_blob(tiny, tall, place), packed)
    assert len(sent) == 1


def test_a_gpu_packs_only_well_under_half_the_rows():
    """1920x1080 letterboxed to 234 rows reads 468 rows (43%): packed on a CPU device, where the
    gather won, sent whole on a GPU, where it lost (H100); 4K to 416 rows (38%) is packed on both."""
    from test_tuner import fake_rt
    from yolo_cl.kernels.preprocess import rows_share
    cpu, gpu = fake_rt(), fake_rt(kind="GPU")
    hd = len(packed_rows(1080, 234)[0]) / 1080
    uhd = len(packed_rows(2160, 416)[0]) / 2160
    assert rows_share(gpu) < hd <= rows_share(cpu)
    assert uhd <= rows_share(gpu) <= rows_share(cpu)


def test_blob_second_image_of_a_batch_and_a_larger_frame(tiny):
    """Staging grows for a larger frame; batch index 1 lands in the second input."""
    rng = np.random.default_rng(3)
    small, big = (rng.integers(0, 256, s + (3,), dtype=np.uint8) for s in ((50, 60), (300, 500)))
    for img in (small, big):
        place = tiny.placement(img.shape[1], img.shape[0])
        ref = to_blob(img, place.net_w, place.net_h, place=place)
        assert np.abs(device_blob(tiny, img, place, index=1, batch=2) - ref).max() <= 2 / 255


def test_blob_after_the_table_cache_was_emptied(tiny, monkeypatch):
    """A frame size seen again after its resize tables were dropped from the cache (the frames
    between had other sizes) is resized with live tables, not the freed buffers its kernel's
    arguments were set to, which newer tables may since occupy."""
    import yolo_cl.kernels.preprocess as prep_mod
    monkeypatch.setattr(prep_mod, "TABLE_CACHE", 4)
    rng = np.random.default_rng(4)
    first = rng.integers(0, 256, (300, 500, 3), dtype=np.uint8)      # the largest: the stage never grows
    others = [rng.integers(0, 256, (40 + 7 * k, 60 + 11 * k, 3), dtype=np.uint8) for k in range(6)]
    # the first frame through the batch-1 executor's kernel, the others through the batch-2
    # executor's (so the batch-1 kernel keeps its arguments), then the first again
    for img, batch in [(first, 1)] + [(o, 2) for o in others] + [(first, 1)]:
        place = tiny.placement(img.shape[1], img.shape[0])
        ref = to_blob(img, place.net_w, place.net_h, place=place)
        if tiny.precision.half:
            ref = ref.astype(np.float16).astype(np.float32)
        assert np.abs(device_blob(tiny, img, place, batch=batch) - ref).max() <= 2 / 255, img.shape


def heads_cfg(scale: float, new_coords: int) -> str:
    """Two 2-class heads, the second behind a 2x2 maxpool, with ``scale_x_y`` and ``new_coords``."""
    head = conv(21, 1, pad=0, bn=0, act="linear")
    return (net_header(32, 32) + head + yolo((0, 1, 2), classes=2, scale_x_y=scale, new_coords=new_coords)
            + route(-2) + maxpool() + head + yolo((3, 4, 5), classes=2, scale_x_y=scale, new_coords=new_coords))


@pytest.mark.parametrize("new_coords,scale", [(0, 1.0), (0, 1.05), (1, 2.0)])
@pytest.mark.parametrize("half", [False, True])
def test_decode_matches_host_on_synthetic_heads(tmp_path, new_coords, scale, half):
    cfg = tmp_path / "heads.cfg"
    cfg.write_text(heads_cfg(scale, new_coords))
    weights = write_random_weights(str(cfg), str(tmp_path / "heads.weights"), calib_size=32)
    det = Detector(cfg, weights, precision="fp16" if half else "fp32", device_preprocess=True, device_decode=True)
    ex = det.executor(2)
    dec = DeviceDecoder(det.runtime, ex, det.heads, slots=2)
    rng = np.random.default_rng(new_coords * 10 + int(half))
    cl, q = det.runtime.cl, det.runtime.queue
    dtype = np.float16 if half else np.float32
    heads = []
    for v in ex.graph.outputs:   # synthetic head tensors written straight into the arena
        x = rng.uniform(-3, 3, (2, v.c, v.h, v.w)) if not new_coords else rng.uniform(0, 1, (2, v.c, v.h, v.w))
        x = x.astype(dtype)
        for b in range(2):
            off = (ex.plan.offset(v.tensor) + v.c0 * v.h * v.w + b * v.tensor.size) * x.itemsize
            cl.enqueue_copy(q, ex.arena, np.ascontiguousarray(x[b]), dst_offset=off)
        heads.append(x.astype(np.float32))
    thresh = 0.3
    for slot in (0, 1):
        dec.enqueue(thresh, slot).wait()
        for b in range(2):
            boxes, probs, _ = dec.collect(slot, b)
            ref_b, ref_p = [], []
            for x, head in zip(heads, det.heads):
                rb, _, rp = post.decode_yolo(x[b], head.p, 32, 32, thresh)
                ref_b.append(rb)
                ref_p.append(rp)
            ref_b, ref_p = np.concatenate(ref_b), np.concatenate(ref_p)
            assert len(ref_b) > 10 and boxes.shape == ref_b.shape
            np.testing.assert_allclose(boxes, ref_b, rtol=2e-5, atol=1e-6)
            np.testing.assert_allclose(probs, ref_p, rtol=2e-5, atol=1e-6)


def test_padding_inputs_of_a_partial_batch_are_not_decoded():
    """Three images on a batch-4 executor: the fourth input is padding, whose counter no
    preprocessing zeroed; the decode leaves it alone (it used to add that input's candidates to
    the last frame's, frame after frame, until the NMS read a list of repeated rows)."""
    det = Detector("yolov3-tiny", input_size=160, device_preprocess=True, device_decode=True)
    frames = [cv2.imread(str(p)) for p in IMAGES][:3]
    frames += [frames[0]] * (3 - len(frames))
    want = [det.detect(f) for f in frames]
    ex = det.executor(4)
    dec = det.device_path.decoder(ex)
    cl, q = det.runtime.cl, det.runtime.queue
    sentinel = np.full(4, 777, np.int32)
    for slot in range(len(dec._sets)):
        cl.enqueue_copy(q, dec.counter(slot), sentinel)
    for _ in range(3 * len(dec._sets)):
        for got, w in zip(det.detect_batch(frames), want):
            assert same_detections(got, w)
    for slot in range(len(dec._sets)):
        counts = np.empty(4, np.int32)
        cl.enqueue_copy(q, counts, dec.counter(slot))
        assert counts[3] == 777 and (counts[:3] != 777).all(), counts


@pytest.mark.parametrize("precision,fit", [("fp32", f) for f in FITS] + [("fp16", "letterbox")])
def test_real_network_same_detections(precision, fit):
    dev = Detector("yolov3-tiny", precision=precision, fit=fit, device_preprocess=True, device_decode=True)
    host = Detector("yolov3-tiny", precision=precision, fit=fit, device_preprocess=False, device_decode=False)
    assert dev.device_decode and not host.device_preprocess
    seen = 0
    for path in IMAGES:
        img = cv2.imread(str(path))
        a, b = dev.detect(img), host.detect(img)
        assert same_detections(a, b), (path.name, a, b)
        seen += len(b)
    assert seen > 0


def test_overflow_falls_back_to_host_decode(monkeypatch):
    """More candidates than the buffer holds: that image is decoded on the host instead."""
    import yolo_cl.kernels.decode as decode
    monkeypatch.setattr(decode, "CAP", 100)
    dev = Detector("yolov3-tiny", input_size=256, device_preprocess=True, device_decode=True)
    host = Detector("yolov3-tiny", input_size=256, device_preprocess=False, device_decode=False)
    img = cv2.imread(str(IMAGES[0]))
    dec = dev.device_path.decoder(dev.executor(1))
    assert dec.cap == 100
    a, b = dev.detect(img, thresh=0.0005), host.detect(img, thresh=0.0005)
    assert int(dec._sets[0]["host_count"][0]) > dec.cap      # the first frame's set did overflow
    assert len(b) > 100 and same_detections(a, b)


def test_region_heads_use_the_device_preprocessing_and_the_host_decode(tmp_path):
    cfg = ROOT / "models" / "cfg" / "yolov2-tiny.cfg"
    weights = write_random_weights(str(cfg), str(tmp_path / "v2.weights"), calib_size=64)
    dev = Detector(cfg, weights, input_size=96, device_preprocess=True)
    host = Detector(cfg, weights, input_size=96, device_preprocess=False)
    assert dev.device_preprocess and not dev.device_decode
    seen = 0
    for path in IMAGES[:3]:
        img = cv2.imread(str(path))
        ref = host.detect(img, thresh=0.05)
        assert same_detections(dev.detect(img, thresh=0.05), ref), path.name
        seen += len(ref)
    assert seen > 0


def test_half_executor_converts_a_float32_blob_on_the_device():
    det = Detector("yolov3-tiny", input_size=64, precision="fp16")
    ex = det.executor(2)
    blob = np.random.default_rng(7).random((2, 3, 64, 64), dtype=np.float32)
    host_converted = ex.run(blob.astype(np.float16))      # the dtype already matches: uploaded as is
    assert ex._f32_input is None
    device_converted = ex.run(blob)
    assert ex._f32_input is not None
    assert all(np.array_equal(a, b) for a, b in zip(device_converted, host_converted))
