"""Issue 4: fp16 vs fp32, crop vs letterbox, batch vs single, plan replay vs eager."""
from pathlib import Path

import cv2
import numpy as np
import pytest

import yolo_cl
from boxes import iou
from clips import read_frames

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
IMAGES = sorted((SHARED / "images").glob("*.jpg"))


def matched(ref, got, min_iou, min_conf=0.0):
    """Every confident reference detection has a same-class detection overlapping it by min_iou."""
    misses = []
    for r in ref:
        if r.confidence < min_conf:
            continue
        best = max((iou(r.box, g.box) for g in got if g.class_id == r.class_id), default=0.0)
        if best < min_iou:
            misses.append((r.label, round(r.confidence, 3), round(best, 3)))
    return misses


@pytest.fixture(scope="module")
def fp32():
    return yolo_cl.Detector("yolov3-tiny")


@pytest.fixture(scope="module")
def fp16():
    return yolo_cl.Detector("yolov3-tiny", precision="fp16")


def test_fp16_matches_fp32_on_every_shared_image(fp32, fp16):
    assert IMAGES, "no shared images"
    worst = 0.0
    for path in IMAGES:
        img = cv2.imread(str(path))
        a, b = fp32.detect(img), fp16.detect(img)
        assert a, path.name
        assert not matched(a, b, 0.9, min_conf=0.3), path.name
        assert not matched(b, a, 0.9, min_conf=0.3), path.name
        blob = np.random.default_rng(1).random((1, 3, 416, 416), dtype=np.float32)
        for x, y in zip(fp32.forward(blob), fp16.forward(blob)):
            worst = max(worst, float(np.abs(x - y).max() / np.abs(x).max()))
    assert worst < 1e-2
    # half storage halves the activation pool and the weights
    m32, m16 = fp32.memory_report(), fp16.memory_report()
    assert m16["pool_peak"] * 2 == m32["pool_peak"]
    assert m16["weights"] * 2 == m32["weights"]


def test_batch_equals_single(fp32):
    rng = np.random.default_rng(2)
    blob = rng.random((3, 3, 416, 416), dtype=np.float32)
    batched = fp32.forward(blob)
    for i in range(3):
        single = fp32.forward(blob[i:i + 1])
        for hb, hs in zip(batched, single):
            np.testing.assert_allclose(hb[i], hs[0], rtol=0, atol=1e-4)
    imgs = [cv2.imread(str(p)) for p in IMAGES[:3]]
    for img, dets in zip(imgs, fp32.detect_batch(imgs)):
        single = fp32.detect(img)
        assert [(d.class_id, round(d.confidence, 4)) for d in dets] == \
            [(d.class_id, round(d.confidence, 4)) for d in single]


def test_batch_nms_is_per_image(fp32):
    """Two copies of one image in a batch must each keep their own detections."""
    img = cv2.imread(str(SHARED / "images" / "dog.jpg"))
    a, b = fp32.detect_batch([img, img])
    assert len(a) == len(b) == len(fp32.detect(img)) > 0


def test_plan_replay_equals_eager(fp32):
    ex = fp32.executor(1)
    blob = np.random.default_rng(3).random((1, 3, 416, 416), dtype=np.float32)
    replay = ex.run(blob)
    eager = ex.run(blob, eager=True)
    for x, y in zip(replay, eager):
        np.testing.assert_array_equal(x, y)
    # replaying allocates nothing new: the launch list and arena are the same objects
    launches, arena = list(ex.launches), ex.arena
    ex.run(blob)
    assert ex.launches == launches and ex.arena is arena


def test_crop_agrees_with_letterbox_on_portrait_video():
    frames = read_frames(SHARED / "videos" / "library1.mp4", 40)
    assert frames and frames[0].shape[:2] == (1280, 720)
    lb = yolo_cl.Detector("yolov3-tiny", fit="letterbox")
    crop = yolo_cl.Detector("yolov3-tiny", fit="crop")
    assert crop.net_size_for(720, 1280) == (288, 416)
    # the cropped network does fewer FLOPs than the square one
    assert crop.graph_for((256, 416)).flops < lb.graph.flops * 0.7
    compared = 0
    for f in frames[::8]:
        a, b = lb.detect(f), crop.detect(f)
        assert not matched(a, b, 0.9, min_conf=0.5)
        compared += sum(d.confidence >= 0.5 for d in a)
    assert compared > 0, "no confident detections to compare"


def test_crop_agrees_with_letterbox_on_landscape_images():
    """Every shared photo, whole (4:3-ish) and as a 2.4:1 band starting a quarter down."""
    lb = yolo_cl.Detector("yolov3-tiny", fit="letterbox")
    crop = yolo_cl.Detector("yolov3-tiny", fit="crop")
    compared = 0
    for path in IMAGES:
        img = cv2.imread(str(path))
        h, w = img.shape[:2]
        band = img[h // 4:h // 4 + int(w / 2.4)]
        for im in (img, band):
            size = crop.net_size_for(im.shape[1], im.shape[0])
            assert size[0] == 416 and size[1] % 32 == 0
            a, b = lb.detect(im), crop.detect(im)
            assert not matched(a, b, 0.9, min_conf=0.5), (path.name, im.shape)
            compared += sum(d.confidence >= 0.5 for d in a)
    assert crop.net_size_for(768, 320) == (416, 224)
    assert compared > 10


@pytest.mark.parametrize("half", [True, False])
def test_outputs_are_packed_on_the_device(half):
    """yc_load_output: values at an offset, images a stride apart -> dense float32, exactly NumPy's
    float16 -> float32 for half storage (what a half or GPU executor's outputs get on the device)."""
    from yolo_cl.runtime import Runtime
    rt = Runtime()
    cl = rt.cl
    rng = np.random.default_rng(3)
    off, stride, n, batch = 5, 23, 17, 3
    arena = rng.normal(0, 40, off + stride * batch).astype(np.float16 if half else np.float32)
    src = cl.Buffer(rt.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=arena)
    dst = rt.alloc(batch * n * 4, "test output")
    k = cl.Kernel(rt.program("preprocess.cl", {"HALF_STORAGE": half}), "yc_load_output")
    k.set_args(src, np.int32(off), np.int32(stride), dst, np.int32(n))
    cl.enqueue_nd_range_kernel(rt.queue, k, (n, batch), None)
    got = np.empty((batch, n), np.float32)
    cl.enqueue_copy(rt.queue, got, dst)
    want = np.stack([arena[off + b * stride: off + b * stride + n] for b in range(batch)]).astype(np.float32)
    assert np.array_equal(got, want)


def test_half_executor_outputs_equal_the_arena():
    """A half executor's float32 outputs (converted on the device, batch 2 with distinct images)
    hold exactly the half values the network wrote: the same as reading the arena and converting."""
    from yolo_cl.executor import Executor
    from yolo_cl.model import load_model
    from yolo_cl.precision import FP16
    from yolo_cl.runtime import Runtime
    ex = Executor(Runtime(), load_model("yolov3-tiny", size=96).graph, batch=2, precision=FP16)
    blob = np.random.default_rng(0).random((2, 3, 96, 96), dtype=np.float32)
    outs = ex.run(blob)
    cl = ex.rt.cl
    for out, host, off, bs in zip(outs, ex._host_out, ex._out_offsets, ex._out_bstride):
        flat = host.reshape(2, -1)
        for b in range(2):
            cl.enqueue_copy(ex.rt.queue, flat[b], ex.arena, src_offset=off + b * bs)
        assert out.dtype == np.float32 and np.array_equal(out, host.astype(np.float32))
    assert not np.array_equal(outs[0][0], outs[0][1])
