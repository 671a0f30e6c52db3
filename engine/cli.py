"""The ``yolo-cl`` command line: ``detect``, ``info``, ``devices``, ``tune``, ``bench``, ``map``, ``valid``,
``download`` and ``serve``.

``detect`` prints what Darknet's ``detector test -ext_output`` prints (or, with ``--json``,
one document in the layout of Darknet's ``-out`` file) and can save annotated copies;
video files, cameras and stream URLs are handed to :mod:`yolo_cl.video`. ``info`` shows
the fused graph and its memory plan without touching a device; ``devices`` lists the
OpenCL devices. Every yolo-cl error ends the command with one ``yolo-cl: error:`` line
and exit status 2; a partly failed ``detect`` (some images unreadable) exits with 1; Ctrl-C
ends the whole run with 130, its finished outputs in place, and SIGTERM likewise with 143
(yolo_cl.stopping). Output paths are checked before
any input is read; third-party warnings reach stderr only with ``--verbose``.
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from . import stopping
from .darknet_json import darknet_box as _darknet_box, group_by_box, json_frame
from .errors import DeviceError, ImageError, LimitError, YoloClError
from .precision import PRECISIONS, precision_named
from .preprocess import FITS
from .userfiles import MAX_IMAGE_FILE_BYTES, display, escape, read_bytes
from .writers import check_output_dir, check_output_file, write_file

IMAGE_EXTS = {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".dib", ".tif", ".tiff", ".webp", ".pbm", ".pgm", ".ppm",
              ".pnm", ".jp2", ".sr", ".ras", ".exr", ".hdr", ".pic"}
VIDEO_EXTS = {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv"}
WRITABLE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
VIDEO_OUT_EXTS = {".mp4", ".avi", ".mkv"}
URL_RE = re.compile(r"^(rtsp|rtsps|rtmp|http|https)://", re.IGNORECASE)
DEFAULT_MODEL = "yolov3-tiny"
MIB = 2.0 ** 20
PRECISION_HELP = ("fp32: IEEE float (default); fp16: half storage, on tensor cores where the device has them, "
                  "in half arithmetic on cl_khr_fp16 devices (YOLO_CL_HALF_MATH=auto|emulate|off); "
                  "tf32: float storage, convs on TF32 tensor cores (NVIDIA sm_80+; elsewhere fp32)")


# -- argument types ---------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with usage errors escaped: they quote the user's arguments, which may hold
    terminal escapes or bytes that are not UTF-8."""

    def error(self, message: str):
        super().error(escape(message))


