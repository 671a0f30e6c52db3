"""OpenCV-DNN reference for Darknet models (tests only; independent of yolo_cl).

Layer naming by OpenCV's Darknet importer (checked on 4.14): every cfg
section after [net] has a darknet index ``j`` (0-based, every section counts,
dropout/yolo included); its op is named ``<kind>_j``: ``conv_j`` (+ ``bn_j``
with batch_normalize), ``pool_j`` (maxpool), ``avgpool_j``, ``identity_j``
(single-input route, dropout), ``concat_j`` (multi-input route), ``slice_j``
(route with groups/group_id), ``shortcut_j``, ``upsample_j``, ``reorg_j``,
``softmax_j``, and ``permute_j`` + ``yolo_j`` for [yolo] or ``permute_j`` +
``detection_out`` for [region].  An activation is a separate layer named
``<act>_{j+1}`` (with the index of the *next* darknet layer): ``leaky_14``
is the activation of ``conv_13``, ``logistic_144`` of ``conv_143``.  So the
post-activation output of layer ``j`` is the last name in getLayerNames()
before layer ``j+1``'s first; for a head ``k`` it is the name just before
``permute_k`` (``conv_15`` for a linear head, ``logistic_144`` otherwise).

Pitfalls found (OpenCV 4.14, CPU):
* with layer fusion on, a requested intermediate output whose producer writes
  straight into a following concat comes back wrong (yolov2 ``leaky_25``
  feeding ``concat_28``: zeros or stale data) while final outputs are right;
  so reference nets run with ``enableFusion(False)`` (BN then unfused, values
  agree with the fused net to ~1e-6 relative).
* re-running one net with a *different* list of outputs can return wrong
  values; every call here builds a fresh net.
* requesting ``conv_j`` of a BN conv gives the pre-BN conv output; ask for the
  last name of the layer (activation or ``bn_j``).
* ``relu6`` is not supported ("Unsupported activation: relu6",
  efficientnet-lite3).  Such cfgs run with ``relu`` instead; with
  ``strict_relu6=True`` the substitution is *verified* exact for the given
  input (every substituted activation <= 6), else ValueError.  Use
  darknet_io.forward_numpy as the reference for relu6 nets.
* the [yolo]/[region] output zeroes class scores obj*cls <= the cfg's
  ``thresh`` (0.2 if absent; .6 in the yolov2 cfgs): opencv_detections
  rewrites ``thresh`` in its temporary cfg.
"""

from __future__ import annotations

import os
import re
import tempfile

import numpy as np

import cv2

__all__ = [
    "cfg_at_size",
    "opencv_net",
    "opencv_heads",
    "opencv_layer_outputs",
    "opencv_detections",
    "head_layer_indices",
    "layer_output_names",
]

_SUBST_ACTS = {"relu6": "relu"}


# --------------------------------------------------------------------------
# cfg helpers
# --------------------------------------------------------------------------

