"""The ``yolo-cl`` command line: ``detect``, ``info``, ``devices``, ``tune`` and ``bench``.

``detect`` prints what Darknet's ``detector test -ext_output`` prints (or, with ``--json``,
one document in the layout of Darknet's ``-out`` file) and can save annotated copies;
video files, cameras and stream URLs are handed to :mod:`yolo_cl.video`. ``info`` shows
the fused graph and its memory plan without touching a device; ``devices`` lists the
OpenCL devices. Every yolo-cl error ends the command with one ``yolo-cl: error:`` line
and exit status 2; a partly failed ``detect`` (some images unreadable) exits with 1.
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

from .errors import DeviceError, ImageError, YoloClError
from .preprocess import FITS

IMAGE_EXTS = {".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".dib", ".tif", ".tiff", ".webp", ".pbm", ".pgm", ".ppm",
              ".pnm", ".jp2", ".sr", ".ras", ".exr", ".hdr", ".pic"}
VIDEO_EXTS = {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".wmv", ".flv"}
WRITABLE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"}
VIDEO_OUT_EXTS = {".mp4", ".avi", ".mkv"}
URL_RE = re.compile(r"^(rtsp|rtsps|rtmp|http|https)://", re.IGNORECASE)
DEFAULT_MODEL = "yolov3-tiny"
MIB = 2.0 ** 20
PRECISION_HELP = ("fp32: IEEE float (default); fp16: half storage, on tensor cores where the device has them; "
                  "tf32: float storage, convs on TF32 tensor cores (NVIDIA sm_80+; elsewhere fp32)")


# -- argument types ---------------------------------------------------------------------------
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
    parser = argparse.ArgumentParser(prog="yolo-cl", description="Darknet-compatible YOLO inference on OpenCL.")
    parser.add_argument("--version", action="version", version=f"yolo-cl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    d = sub.add_parser("detect", help="detect objects in images, folders, globs, videos, cameras or streams",
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
    d.add_argument("--precision", choices=("fp32", "fp16", "tf32"), default="fp32", help=PRECISION_HELP)
    d.add_argument("--batch", type=_positive, default=1, help="images per forward pass (default 1)")
    d.add_argument("--show", action="store_true", help="streams: show frames in a window")
    d.add_argument("--live", action="store_true", default=None,
                   help="streams: treat the source as live, dropping late frames (default: cameras and URLs)")
    d.add_argument("--reconnect", type=_count, default=None, metavar="N",
                   help="streams: reconnect up to N times after a live source drops")
    d.set_defaults(func=cmd_detect)

    i = sub.add_parser("info", help="show a model's fused graph and memory plan (no device needed)")
    i.add_argument("model", nargs="?", metavar="MODEL", help="zoo model name or cfg path")
    i.add_argument("--cfg", help="Darknet .cfg file (instead of MODEL)")
    i.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    i.add_argument("--batch", type=_positive, default=1, help="batch size for the memory plan")
    i.add_argument("--precision", choices=("fp32", "fp16", "tf32"), default="fp32", help=PRECISION_HELP)
    i.set_defaults(func=cmd_info)

    v = sub.add_parser("devices", help="list OpenCL platforms and devices")
    v.set_defaults(func=cmd_devices)

    t = sub.add_parser("tune", help="tune the conv kernels of a model for a device (saved to the tuning database)",
                       description="Find fast, checked kernel configs for every conv shape of MODEL and store them "
                                   "in the user tuning database (inference only reads it).")
    t.add_argument("model", metavar="MODEL", help="zoo model name or cfg path")
    t.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    t.add_argument("--batch", type=_positive, default=1, help="batch size to tune for (default 1)")
    t.add_argument("--precision", choices=("fp32", "fp16", "tf32"), default="fp32", help=PRECISION_HELP)
    t.add_argument("--device", help="OpenCL device: 'P:D', flat index or name substring")
    t.add_argument("--budget", type=float, metavar="SECONDS", help="stop starting new shapes after this long")
    t.add_argument("--db", metavar="FILE", help="database file to write (default: the user cache)")
    t.add_argument("--clock", choices=("events", "cpu"), default="events",
                   help="events: OpenCL profiling (default); cpu: process CPU time per compute unit, for a CPU "
                        "device on a machine busy with other work")
    t.add_argument("--exhaustive", action="store_true", help="time every legal candidate (slow; the baseline)")
    t.add_argument("--jobs", type=_positive, help="compile this many candidates at once (default: CPUs, at most 16)")
    t.set_defaults(func=cmd_tune)

    b = sub.add_parser("bench", help="per-layer device time, GFLOP/s and latency, optionally against OpenCV DNN")
    b.add_argument("model", metavar="MODEL", help="zoo model name or cfg path (no weights: random ones)")
    b.add_argument("--size", type=parse_size, help="network input size N or WxH (default: the cfg's)")
    b.add_argument("--batch", type=_positive, default=1, help="images per forward pass (default 1)")
    b.add_argument("--precision", choices=("fp32", "fp16", "tf32"), default="fp32", help=PRECISION_HELP)
    b.add_argument("--device", help="OpenCL device: 'P:D', flat index or name substring")
    b.add_argument("--weights", help="Darknet .weights file (default: bundled, else random)")
    b.add_argument("--compare", choices=("opencv", "opencv-opencl"),
                   help="also run OpenCV DNN, interleaved, in the same process (opencv: its CPU backend on a CPU "
                        "device, its OpenCL target on a GPU; opencv-opencl: its OpenCL target)")
    b.add_argument("--repeat", type=_positive, default=20, help="timed runs (default 20)")
    b.add_argument("--peak", type=float, metavar="GFLOPS", help="device peak (default: measured once and cached)")
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 some inputs failed, 2 error, 130 interrupted)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:          # --help, --version, usage errors: argparse has printed them
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Non-empty compiler output")
            return args.func(args)
    except YoloClError as e:
        _error(str(e))
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:          # e.g. `yolo-cl detect ... | head`
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        return 141


def _error(message: str) -> None:
    print(f"yolo-cl: error: {' '.join(message.split())}", file=sys.stderr, flush=True)


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
    if os.path.exists(path) and not os.path.isfile(path):   # a FIFO or device could block forever
        raise ImageError(f"{path}: not a regular file")
    try:
        data = np.fromfile(path, np.uint8)
    except OSError as e:
        raise ImageError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        img = cv2.imdecode(data, cv2.IMREAD_COLOR) if data.size else None
    except cv2.error as e:           # e.g. a header claiming more pixels than OpenCV's limit
        raise ImageError(f"{path}: not an image OpenCV can decode ({getattr(e, 'err', '') or 'decoder error'})") \
            from None
    if img is None:
        raise ImageError(f"{path}: not an image OpenCV can decode")
    return img


def _c_round(v: float) -> float:
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


def group_by_box(detections: list) -> list:
    """Detections of one box together, best class first then the others by class id; boxes left to right.

    This is the order of Darknet's draw_detections_v3; classes named ``dont_show…`` are hidden as there.
    """
    groups: dict = {}
    for d in detections:
        if not d.label.startswith("dont_show"):
            groups.setdefault(tuple(d.box), []).append(d)
    out = []
    for ds in groups.values():
        best = max(ds, key=lambda d: d.confidence)
        out.append([best] + sorted((d for d in ds if d is not best), key=lambda d: d.class_id))
    out.sort(key=lambda g: g[0].box[0])
    return out


def _darknet_box(d) -> tuple:
    """(x1, y1, x2, y2) in pixels as Darknet prints it: unclipped when known."""
    return d.unclipped if d.unclipped is not None else d.box


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


def json_frame(frame_id: int, filename: str, detections: list, img_w: int, img_h: int, fit: str) -> dict:
    """One frame in Darknet's ``-out`` JSON layout (coordinates relative to the image), plus ``resize``."""
    objects = []
    for group in group_by_box(detections):
        x1, y1, x2, y2 = _darknet_box(group[0])
        rel = {"center_x": round((x1 + x2) / 2 / img_w, 6), "center_y": round((y1 + y2) / 2 / img_h, 6),
               "width": round((x2 - x1) / img_w, 6), "height": round((y2 - y1) / img_h, 6)}
        for d in sorted(group, key=lambda d: d.class_id):
            objects.append({"class_id": d.class_id, "name": d.label, "relative_coordinates": dict(rel),
                            "confidence": round(float(d.confidence), 6)})
    return {"frame_id": frame_id, "filename": filename, "objects": objects, "resize": fit}