def parse_size(text: str):
    """``416`` -> 416, ``608x416`` -> (608, 416): the network input size (width x height)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+))?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (use N or WxH, e.g. 416 or 608x352)")
    w = int(m.group(1))
    h = int(m.group(2)) if m.group(2) else None
    if w < 1 or (h is not None and h < 1):
        raise argparse.ArgumentTypeError(f"size '{text}' must be positive")
    return w if h is None else (w, h)


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not in [0, 1]")
    return v


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text} must not be negative")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of all subcommands."""
    from . import __version__
    parser = _Parser(prog="yolo-cl", description="Darknet-compatible YOLO inference on OpenCL.")
    parser.add_argument("--version", action="version", version=f"yolo-cl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _Parser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="also show third-party warnings (OpenCV, libpng, FFmpeg, NumPy) on stderr")

    d = sub.add_parser("detect", parents=[common],
                       help="detect objects in images, folders, globs, videos, cameras or streams",
                       description="Detect objects. Image sources print Darknet's -ext_output lines; video files, "
                                   "camera indices (0) and rtsp/http(s) URLs are streamed.")
    d.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="image file, folder, glob ('imgs/*.jpg'), video file, camera index or stream URL")
    d.add_argument("--model", help=f"zoo model name or cfg path (default: {DEFAULT_MODEL}, bundled)")
    d.add_argument("--cfg", help="Darknet .cfg file (instead of --model)")
    d.add_argument("--weights", help="Darknet .weights file (zoo models without bundled weights need it)")
    d.add_argument("--names", help="class names file, one per line (default: by class count, COCO or VOC)")
    d.add_argument("--thresh", type=_fraction, default=0.25, help="confidence threshold (default 0.25)")
    d.add_argument("--nms", type=_fraction, default=0.45, help="NMS IoU threshold, 0 disables (default 0.45)")
    d.add_argument("--out", metavar="PATH", help="folder for annotated images and videos (same file names), or, for one "
                   "video/camera/stream source, the output video file (e.g. out.mp4)")
    d.add_argument("--json", action="store_true",
                   help="print one JSON document in Darknet's -out layout instead of text")
    d.add_argument("--jsonl", metavar="FILE", help="streams: write one JSON line per frame to FILE")
    d.add_argument("--device", help="OpenCL device: 'P:D', flat index or name substring (default: "
                                    "$YOLO_CL_DEVICE, else the first GPU)")
    d.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    d.add_argument("--letterbox", action="store_true", help="short for --fit letterbox")
    d.add_argument("--fit", choices=FITS,
                   help="resize mode (default: the cfg's letter_box, as Darknet)")
    d.add_argument("--precision", choices=PRECISIONS, default="fp32", help=PRECISION_HELP)
    d.add_argument("--batch", type=_positive, default=1, help="images per forward pass (default 1)")
    d.add_argument("--show", action="store_true", help="streams: show frames in a window")
    d.add_argument("--live", action="store_true", default=None,
                   help="streams: treat the source as live, dropping late frames (default: cameras and URLs)")
    d.add_argument("--track", action="store_true",
                   help="streams: give each detection a track id that follows its object across frames")
    d.add_argument("--track-age", type=_positive, default=30, metavar="N",
                   help="with --track: frames a track survives without a detection (default 30)")
    d.add_argument("--reconnect", type=_count, default=None, metavar="N",
                   help="streams: reconnect up to N times after a live source drops")
    d.set_defaults(func=cmd_detect)
    _add_fleet_options(d)

    i = sub.add_parser("info", parents=[common],
                       help="show a model's fused graph and memory plan (no device needed)")
    i.add_argument("model", nargs="?", metavar="MODEL", help="zoo model name or cfg path")
    i.add_argument("--cfg", help="Darknet .cfg file (instead of MODEL)")
    i.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    i.add_argument("--batch", type=_positive, default=1, help="batch size for the memory plan")
    i.add_argument("--precision", choices=PRECISIONS, default="fp32", help=PRECISION_HELP)
    i.set_defaults(func=cmd_info)

    v = sub.add_parser("devices", parents=[common], help="list OpenCL platforms and devices")
    v.set_defaults(func=cmd_devices)

    t = sub.add_parser("tune", parents=[common],
                       help="tune the conv kernels of a model for a device (saved to the tuning database)",
                       description="Find fast, checked kernel configs for every conv shape of MODEL and store them "
                                   "in the user tuning database (inference only reads it).")
    t.add_argument("model", metavar="MODEL", help="zoo model name or cfg path")
    t.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    t.add_argument("--batch", type=_positive, default=1, help="batch size to tune for (default 1)")
    t.add_argument("--precision", choices=PRECISIONS, default="fp32", help=PRECISION_HELP)
    t.add_argument("--device", help="OpenCL device: 'P:D', flat index or name substring")
    t.add_argument("--budget", type=float, metavar="SECONDS", help="stop starting new shapes after this long")
    t.add_argument("--db", metavar="FILE", help="database file to write (default: the user cache)")
    t.add_argument("--clock", choices=("events", "cpu"), default="events",
                   help="events: OpenCL profiling (default); cpu: the busiest thread's CPU time (at least the "
                        "process's per compute unit), for a CPU device on a machine busy with other work")
    t.add_argument("--exhaustive", action="store_true", help="time every legal candidate (slow; the baseline)")
    t.add_argument("--jobs", type=_positive, help="compile this many candidates at once (default: CPUs, at most 16)")
    t.add_argument("--plot", metavar="PNG", help="draw each shape's search (every timing, the best so far) into PNG")
    t.add_argument("--traversal", metavar="RECORDING", help="with --plot: a tools/tune_eval.py recording whose full "
                   "traversals' best times are drawn beside the search's")
    t.set_defaults(func=cmd_tune)

    b = sub.add_parser("bench", parents=[common],
                       help="per-layer device time, GFLOP/s and latency, optionally against OpenCV DNN")
    b.add_argument("model", metavar="MODEL", help="zoo model name or cfg path (no weights: random ones)")
    b.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    b.add_argument("--batch", type=_positive, default=1, help="images per forward pass (default 1)")
    b.add_argument("--precision", choices=PRECISIONS, default="fp32", help=PRECISION_HELP)
    b.add_argument("--device", help="OpenCL device: 'P:D', flat index or name substring")
    b.add_argument("--weights", help="Darknet .weights file (default: bundled, else random)")
    b.add_argument("--compare", choices=("opencv", "opencv-opencl"),
                   help="also run OpenCV DNN, interleaved, in the same process (opencv: its CPU backend on a CPU "
                        "device, its OpenCL target on a GPU; opencv-opencl: its OpenCL target)")
    b.add_argument("--repeat", type=_positive, default=20, help="timed runs (default 20)")
    b.add_argument("--peak", type=float, metavar="GFLOPS", help="device peak (default: measured once and cached)")
    b.add_argument("--plot", metavar="PNG", help="draw per-launch device time and a roofline into PNG")
    b.set_defaults(func=cmd_bench)

    m = sub.add_parser("map", parents=[common], help="mAP of a model on a labelled image set, as 'darknet detector map'",
                       description="Detect on every image of a Darknet .data file's valid= list and print per-class "
                                   "AP, precision/recall/F1, TP/FP/FN, average IoU, mAP@IoU and mAP@0.50:0.95.")
    _eval_options(m)
    m.add_argument("--iou-thresh", type=_fraction, default=0.5, help="IoU a detection needs to match (default 0.5)")
    m.add_argument("--points", type=int, choices=(0, 11, 101), default=0,
                   help="0: area under the PR curve (Darknet's default), 11: VOC2007, 101: COCO's interpolation")
    m.add_argument("--thresh", type=_fraction, default=0.25,
                   help="confidence for the precision/recall/F1 and TP/FP/FN lines (default 0.25)")
    m.add_argument("--json", action="store_true", help="print the results as one JSON object")
    m.add_argument("--plot", metavar="DIR", help="write a precision-recall curve per class (PNG) into DIR")
    m.add_argument("--coco", metavar="INSTANCES", help="also run COCO's evaluator (pycocotools) against this "
                   "instances JSON file and print its twelve numbers")
    m.set_defaults(func=cmd_map)

    va = sub.add_parser("valid", parents=[common], help="COCO results JSON for a labelled image set, as 'darknet detector valid'",
                        description="Detect on every image of a .data file's valid= list at Darknet's evaluation "
                                    "threshold and write COCO's results format (for pycocotools or the COCO server).")
    _eval_options(va)
    va.add_argument("--out", metavar="FILE", required=True, help="results JSON file to write")
    va.set_defaults(func=cmd_valid)

    dl = sub.add_parser("download", parents=[common], help="download a zoo model's published weights into the user cache",
                        description="Fetch MODEL's weights from the URL in models/zoo.yaml (resuming an interrupted "
                                    "download), verify the checksum and store them in ~/.cache/yolo-cl/weights.")
    dl.add_argument("model", metavar="MODEL", help="zoo model name (e.g. yolov4)")
    dl.add_argument("--url", help="download from this URL instead (a mirror)")
    dl.add_argument("--checksum", metavar="ALG:HEX", help="expected sha256:HEX or sha1:HEX (default: the zoo's)")
    dl.add_argument("--out", metavar="FILE", help="write here instead of the user cache")
    dl.set_defaults(func=cmd_download)
    _add_serve_parser(sub, common)
    return parser


