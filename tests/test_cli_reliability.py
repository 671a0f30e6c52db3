"""The README's reliability promises, held by running ``yolo-cl`` as a subprocess.

Each test looks at what a user sees: the exit status, the stderr lines, and the files left
on disk. A tiny network (64x64, random weights) keeps every run to a few seconds.
A full disk is a file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) in the child: every
write past it fails with EFBIG exactly as it would with ENOSPC, for root and non-root alike.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from clips import read_frames
from darknet_io import write_random_weights
from interrupt import interrupt_when
from tiny_cfgs import conv, maxpool, net_header, yolo

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
CLIP = SHARED / "videos" / "library1.mp4"
DOG = SHARED / "images" / "dog.jpg"
if not DOG.is_file():
    DOG = ROOT / "models" / "images" / "dog.jpg"
CLIP_FRAMES = 69

ANCHORS = "10,14, 23,27, 37,58"


def tiny_cfg(channels: int, anchors: str) -> str:
    """Two stride-2 convs and a maxpool to one 2-class head of three ``anchors``, 64x64 input."""
    return (net_header(64, 64, channels) + conv(8, stride=2) + maxpool() + conv(16, stride=2)
            + conv(21, 1, bn=0, act="linear") + yolo((0, 1, 2), classes=2, num=3, anchors=anchors))


def make_model(d: Path, name: str, channels: int = 3, anchors: str = ANCHORS) -> list:
    """--cfg/--weights/--names arguments for a tiny random-weights model written into ``d``."""
    cfg = d / f"{name}.cfg"
    cfg.write_text(tiny_cfg(channels, anchors))
    weights = write_random_weights(str(cfg), str(d / f"{name}.weights"), seed=5, calib_size=64)
    names = d / "two.names"
    names.write_text("a\nb\n")
    return ["--cfg", str(cfg), "--weights", weights, "--names", str(names)]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> list:
    return make_model(tmp_path_factory.mktemp("tiny"), "tiny")


def _env(**extra) -> dict:
    import yolo_cl
    src = str(Path(yolo_cl.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]), **extra}


def _fsize_limit(nbytes: int):
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return limit


def cli(*argv, timeout: float = 180, fsize: int = 0, env: dict = None, **kw) -> subprocess.CompletedProcess:
    """Run ``python -m yolo_cl ARGV`` (bytes arguments allowed) and return its result (text as bytes)."""
    args = [sys.executable, "-m", "yolo_cl"] + [a if isinstance(a, bytes) else str(a) for a in argv]
    return subprocess.run(args, capture_output=True, timeout=timeout, env=env or _env(),
                          preexec_fn=_fsize_limit(fsize) if fsize else None, **kw)


def err_lines(p: subprocess.CompletedProcess) -> list:
    return p.stderr.decode("utf-8", "strict").splitlines()


def assert_one_error(p: subprocess.CompletedProcess, *words: str, rc: int = 2) -> str:
    """Exit status ``rc``, exactly one ``yolo-cl: error:`` line (containing ``words``), no traceback."""
    lines = err_lines(p)
    errors = [l for l in lines if l.startswith("yolo-cl: error:")]
    assert p.returncode == rc, (p.returncode, lines)
    assert len(errors) == 1, lines
    assert not any("Traceback" in l for l in lines), lines
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def video_frames(path: Path) -> int:
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    return n


# -- outputs ------------------------------------------------------------------------------------
# The runs under a size limit load exported program binaries, which write nothing: PoCL's own
# kernel cache (the default on PoCL) writes a file per build, so there the build would meet the
# limit first (test_disk_full_in_the_kernel_cache_is_one_error).
EXPORTED = _env(YOLO_CL_EXPORT_BINARIES="1")


@pytest.fixture(scope="module")
def clip_run(model, tmp_path_factory):
    """One complete video run (exports every program binary before the runs under a size limit)."""
    out = tmp_path_factory.mktemp("full")
    p = cli("detect", CLIP, *model, "--thresh", "0.6", "--out", out / "v.mp4", "--jsonl", out / "d.jsonl",
            env=EXPORTED)
    return p, out


def test_video_run_writes_complete_outputs(clip_run):
    p, out = clip_run
    assert p.returncode == 0, err_lines(p)
    assert sorted(q.name for q in out.iterdir()) == ["d.jsonl", "v.mp4"]
    assert video_frames(out / "v.mp4") == CLIP_FRAMES
    lines = (out / "d.jsonl").read_text().splitlines()
    assert len(lines) == CLIP_FRAMES
    for line in lines:
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


@pytest.mark.parametrize("outputs", ["video", "jsonl", "both", "images"])
def test_disk_full_is_one_error_and_leaves_nothing(model, clip_run, tmp_path, outputs):
    """Disk full while writing: exit 2, one error line, no temp file, nothing under the final names."""
    full_video = (clip_run[1] / "v.mp4").stat().st_size
    full_jsonl = (clip_run[1] / "d.jsonl").stat().st_size
    args = {"video": ["--out", tmp_path / "v.mp4"], "jsonl": ["--jsonl", tmp_path / "d.jsonl"],
            "both": ["--out", tmp_path / "v.mp4", "--jsonl", tmp_path / "d.jsonl"],
            "images": ["--out", tmp_path]}[outputs]
    limit = {"video": full_video // 3, "images": 2000}.get(outputs, full_jsonl // 3)
    source = DOG if outputs == "images" else CLIP
    p = cli("detect", source, *model, "--thresh", "0.6", *args, fsize=limit, env=EXPORTED)
    line = assert_one_error(p, "disk full")
    assert str(tmp_path) in line
    assert not any("wrote" in l for l in err_lines(p))
    assert list(tmp_path.iterdir()) == []


def test_disk_full_in_the_kernel_cache_is_one_error(model, tmp_path):
    """On PoCL (no binaries exported), a build that cannot write PoCL's kernel cache is one line
    naming that cache and the cause, not an empty compiler log; no output file is left."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    out.mkdir()
    env = _env(YOLO_CL_CACHE=str(cache), POCL_CACHE_DIR=str(cache / "pocl"))
    env.pop("YOLO_CL_EXPORT_BINARIES", None)
    p = cli("detect", DOG, *model, "--out", out, fsize=2000, env=env)
    line = assert_one_error(p, "disk full", str(cache / "pocl"), "kernel cache")
    assert "layer" in line
    assert list(out.iterdir()) == []