def _fit(args) -> Optional[str]:
    if args.letterbox and args.fit not in (None, "letterbox"):
        raise YoloClError(f"--letterbox contradicts --fit {args.fit}")
    return "letterbox" if args.letterbox else args.fit


def _make_detector(args):
    from .detector import Detector
    if args.cfg and args.model:
        raise YoloClError("give either --model or --cfg, not both")
    model = args.cfg or args.model or DEFAULT_MODEL
    return Detector(model, args.weights, names=args.names, input_size=args.size, precision=args.precision,
                    device=args.device, fit=_fit(args))


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
            stem = src.stem or "image"
        name, k = f"{stem}{ext}", 1
        while name in self.used or _same_file(self.dir / name, src):
            name, k = f"{stem}_{k}{ext}", k + 1
        self.used.add(name)
        return self.dir / name


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def write_image(path: Path, image: np.ndarray) -> None:
    """Encode and write atomically (a reader never sees half a file)."""
    import cv2
    from .runtime import atomic_write
    ok, buf = cv2.imencode(path.suffix, image)
    if not ok:
        raise ImageError(f"{path}: OpenCV cannot encode this image format")
    try:
        atomic_write(path, buf.tobytes())
    except OSError as e:
        raise ImageError(f"{path}: cannot write ({e.strerror or e})") from None