def _eval_options(p: argparse.ArgumentParser) -> None:
    """Options shared by ``map`` and ``valid``: the data set and the model."""
    p.add_argument("data", metavar="DATA", help="Darknet .data file (classes=, valid=, names=)")
    p.add_argument("--model", help=f"zoo model name or cfg path (default: {DEFAULT_MODEL}, bundled)")
    p.add_argument("--cfg", help="Darknet .cfg file (instead of --model)")
    p.add_argument("--weights", help="Darknet .weights file")
    p.add_argument("--names", help="class names file (default: the .data file's names=)")
    p.add_argument("--device", help="OpenCL device: 'P:D', flat index or name substring")
    p.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    p.add_argument("--letterbox", action="store_true", help="short for --fit letterbox")
    p.add_argument("--fit", choices=FITS, help="resize mode (default: the cfg's letter_box)")
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help=PRECISION_HELP)
    p.add_argument("--batch", type=_positive, default=1, help="images per forward pass (default 1)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 some inputs failed, 2 error, 130 interrupted
    by Ctrl-C, 143 by SIGTERM)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:          # --help, --version, usage errors: argparse has printed them
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    for stream in (sys.stdout, sys.stderr):       # a non-UTF-8 file name never crashes a print
        try:
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError):
            pass
    from .noise import routed
    stopping.reset()
    try:
        with routed(getattr(args, "verbose", False)), warnings.catch_warnings(), stopping.sigterm_as_interrupt():
            warnings.filterwarnings("ignore", message="Non-empty compiler output")
            return args.func(args)
    except YoloClError as e:
        _error(str(e))
        return 2
    except KeyboardInterrupt:
        return stopping.status()
    except BrokenPipeError:          # e.g. `yolo-cl detect ... | head`
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 141


def _error(message: str) -> None:
    """One ``yolo-cl: error:`` line: control characters (newlines too) and raw bytes escaped."""
    print(f"yolo-cl: error: {escape(message.strip())}", file=sys.stderr, flush=True)


# -- detect -----------------------------------------------------------------------------------
def is_stream(source: str) -> bool:
    """True for a video file (by extension), a camera index or a stream URL."""
    if URL_RE.match(source):
        return True
    if source.isdigit() and not os.path.exists(source):
        return True
    return Path(source).suffix.lower() in VIDEO_EXTS


def expand_source(source: str) -> list:
    """One SOURCE -> [(kind, path)] with kind 'image' or 'stream'; folders and globs expand, sorted."""
    try:
        return _expand(source)
    except OSError as e:             # a name too long for the file system, a loop of links …
        raise ImageError(f"{display(source)}: cannot read ({e.strerror or e})") from None


def _expand(source: str) -> list:
    if is_stream(source):
        return [("stream", source)]
    p = Path(source)
    if p.is_dir():
        found = sorted(q for q in p.iterdir() if q.is_file() and q.suffix.lower() in IMAGE_EXTS)
        if not found:
            raise ImageError(f"{source}: no images in this folder")
        return [("image", str(q)) for q in found]
    if p.exists():
        return [("image", source)]
    if glob.has_magic(source):
        found = []
        for q in sorted(glob.glob(source, recursive=True)):
            ext = Path(q).suffix.lower()
            if os.path.isfile(q) and ext in IMAGE_EXTS:
                found.append(("image", q))
            elif os.path.isfile(q) and ext in VIDEO_EXTS:
                found.append(("stream", q))
        if not found:
            raise ImageError(f"{source}: no images or videos match")
        return found
    raise ImageError(f"{source}: no such file or directory")


def read_image(path: str) -> np.ndarray:
    """Decode an image file as BGR (OpenCV, so EXIF orientation applies as in Darknet's OpenCV build)."""
    import cv2
    from .limits import check_image_pixels
    raw = read_bytes(path, "image", MAX_IMAGE_FILE_BYTES, ImageError)
    check_image_pixels(raw, display(path))
    data = np.frombuffer(raw, np.uint8)
    try:
        img = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    except cv2.error as e:           # e.g. a header claiming more pixels than OpenCV's limit
        raise ImageError(f"{display(path)}: not an image OpenCV can decode "
                         f"({getattr(e, 'err', '') or 'decoder error'})") from None
    if img is None:
        raise ImageError(f"{display(path)}: not an image OpenCV can decode")
    return img


def _c_round(v: float) -> float:
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


def format_detections(detections: list) -> list:
    """Darknet's ``-ext_output`` lines: ``dog: 83%\\t(left_x:  124   top_y:  219   width:  258   height:  300)``."""
    lines = []
    for group in group_by_box(detections):
        x1, y1, x2, y2 = _darknet_box(group[0])
        where = (f"(left_x: {_c_round(x1):4.0f}   top_y: {_c_round(y1):4.0f}   "
                 f"width: {_c_round(x2 - x1):4.0f}   height: {_c_round(y2 - y1):4.0f})")
        for d in group:
            lines.append(f"{d.label}: {d.confidence * 100:.0f}%\t{where}")
    return lines


def _fit(args) -> Optional[str]:
    if args.letterbox and args.fit not in (None, "letterbox"):
        raise YoloClError(f"--letterbox contradicts --fit {args.fit}")
    return "letterbox" if args.letterbox else args.fit


def _make_detector(args):
    from .detector import Detector
    det = Detector(**_detector_options(args), device=args.device, progress=True)
    note = half_storage_note(det)
    if note:
        print(f"yolo-cl: note: {note}", file=sys.stderr)
    return det


def half_storage_note(det) -> str:
    """Why fp16 asked of a CPU device without ``cl_khr_fp16`` is the slow choice there, or "": it
    stores half and computes in float, so every load and store converts (yolov3-tiny 416 on a Zen 5
    with PoCL: 46 ms against fp32's 13; README, "Precisions")."""
    from .precision import half_math
    rt = det.runtime
    if not det.precision.half or not rt.is_cpu or det.mma or half_math(det.precision, rt.fp16):
        return ""
    return (f"fp16 on {rt.device_name} stores half and computes in float (no cl_khr_fp16): on a CPU that is "
            f"slower than fp32, the faster choice here")


def _detector_options(args) -> dict:
    """Detector's keyword arguments (all but device and progress) for the model options in ``args``;
    fetches a zoo model's weights first when they are not here yet."""
    from .zoo import resolve
    if args.cfg and args.model:
        raise YoloClError("give either --model or --cfg, not both")
    model = args.cfg or args.model or DEFAULT_MODEL
    zoo = resolve(model) if not args.cfg and args.weights is None else None
    if zoo is not None and zoo[1] is None:       # a zoo model whose weights are not here yet: fetch them
        from .download import download
        print(f"yolo-cl: {model}: downloading its published weights (once; 'yolo-cl download' does only this)",
              file=sys.stderr)
        args.weights = str(download(model))
    return dict(cfg=model, weights=args.weights, names=args.names, input_size=args.size, precision=args.precision,
                fit=_fit(args), warmup=True)