def test_video_without_index_is_not_renamed(model, clip_run, tmp_path):
    """A size limit above the frames but below the finished container (its index) is caught by the
    check of the finished file."""
    full_video = (clip_run[1] / "v.mp4").stat().st_size
    p = cli("detect", CLIP, *model, "--thresh", "0.6", "--out", tmp_path / "v.mp4", fsize=full_video - 200, env=EXPORTED)
    assert_one_error(p, "v.mp4")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def readonly_dir(tmp_path):
    """A folder nobody may write to: a read-only tmpfs for root (who ignores modes), else mode 0555."""
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(d)], capture_output=True)
        if r.returncode != 0:            # no mount rights in this container: sysfs refuses new files
            yield Path("/sys")
            return
        yield d
        subprocess.run(["umount", str(d)], capture_output=True)
    else:
        d.chmod(0o555)
        yield d
        d.chmod(0o755)


def test_output_paths_are_checked_before_any_input_is_read(tmp_path, readonly_dir):
    """--cfg is a FIFO: reading any input first would hang, so each run proves the order."""
    fifo = tmp_path / "model.cfg"
    os.mkfifo(fifo)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    folder = tmp_path / "folder.mp4"
    folder.mkdir()
    cases = [(["--out", folder], "is a folder"), (["--jsonl", tmp_path], "is a folder"),
             (["--out", blocker / "v.mp4"], "is a file"), (["--jsonl", blocker / "d.jsonl"], "is a file"),
             (["--out", blocker / "sub"], "is a file"), (["--out", blocker], "is a file"),
             (["--out", readonly_dir / "v.mp4"], "cannot write"), (["--jsonl", readonly_dir / "d.jsonl"], "cannot"),
             (["--out", readonly_dir / "sub"], "cannot create"), (["--jsonl", "/dev/full"], "not a regular file"),
             (["--jsonl", fifo], "not a regular file")]
    for args, words in cases:
        p = cli("detect", CLIP, "--cfg", fifo, "--weights", blocker, *args, timeout=60)
        assert_one_error(p, words)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["a-file", "folder.mp4", "model.cfg", "ro"]
    assert Path("/dev/full").is_char_device()


