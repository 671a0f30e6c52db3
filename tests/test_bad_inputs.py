"""Images and streams a user can throw at yolo-cl: each is either used (converted the way
the docs say) or refused with one ImageError line; a bad file never stops the rest of a batch.
"""
from __future__ import annotations

import os
import struct
import warnings
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from yolo_cl import Detector
from yolo_cl.errors import ImageError, YoloClError

from clips import read_frames

ROOT = Path(__file__).resolve().parents[1]
DOG = ROOT / "models" / "images" / "dog.jpg"
VIDEO = ROOT.parent / "shared" / "videos" / "library1.mp4"
SIZE = 96


@pytest.fixture(scope="module")
def det():
    return Detector("yolov3-tiny", input_size=SIZE)


@pytest.fixture(scope="module", params=["letterbox", "crop"])
def det_fit(request):
    return Detector("yolov3-tiny", input_size=SIZE, fit=request.param)


@pytest.fixture(scope="module")
def dog():
    return cv2.imread(str(DOG))


@pytest.fixture(scope="module")
def dog_dets(det, dog):
    dets = det.detect(dog)
    assert dets, "the reference image must give detections at this size"
    return dets


def same(a: list, b: list) -> bool:
    return [(d.class_id, round(d.confidence, 5), tuple(np.round(d.box, 3))) for d in a] == \
        [(d.class_id, round(d.confidence, 5), tuple(np.round(d.box, 3))) for d in b]


# -- arrays through the Python API ---------------------------------------------------------------
@pytest.mark.parametrize("convert", [
    lambda im: cv2.cvtColor(im, cv2.COLOR_BGR2BGRA),                   # 4-channel
    lambda im: im.astype(np.uint16) * 257,                             # 16-bit
    lambda im: cv2.cvtColor(im, cv2.COLOR_BGR2BGRA).astype(np.uint16) * 257,
    lambda im: im.astype(np.float64) / 255.0,                          # float in [0, 1]
    lambda im: im.astype(np.float32),                                  # float in [0, 255]
    lambda im: np.ascontiguousarray(im[::-1, ::-1])[::-1, ::-1],       # negative strides
    lambda im: im.astype(">u2") * 257,                                 # big-endian 16-bit
], ids=["bgra", "uint16", "uint16_bgra", "float01", "float255", "strided", "big_endian"])
def test_convertible_images_detect_like_the_8bit_original(det, dog, dog_dets, convert):
    assert same(det.detect(convert(dog)), dog_dets)


def test_grayscale_images_detect_like_their_bgr_copy(det, dog):
    gray = cv2.cvtColor(dog, cv2.COLOR_BGR2GRAY)
    ref = det.detect(cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR))
    assert same(det.detect(gray), ref)
    assert same(det.detect(gray[:, :, None]), ref)
    assert same(det.detect(gray.astype(np.uint16) * 257), ref)


@pytest.mark.parametrize("image", [
    None, [[1, 2, 3]], np.zeros((0, 0, 3), np.uint8), np.zeros((0, 10, 3), np.uint8), np.zeros((10, 0), np.uint8),
    np.zeros(30, np.uint8), np.zeros((1, 20, 30, 3), np.uint8), np.zeros((20, 30, 2), np.uint8),
    np.zeros((20, 30, 5), np.uint8), np.full((20, 30, 3), "a"), np.empty((20, 30, 3), object),
    np.ones((20, 30, 3), complex),
], ids=["none", "list", "empty", "zero_height", "zero_width", "1d", "4d", "2_channels", "5_channels", "strings",
        "objects", "complex"])
def test_unusable_images_are_one_image_error(det, image):
    with pytest.raises(ImageError) as e:
        det.detect(image)
    assert "\n" not in str(e.value)


def test_one_bad_image_in_a_batch_is_named(det, dog):
    with pytest.raises(ImageError, match=r"^image 2 of the batch: "):
        det.detect_batch([dog, dog, np.zeros((0, 3, 3), np.uint8)])


@pytest.mark.parametrize("image", [
    np.full((20, 30, 3), np.nan), np.full((20, 30, 3), np.inf), np.full((20, 30, 3), -1e300),
    np.ones((20, 30, 3), bool), np.full((20, 30, 3), -5, np.int8), np.full((20, 30, 3), 2**40, np.int64),
    np.zeros((1, 1, 3), np.uint8),
], ids=["nan", "inf", "minus_huge", "bool", "negative_int8", "int64", "1x1"])
def test_odd_pixel_values_detect_without_warnings(det, image):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert isinstance(det.detect(image), list)


@pytest.mark.parametrize("shape", [(1, 100000, 3), (100000, 1, 3), (1, 1, 3), (7, 3000, 3)])
def test_extreme_aspect_ratios_in_every_fit(det, det_fit, shape):
    img = np.full(shape, 128, np.uint8)
    for d in (det, det_fit):
        out = d.detect(img)
        assert isinstance(out, list)
        for x in out:
            x1, y1, x2, y2 = x.box
            assert 0 <= x1 <= x2 <= shape[1] and 0 <= y1 <= y2 <= shape[0]


def test_huge_image(det, dog, dog_dets):
    """A 48-megapixel image (the dog scaled up 8x) gives the dog's detections scaled by 8."""
    big = cv2.resize(dog, (dog.shape[1] * 8, dog.shape[0] * 8), interpolation=cv2.INTER_NEAREST)
    out = det.detect(big)
    assert [d.class_id for d in out] == [d.class_id for d in dog_dets]
    for a, b in zip(out, dog_dets):
        np.testing.assert_allclose(np.array(a.box) / 8, b.box, atol=3.0)