class _OutputNames:
    """File names for annotated images and videos in --out: the source's name, unique within this run."""

    def __init__(self, out_dir: Path) -> None:
        self.dir = out_dir
        self.used: set = set()

    def path_for(self, source: str, exts: set = WRITABLE_EXTS, default_ext: str = ".jpg") -> Path:
        src = Path(source)
        ext = src.suffix.lower() if src.suffix.lower() in exts else default_ext
        if source.isdigit():
            stem = f"camera{source}"
        elif URL_RE.match(source):
            stem = "stream"
        else:
            stem = _short(src.stem) or "image"
        name, k = f"{stem}{ext}", 1
        while name in self.used or _same_file(self.dir / name, src):
            name, k = f"{stem}_{k}{ext}", k + 1
        self.used.add(name)
        return self.dir / name


def _short(stem: str, limit: int = 200) -> str:
    """A file stem cut to ``limit`` bytes, so the output name (stem, ``_N``, extension) stays legal."""
    raw = stem.encode(errors="surrogateescape")
    return stem if len(raw) <= limit else raw[:limit].decode(errors="surrogateescape")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def write_image(path: Path, image: np.ndarray) -> None:
    """Encode and write atomically (a reader never sees half a file); a failed write raises OutputError."""
    import cv2
    ok, buf = cv2.imencode(path.suffix, image)
    if not ok:
        raise ImageError(f"{display(path)}: OpenCV cannot encode this image format")
    write_file(path, buf.tobytes(), "annotated image")


def check_detect_outputs(args) -> Optional[Path]:
    """Check --out and --jsonl before any input is read; returns the video file --out names, if it does."""
    out_file = None
    if args.out:
        if Path(args.out).suffix.lower() in VIDEO_EXTS:
            out_file = check_output_file(args.out, "output video")
        else:
            check_output_dir(args.out)
    if args.jsonl:
        check_output_file(args.jsonl, "JSON lines")
    return out_file


def cmd_detect(args) -> int:
    """Detect in every source; images print Darknet-style lines (or JSON), streams go to yolo_cl.video."""
    _fit(args)
    out_file = check_detect_outputs(args)
    frames: list = []
    try:
        return _detect(args, out_file, frames)
    except KeyboardInterrupt:        # Ctrl-C between frames or images: what is done stays done
        if args.json:
            print(json.dumps(frames, indent=1, allow_nan=False))
        return stopping.status()


def _detect(args, out_file: Optional[Path], frames: list) -> int:
    from .draw import draw
    failures = 0
    items = []
    for src in args.sources:
        try:
            items.extend(expand_source(src))
        except ImageError as e:
            _error(str(e))
            failures += 1
    if not items:
        return 1
    if out_file is not None and (len(items) != 1 or items[0][0] == "image"):
        raise YoloClError(f"--out {display(out_file)}: a video file name needs exactly one video, camera or stream "
                          "source; give a folder for images or several sources")
    streams = sum(kind != "image" for kind, _ in items)
    if args.jsonl and streams > 1:      # each stream would rewrite the one file: only the last would stay
        raise YoloClError(f"--jsonl {args.jsonl}: one file takes one video, camera or stream source; with "
                          f"{streams} of them use --jsonl-dir DIR (a file per source)")
    out_names = _OutputNames(Path(args.out)) if args.out and out_file is None else None
    detector = _make_detector(args)
    for flag, on, hint in (("--show", args.show, ""), ("--track", args.track, ""),
                           ("--jsonl", args.jsonl, " (images: --json)")):
        if on and any(kind == "image" for kind, _ in items):
            print(f"yolo-cl: note: {flag} applies to video and camera sources only{hint}", file=sys.stderr)
    pending: list = []            # consecutive image paths, run args.batch at a time

    def flush_images() -> None:
        nonlocal failures
        while pending:
            chunk, pending[:] = pending[:args.batch], pending[args.batch:]
            images, paths = [], []
            for path in chunk:
                try:
                    images.append(read_image(path))
                    paths.append(path)
                except (ImageError, LimitError) as e:
                    _error(str(e))
                    failures += 1
            if not images:
                continue
            t0 = time.perf_counter()
            results = detector.detect_batch(images, args.thresh, args.nms)
            ms = (time.perf_counter() - t0) * 1000.0 / len(images)
            for path, img, dets in zip(paths, images, results):
                h, w = img.shape[:2]
                if args.json:
                    frames.append(json_frame(len(frames) + 1, path, dets, w, h, detector.fit))
                else:
                    print(f"{display(path)}: Predicted in {ms:f} milli-seconds.")
                    for line in format_detections(dets):
                        print(line)
                    sys.stdout.flush()
                if out_names is not None:
                    try:
                        write_image(out_names.path_for(path), draw(img, dets))
                    except ImageError as e:   # cannot encode; a failed write (OutputError) ends the run
                        _error(str(e))
                        failures += 1

    for kind, src in items:
        if kind == "image":
            pending.append(src)
            continue
        flush_images()
        video = out_names.path_for(src, VIDEO_OUT_EXTS, ".mp4") if out_names is not None else out_file
        rc = _run_stream(detector, src, argparse.Namespace(**{**vars(args), "out": video}))
        if rc in stopping.STATUSES:  # Ctrl-C (or SIGTERM) ends the whole run, not only this source
            raise KeyboardInterrupt
        failures += rc
    flush_images()
    if args.json:
        print(json.dumps(frames, indent=1, allow_nan=False))
    return 1 if failures else 0


def _run_stream(detector, source: str, args) -> int:
    """Hand a video/camera/URL source to yolo_cl.video; returns the number of failures (0 or 1), or 130
    after Ctrl-C (143 after SIGTERM).

    There ``args.out`` is the annotated video's file (in the --out folder), not the folder.
    """
    try:
        from .video_cli import run_detect_stream
    except ImportError as e:
        _error(f"{source}: video and camera sources need yolo_cl.video, which cannot be imported ({e})")
        return 1
    sys.stdout.flush()
    try:
        rc = run_detect_stream(detector, source, args)
    except ImageError as e:          # this source cannot be opened: report it, go on with the others
        _error(str(e))
        return 1
    if rc in stopping.STATUSES:
        return rc
    return 1 if isinstance(rc, int) and not isinstance(rc, bool) and rc != 0 else 0