def _sections(cfg_path: str) -> list[str]:
    """Section names (lower case) in order, [net] included."""
    out = []
    with open(cfg_path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            s = line.strip()
            if s.startswith("["):
                out.append(s[1:s.find("]")].strip().lower())
    return out


def head_layer_indices(cfg_path: str) -> list[int]:
    """Darknet indices (net excluded) of the [yolo]/[region] layers, in order."""
    secs = _sections(cfg_path)[1:]
    return [i for i, s in enumerate(secs) if s in ("yolo", "region")]


def cfg_at_size(cfg_path: str, width: int, height: int, out_dir: str,
                substitute_acts: bool = True, head_thresh: float | None = None) -> str:
    """Copy cfg_path into out_dir with [net] width/height replaced.

    With substitute_acts, activations OpenCV cannot import (relu6) are
    replaced (relu6 -> relu); see opencv_heads for the exactness check.
    head_thresh, if given, sets ``thresh=`` of every [yolo]/[region] section
    (OpenCV zeroes class scores obj*cls <= that value: the cfg's thresh, e.g.
    .6 in the yolov2 cfgs, else 0.2).  Returns the new path.
    """
    os.makedirs(out_dir, exist_ok=True)
    with open(cfg_path, "r", encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    out: list[str] = []
    section = None
    seen_w = seen_h = False
    net_end = None
    for line in lines:
        s = line.strip()
        if s.startswith("["):
            if section in ("net", "network") and net_end is None:
                net_end = len(out)
            section = s[1:s.find("]")].strip().lower()
            out.append(line)
            if head_thresh is not None and section in ("yolo", "region"):
                out.append(f"thresh={float(head_thresh):.9g}")
            continue
        key = re.sub(r"\s+", "", s).split("=", 1)[0] if "=" in s and not s.startswith(("#", ";")) else None
        if head_thresh is not None and section in ("yolo", "region") and key == "thresh":
            continue  # replaced by the line added after the section header
        if section in ("net", "network") and key == "width":
            out.append(f"width={int(width)}")
            seen_w = True
            continue
        if section in ("net", "network") and key == "height":
            out.append(f"height={int(height)}")
            seen_h = True
            continue
        if substitute_acts and key == "activation":
            act = re.sub(r"\s+", "", s).split("=", 1)[1].split("#", 1)[0]
            if act in _SUBST_ACTS:
                out.append(f"activation={_SUBST_ACTS[act]}")
                continue
        out.append(line)
    if net_end is None:
        net_end = len(out)
    extra = []
    if not seen_w:
        extra.append(f"width={int(width)}")
    if not seen_h:
        extra.append(f"height={int(height)}")
    out[net_end:net_end] = extra
    base = os.path.splitext(os.path.basename(cfg_path))[0]
    path = os.path.join(out_dir, f"{base}-{int(width)}x{int(height)}.cfg")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return path


def _net_size(cfg_path: str) -> tuple[int, int]:
    w = h = 0
    section = None
    with open(cfg_path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            s = re.sub(r"\s+", "", line)
            if s.startswith("["):
                section = s[1:s.find("]")].lower()
                if section not in ("net", "network"):
                    break
            elif s.startswith("width="):
                w = int(s[6:].split("#")[0])
            elif s.startswith("height="):
                h = int(s[7:].split("#")[0])
    return w, h


def _substituted_layers(cfg_path: str) -> list[int]:
    """Darknet indices of layers whose activation cfg_at_size substitutes."""
    idx = -1
    res = []
    with open(cfg_path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            s = re.sub(r"\s+", "", line)
            if not s or s[0] in "#;":
                continue
            if s.startswith("["):
                idx += 1
                continue
            if s.startswith("activation="):
                if s.split("=", 1)[1].split("#", 1)[0] in _SUBST_ACTS:
                    res.append(idx - 1)  # idx counts [net] as 0
    return res


def _needs_subst(cfg_path: str) -> bool:
    return bool(_substituted_layers(cfg_path))


# --------------------------------------------------------------------------
# running OpenCV
# --------------------------------------------------------------------------

def opencv_net(cfg_path: str, weights_path: str, width: int | None = None,
               height: int | None = None, fusion: bool = False,
               head_thresh: float | None = None):
    """A fresh cv2.dnn net (OpenCV backend, CPU target) for cfg at
    (width, height) (default: the cfg's own size).  A temporary cfg is used
    when the size differs, relu6 must be substituted or head_thresh is set.
    fusion=False by default (see module docstring)."""
    cw, ch = _net_size(cfg_path)
    width = int(width or cw)
    height = int(height or ch)
    if (width, height) != (cw, ch) or _needs_subst(cfg_path) or head_thresh is not None:
        with tempfile.TemporaryDirectory(prefix="ocvref-") as d:
            cfg2 = cfg_at_size(cfg_path, width, height, d, head_thresh=head_thresh)
            net = cv2.dnn.readNetFromDarknet(cfg2, weights_path)
    else:
        net = cv2.dnn.readNetFromDarknet(cfg_path, weights_path)
    net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
    net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
    net.enableFusion(bool(fusion))
    return net


_IDX_RE = re.compile(r"^(.*)_(\d+)$")
_ACT_AFTER = ("conv", "bn", "shortcut", "fc", "connected")


def layer_output_names(net, n_layers: int) -> list[str | None]:
    """For each darknet layer index j < n_layers, the OpenCV layer name that
    holds its final (post-activation) output (None if OpenCV has none).

    A name ``<act>_{j+1}`` right after ``conv_j``/``bn_j``/``shortcut_j`` is
    j's activation, everything else with suffix ``_j`` belongs to j, and
    suffix-less names (``detection_out``) belong to the preceding layer.
    """
    names = list(net.getLayerNames())
    owner: list[int] = []
    cur = -1
    for pos, n in enumerate(names):
        m = _IDX_RE.match(n)
        if m is None:
            owner.append(cur)
            continue
        j, kind = int(m.group(2)), m.group(1)
        prev = _IDX_RE.match(names[pos - 1]) if pos else None
        if (j == cur + 1 and prev is not None and int(prev.group(2)) == cur
                and prev.group(1) in _ACT_AFTER and kind not in _MAIN_KINDS):
            owner.append(cur)
            continue
        cur = j
        owner.append(cur)
    out: list[str | None] = [None] * n_layers
    for pos, j in enumerate(owner):
        if 0 <= j < n_layers:
            out[j] = names[pos]
    return out


_MAIN_KINDS = {"conv", "bn", "pool", "avgpool", "identity", "concat", "slice",
               "shortcut", "upsample", "reorg", "softmax", "permute", "yolo",
               "scale_channels", "sam", "fc", "connected", "dropout", "region",
               "crop", "eltwise", "reshape", "flatten"}


def _prep_blob(blob: np.ndarray) -> np.ndarray:
    blob = np.ascontiguousarray(blob, dtype=np.float32)
    if blob.ndim == 3:
        blob = blob[None]
    if blob.ndim != 4:
        raise ValueError(f"blob must be NCHW, got shape {blob.shape}")
    return blob


def _check_subst(cfg_path: str, names: list, outs: dict, strict: bool) -> None:
    if not strict:
        return
    for j in _substituted_layers(cfg_path):
        n = names[j]
        mx = float(outs[n].max())
        if not mx <= 6.0:
            raise ValueError(
                f"relu6 -> relu substitution inexact at darknet layer {j} ({n}): max "
                f"activation {mx:.3f} > 6; use darknet_io.forward_numpy as the reference")


def _run(cfg_path, weights_path, blob, want_layers, strict_relu6, head_names=False):
    n = len(_sections(cfg_path)) - 1
    net = opencv_net(cfg_path, weights_path, blob.shape[3], blob.shape[2])
    names = layer_output_names(net, n)
    subst = _substituted_layers(cfg_path) if strict_relu6 else []
    req = list(dict.fromkeys([names[j] for j in list(want_layers) + subst]))
    if None in req:
        raise KeyError(f"no OpenCV layer for some of darknet layers {want_layers}")
    net.setInput(blob)
    res = net.forward(req)
    outs = {nm: np.array(r, dtype=np.float32) for nm, r in zip(req, res)}
    _check_subst(cfg_path, names, outs, strict_relu6)
    return net, names, outs


def opencv_layer_outputs(cfg_path: str, weights_path: str, blob: np.ndarray,
                         layers: list[int] | None = None,
                         strict_relu6: bool = True) -> dict[int, np.ndarray]:
    """Post-activation outputs {darknet index: array} of the given layers
    (default: every layer OpenCV has a name for) on an NCHW float32 blob; the
    net runs at the blob's size.  [yolo]/[region] entries are OpenCV's
    decoded detection rows, not NCHW."""
    blob = _prep_blob(blob)
    if layers is None:
        n = len(_sections(cfg_path)) - 1
        probe = opencv_net(cfg_path, weights_path, blob.shape[3], blob.shape[2])
        names = layer_output_names(probe, n)
        layers = [j for j in range(n) if names[j] is not None]
    _, names, outs = _run(cfg_path, weights_path, blob, layers, strict_relu6)
    return {j: outs[names[j]] for j in layers}


def opencv_heads(cfg_path: str, weights_path: str, blob: np.ndarray,
                 strict_relu6: bool = True) -> list[np.ndarray]:
    """Raw inputs of every [yolo]/[region] layer, in cfg order (NCHW float32).

    That is the post-activation output of the layer feeding each head (the
    conv; linear, or logistic for new_coords heads).  For a network without
    heads: [output of the last layer], 2-D outputs reshaped to (N, C, 1, 1).
    blob: NCHW float32 (values normally in [0, 1]); the net runs at the blob's
    spatial size (via a temporary cfg with [net] width/height replaced).
    """
    blob = _prep_blob(blob)
    heads = head_layer_indices(cfg_path)
    n = len(_sections(cfg_path)) - 1
    want = [k - 1 for k in heads] if heads else [n - 1]
    net, names, outs = _run(cfg_path, weights_path, blob, want, strict_relu6)
    all_names = list(net.getLayerNames())
    for k in heads:  # cross-check the naming rule
        p = all_names.index(f"permute_{k}")
        if all_names[p - 1] != names[k - 1]:
            raise AssertionError(f"head {k}: name before permute_{k} is {all_names[p - 1]}, "
                                 f"expected {names[k - 1]}")
    result = []
    for j in want:
        a = outs[names[j]]
        if a.ndim == 2:
            a = a.reshape(a.shape[0], a.shape[1], 1, 1)
        result.append(np.ascontiguousarray(a))
    return result


def opencv_detections(cfg_path: str, weights_path: str, image_bgr: np.ndarray,
                      size: int | tuple[int, int] = 416, thresh: float = 0.25,
                      nms: float = 0.45) -> list[tuple[int, float, tuple[float, float, float, float]]]:
    """Detections by OpenCV's standard sample pipeline.

    blobFromImage(1/255, (w, h), swapRB=True, crop=False) (plain stretch, no
    letterbox); every output row is [cx, cy, w, h, obj, scores...] relative to
    the image, where OpenCV already sets scores = obj * class_prob (verified
    against the raw heads: |diff| ~1e-5) and zeroes those <= the head
    ``thresh`` (set here to min(thresh, 0.2) via a temporary cfg).  class =
    argmax(scores), confidence = max score, kept if > thresh, then per-class
    cv2.dnn.NMSBoxes(nms).  size: int or (w, h).  Returns
    [(class_id, confidence, (x1, y1, x2, y2))] in original image pixels,
    sorted by confidence (descending).
    """
    if isinstance(size, (int, np.integer)):
        size = (int(size), int(size))
    W, H = size
    net = opencv_net(cfg_path, weights_path, W, H, fusion=True,
                     head_thresh=min(float(thresh), 0.2) * 0.999)
    ih, iw = image_bgr.shape[:2]
    blob = cv2.dnn.blobFromImage(image_bgr, 1 / 255.0, (W, H), swapRB=True, crop=False)
    net.setInput(blob)
    outs = net.forward(net.getUnconnectedOutLayersNames())
    per_class: dict[int, tuple[list, list]] = {}
    for out in outs:
        out = np.asarray(out).reshape(-1, out.shape[-1])
        scores = out[:, 5:]
        cls = scores.argmax(axis=1)
        conf = scores[np.arange(len(out)), cls]
        for r in np.nonzero(conf > thresh)[0]:
            cx, cy, bw, bh = (float(v) for v in out[r, :4])
            box = [(cx - bw / 2) * iw, (cy - bh / 2) * ih, bw * iw, bh * ih]
            bl, cl = per_class.setdefault(int(cls[r]), ([], []))
            bl.append(box)
            cl.append(float(conf[r]))
    dets = []
    for c, (bl, cl) in per_class.items():
        keep = cv2.dnn.NMSBoxes(bl, cl, float(thresh), float(nms))
        for i in np.array(keep).reshape(-1):
            x, y, w, h = bl[int(i)]
            dets.append((c, cl[int(i)], (x, y, x + w, y + h)))
    dets.sort(key=lambda d: -d[1])
    return dets
