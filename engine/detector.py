"""The public ``Detector``: cfg + weights in, detections out.

It strings the stages together in one direction — parse (cfg.py) → layers (layers.py) →
weights (weights.py) → fused graph (graph.py) → executor (planner + kernels) — and adds
pre-processing before and decoding/NMS after. One Detector owns one OpenCL queue; calls
are serialised by a lock, so it is safe to share between threads.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator, Optional, Union

import numpy as np

from . import postprocess as post
from .errors import ImageError, YoloClError
from .executor import Executor, batch_bucket
from .graph import BN_EPS, build_graph
from .kernels.family import tuning_database
from .kernels.gemm_mma import mode_for as mma_mode
from .layers import build_layers, head_layers
from .model import load_model
from .outputs import head_output, layer_indices, layer_name
from .preprocess import FITS, Placement, check_image, placement, to_blob
from .precision import Precision, precision_named
from .runtime import Runtime
from .zoo import default_names, read_names

MAX_EXECUTORS = 8     # (batch, size) executors kept, least recently used dropped first
PINNED_FRAME_BYTES = 256 << 20   # pinned frames frame_array may lend per size (made only as they are asked for)
log = logging.getLogger("yolo_cl.detector")


class Detector:
    """A Darknet network ready to run on one OpenCL device.

    ``Detector("yolov3-tiny")`` loads the bundled model; otherwise pass a cfg and weights
    path (or a zoo name and a weights path). ``input_size`` (int or (width, height))
    overrides the cfg's network size; ``fit`` is ``stretch``, ``letterbox`` or ``crop`` (default:
    what the cfg's ``letter_box`` says). ``bn_eps`` is batchnorm's epsilon: Darknet's 1e-5 by
    default; OpenCV's Darknet importer uses 1e-6, which moves outputs by up to ~1e-3.
    ``device_preprocess`` and ``device_decode`` resize the frame and decode [yolo] heads on the
    device (default: on a GPU, not on a CPU device; YOLO_CL_HOST_PREPOST=1 / 0 turns both off /
    on); off, the host does both (the reference path). ``fold`` runs SPP's pools as one launch and,
    on a GPU by default, max-pools, upsamples and route copies inside the Winograd convs that read
    them, and on every device max-pools and upsamples in the epilogue of the convs that feed them
    (graph.py, Executor): fewer launches per frame, the same outputs; False (or YOLO_CL_FOLD=0)
    gives the unfolded plan, True (or YOLO_CL_FOLD=1) reads through on a CPU too. ``branches``
    runs the layers only one head needs on a second queue (branches.py; off by default, True or
    YOLO_CL_BRANCHES=1 turns it on). ``per_image``: batches run their first and last layers image
    by image on a device with a copy queue, so transfers overlap compute (per_image.py; on by
    default, False or YOLO_CL_PER_IMAGE=0 turns it off, ``"first"`` / ``"last"`` keeps one end).
    """

    def __init__(self, cfg: Union[str, Path], weights: Optional[Union[str, Path]] = None, *,
                 names: Optional[Union[str, Path, list]] = None, input_size=None,
                 precision: Union[str, Precision] = "fp32",
                 device=None, fit: Optional[str] = None, profiling: bool = False, tuning=None,
                 bn_eps: float = BN_EPS, device_preprocess: Optional[bool] = None,
                 device_decode: Optional[bool] = None, progress: bool = False, warmup: bool = False,
                 fold: Optional[bool] = None, branches: Optional[bool] = None,
                 per_image=None) -> None:
        precision = precision_named(precision)
        model = load_model(cfg, weights, input_size, bn_eps=bn_eps, warn=True, fold=fold)
        self.cfg_path, self.weights_path = model.cfg_path, model.weights_path
        self._sections, self.net, self.layers = model.sections, model.net, model.layers
        self.cfg_warnings = model.cfg_warnings      # unused and repeated keys, one line each
        self._params = model.params
        self.bn_eps = bn_eps
        self.fold, self.branches, self.per_image = fold, branches, per_image
        self.graph = model.graph
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
        self.progress = progress
        if progress and sys.stderr is not None and sys.stderr.isatty():   # a terminal: logs keep one line per error
            self.runtime.on_first_build = lambda: print(
                f"yolo-cl: compiling OpenCL kernels for {self.runtime.device_name} (once: they are cached under "
                f"{self.runtime.program_cache})", file=sys.stderr, flush=True)
        self.mma = mma_mode(self.runtime, precision)     # tensor cores where the probe passes
        if tuning is None:
            tuning = tuning_database(self.runtime, precision, self.mma)
        self.tuning = tuning
        self._executors: OrderedDict = OrderedDict()
        self._warned_nonfinite = False
        self._weights: dict = {}
        self._lock = threading.RLock()
        # The device path pays on a GPU; on a CPU device the host's OpenCV resize and NumPy decode
        # are faster than extra kernels sharing the same cores (YOLO_CL_HOST_PREPOST=0 forces it).
        env = os.environ.get("YOLO_CL_HOST_PREPOST", "").strip()
        on = env == "0" or (env != "1" and not self.runtime.is_cpu)
        self.device_preprocess = (on if device_preprocess is None else bool(device_preprocess)) \
            and self.net.channels == 3          # the preprocessing kernel writes RGB; grey models use the host path
        decode = on if device_decode is None else bool(device_decode)
        self.device_decode = decode and bool(self.heads) and all(h.kind == "yolo" for h in self.heads) \
            and len({h.p["classes"] for h in self.heads}) == 1
        self._device_path = None
        self._frames: dict = {}        # (height, width) -> HostSets of pinned frames frame_array lends
        # frame_array's own lock: a stream's decode thread must not wait while another thread
        # holds the queue's lock to enqueue a whole batch (py-spy, 8 streams on an H100)
        self._frames_lock = threading.Lock()
        self.executor(1)   # build and compile everything now, not on the first frame
        if self.device_preprocess:
            self.device_path.decoder(self.executor(1))
        if warmup and self.runtime.builds:
            # A cold start: run once, so that drivers which finish code generation at a kernel's first
            # launch (PoCL, per work-group size) do it here rather than in the first detection.
            if self.heads:
                self.detect(np.zeros((self.net.height, self.net.width, 3), np.uint8))
            else:
                self.forward(np.zeros((1, self.net.channels, self.net.height, self.net.width), np.float32))

    # -- execution ---------------------------------------------------------------------------
    @property
    def input_size(self) -> tuple:
        """(width, height) of the network input."""
        return self.net.width, self.net.height

    def graph_for(self, size: Optional[tuple] = None, keep: tuple = ()):
        """The fused graph at network input ``size`` (width, height); built once per size.
        ``keep``: layer indices whose outputs it returns instead of the heads' inputs."""
        size = tuple(size) if size is not None else self.input_size
        key = size if not keep else (size, keep)
        with self._lock:
            g = self._graphs.get(key)
            if g is None:
                net = replace(self.net, width=size[0], height=size[1])
                g = build_graph(net, build_layers(self._sections, net), self._params, self.bn_eps, keep, fold=self.fold)
                self._graphs[key] = g
            return g

    def executor(self, batch: int, size: Optional[tuple] = None, keep: tuple = ()) -> Executor:
        """The executor for ``batch`` images at input ``size`` (built once, then reused; at most
        MAX_EXECUTORS are kept, the least recently used is released first). ``keep``: see ``graph_for``."""
        size = tuple(size) if size is not None else self.input_size
        key = (batch, size) if not keep else (batch, size, keep)
        with self._lock:
            ex = self._executors.get(key)
            if ex is None:
                while len(self._executors) >= MAX_EXECUTORS:
                    self._executors.popitem(last=False)
                ex = Executor(self.runtime, self.graph_for(size, keep), batch, self.precision, self.tuning,
                              self._weights, progress=self.progress, mma=self.mma, fold=self.fold,
                              branches=self.branches, per_image=self.per_image)
                self._executors[key] = ex
            else:
                self._executors.move_to_end(key)
            return ex

    @property
    def layer_names(self) -> list:
        """Each layer's name for ``forward(outputs=...)``: ``conv_0``, ``maxpool_1``, ..., ``yolo_16``."""
        return [layer_name(l) for l in self.layers]

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
        options (``reconnect``, ``backoff``, ``timeout``, ``fps``, ``stats``, ``track``, ``track_age``): see
        ``yolo_cl.video.stream``.
        """
        from .video import stream
        return stream(self, source, thresh=thresh, nms=nms, batch=batch, live=live, **opts)

    def net_size_for(self, img_w: int, img_h: int) -> tuple:
        """The network input (width, height) used for an image of this size."""
        p = self.placement(img_w, img_h)
        return p.net_w, p.net_h

    def forward(self, blob: np.ndarray, outputs: Optional[Iterable] = None) -> list:
        """Raw head inputs (NCHW float32, one per [yolo]/[region] in cfg order) for an NCHW blob in [0, 1].

        The blob's height and width select the network size (the cfg's, or any other multiple
        of the stride: the network is fully convolutional). ``outputs`` (layer indices, negative
        from the end, or names such as ``conv_12`` / ``yolo_16``, see ``layer_names``) returns
        those layers' outputs instead, as Darknet computes them: a [yolo]/[region] layer's
        own activated output, not its raw input. The first call with a new list builds (and
        keeps) one more executor in which those layers are not fused away. The arrays are lent,
        not copied (``Executor.run``): unchanged while you refer to them, reused once you don't."""
        blob = np.asarray(blob, dtype=np.float32)
        if blob.ndim == 3:
            blob = blob[None]
        if blob.ndim != 4:
            raise YoloClError(f"blob must be NCHW, got shape {blob.shape}")
        size = (blob.shape[3], blob.shape[2])
        if outputs is None:
            with self._lock:
                return self.executor(blob.shape[0], size).run(blob)
        if isinstance(outputs, (str, int)):
            raise YoloClError("outputs must be a list of layer indices or names, e.g. ['conv_12', -1]")
        wanted = layer_indices(self.layers, outputs)
        keep = tuple(dict.fromkeys(wanted))
        with self._lock:
            ex = self.executor(blob.shape[0], size, keep)
            got = dict(zip(keep, ex.run(blob)))
        return [head_output(got[i], ex.graph.layers[i]) for i in wanted]

    def forward_iter(self, blobs: Iterable) -> Iterator[list]:
        """``forward`` over a sequence of NCHW blobs, two in flight: blob N+1 is copied into
        pinned memory and enqueued while the device computes blob N. Yields each blob's heads."""
        pending: list = []
        slot = 0
        for blob in blobs:
            blob = np.asarray(blob, dtype=np.float32)
            blob = blob[None] if blob.ndim == 3 else blob
            if blob.ndim != 4:
                raise YoloClError(f"blob must be NCHW, got shape {blob.shape}")
            with self._lock:
                ex = self.executor(blob.shape[0], (blob.shape[3], blob.shape[2]))
                if len(pending) == 2:
                    pex, pslot = pending.pop(0)
                    outs = pex.collect(pslot)
                else:
                    outs = None
                ex.submit(blob, slot)
            pending.append((ex, slot))
            slot ^= 1
            if outs is not None:
                yield outs
        for pex, pslot in pending:
            with self._lock:
                outs = pex.collect(pslot)
            yield outs

    # -- detection ---------------------------------------------------------------------------
    def frame_array(self, height: int, width: int) -> np.ndarray:
        """A (height, width, 3) uint8 array in pinned memory to decode the next frame into (e.g.
        ``cap.read(frame)``) and pass to ``detect``/``submit``: on the device path the frame then
        goes to the device by DMA as it is, without the copy into pinned memory a plain array
        needs (0.24 ms for 1280x720 on an H100 host). It is the caller's until nothing refers to
        it any more; a frame handed to ``submit`` must stay unchanged until its ``result``. A
        plain array while the caller holds every pinned one of that size: at least 8, and as
        many as ``PINNED_FRAME_BYTES`` of them hold, since every stream of a Fleet on this
        detector keeps a few frames in flight (eight 1280x720 streams on an H100 held more than
        8, and the frames past that were copied and page-faulted in, each one)."""
        from .hostsets import HostSets
        from .staging import pinned
        if height <= 0 or width <= 0:
            raise YoloClError(f"frame_array({height}, {width}): the size must be positive")
        with self._frames_lock:
            sets = self._frames.get((height, width))
            if sets is None:
                if len(self._frames) >= 4:          # a few sizes: a stream's frames are one size
                    self._frames.clear()
                sets = self._frames[(height, width)] = HostSets(
                    lambda: [pinned(self.runtime, (height, width, 3), np.uint8)[1]],
                    cap=max(8, PINNED_FRAME_BYTES // (height * width * 3)))
            return sets.lend(lambda: np.empty((height, width, 3), np.uint8))

    def detect(self, image_bgr: np.ndarray, thresh: float = 0.25, nms: float = 0.45) -> list:
        """Detections in one BGR image, boxes in its pixels."""
        return self.detect_batch([image_bgr], thresh, nms)[0]

    def detect_batch(self, images: Iterable, thresh: float = 0.25, nms: float = 0.45,
                     nms_kind: Optional[str] = None) -> list:
        """Detections for several images, batched into one forward pass per network size; NMS per image
        (``nms_kind``: the last head's ``nms_kind`` by default; ``"default"`` is Darknet's do_nms_sort).

        A pass runs at a power-of-two batch (the rest padded with zeros), see ``batch_bucket``."""
        imgs = [_checked(im, i) for i, im in enumerate(images)]
        if self.device_preprocess:
            path = self.device_path
            return path.result(path.submit(imgs, thresh, nms, nms_kind))
        places = [self.placement(im.shape[1], im.shape[0]) for im in imgs]
        results: list = [None] * len(imgs)
        for size in dict.fromkeys((p.net_w, p.net_h) for p in places):
            idx = [i for i, p in enumerate(places) if (p.net_w, p.net_h) == size]
            with self._lock:
                blob = self.executor(batch_bucket(len(idx)), size).input_array()   # pinned: written once
            blob[len(idx):] = 0.0
            for j, i in enumerate(idx):
                to_blob(imgs[i], size[0], size[1], out=blob[j], place=places[i])
            outs = self.forward(blob)
            for j, i in enumerate(idx):
                im = imgs[i]
                results[i] = self.postprocess([o[j] for o in outs], im.shape[1], im.shape[0], thresh, nms, places[i],
                                              nms_kind)
        return results

    def postprocess(self, heads: list, img_w: int, img_h: int, thresh: float = 0.25, nms: float = 0.45,
                    place: Optional[Placement] = None, nms_kind: Optional[str] = None) -> list:
        """Decode one image's raw heads, map boxes to its pixels through ``place``
        (default: the Detector's layout for that image size), apply NMS."""
        if not self.heads:
            raise YoloClError(f"{self.cfg_path}: the network has no [yolo], [region], [Gaussian_yolo] or [detection] "
                              "layer to detect with")
        place = place if place is not None else self.placement(img_w, img_h)
        w, h = place.net_w, place.net_h
        all_boxes, all_probs = [], []
        for raw, head in zip(heads, self.heads):
            with np.errstate(over="ignore", invalid="ignore"):     # overflow is dropped below, with a warning
                if head.kind == "yolo":
                    boxes, _, probs = post.decode_yolo(raw, head.p, w, h, thresh)
                elif head.kind == "gaussian_yolo":
                    boxes, _, probs = post.decode_gaussian_yolo(raw, head.p, w, h, thresh)
                elif head.kind == "detection":
                    boxes, _, probs = post.decode_detection(raw, head.p, thresh)
                else:
                    boxes, _, probs = post.decode_region(raw, head.p, thresh)
            all_boxes.append(boxes)
            all_probs.append(probs)
        boxes = np.concatenate(all_boxes) if all_boxes else np.zeros((0, 4))
        probs = np.concatenate(all_probs) if all_probs else np.zeros((0, self.classes))
        return self.finish_detections(boxes, probs, img_w, img_h, thresh, nms, place, nms_kind)

    def nms_rule(self, nms_kind: Optional[str] = None) -> tuple:
        """(kind, beta) of the NMS: ``nms_kind`` if given, else the last head's ``nms_kind`` and
        ``beta_nms`` (Darknet's defaults ``default`` and 0.6); the host's and the device's NMS both."""
        p = self.heads[-1].p
        return nms_kind or p.get("nms_kind", "default"), p.get("beta_nms", 0.6)

    def finish_detections(self, boxes: np.ndarray, probs: np.ndarray, img_w: int, img_h: int, thresh: float,
                          nms: float, place: Placement, nms_kind: Optional[str] = None,
                          nms_done: bool = False) -> list:
        """Decoded candidates (xywh relative to the network input, per-class probabilities) ->
        detections in the image's pixels, after NMS (``nms_done``: the device ran it already);
        shared by the host and device decodes."""
        if nms_done:
            out = post.placed_detections(boxes, probs, place, img_w, img_h, thresh, self.names)
            if out is not None:
                return out
        boxes = post.correct_boxes(boxes, place)
        boxes, probs, dropped = post.finite_only(boxes, probs)
        self._warn_nonfinite(dropped)
        if not nms_done:
            probs = post.nms(boxes, probs, nms, *self.nms_rule(nms_kind))
        return post.to_detections(boxes, probs, img_w, img_h, thresh, self.names)

    def finish_listed(self, listed: np.ndarray, dropped: int, img_w: int, img_h: int, place: Placement) -> list:
        """``finish_detections`` for what the device NMS kept and listed (``DeviceDecoder.listed``),
        ``dropped`` candidates having been left out as non-finite."""
        self._warn_nonfinite(dropped)
        return post.listed_detections(listed, place, img_w, img_h, self.names)

    def _warn_nonfinite(self, dropped: int) -> None:
        if dropped and not self._warned_nonfinite:
            self._warned_nonfinite = True
            log.warning("%s: dropped %d boxes with non-finite coordinates or scores (huge anchors, or weights "
                        "that overflow); warning once", self.cfg_path, dropped)

    # -- frames in flight --------------------------------------------------------------------
    @property
    def device_path(self):
        """The device pre/post-processing stages and their in-flight slots (made on first use)."""
        with self._lock:
            if self._device_path is None:
                from .inflight import DevicePath
                self._device_path = DevicePath(self, self.device_decode)
            return self._device_path

    def submit(self, images, thresh: float = 0.25, nms: float = 0.45):
        """Start detecting in one BGR image or a list of them and return at once; ``result``
        gives the detections. Up to three submissions are in flight, so the host prepares the
        next frame while the device computes this one (the device path; with
        ``device_preprocess=False`` the work is done here and ``result`` only returns it)."""
        single = isinstance(images, np.ndarray)
        imgs = [_checked(im, i) for i, im in enumerate([images] if single else images)]
        if not self.device_preprocess:
            return single, self.detect_batch(imgs, thresh, nms)
        return single, self.device_path.submit(imgs, thresh, nms)

    def result(self, handle) -> list:
        """The detections of a ``submit``: a list for one image, a list of lists for several."""
        single, pending = handle
        out = pending if isinstance(pending, list) else self.device_path.result(pending)
        return out[0] if single else out

    # -- reporting ---------------------------------------------------------------------------
    def memory_report(self, batch: int = 1) -> dict:
        """Pool peak vs the naive sum of all activations, plus weights and workspace, in bytes."""
        ex = self.executor(batch)
        item = self.precision.itemsize
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