# -- info -------------------------------------------------------------------------------------
def _model_cfg(model: Optional[str], cfg: Optional[str]) -> tuple:
    """(display name, cfg path) for a zoo name or a cfg path."""
    from .zoo import resolve, zoo_cfgs
    if cfg and model:
        raise YoloClError("give either MODEL or --cfg, not both")
    if cfg:
        return cfg, Path(cfg)
    if not model:
        raise YoloClError(f"name a model: a zoo name ({', '.join(zoo_cfgs())}) or a cfg path")
    if Path(model).is_file():
        return model, Path(model)
    z = resolve(model)
    if z is None:
        if model.endswith(".cfg") or "/" in model:
            raise YoloClError(f"{model}: no such cfg file")
        raise YoloClError(f"'{model}' is neither a cfg file nor a zoo model ({', '.join(zoo_cfgs())})")
    return model, z[0]


def _shape(v) -> str:
    return "x".join(str(n) for n in v.shape)


def _destination(node, graph) -> str:
    """Where a node's output goes: a concat slice (``-> route 16 [64:128]``) or a detection head."""
    out = node.output
    for k, v in enumerate(graph.outputs):
        if v.tensor is out.tensor and v.c0 == out.c0 and v.c == out.c and k < len(graph.heads):
            head = graph.heads[k]
            return f"-> {head.kind} {head.index}"
    name = out.tensor.name
    if name.startswith("route") and (out.c0, out.c) != (0, out.tensor.c):
        return f"-> route {name[len('route'):]} [{out.c0}:{out.c0 + out.c}]"
    return ""


def _names(node, graph) -> str:
    """The names (for ``forward(outputs=...)``) of the layers a node computes: ``[conv_12 shortcut_13]``."""
    from .outputs import layer_name
    return "[" + " ".join(layer_name(graph.layers[i]) for i in node.layers) + "]"


