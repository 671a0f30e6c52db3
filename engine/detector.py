"""The public ``Detector``: cfg + weights in, detections out.

It strings the stages together in one direction — parse (cfg.py) → layers (layers.py) →
weights (weights.py) → fused graph (graph.py) → executor (planner + kernels) — and adds
pre-processing before and decoding/NMS after. One Detector owns one OpenCL queue; calls
are serialised by a lock, so it is safe to share between threads.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from . import postprocess as post
from .cfg import parse_cfg
from .errors import YoloClError
from .executor import Executor
from .graph import build_graph
from .layers import build_layers, head_layers, parse_net
from .postprocess import Detection
from .preprocess import FITS, check_image, to_blob
from .runtime import Runtime
from .weights import load_weights
from .zoo import default_names, read_names, resolve

PRECISIONS = ("fp32", "fp16")


class Detector:
    """A Darknet network ready to run on one OpenCL device.

    ``Detector("yolov3-tiny")`` loads the bundled model; otherwise pass a cfg and weights
    path (or a zoo name and a weights path). ``input_size`` (int or (width, height))
    overrides the cfg's network size; ``fit`` is ``stretch`` or ``letterbox`` (default:
    what the cfg's ``letter_box`` says).
    """

    def __init__(self, cfg: Union[str, Path], weights: Optional[Union[str, Path]] = None, *,
                 names: Optional[Union[str, Path, list]] = None, input_size=None, precision: str = "fp32",
                 device=None, fit: Optional[str] = None, profiling: bool = False, tuning=None) -> None:
        if precision not in PRECISIONS:
            raise YoloClError(f"precision '{precision}' is not one of {', '.join(PRECISIONS)}")
        cfg_path, weights_path = _resolve_model(cfg, weights)
        self.cfg_path, self.weights_path = cfg_path, weights_path
        sections = parse_cfg(cfg_path)
        self.net = parse_net(sections[0], input_size)
        self.layers = build_layers(sections, self.net)
        params = load_weights(weights_path, self.layers) if weights_path is not None else None
        if params is None:
            raise YoloClError(f"{cfg_path}: no weights given (use --weights, or 'yolo-cl info' for shapes only)")
        self.graph = build_graph(self.net, self.layers, params)
        self.heads = head_layers(self.layers)
        self.classes = self.heads[0].p["classes"] if self.heads else self.layers[-1].c
        if isinstance(names, (list, tuple)):
            self.names = list(names)
        elif names is not None:
            self.names = read_names(names)
        else:
            self.names = default_names(self.classes)
        fit = fit or ("letterbox" if self.net.letter_box else "stretch")
        if fit not in FITS:
            raise YoloClError(f"fit '{fit}' is not one of {', '.join(FITS)}")
        self.fit = fit
        self.precision = precision
        self.runtime = Runtime(device, profiling=profiling)
        if tuning is None:
            from .tuner import TuningDatabase
            tuning = TuningDatabase.for_runtime(self.runtime, precision)
        self.tuning = tuning
        self._executors: dict = {}
        self._weights: dict = {}
        self._lock = threading.RLock()
        self.executor(1)   # build and compile everything now, not on the first frame

    # -- execution ---------------------------------------------------------------------------
    @property
    def input_size(self) -> tuple:
        """(width, height) of the network input."""
        return self.net.width, self.net.height

    def executor(self, batch: int) -> Executor:
        """The executor for ``batch`` images (built once, then reused)."""
        with self._lock:
            ex = self._executors.get(batch)
            if ex is None:
                ex = Executor(self.runtime, self.graph, batch, self.precision == "fp16", self.tuning, self._weights)
                self._executors[batch] = ex
            return ex

    def forward(self, blob: np.ndarray) -> list:
        """Raw head inputs (NCHW float32, one per [yolo]/[region] in cfg order) for an NCHW blob in [0, 1]."""
        blob = np.asarray(blob, dtype=np.float32)
        if blob.ndim == 3:
            blob = blob[None]
        if blob.ndim != 4:
            raise YoloClError(f"blob must be NCHW, got shape {blob.shape}")
        with self._lock:
            return self.executor(blob.shape[0]).run(blob)

    # -- detection ---------------------------------------------------------------------------
    def detect(self, image_bgr: np.ndarray, thresh: float = 0.25, nms: float = 0.45) -> list:
        """Detections in one BGR image, boxes in its pixels."""
        return self.detect_batch([image_bgr], thresh, nms)[0]

    def detect_batch(self, images: Iterable, thresh: float = 0.25, nms: float = 0.45) -> list:
        """Detections for several images in one forward pass; NMS runs per image."""
        imgs = [check_image(im) for im in images]
        if not imgs:
            return []
        w, h = self.input_size
        blob = np.empty((len(imgs), self.net.channels, h, w), np.float32)
        for i, im in enumerate(imgs):
            to_blob(im, w, h, self.fit, out=blob[i])
        outs = self.forward(blob)
        return [self.postprocess([o[i] for o in outs], im.shape[1], im.shape[0], thresh, nms)
                for i, im in enumerate(imgs)]

    def postprocess(self, heads: list, img_w: int, img_h: int, thresh: float = 0.25, nms: float = 0.45) -> list:
        """Decode one image's raw heads, map boxes to its pixels, apply NMS."""
        if not self.heads:
            raise YoloClError(f"{self.cfg_path}: the network has no [yolo] or [region] layer to detect with")
        w, h = self.input_size
        all_boxes, all_probs = [], []
        for raw, head in zip(heads, self.heads):
            if head.kind == "yolo":
                boxes, _, probs = post.decode_yolo(raw, head.p, w, h, thresh)
            else:
                boxes, _, probs = post.decode_region(raw, head.p, thresh)
            all_boxes.append(boxes)
            all_probs.append(probs)
        boxes = np.concatenate(all_boxes) if all_boxes else np.zeros((0, 4))
        probs = np.concatenate(all_probs) if all_probs else np.zeros((0, self.classes))
        boxes = post.correct_boxes(boxes, img_w, img_h, w, h, self.fit == "letterbox")
        p = self.heads[-1].p
        probs = post.nms(boxes, probs, nms, p.get("nms_kind", "default"), p.get("beta_nms", 0.6))
        return post.to_detections(boxes, probs, img_w, img_h, thresh, self.names)

    # -- reporting ---------------------------------------------------------------------------
    def memory_report(self, batch: int = 1) -> dict:
        """Pool peak vs the naive sum of all activations, plus weights and workspace, in bytes."""
        ex = self.executor(batch)
        item = 2 if self.precision == "fp16" else 4
        wbytes = sum(n.attrs["weights"].size for n in self.graph.nodes if n.op == "conv") * item
        return {"pool_peak": ex.arena_bytes, "naive_total": ex.naive_bytes, "workspace": ex.workspace_bytes,
                "weights": wbytes}


def _resolve_model(cfg, weights) -> tuple:
    """Zoo name or paths -> (cfg path, weights path or None)."""
    p = Path(str(cfg))
    if not p.is_file() and "/" not in str(cfg) and not str(cfg).endswith(".cfg"):
        z = resolve(str(cfg))
        if z is None:
            from .zoo import zoo_cfgs
            raise YoloClError(f"'{cfg}' is neither a cfg file nor a zoo model ({', '.join(zoo_cfgs())})")
        cfg_path, zoo_weights = z
        return cfg_path, Path(weights) if weights is not None else zoo_weights
    return p, (Path(weights) if weights is not None else None)