def test_tune_db_is_checked_before_tuning(tmp_path, readonly_dir):
    fifo = tmp_path / "model.cfg"
    os.mkfifo(fifo)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    big = tmp_path / "big.yaml"
    big.write_text("#" * (4 << 20) + "\n")
    for db, words in ((tmp_path, "is a folder"), (blocker / "db.yaml", "is a file"),
                      (readonly_dir / "db.yaml", "cannot write"), (big, "limit")):
        p = cli("tune", fifo, "--db", db, timeout=60)
        assert_one_error(p, words)


# -- Ctrl-C -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def long_clip(tmp_path_factory) -> Path:
    """The clip six times over (414 frames), so a fast device is still in the first source at Ctrl-C."""
    frames = read_frames(CLIP)
    path = tmp_path_factory.mktemp("long") / "long.mp4"
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 30.0, (w, h))
    for _ in range(6):
        for f in frames:
            writer.write(f)
    writer.release()
    return path


STOPS = [pytest.param(signal.SIGINT, 130, id="SIGINT"), pytest.param(signal.SIGTERM, 143, id="SIGTERM")]


@pytest.mark.parametrize("sig,status", STOPS)
def test_a_stop_signal_ends_every_source_with_finished_outputs(model, long_clip, tmp_path, sig, status):
    """Ctrl-C (130) or SIGTERM (143: kill, timeout, a container stopping) during a video: the frames
    done are in a playable file and the sources after it never start."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "yolo_cl", "detect", str(long_clip), str(CLIP), *model,
                             "--thresh", "0.6", "--out", str(out)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def started() -> bool:
        parts = list(out.glob(".long.mp4.*")) if out.is_dir() else []
        return bool(parts) and parts[0].stat().st_size > 20000

    lines = interrupt_when(proc, started, sig=sig).decode().splitlines()
    assert proc.returncode == status, lines
    assert not any("Traceback" in l or "error" in l for l in lines), lines
    assert sorted(q.name for q in out.iterdir()) == ["long.mp4"]     # the second source never started
    assert 0 < video_frames(out / "long.mp4") < 6 * CLIP_FRAMES


@pytest.mark.parametrize("sig,status", STOPS)
def test_a_stop_signal_during_images_leaves_complete_files_and_json(model, tmp_path, sig, status):
    """Ctrl-C (130) or SIGTERM (143) among many images: the JSON of the images done, only complete
    annotated files."""
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    for k in range(1000):
        (src / f"img{k:04d}.jpg").symlink_to(DOG)
    proc = subprocess.Popen([sys.executable, "-m", "yolo_cl", "detect", str(src), *model, "--thresh", "0.6",
                             "--json", "--out", str(out)], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and len(list(out.glob("img*.jpg"))) < 5:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        stdout, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, err.decode()
    assert not any("Traceback" in l for l in err.decode().splitlines())
    frames = json.loads(stdout)
    written = sorted(out.iterdir())
    assert all(p.suffix == ".jpg" and not p.name.startswith(".") for p in written), written   # no temp file
    assert 5 <= len(written) <= len(frames) < 1000
    assert all(cv2.imread(str(p)) is not None for p in written)


# -- numbers ------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["text", "json"])
def test_non_finite_boxes_are_dropped_with_one_warning(tmp_path, mode):
    """Anchors near float32's maximum overflow every box: one warning, strict JSON, exit 0."""
    big = make_model(tmp_path, "huge", anchors="3e38,3e38, 3e38,3e38, 3e38,3e38")
    p = cli("detect", DOG, *big, "--thresh", "0.6", *(["--json"] if mode == "json" else []))
    lines = err_lines(p)
    assert p.returncode == 0, lines
    assert len(lines) == 1 and "non-finite" in lines[0], lines
    if mode == "json":
        doc = json.loads(p.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
        values = [v for o in doc[0]["objects"] for v in o["relative_coordinates"].values()]
        assert all(np.isfinite(values))


def test_weights_that_overflow_are_dropped_with_one_warning(tmp_path):
    """Finite weights (they pass validation) whose box sizes overflow: exp(1e30) is infinite."""
    args = make_model(tmp_path, "overflow")
    w = np.fromfile(args[3], np.uint8)
    header, floats = w[:20], w[20:].view("<f4").copy()
    head = 21 * 16 + 21                          # the last conv: 21 biases, then 21x16 weights
    bias = floats[-head:-head + 21]
    bias[2:4] = 1e30                             # tw, th of the first anchor
    bias[4] = 20.0                               # objectness ~1: every cell a candidate
    floats[-head:-head + 21] = bias
    Path(args[3]).write_bytes(header.tobytes() + floats.astype("<f4").tobytes())
    p = cli("detect", DOG, *args, "--thresh", "0.6", "--json")
    lines = err_lines(p)
    assert p.returncode == 0, lines
    assert len(lines) == 1 and "non-finite" in lines[0], lines
    json.loads(p.stdout, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))