def graph_report(graph, batch: int = 1, itemsize: int = 4) -> dict:
    """Totals of a fused graph: GFLOPs, fusions, and memory (pool peak vs naive, workspace, weights) in bytes."""
    from .kernels.nodes import largest_workspace_elems
    from .planner import plan_memory
    plan = plan_memory(graph, batch)
    concat_inputs = sum(len(l.inputs) for l in graph.layers if l.kind == "route" and len(l.inputs) >= 2)
    copies = sum(1 for n in graph.nodes if n.op == "copy")
    weights = 0
    for n in graph.nodes:
        if n.op == "conv":
            a = n.attrs
            weights += a["filters"] * (a["in_c"] // a["groups"]) * a["size"] ** 2 + a["filters"]
    return {
        "gflops": graph.flops / 1e9,
        "fused_shortcuts": sum(1 for n in graph.nodes if n.op == "conv" and n.attrs.get("residual") is not None),
        "concat_copies_avoided": concat_inputs - copies,
        "concat_copies": copies,
        "pool_peak": plan.arena_elems * itemsize,
        "naive_total": plan.naive_elems * itemsize,
        "workspace": max((largest_workspace_elems(n, batch) for n in graph.nodes), default=0) * itemsize,
        "weights": weights * itemsize,
    }


def cmd_info(args) -> int:
    """Print the fused graph node by node, then totals and the memory plan. Needs no OpenCL device."""
    from .model import load_model
    from .outputs import layer_name
    name, cfg_path = _model_cfg(args.model, args.cfg)
    m = load_model(cfg_path, None, args.size, params="none", warn=True)
    net, layers, graph = m.net, m.layers, m.graph
    itemsize = precision_named(args.precision).itemsize
    print(f"model:  {name} ({cfg_path})")
    print(f"input:  {net.width}x{net.height}x{net.channels}, batch {args.batch}, {args.precision}")
    print(f"resize: {'letterbox' if net.letter_box else 'stretch'} (cfg letter_box={int(net.letter_box)})")
    print()
    print(f"{'node':>4}  {'layers':<8} {'op':<28} {'inputs (CxHxW)':<26}    {'output':<14} {'GFLOPs':>8}")
    for k, node in enumerate(graph.nodes):
        ins = [_shape(v) for v in node.inputs]
        if node.attrs.get("residual") is not None:
            ins.append("+" + _shape(node.attrs["residual"]))
        line = (f"{k:>4}  {node.label:<8} {node.describe():<28} {', '.join(ins):<26} -> {_shape(node.output):<14} "
                f"{node.flops / 1e9:>8.3f}")
        dest = " ".join(d for d in (_destination(node, graph), _names(node, graph)) if d)
        print(f"{line}  {dest}" if dest else line)
    computed = {i for n in graph.nodes for i in n.layers}
    views = [layer_name(l) for l in layers if l.index not in computed]
    if views:
        print(f"views (no node of their own; forward(outputs=...) reads them too): {' '.join(views)}")
    r = graph_report(graph, args.batch, itemsize)
    print()
    print(f"total: {r['gflops']:.3f} GFLOPs per image; {len(graph.nodes)} nodes from {len(layers)} layers; "
          f"{r['fused_shortcuts']} shortcuts fused into convs; {r['concat_copies_avoided']} concat copies avoided "
          f"({r['concat_copies']} remain)")
    saved = 100.0 * (1 - r["pool_peak"] / r["naive_total"]) if r["naive_total"] else 0.0
    print(f"memory ({args.precision}, batch {args.batch}): activation pool peak {r['pool_peak'] / MIB:.2f} MiB "
          f"vs naive {r['naive_total'] / MIB:.2f} MiB ({saved:.0f}% saved); workspace up to "
          f"{r['workspace'] / MIB:.2f} MiB; weights {r['weights'] / MIB:.2f} MiB")
    return 0


# -- devices ----------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    """Tune a model's conv shapes on one device; configs go to the tuning database."""
    from .tune_cli import tune_model
    from .tuning_db import check_db_writable, user_db_path
    db = check_output_file(args.db, "tuning database") if args.db else user_db_path()   # before tuning
    check_db_writable(db)
    traversal = None
    if args.plot:
        from .plots import recorded_bests, require
        require()
        check_output_file(args.plot, "figure")
        traversal = recorded_bests(args.traversal) if args.traversal else None
    results = tune_model(args.model, args.size, args.batch, args.precision, args.device, args.budget, args.db,
                         args.clock, args.exhaustive, jobs=args.jobs)
    if args.plot and results:
        from .plots import tune_figure
        tune_figure(args.plot, results, traversal)
        print(f"wrote {display(args.plot)}")
    return 0


def cmd_bench(args) -> int:
    """Benchmark a model layer by layer (and against OpenCV DNN with --compare opencv)."""
    from .bench import run_bench
    if args.plot:
        from .plots import require
        require()
        check_output_file(args.plot, "figure")
    report = run_bench(args.model, args.size, args.batch, args.precision, args.device, args.compare, args.repeat,
                       args.weights, args.peak, plot=bool(args.plot))
    print(report.render())
    if args.plot:
        from .plots import bench_figure
        bench_figure(args.plot, report)
        print(f"wrote {display(args.plot)}")
    return 0


# -- map / valid -------------------------------------------------------------------------------
def _run_eval(args, spec, collect) -> tuple:
    """Detect on every image of ``spec``'s list at Darknet's evaluation thresholds; ``collect(path, image,
    detections)`` takes each result. Returns (images done, interrupted); a progress bar goes to stderr."""
    from tqdm import tqdm
    from .evaluate import DARKNET_NMS, DARKNET_THRESH, image_paths
    paths = image_paths(spec)
    if args.names is None and spec.names is not None:
        args.names = str(spec.names)
    detector = _make_detector(args)
    if detector.classes != spec.classes:
        raise YoloClError(f"{spec.path}: classes = {spec.classes}, but the model has {detector.classes}")
    done = 0
    bar = tqdm(total=len(paths), desc="evaluating", unit="img", file=sys.stderr, disable=None, leave=False)
    try:
        for start in range(0, len(paths), args.batch):
            chunk = paths[start:start + args.batch]
            images = [read_image(p) for p in chunk]
            results = detector.detect_batch(images, DARKNET_THRESH, DARKNET_NMS, nms_kind="default")
            for path, img, dets in zip(chunk, images, results):
                collect(path, img, dets)
            done += len(chunk)
            bar.update(len(chunk))
    except KeyboardInterrupt:
        return done, True
    finally:
        bar.close()
    return done, False


def cmd_map(args) -> int:
    """Darknet's ``detector map`` (plus mAP@0.50:0.95 and, with --coco, COCO's own numbers)."""
    from .evaluate import (ImageRecord, coco_detections, coco_eval, detection_rows, evaluate_all, format_report,
                           label_path, read_data, read_labels)
    from .zoo import read_names
    _fit(args)
    spec = read_data(args.data)
    records, coco, missing = [], [], []

    def collect(path, img, dets) -> None:
        h, w = img.shape[:2]
        truths = read_labels(label_path(path), spec.classes)
        if truths is None:
            missing.append(path)
            truths = np.zeros((0, 5))
        records.append(ImageRecord(path, detection_rows(dets, w, h), truths))
        if args.coco:
            coco.extend(coco_detections(path, dets, w, h, spec.classes))

    if args.plot:
        _plot_dir(args.plot)
    if args.coco:                    # fail before the images are read, not after
        if not Path(args.coco).is_file():
            raise YoloClError(f"--coco {display(args.coco)}: no such file")
        try:
            import pycocotools  # noqa: F401
        except ImportError:
            raise YoloClError("--coco needs pycocotools: pip install 'yolo-cl[eval]'") from None
    _, interrupted = _run_eval(args, spec, collect)
    if missing:
        print(f"yolo-cl: warning: {len(missing)} of {len(records)} images have no label file and count as having "
              f"no objects (e.g. {label_path(missing[0])})", file=sys.stderr)
    names = read_names(args.names) if args.names else None
    result = evaluate_all(records, spec.classes, names, args.iou_thresh, args.points, args.thresh)
    result.partial = interrupted
    if args.coco and records:
        from .evaluate import coco_image_id
        result.coco = coco_eval(args.coco, coco, [coco_image_id(r.path) for r in records])
    if args.plot:
        from .plots import pr_figures
        pr_figures(args.plot, result)
    if args.json:
        print(json.dumps(result.as_dict(), indent=1, allow_nan=False))
    else:
        print(format_report(result))
    return stopping.status() if interrupted else 0


def cmd_valid(args) -> int:
    """Darknet's ``detector valid`` with ``eval=coco``: one COCO results JSON file."""
    from .evaluate import coco_detections, read_data
    from .writers import check_output_file, write_file
    _fit(args)
    out = check_output_file(args.out, "results file")       # before any image is read
    spec = read_data(args.data)
    entries: list = []
    done, interrupted = _run_eval(args, spec, lambda path, img, dets: entries.extend(
        coco_detections(path, dets, img.shape[1], img.shape[0], spec.classes)))
    if interrupted:
        print(f"yolo-cl: interrupted after {done} images; {display(out)} not written", file=sys.stderr)
        return stopping.status()
    write_file(out, json.dumps(entries, allow_nan=False).encode(), "results file")
    print(f"{display(out)}: {len(entries)} detections in {done} images", file=sys.stderr)
    return 0


def _plot_dir(folder: str) -> None:
    """Check that --plot can work before any image is read: matplotlib present, folder creatable."""
    from .plots import require
    require()
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise YoloClError(f"{folder}: cannot create the plot folder ({e.strerror or e})") from None


def cmd_download(args) -> int:
    """Download a zoo model's weights (resumable, verified, atomic) and print where they are."""
    from .download import download
    path = download(args.model, args.url, args.checksum, Path(args.out) if args.out else None)
    print(path)
    return 0


def cmd_devices(args) -> int:
    """List every OpenCL device as P:D with its type, size and fp16 support; mark the default; say
    which ones build no kernel, and why (a one-line build each)."""
    from .runtime import INSTALL_HINT, build_error, list_devices, select_device
    devices = list_devices()
    if not devices:
        _error(str(DeviceError(INSTALL_HINT)))
        return 1
    try:
        default, note = select_device(), ""
    except DeviceError as e:
        default, note = None, f"no default device: {e}"
    print(f"  {'P:D':<5} {'type':<11} {'CUs':>4} {'memory':>10}  {'fp16':<4}  device (platform, driver)")
    for pi, di, platform, dev in devices:
        mark = "*" if default is not None and dev == default else " "
        kind = _device_type(dev)
        mem = f"{dev.global_mem_size / 2 ** 30:.1f} GiB"
        fp16 = "yes" if "cl_khr_fp16" in dev.extensions else "no"
        print(f"{mark} {f'{pi}:{di}':<5} {kind:<11} {dev.max_compute_units:>4} {mem:>10}  {fp16:<4}  "
              f"{dev.name.strip()} ({platform.name.strip()}, {dev.driver_version.strip()})")
    print("* default (set YOLO_CL_DEVICE or --device to choose another)" if not note else note)
    for pi, di, _, dev in devices:
        why = build_error(dev)
        if why is not None:
            print(f"  {pi}:{di} builds no kernel: {why}")
    return 0


def _device_type(dev) -> str:
    import pyopencl as cl
    for flag, name in ((cl.device_type.GPU, "GPU"), (cl.device_type.CPU, "CPU"),
                       (cl.device_type.ACCELERATOR, "ACCELERATOR")):
        if dev.type & flag:
            return name
    return "OTHER"


# -- many sources, many devices, and the server (yolo_cl.fleet, yolo_cl.serve) -----------------
def _add_fleet_options(d: argparse.ArgumentParser) -> None:
    """detect's options for running every stream source at once over several devices."""
    d.add_argument("--devices", metavar="LIST",
                   help="streams: run every video/camera/stream source at once, spread over these OpenCL devices: "
                        "'all', or a list such as 0,1 or 0:0,0:1 (a device listed twice gets two contexts)")
    d.add_argument("--jsonl-dir", metavar="DIR",
                   help="streams: run every source at once and write one JSONL per source into DIR")
    d.add_argument("--device-processes", action="store_true",
                   help="streams: one process per device of --devices, so each device's frames have a Python of "
                        "their own (stream K on device K mod the device count)")
    d.set_defaults(func=cmd_detect_fleet)


def _detectors(args, devices: Optional[str]) -> list:
    """One Detector per device of ``devices`` (default: --device), built as ``detect`` builds one."""
    from .fleet import device_specs
    specs = device_specs(devices) if devices else [args.device]
    return [_make_detector(argparse.Namespace(**{**vars(args), "device": spec})) for spec in specs]


def cmd_detect_fleet(args) -> int:
    """``detect`` with --devices or --jsonl-dir: every stream source at once on a Fleet; else plain ``detect``."""
    if args.devices is None and args.jsonl_dir is None:
        return cmd_detect(args)
    from .fleet import Fleet, ProcessFleet, device_specs
    _fit(args)
    streams, failures = [], 0
    for src in args.sources:
        try:
            for kind, item in expand_source(src):
                if kind == "image":
                    raise YoloClError(f"{item}: --devices/--jsonl-dir run video, camera and stream sources; "
                                      "detect images in a separate run")
                streams.append(item)
        except ImageError as e:
            _error(str(e))
            failures += 1
    if not streams:
        return 1
    if args.json:
        raise YoloClError("--json prints images' detections; streams write --jsonl-dir")
    if getattr(args, "track", False):
        raise YoloClError("--track runs one source at a time; leave out --devices/--jsonl-dir for it")
    if args.jsonl and len(streams) > 1:
        raise YoloClError("--jsonl names one file; with several sources use --jsonl-dir")
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None and out_dir.suffix.lower() in VIDEO_EXTS and len(streams) > 1:
        raise YoloClError(f"--out {out_dir}: several sources need a folder")
    if args.show:
        print("yolo-cl: note: --show is not available with --devices/--jsonl-dir", file=sys.stderr)
    outs, jsonls = [None] * len(streams), [args.jsonl] * len(streams)
    for names_dir, target, exts, ext in ((out_dir, outs, VIDEO_OUT_EXTS, ".mp4"),
                                         (Path(args.jsonl_dir) if args.jsonl_dir else None, jsonls, {".jsonl"},
                                          ".jsonl")):
        if names_dir is None:
            continue
        if names_dir.suffix.lower() in VIDEO_EXTS and target is outs:
            outs[0] = names_dir
            continue
        try:
            names_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise YoloClError(f"{names_dir}: cannot create output folder ({e.strerror or e})") from None
        namer = _OutputNames(names_dir)
        for k, src in enumerate(streams):
            target[k] = namer.path_for(src, exts, ext)
    specs = device_specs(args.devices) if args.devices else [args.device]
    if args.device_processes:
        fleet = ProcessFleet(_detector_options(args), specs)
    else:
        fleet = Fleet(_detectors(args, args.devices))
    status = _FleetStatus(fleet, quiet=False)
    interrupted = False
    try:
        for src, out, jsonl in zip(streams, outs, jsonls):
            fleet.add_stream(src, thresh=args.thresh, nms=args.nms, batch=args.batch, live=args.live, out=out,
                             jsonl=jsonl)
        fleet.wait_streams(tick=status.update)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        fleet.close()
        status.finish()
    for run in fleet.streams.values():
        if run.error:
            _error(run.error)
            failures += 1
            continue
        print(f"[{run.id} on device {run.device}] " + run.stats.format(), file=sys.stderr)
        for path in run.written:
            print(f"wrote {path}", file=sys.stderr)
    frames = sum(r.stats.frames for r in fleet.streams.values())
    secs = max((r.stats.seconds for r in fleet.streams.values()), default=0.0)
    print(f"total: {frames} frames from {len(fleet.streams)} sources on {len(specs)} device(s), "
          f"{frames / secs if secs > 0 else 0.0:.1f} fps", file=sys.stderr)
    if interrupted:
        return stopping.status()
    return 1 if failures else 0


class _FleetStatus:
    """One status line on a terminal: each stream's fps, then the total."""

    def __init__(self, fleet, quiet: bool, stream=sys.stderr) -> None:
        self.fleet, self.stream = fleet, stream
        self.enabled = not quiet and hasattr(stream, "isatty") and stream.isatty()
        self.shown = False

    def update(self) -> None:
        if not self.enabled:
            return
        parts = [f"{r.id}:{Path(r.name).name[:16]} {r.stats.fps:5.1f}" for r in self.fleet.streams.values()]
        self.stream.write("\r" + " | ".join(parts) + f" | total {self.fleet.total_fps():6.1f} fps\x1b[K")
        self.stream.flush()
        self.shown = True

    def finish(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


def _add_serve_parser(sub, common: argparse.ArgumentParser) -> None:
    """The ``serve`` subcommand."""
    s = sub.add_parser("serve", parents=[common], help="serve detection over HTTP: POST /detect, live streams, a page, metrics",
                       description="An HTTP server (pip install \"yolo-cl[serve]\"): POST /detect with an image, "
                                   "GET /streams/ID.mjpg for --source streams, GET / for the page, GET /metrics.")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=_count, default=8080, help="port (default 8080; 0 picks a free one)")
    s.add_argument("--model", help=f"zoo model name or cfg path (default: {DEFAULT_MODEL}, bundled)")
    s.add_argument("--cfg", help="Darknet .cfg file (instead of --model)")
    s.add_argument("--weights", help="Darknet .weights file")
    s.add_argument("--names", help="class names file, one per line")
    s.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    s.add_argument("--precision", choices=PRECISIONS, default="fp32", help=PRECISION_HELP)
    s.add_argument("--device", help="OpenCL device: 'P:D', flat index or name substring")
    s.add_argument("--devices", metavar="LIST", help="serve on several devices: 'all' or a list such as 0,1")
    s.add_argument("--fit", choices=FITS, help="resize mode (default: the cfg's letter_box)")
    s.add_argument("--letterbox", action="store_true", help="short for --fit letterbox")
    s.add_argument("--source", action="append", default=[], metavar="URI",
                   help="a live stream to run and show (video file, looped at its frame rate; camera index; URL); "
                        "repeatable")
    s.add_argument("--thresh", type=_fraction, default=0.25, help="streams' confidence threshold (default 0.25)")
    s.add_argument("--nms", type=_fraction, default=0.45, help="streams' NMS IoU threshold (default 0.45)")
    s.add_argument("--max-batch", type=_positive, default=8, help="images per batched forward pass (default 8)")
    s.add_argument("--max-wait-ms", type=float, default=0.0,
                   help="how long an idle device waits for a batch to fill (default 0: run at once; under load "
                        "requests queue while the device works, so batches fill anyway)")
    s.add_argument("--max-queue", type=_positive, default=64,
                   help="requests that may wait; past that the answer is 503 at once (default 64)")
    s.add_argument("--max-body-mb", type=float, default=16.0, help="request body limit in MiB (default 16)")
    s.add_argument("--max-pixels", type=_positive, default=40_000_000, help="image size limit (default 40e6)")
    s.add_argument("--timeout", type=float, default=30.0, help="per-request time limit in seconds (default 30)")
    s.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="serve POST /detect on Ray Serve (pip install \"yolo-cl[ray]\"): a local Ray instance, or the "
                        "cluster at ADDRESS; one deployment per device (resource yolo_cl_device_K)")
    s.add_argument("--replicas", type=_positive, default=1, help="--ray: replicas per device deployment (default 1)")
    s.add_argument("--workers", type=_positive,
                   help="server processes sharing the port, each with its own detector; worker K uses device K mod "
                        "the device count (default: one per device; with 1, a single process)")
    s.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    """Build a Fleet (one Detector per device), start the --source streams, serve until interrupted;
    with several workers (``--workers``, or one per device of ``--devices``), one process each."""
    from .fleet import Fleet, device_specs
    from .serve import Limits, serve
    if args.max_wait_ms < 0 or args.timeout <= 0 or args.max_body_mb <= 0:
        raise YoloClError("--max-wait-ms must be >= 0, --timeout and --max-body-mb > 0")
    if args.ray is not None:
        if args.workers is not None:
            raise YoloClError("--workers runs the embedded server's processes; on Ray use --replicas")
        return _serve_on_ray(args)
    devices = device_specs(args.devices) if args.devices else [args.device]
    limits = Limits(max_body=int(args.max_body_mb * MIB), max_pixels=args.max_pixels, timeout=args.timeout)
    if (args.workers or len(devices)) > 1:
        from .workers import WorkerPlan, run_workers
        run_workers(WorkerPlan(_detector_options(args), devices, args.workers or len(devices), args.host, args.port,
                               limits, args.max_batch, args.max_wait_ms, args.max_queue, list(args.source),
                               args.thresh, args.nms))
        return 0
    fleet = Fleet(_detectors(args, args.devices), max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                  max_queue=args.max_queue)
    try:
        for src in args.source:
            fleet.add_stream(src, thresh=args.thresh, nms=args.nms, loop=True, live=True)
        serve(fleet, args.host, args.port, limits)
    finally:
        fleet.close()
    return 0


def _serve_on_ray(args) -> int:
    """``serve --ray``: the same POST /detect on Ray Serve, one deployment per device."""
    from .fleet import device_specs
    from .serve import Limits
    if args.source:
        raise YoloClError("--source streams run on the embedded server; leave out --ray for them")
    if args.cfg and args.model:
        raise YoloClError("give either --model or --cfg, not both")
    try:
        from .ray import run_serve
    except ImportError as e:
        raise YoloClError(f"--ray needs Ray Serve: pip install \"yolo-cl[ray]\" ({e})") from None
    devices = device_specs(args.devices) if args.devices else [args.device]
    limits = Limits(max_body=int(args.max_body_mb * MIB), max_pixels=args.max_pixels, timeout=args.timeout)
    run_serve(args.ray or None, args.host, args.port, devices, model=args.cfg or args.model or DEFAULT_MODEL,
              weights=args.weights, replicas=args.replicas, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
              max_queue=args.max_queue, limits=limits, names=args.names, input_size=args.size,
              precision=args.precision, fit=_fit(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