# -- files through the CLI ---------------------------------------------------------------------------
def _png_header(w: int, h: int) -> bytes:
    """A PNG whose header claims w x h pixels and whose data is almost nothing."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def image_files(tmp_path_factory, dog):
    d = tmp_path_factory.mktemp("imgs")
    data = DOG.read_bytes()
    good = {"a_dog.jpg": data}
    bad = {"b_empty.jpg": b"", "c_truncated.jpg": data[:len(data) // 3], "d_text.jpg": b"hello, not a jpeg",
           "e_huge_header.png": _png_header(100000, 100000), "f_zero_size.png": _png_header(0, 0)}
    for name, content in {**good, **bad}.items():
        (d / name).write_bytes(content)
    cv2.imwrite(str(d / "g_gray.jpg"), cv2.cvtColor(dog, cv2.COLOR_BGR2GRAY))
    cv2.imwrite(str(d / "h_16bit.png"), dog.astype(np.uint16) * 257)
    cv2.imwrite(str(d / "i_bgra.png"), cv2.cvtColor(dog, cv2.COLOR_BGR2BGRA))
    os.mkfifo(d / "j_fifo.jpg")
    good_names = ["a_dog.jpg", "g_gray.jpg", "h_16bit.png", "i_bgra.png"]
    bad_names = sorted(bad) + ["j_fifo.jpg", "k_missing.jpg"]
    return d, good_names, bad_names


@pytest.mark.parametrize("batch", ["1", "3"])
def test_cli_batch_with_bad_files_processes_the_rest(image_files, capsys, batch):
    from yolo_cl.cli import main
    d, good, bad = image_files
    files = sorted(good + bad)
    code = main(["detect", *[str(d / f) for f in files], "--size", str(SIZE), "--batch", batch])
    out, err = capsys.readouterr()
    assert code == 1, "a partly failed run exits with 1"
    errors = [l for l in err.splitlines() if l.startswith("yolo-cl: error:")]
    for name in bad:
        assert sum(name in l for l in errors) == 1, f"{name} must get exactly one error line:\n{err}"
    assert len(errors) == len(bad)
    for name in good:
        assert f"{d / name}: Predicted in" in out, f"{name} was not processed:\n{out}"
    assert "bicycle" in out
    assert "Traceback" not in err


def test_cli_all_good_exits_zero(image_files, capsys):
    from yolo_cl.cli import main
    d, good, _ = image_files
    assert main(["detect", *[str(d / f) for f in good], "--size", str(SIZE)]) == 0
    assert capsys.readouterr().out.count("Predicted in") == len(good)


# -- video and camera --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_frames():
    frames = [cv2.resize(f, (90, 160)) for f in read_frames(VIDEO)]
    assert len(frames) == 69
    return frames


@pytest.fixture(scope="module")
def cut_video(tmp_path_factory, small_frames):
    """An AVI (frames need no index to decode) cut off halfway through its frame data."""
    d = tmp_path_factory.mktemp("video")
    full = d / "full.avi"
    w = cv2.VideoWriter(str(full), cv2.VideoWriter_fourcc(*"MJPG"), 25, (90, 160))
    assert w.isOpened()
    for f in small_frames:
        w.write(f)
    w.release()
    data = full.read_bytes()
    cut = d / "cut.avi"
    cut.write_bytes(data[:len(data) // 2])
    return cut


def test_video_whose_frames_stop_mid_file_ends_cleanly(det, cut_video):
    results = list(det.stream(str(cut_video)))
    assert 10 < len(results) < 69
    assert [r[0] for r in results] == list(range(len(results)))
    assert all(isinstance(r[2], list) for r in results)


def test_video_source_reports_the_early_end(cut_video):
    from yolo_cl.video import open_source
    src = open_source(str(cut_video))
    n = 0
    while src.read() is not None:
        n += 1
    src.close()
    assert 10 < n < 69 and src.end_reason


def test_video_cut_before_its_index_is_one_clear_error(tmp_path, det):
    """library1.mp4 keeps its index (moov) at the end: a cut copy cannot be opened at all."""
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(VIDEO.read_bytes()[:600_000])
    with pytest.raises(ImageError, match=r"cut\.mp4: cannot open as a video"):
        list(det.stream(str(cut)))


def test_cli_bad_streams_do_not_stop_the_others(cut_video, tmp_path, capsys):
    """An unopenable video and a missing camera each get one error line; the cut AVI after them still runs."""
    from yolo_cl.cli import main
    cut_mp4 = tmp_path / "cut.mp4"
    cut_mp4.write_bytes(VIDEO.read_bytes()[:600_000])
    code = main(["detect", str(cut_mp4), "97", str(cut_video), str(DOG), "--size", "64"])
    out, err = capsys.readouterr()
    assert code == 1
    errors = [l for l in err.splitlines() if l.startswith("yolo-cl: error:")]
    assert len(errors) == 2
    assert "cut.mp4: cannot open as a video" in errors[0] and "camera 97: cannot open" in errors[1]
    assert f"{cut_video}:" in err and " frames" in err          # the AVI's summary line
    assert f"{DOG}: Predicted in" in out
    assert "Traceback" not in err


def test_missing_camera_is_one_clear_error(det):
    from yolo_cl.video import open_source
    with pytest.raises(ImageError, match=r"camera 97: cannot open"):
        open_source(97)
    with pytest.raises(YoloClError, match=r"camera 97"):
        list(det.stream(97))