# -- files we read ------------------------------------------------------------------------------
def test_names_must_be_a_bounded_regular_file(model, tmp_path):
    fifo = tmp_path / "names.fifo"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.names"
    with open(huge, "wb") as f:
        f.truncate(5 << 20)
    base = model[:4]
    for names, words in (("/dev/zero", "not a regular file"), (fifo, "not a regular file"),
                         (tmp_path, "is a folder"), (huge, "limit"), (tmp_path / "none", "cannot read")):
        p = cli("detect", DOG, *base, "--names", names, timeout=60)
        assert_one_error(p, "names file", words)


def test_oversized_tuning_database_is_skipped_with_one_warning(model, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tuning.yaml").write_text("#" * (4 << 20) + "\nrecords: []\n")
    p = cli("detect", DOG, *model, "--thresh", "0.6", env=_env(YOLO_CL_CACHE=str(cache)))
    lines = err_lines(p)
    assert p.returncode == 0, lines
    assert len(lines) == 1 and "tuning.yaml" in lines[0] and "limit" in lines[0], lines


def test_image_over_the_pixel_limit_is_refused_from_its_header(model, tmp_path):
    """A PNG header claiming 20000x20000 is refused before decoding; the next source still runs."""
    ok, buf = cv2.imencode(".png", np.zeros((8, 8, 3), np.uint8))
    data = bytearray(buf.tobytes())
    data[16:24] = (20000).to_bytes(4, "big") * 2
    big = tmp_path / "big.png"
    big.write_bytes(bytes(data))
    p = cli("detect", big, DOG, *model, "--thresh", "0.6")
    assert_one_error(p, "big.png", "pixel limit", rc=1)
    assert f"{DOG}: Predicted in" in p.stdout.decode()


# -- paths --------------------------------------------------------------------------------------
def test_hostile_file_names_are_one_escaped_line_each(model, tmp_path):
    """Very long, control-character and non-UTF-8 names on a strict-UTF-8 terminal: one escaped
    line each, and the good sources (one of them with a non-UTF-8 name) still run."""
    escape_name = tmp_path / "evil\x1b[2J\x07name.jpg"
    escape_name.write_bytes(b"not an image")
    raw_good = os.fsencode(tmp_path) + b"/caf\xe9-\xff.jpg"
    with open(raw_good, "wb") as f:
        f.write(DOG.read_bytes())
    long_name = tmp_path / ("x" * 300 + ".jpg")
    env = _env(PYTHONIOENCODING="utf-8:strict", LC_ALL="C.UTF-8")
    p = cli("detect", long_name, escape_name, raw_good, DOG, *model, "--thresh", "0.6", env=env)
    err = p.stderr.decode("utf-8", "strict")
    assert "\x1b" not in err and "\x07" not in err
    lines = err.splitlines()
    assert p.returncode == 1, lines
    assert len(lines) == 2 and all(l.startswith("yolo-cl: error:") for l in lines), lines
    assert "File name too long" in lines[0] and len(lines[0]) < 400
    assert "evil\\x1b[2J\\x07name.jpg" in lines[1]
    out = p.stdout.decode("utf-8", "strict")
    assert "caf\\xe9-\\xff.jpg: Predicted in" in out and f"{DOG}: Predicted in" in out


def test_unanswered_stream_url_times_out_at_10_seconds(model):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    try:
        t0 = time.monotonic()
        p = cli("detect", f"http://127.0.0.1:{srv.getsockname()[1]}/live.mjpg", *model, timeout=120)
        seconds = time.monotonic() - t0
    finally:
        srv.close()
    assert_one_error(p, "cannot open the stream", rc=1)
    assert 10 <= seconds < 25, seconds           # the documented timeout, not FFmpeg's default on top


# -- models and noise ---------------------------------------------------------------------------
def test_grey_model_runs_on_colour_images(tmp_path):
    grey = make_model(tmp_path, "grey", channels=1)
    p = cli("detect", DOG, *grey, "--thresh", "0.6", "--json")
    assert p.returncode == 0, err_lines(p)
    assert json.loads(p.stdout)[0]["objects"]
    from yolo_cl import Detector
    det = Detector(grey[1], grey[3], names=["a", "b"])
    img = cv2.imread(str(DOG))
    assert [d.to_dict() for d in det.detect(img, 0.6)] == \
        [d.to_dict() for d in det.detect(cv2.cvtColor(img, cv2.COLOR_BGR2GRAY), 0.6)]


def test_third_party_warnings_only_with_verbose(model, tmp_path):
    ok, buf = cv2.imencode(".png", np.full((64, 64, 3), 90, np.uint8))
    data = bytearray(buf.tobytes())
    data[60:80] = b"\0" * 20                        # breaks the image data: libpng complains
    bad = tmp_path / "bad.png"
    bad.write_bytes(bytes(data))
    p = cli("detect", bad, *model[:4])
    assert_one_error(p, "bad.png", rc=1)
    assert len(err_lines(p)) == 1, err_lines(p)
    p = cli("detect", bad, *model[:4], "--verbose")
    assert p.returncode == 1 and any("libpng" in l for l in err_lines(p)), err_lines(p)


def test_sigterm_is_ended_as_ctrl_c_with_status_143():
    """``stopping.sigterm_as_interrupt``: SIGTERM raises KeyboardInterrupt (what every command's
    Ctrl-C path handles) and the status becomes 143; the previous handler comes back after."""
    from yolo_cl import stopping
    before = signal.getsignal(signal.SIGTERM)
    stopping.reset()
    assert stopping.status() == 130
    with pytest.raises(KeyboardInterrupt):
        with stopping.sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
    assert stopping.status() == 143
    assert signal.getsignal(signal.SIGTERM) is before
    stopping.note(signal.SIGINT)            # the first signal decides
    assert stopping.status() == 143
    stopping.reset()
    assert stopping.status() == 130


def test_sigterm_to_the_whole_group_finishes_every_device_processs_video(model, long_clip, tmp_path):
    """A service manager or ``docker stop`` sends SIGTERM to every process of the group: with one
    process per device, each finishes the video it was writing (playable, the frames done), and
    the run ends with 143 without a hidden temp file."""
    second = tmp_path / "second.mp4"
    second.symlink_to(long_clip)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "yolo_cl", "detect", str(long_clip), str(second), *model,
                             "--thresh", "0.6", "--devices", "0,0", "--device-processes", "--out", str(out)],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            parts = list(out.glob(".*.part*")) if out.is_dir() else []
            if len(parts) == 2 and all(p.stat().st_size > 20000 for p in parts):
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGTERM)
        err = proc.communicate(timeout=120)[1].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 143, err
    assert "Traceback" not in err, err
    videos = sorted(out.iterdir())
    assert [p.stem for p in videos] == ["long", "second"], videos      # no temp file left
    assert all(0 < video_frames(p) < 6 * CLIP_FRAMES for p in videos)