def cmd_detect(args) -> int:
    """Detect in every source; images print Darknet-style lines (or JSON), streams go to yolo_cl.video."""
    from .draw import draw
    _fit(args)
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
    detector = _make_detector(args)
    out_names = None
    out_file = Path(args.out) if args.out and Path(args.out).suffix.lower() in VIDEO_EXTS else None
    if out_file is not None and (len(items) != 1 or items[0][0] == "image"):
        raise YoloClError(f"--out {out_file}: a video file name needs exactly one video, camera or stream source; "
                          "give a folder for images or several sources")
    if args.out and out_file is None:
        out_dir = Path(args.out)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise YoloClError(f"{out_dir}: cannot create output folder ({e.strerror or e})") from None
        out_names = _OutputNames(out_dir)
    if args.show and any(kind == "image" for kind, _ in items):
        print("yolo-cl: note: --show applies to video and camera sources only", file=sys.stderr)
    frames: list = []
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
                except ImageError as e:
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
                    print(f"{path}: Predicted in {ms:f} milli-seconds.")
                    for line in format_detections(dets):
                        print(line)
                    sys.stdout.flush()
                if out_names is not None:
                    try:
                        write_image(out_names.path_for(path), draw(img, dets))
                    except ImageError as e:
                        _error(str(e))
                        failures += 1

    for kind, src in items:
        if kind == "image":
            pending.append(src)
            continue
        flush_images()
        video = out_names.path_for(src, VIDEO_OUT_EXTS, ".mp4") if out_names is not None else out_file
        failures += _run_stream(detector, src, argparse.Namespace(**{**vars(args), "out": video}))
    flush_images()
    if args.json:
        print(json.dumps(frames, indent=1))
    return 1 if failures else 0


def _run_stream(detector, source: str, args) -> int:
    """Hand a video/camera/URL source to yolo_cl.video; returns the number of failures (0 or 1).

    There ``args.out`` is the annotated video's file (in the --out folder), not the folder.
    """
    try:
        from .video import run_detect_stream
    except ImportError as e:
        _error(f"{source}: video and camera sources need yolo_cl.video, which cannot be imported ({e})")
        return 1
    sys.stdout.flush()
    try:
        rc = run_detect_stream(detector, source, args)
    except ImageError as e:          # this source cannot be opened: report it, go on with the others
        _error(str(e))
        return 1
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


def graph_report(graph, batch: int = 1, itemsize: int = 4) -> dict:
    """Totals of a fused graph: GFLOPs, fusions, and memory (pool peak vs naive, workspace, weights) in bytes."""
    from .kernels import workspace_elems
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
        "workspace": max((workspace_elems(n, batch) for n in graph.nodes), default=0) * itemsize,
        "weights": weights * itemsize,
    }


def cmd_info(args) -> int:
    """Print the fused graph node by node, then totals and the memory plan. Needs no OpenCL device."""
    from .cfg import parse_cfg
    from .graph import build_graph
    from .layers import build_layers, parse_net
    name, cfg_path = _model_cfg(args.model, args.cfg)
    sections = parse_cfg(cfg_path)
    net = parse_net(sections[0], args.size)
    layers = build_layers(sections, net)
    graph = build_graph(net, layers, None)
    itemsize = 2 if args.precision == "fp16" else 4
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
        dest = _destination(node, graph)
        print(f"{line}  {dest}" if dest else line)
    r = graph_report(graph, args.batch, itemsize)
    print()
    print(f"total: {r['gflops']:.3f} GFLOPs per image; {len(graph.nodes)} nodes from {len(layers)} layers; "
          f"{r['fused_shortcuts']} shortcuts fused into convs; {r['concat_copies_avoided']} concat copies avoided "
          f"({r['concat_copies']} remain)")
    saved = 100.0 * (1 - r["pool_peak"] / r["naive_total"]) if r["naive_total"] else 0.0
    print(f"memory ({args.precision}, batch {args.batch}): activation pool peak {r['pool_peak'] / MIB:.2f} MiB "
          f"vs naive {r['naive_total'] / MIB:.2f} MiB ({saved:.0f}% saved); im2col workspace "
          f"{r['workspace'] / MIB:.2f} MiB; weights {r['weights'] / MIB:.2f} MiB")
    return 0


# -- devices ----------------------------------------------------------------------------------
def cmd_tune(args) -> int:
    """Tune a model's conv shapes on one device; configs go to the tuning database."""
    from .tuner import tune_model
    tune_model(args.model, args.size, args.batch, args.precision, args.device, args.budget, args.db, args.clock,
               args.exhaustive, jobs=args.jobs)
    return 0


def cmd_bench(args) -> int:
    """Benchmark a model layer by layer (and against OpenCV DNN with --compare opencv)."""
    from .bench import run_bench
    report = run_bench(args.model, args.size, args.batch, args.precision, args.device, args.compare, args.repeat,
                       args.weights, args.peak)
    print(report.render())
    return 0


def cmd_devices(args) -> int:
    """List every OpenCL device as P:D with its type, size and fp16 support; mark the default."""
    from .runtime import INSTALL_HINT, list_devices, select_device
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
    return 0


def _device_type(dev) -> str:
    import pyopencl as cl
    for flag, name in ((cl.device_type.GPU, "GPU"), (cl.device_type.CPU, "CPU"),
                       (cl.device_type.ACCELERATOR, "ACCELERATOR")):
        if dev.type & flag:
            return name
    return "OTHER"


if __name__ == "__main__":
    sys.exit(main())
