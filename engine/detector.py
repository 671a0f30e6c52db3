"""The public ``Detector``: cfg + weights in, detections out.

It strings the stages together in one direction — parse (cfg.py) → layers (layers.py) →
weights (weights.py) → fused graph (graph.py) → executor (planner + kernels) — and adds
pre-processing before and decoding/NMS after. One Detector owns one OpenCL queue; calls
are serialised by a lock, so it is safe to share between threads.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np

from . import postprocess as post
from .cfg import parse_cfg
from .errors import ImageError, YoloClError
from .executor import Executor
from .graph import BN_EPS, build_graph
from .kernels.gemm_mma import db_precision, mode_for as mma_mode
from .layers import build_layers, head_layers, parse_net
from .preprocess import FITS, Placement, check_image, placement, to_blob
from .runtime import Runtime
from .weights import load_weights
from .zoo import default_names, read_names, resolve

PRECISIONS = ("fp32", "fp16", "tf32")


class Detector:
    """A Darknet network ready to run on one OpenCL device.

    ``Detector("yolov3-tiny")`` loads the bundled model; otherwise pass a cfg and weights
    path (or a zoo name and a weights path). ``input_size`` (int or (width, height))
    overrides the cfg's network size; ``fit`` is ``stretch``, ``letterbox`` or ``crop`` (default:
    what the cfg's ``letter_box`` says). ``bn_eps`` is batchnorm's epsilon: Darknet's 1e-5 by
    default; OpenCV's Darknet importer uses 1e-6, which moves outputs by up to ~1e-3.
    """

    def __init__(self, cfg: Union[str, Path], weights: Optional[Union[str, Path]] = None, *,
                 names: Optional[Union[str, Path, list]] = None, input_size=None, precision: str = "fp32",
                 device=None, fit: Optional[str] = None, profiling: bool = False, tuning=None,
                 bn_eps: float = BN_EPS) -> None:
        if precision not in PRECISIONS:
            raise YoloClError(f"precision '{precision}' is not one of {', '.join(PRECISIONS)}")
        cfg_path, weights_path = _resolve_model(cfg, weights)
        self.cfg_path, self.weights_path = cfg_path, weights_path
        self._sections = parse_cfg(cfg_path)
        self.net = parse_net(self._sections[0], input_size)
        self.layers = build_layers(self._sections, self.net)
        if weights_path is None:
            raise YoloClError(f"{cfg_path}: no weights given (use --weights, or 'yolo-cl info' for shapes only)")
        self._params = load_weights(weights_path, self.layers)
        self.bn_eps = bn_eps
        self.graph = build_graph(self.net, self.layers, self._params, bn_eps)
        self._graphs: dict = {(self.net.width, self.net.height): self.graph}
        self.heads = head_layers(self.layers)
        self.classes = self.heads[0].p["classes"] if self.heads else self.layers[-1].c
        self.stride = network_stride(self.layers, self.net)
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
        self.mma = mma_mode(self.runtime, precision)     # tensor cores where the probe passes
        if tuning is None:
            from .tuner import TuningDatabase
            tuning = TuningDatabase.for_runtime(self.runtime, db_precision(precision, self.mma), self.mma)
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

    def graph_for(self, size: Optional[tuple] = None):
        """The fused graph at network input ``size`` (width, height); built once per size."""
        size = tuple(size) if size is not None else self.input_size
        with self._lock:
            g = self._graphs.get(size)
            if g is None:
                net = replace(self.net, width=size[0], height=size[1])
                g = build_graph(net, build_layers(self._sections, net), self._params, self.bn_eps)
                self._graphs[size] = g
            return g

    def executor(self, batch: int, size: Optional[tuple] = None) -> Executor:
        """The executor for ``batch`` images at input ``size`` (built once, then reused)."""
        size = tuple(size) if size is not None else self.input_size
        with self._lock:
            ex = self._executors.get((batch, size))
            if ex is None:
                ex = Executor(self.runtime, self.graph_for(size), batch, self.precision == "fp16", self.tuning,
                              self._weights, mma=self.mma)
                self._executors[(batch, size)] = ex
            return ex

    def placement(self, img_w: int, img_h: int) -> Placement:
        """How an image of this size is laid out in the network input under the Detector's fit.

        ``fit="crop"`` shrinks the input to the image's aspect ratio (16:9 in 416x416 ->
        416x256): the network is fully convolutional, so only the yolo grids change."""
        w, h = self.input_size
        return placement(self.fit, img_w, img_h, w, h, self.stride)

    def stream(self, source, *, thresh: float = 0.25, nms: float = 0.45, batch: int = 1,
               live: Optional[bool] = None, **opts):
        """Yield ``(frame_index, frame, detections)`` from a video file, camera index, stream
        URL or iterable of BGR frames, with decode, inference and box decoding on a thread pipeline.

        Files yield every frame in order (``batch`` frames per forward pass); live sources
        (cameras, streams, or ``live=True``) yield the newest frame and skip stale ones. Other
        options (``reconnect``, ``backoff``, ``timeout``, ``fps``, ``stats``): see ``yolo_cl.video.stream``.
        """
        from .video import stream
        return stream(self, source, thresh=thresh, nms=nms, batch=batch, live=live, **opts)

    def net_size_for(self, img_w: int, img_h: int) -> tuple:
        """The network input (width, height) used for an image of this size."""
        p = self.placement(img_w, img_h)
        return p.net_w, p.net_h

    def forward(self, blob: np.ndarray) -> list:
        """Raw head inputs (NCHW float32, one per [yolo]/[region] in cfg order) for an NCHW blob in [0, 1].

        The blob's height and width select the network size (the cfg's, or any other multiple
        of the stride: the network is fully convolutional)."""
        blob = np.asarray(blob, dtype=np.float32)
        if blob.ndim == 3:
            blob = blob[None]
        if blob.ndim != 4:
            raise YoloClError(f"blob must be NCHW, got shape {blob.shape}")
        with self._lock:
            return self.executor(blob.shape[0], (blob.shape[3], blob.shape[2])).run(blob)

    # -- detection ---------------------------------------------------------------------------
    def detect(self, image_bgr: np.ndarray, thresh: float = 0.25, nms: float = 0.45) -> list:
        """Detections in one BGR image, boxes in its pixels."""
        return self.detect_batch([image_bgr], thresh, nms)[0]

    def detect_batch(self, images: Iterable, thresh: float = 0.25, nms: float = 0.45) -> list:
        """Detections for several images, batched into one forward pass per network size; NMS per image."""
        imgs = [_checked(im, i) for i, im in enumerate(images)]
        places = [self.placement(im.shape[1], im.shape[0]) for im in imgs]
        results: list = [None] * len(imgs)
        for size in dict.fromkeys((p.net_w, p.net_h) for p in places):
            idx = [i for i, p in enumerate(places) if (p.net_w, p.net_h) == size]
            blob = np.empty((len(idx), self.net.channels, size[1], size[0]), np.float32)
            for j, i in enumerate(idx):
                to_blob(imgs[i], size[0], size[1], out=blob[j], place=places[i])
            outs = self.forward(blob)
            for j, i in enumerate(idx):
                im = imgs[i]
                results[i] = self.postprocess([o[j] for o in outs], im.shape[1], im.shape[0], thresh, nms, places[i])
        return results

    def postprocess(self, heads: list, img_w: int, img_h: int, thresh: float = 0.25, nms: float = 0.45,
                    place: Optional[Placement] = None) -> list:
        """Decode one image's raw heads, map boxes to its pixels through ``place``
        (default: the Detector's layout for that image size), apply NMS."""
        if not self.heads:
            raise YoloClError(f"{self.cfg_path}: the network has no [yolo] or [region] layer to detect with")
        place = place if place is not None else self.placement(img_w, img_h)
        w, h = place.net_w, place.net_h
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
        boxes = post.correct_boxes(boxes, place)
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


def _checked(image, index: int) -> np.ndarray:
    """``check_image``, with the image's position in the batch in the error."""
    try:
        return check_image(image)
    except ImageError as e:
        raise ImageError(f"image {index} of the batch: {e}") from None


def network_stride(layers: list, net) -> int:
    """Total downsampling of the network (input width over the coarsest head's width), e.g. 32."""
    heads = head_layers(layers)
    widths = [l.w for l in heads] or [layers[-1].w]
    return max(1, net.width // max(1, min(widths)))


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
