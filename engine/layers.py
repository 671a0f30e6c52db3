"""Darknet's layers, one function each: read a section's options and infer its output shape.

This is the only place that knows what each ``[section]`` means. The result is a flat
list of :class:`Layer` records in cfg order, each with its input layer indices and
output shape — no weights, no device, no fusion yet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .cfg import Section, show
from .errors import CfgError, LimitError
from .limits import cap_source, check_layer, gib, max_bytes

# Element-wise activations, each defined in cl/common.h as A_<NAME> (kernels.act_id; checked by
# tests/test_architecture.py): every layer with an ``activation=`` key may use them, and a
# convolution runs them in its GEMM epilogue.
ACTIVATIONS = ("linear", "leaky", "relu", "relu6", "logistic", "tanh", "mish", "swish", "hard_mish",
               "elu", "selu", "gelu", "hardtan", "lhtan", "ramp", "plse", "stair", "loggy", "relie", "revleaky")
# Darknet's cross-channel activations (activate_array_normalize_channels[_softmax]): per pixel over
# the channels, so they run as a node of their own after the layer. Only [convolutional] applies
# them; every other layer's activate() returns 0 for them, so there they are refused.
CHANNEL_ACTIVATIONS = ("normalize_channels", "normalize_channels_softmax", "normalize_channels_softmax_maxval")

MAX_SIDE = 16384      # largest network width/height we accept
MAX_CHANNELS = 65536  # largest channel count of any tensor
MAX_KERNEL = 64
MAX_INPUTS = 256      # largest number of layers one [route] or [shortcut] may name


@dataclass
class Layer:
    """One cfg layer with its inferred output shape (channels, height, width)."""

    index: int
    kind: str
    section: Section
    inputs: list          # producer layer indices; -1 is the network input
    c: int
    h: int
    w: int
    p: dict = field(default_factory=dict)   # parsed parameters

    @property
    def name(self) -> str:
        return f"layer {self.index} [{self.kind}]"

    def error(self, msg: str, key: Optional[str] = None) -> CfgError:
        return CfgError(f"{self.section.where(key)}: layer {self.index} [{self.kind}]: {msg}")


@dataclass
class NetInfo:
    """The [net] section: input size and the resize mode Darknet uses for it."""

    width: int
    height: int
    channels: int
    letter_box: bool


def parse_net(s: Section, input_size=None) -> NetInfo:
    """Read [net]; ``input_size`` (int or (width, height)) overrides the cfg's size."""
    w = s.int("width", 416, 1, MAX_SIDE)
    h = s.int("height", 416, 1, MAX_SIDE)
    if input_size is not None:
        w, h = _input_size(input_size)
    return NetInfo(w, h, s.int("channels", 3, 1, 4096), bool(s.int("letter_box", 0, 0, 1)))


def _input_size(value) -> tuple:
    """An int or a (width, height) pair of ints within [1, MAX_SIDE]."""
    try:
        pair = (value, value) if isinstance(value, int) else tuple(value)
    except TypeError:
        pair = ()
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise CfgError(f"input size {str(value)[:40]!r} is not an integer or a (width, height) pair")
    w, h = pair
    if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
        raise CfgError(f"input size {w}x{h} is out of range [1, {MAX_SIDE}]")
    return w, h


def _activation(s: Section, default: str, channel: bool = False) -> str:
    """The ``activation`` key; ``channel`` admits the cross-channel ones (only [convolutional] runs them)."""
    name = s.str("activation", default)
    if name in CHANNEL_ACTIVATIONS and not channel:
        raise s.error(f"activation '{name}' is only applied by [convolutional] layers; Darknet's [{s.kind}] "
                      "outputs 0 for it", "activation")
    if name not in ACTIVATIONS and name not in CHANNEL_ACTIVATIONS:
        raise s.error(f"option 'activation={show(name)}' is not one of "
                      f"{', '.join(ACTIVATIONS + CHANNEL_ACTIVATIONS)}", "activation")
    return name


def _refs(s: Section, idx: int, key: str) -> list:
    """The earlier layers a list option names (at least one, at most MAX_INPUTS)."""
    values = s.ints(key)
    if not values:
        raise s.error(f"'{key}' is empty", key)
    if len(values) > MAX_INPUTS:
        raise s.error(f"'{key}' names {len(values)} layers; at most {MAX_INPUTS} are supported", key)
    return [_rel(s, idx, v, key) for v in values]


def _rel(s: Section, idx: int, value: int, key: str) -> int:
    """Resolve Darknet's relative (negative) or absolute layer index."""
    j = idx + value if value < 0 else value
    if not 0 <= j < idx:
        raise s.error(f"'{key}' refers to layer {show(str(value))}, which is not an earlier layer", key)
    return j


def _conv(s, i, c, h, w, prev):
    filters = s.int("filters", 1, 1, MAX_CHANNELS)
    size = s.int("size", 1, 1, MAX_KERNEL)
    stride = s.int("stride", 1, 1, MAX_KERNEL)
    sx = s.int("stride_x", -1, -1, MAX_KERNEL)
    sy = s.int("stride_y", -1, -1, MAX_KERNEL)
    sx = stride if sx < 1 else sx
    sy = stride if sy < 1 else sy
    groups = s.int("groups", 1, 1, MAX_CHANNELS)
    dilation = 1 if size == 1 else s.int("dilation", 1, 1, MAX_KERNEL)
    padding = s.int("padding", 0, 0, MAX_KERNEL)
    if s.int("pad", 0, 0, 1):
        padding = size // 2
    for key in ("binary", "xnor", "antialiasing", "assisted_excitation", "coordconv"):
        if s.has(key) and s.float(key) != 0:
            raise s.error(f"option '{key}' is not supported", key)
    if c % groups or filters % groups:
        raise s.error(f"groups={groups} must divide the input channels ({c}) and filters ({filters})", "groups")
    pad = padding * dilation
    oh = (h + 2 * pad - dilation * (size - 1) - 1) // sy + 1
    ow = (w + 2 * pad - dilation * (size - 1) - 1) // sx + 1
    if oh < 1 or ow < 1:
        raise s.error(f"a {size}x{size} kernel does not fit the {w}x{h} input", "size")
    if dilation > 1 and (oh, ow) != ((h + 2 * padding - size) // sy + 1, (w + 2 * padding - size) // sx + 1):
        # Darknet sizes the output without the dilation but convolves with it: its own result is undefined.
        raise s.error(f"dilation={dilation} with size={size} and padding={padding} gives a {ow}x{oh} output, but "
                      f"Darknet allocates {(w + 2 * padding - size) // sx + 1}x{(h + 2 * padding - size) // sy + 1}; "
                      "use an odd size with pad=1", "dilation")
    p = dict(filters=filters, size=size, stride_x=sx, stride_y=sy, pad=pad, dilation=dilation, groups=groups,
             bn=bool(s.int("batch_normalize", 0, 0, 1)), activation=_activation(s, "logistic", True),
             in_c=c, in_h=h, in_w=w)
    return [prev], filters, oh, ow, p


def _maxpool(s, i, c, h, w, prev):
    stride = s.int("stride", 1, 1, MAX_KERNEL)
    sx = s.int("stride_x", stride, 1, MAX_KERNEL)
    sy = s.int("stride_y", stride, 1, MAX_KERNEL)
    size = s.int("size", stride, 1, MAX_KERNEL)
    padding = s.int("padding", size - 1, 0, MAX_KERNEL)
    if s.int("antialiasing", 0) != 0:
        raise s.error("option 'antialiasing' is not supported", "antialiasing")
    if s.int("maxpool_depth", 0, 0, 1):
        oc = s.int("out_channels", 1, 1, MAX_CHANNELS)
        return [prev], oc, h, w, dict(depth=True, out_channels=oc)
    oh = (h + padding - size) // sy + 1
    ow = (w + padding - size) // sx + 1
    if oh < 1 or ow < 1:
        raise s.error(f"a {size}x{size} pool does not fit the {w}x{h} input", "size")
    return [prev], c, oh, ow, dict(depth=False, size=size, stride_x=sx, stride_y=sy, padding=padding)


def _avgpool(s, i, c, h, w, prev):
    return [prev], c, 1, 1, {}


class RouteSizeError(CfgError):
    """A [route] joins maps of different sizes (often an input size the network's strides do not divide)."""


def _route(s, i, c, h, w, prev, layers):
    idx = _refs(s, i, "layers")
    groups = s.int("groups", 1, 1, MAX_CHANNELS)
    group_id = s.int("group_id", 0, 0, groups - 1)
    first = layers[idx[0]]
    total = 0
    for j in idx:
        lj = layers[j]
        if (lj.h, lj.w) != (first.h, first.w):
            raise RouteSizeError(str(s.error(f"layer {j} is {lj.w}x{lj.h} but layer {idx[0]} is "
                                             f"{first.w}x{first.h}; routed layers must share a size", "layers")))
        if lj.c % groups:
            raise s.error(f"groups={groups} does not divide layer {j}'s {lj.c} channels", "groups")
        total += lj.c // groups
    return idx, total, first.h, first.w, dict(groups=groups, group_id=group_id)


def _shortcut(s, i, c, h, w, prev, layers):
    idx = _refs(s, i, "from")
    # AlexeyAB's weighted shortcut: (len(from) + 1) weights, or that many per channel, from the weights file.
    wtype = s.str("weights_type", "none", ("none", "per_feature", "per_layer", "per_channel"))
    wtype = "per_feature" if wtype == "per_layer" else wtype
    norm = s.str("weights_normalization", "none")   # Darknet reads it; it only matters with weights_type
    if wtype != "none" and norm not in ("none", "relu", "avg_relu", "softmax"):
        raise s.error(f"option 'weights_normalization={show(norm)}' is not one of none, relu, softmax",
                      "weights_normalization")
    nweights = {"none": 0, "per_feature": len(idx) + 1, "per_channel": (len(idx) + 1) * c}[wtype]
    # pjreddie's Darknet: out = alpha * out + beta * from (shortcut_cpu); AlexeyAB's ignores both keys.
    alpha, beta = s.float("alpha", 1.0), s.float("beta", 1.0)
    if (alpha, beta) != (1.0, 1.0):
        if nweights:
            raise s.error("alpha/beta (pjreddie's Darknet) and weights_type (AlexeyAB's) do not go together",
                          "weights_type")
        if len(idx) > 1:
            raise s.error("alpha/beta (pjreddie's weighted shortcut) take a single 'from' layer",
                          "alpha" if s.has("alpha") else "beta")
        s.note("alpha" if s.has("alpha") else "beta", f"alpha={alpha:g}, beta={beta:g} follow pjreddie's Darknet "
               "(out = alpha*out + beta*from); AlexeyAB's ignores them")
    for j in idx:
        if (layers[j].h, layers[j].w) != (h, w):
            raise s.error(f"layer {j} is {layers[j].w}x{layers[j].h} but the input is {w}x{h}", "from")
    return [prev] + idx, c, h, w, dict(activation=_activation(s, "linear"), alpha=alpha, beta=beta,
                                       weights_type=wtype, nweights=nweights,
                                       normalization="relu" if norm == "avg_relu" else norm)


def _upsample(s, i, c, h, w, prev):
    stride = s.int("stride", 2, 1, 64)
    return [prev], c, h * stride, w * stride, dict(stride=stride, scale=s.float("scale", 1.0))


def _reorg(s, i, c, h, w, prev):
    stride = s.int("stride", 1, 1, 64)
    if s.int("reverse", 0) != 0:
        raise s.error("reverse reorg is not supported", "reverse")
    if h % stride or w % stride:
        raise s.error(f"stride {stride} does not divide the {w}x{h} input", "stride")
    if c % (stride * stride):
        raise s.error(f"stride {stride} needs input channels ({c}) to be a multiple of {stride * stride}", "stride")
    return [prev], c * stride * stride, h // stride, w // stride, dict(stride=stride, in_c=c, in_h=h, in_w=w)


def _scale_channels(s, i, c, h, w, prev, layers):
    j = _rel(s, i, s.int("from"), "from")
    src = layers[j]
    wh = bool(s.int("scale_wh", 0, 0, 1))
    ok = (c == 1 and (h, w) == (src.h, src.w)) if wh else (c == src.c and h == 1 and w == 1)
    if not ok:
        raise s.error(f"input {c}x{h}x{w} cannot scale layer {j}'s {src.c}x{src.h}x{src.w}", "from")
    return [prev, j], src.c, src.h, src.w, dict(scale_wh=wh, activation=_activation(s, "linear"))


def _sam(s, i, c, h, w, prev, layers):
    j = _rel(s, i, s.int("from"), "from")
    src = layers[j]
    if (src.c, src.h, src.w) != (c, h, w):
        raise s.error(f"input {c}x{h}x{w} differs from layer {j}'s {src.c}x{src.h}x{src.w}", "from")
    return [prev, j], c, h, w, dict(activation=_activation(s, "linear"))


def _dropout(s, i, c, h, w, prev):
    s.float("probability", 0.5, 0.0, 1.0)
    return [prev], c, h, w, {}


def _softmax(s, i, c, h, w, prev):
    if s.has("tree"):
        raise s.error("a hierarchical softmax ('tree', YOLO9000) is not supported", "tree")
    groups = s.int("groups", 1, 1, MAX_CHANNELS)
    if (c * h * w) % groups:
        raise s.error(f"groups={groups} does not divide the {c * h * w} inputs", "groups")
    return [prev], c, h, w, dict(groups=groups, temperature=s.float("temperature", 1.0))


def _yolo(s, i, c, h, w, prev):
    classes = s.int("classes", 20, 1, 100000)
    num = s.int("num", 1, 1, 1000)
    mask, anchors = _yolo_mask(s, num)
    if c != len(mask) * (classes + 5):
        raise s.error(f"input has {c} channels; {len(mask)} masks x ({classes} classes + 5) need "
                      f"{len(mask) * (classes + 5)}", "classes")
    return [prev], c, h, w, dict(classes=classes, mask=mask, anchors=anchors,
                                 scale_x_y=s.float("scale_x_y", 1.0), new_coords=bool(s.int("new_coords", 0, 0, 1)),
                                 **_nms(s))


def _region(s, i, c, h, w, prev):
    if s.has("tree"):
        raise s.error("a hierarchical softmax ('tree', YOLO9000) is not supported", "tree")
    classes = s.int("classes", 20, 1, 100000)
    coords = s.int("coords", 4, 4, 4)
    num = s.int("num", 1, 1, 1000)
    anchors = s.floats("anchors", [0.5] * (2 * num))
    if len(anchors) < 2 * num:
        raise s.error(f"'anchors' has {len(anchors)} values; num={num} needs {2 * num}", "anchors")
    if c != num * (classes + coords + 1):
        raise s.error(f"input has {c} channels; num={num} x ({classes} classes + 5) need "
                      f"{num * (classes + coords + 1)}", "classes")
    return [prev], c, h, w, dict(classes=classes, num=num, anchors=anchors, softmax=bool(s.int("softmax", 0)),
                                 nms_kind="default", beta_nms=0.6)


def _yolo_mask(s: Section, num: int) -> tuple:
    """``mask`` and ``anchors`` of a [yolo]-like head (every anchor when there is no mask)."""
    mask = s.ints("mask", list(range(num)), 0, num - 1)
    anchors = s.floats("anchors", [0.5] * (2 * num))
    if len(anchors) < 2 * num:
        raise s.error(f"'anchors' has {len(anchors)} values; num={num} needs {2 * num}", "anchors")
    return mask, anchors


def _nms(s: Section) -> dict:
    nms_kind = s.str("nms_kind", "default")
    if nms_kind not in ("default", "greedynms", "diounms", "cornersnms"):
        nms_kind = "default"
    return dict(nms_kind=nms_kind, beta_nms=s.float("beta_nms", 0.6))


def _heard(s: Section, keys: tuple) -> None:
    """Read options Darknet reads only for training, so they count as used (never as typos)."""
    for key in keys:
        s.str(key, "")


def _gaussian_yolo(s, i, c, h, w, prev):
    """Gaussian YOLOv3 head: per anchor x, y, w, h each as (mean, sigma), objectness, classes."""
    classes = s.int("classes", 20, 1, 100000)
    num = s.int("num", 1, 1, 1000)
    mask, anchors = _yolo_mask(s, num)
    if c != len(mask) * (classes + 9):
        raise s.error(f"input has {c} channels; {len(mask)} masks x ({classes} classes + 9) need "
                      f"{len(mask) * (classes + 9)}", "classes")
    point = s.str("yolo_point", "center")
    point = point if point in ("left_top", "right_bottom") else "center"
    _heard(s, ("max", "max_delta", "counters_per_class", "label_smooth_eps", "objectness_smooth", "uc_normalizer",
               "iou_normalizer", "obj_normalizer", "cls_normalizer", "delta_normalizer", "iou_loss",
               "iou_thresh_kind", "jitter", "resize", "ignore_thresh", "truth_thresh", "iou_thresh", "random", "map"))
    return [prev], c, h, w, dict(classes=classes, mask=mask, anchors=anchors, scale_x_y=s.float("scale_x_y", 1.0),
                                 yolo_point=point, **_nms(s))


def _detection(s, i, c, h, w, prev):
    """YOLOv1 head on a flat input: side x side cells of classes, then num confidences, then num boxes."""
    coords = s.int("coords", 1)
    if coords != 4:   # get_detection_detections reads 4 values a box whatever coords says
        raise s.error(f"coords={coords}: only coords=4 is defined (Darknet's decoding reads 4 values a box)", "coords")
    classes = s.int("classes", 1, 1, 100000)
    num = s.int("num", 1, 1, 1000)
    side = s.int("side", 7, 1, MAX_SIDE)
    need = side * side * ((1 + coords) * num + classes)
    if c * h * w != need:
        raise s.error(f"input has {c * h * w} values; side={side}, num={num}, classes={classes} need {need}", "side")
    _heard(s, ("rescore", "forced", "max", "reorg", "coord_scale", "object_scale", "noobject_scale", "class_scale",
               "jitter", "resize", "random"))
    return [prev], c, h, w, dict(classes=classes, num=num, side=side, softmax=bool(s.int("softmax", 0)),
                                 sqrt=bool(s.int("sqrt", 0)), nms_kind="default", beta_nms=0.6)


def _connected(s, i, c, h, w, prev):
    """Fully connected: the flattened (c, h, w) input times an (outputs, inputs) matrix."""
    outputs = s.int("output", 1, 1, MAX_CHANNELS * 64)
    p = dict(outputs=outputs, inputs=c * h * w, bn=bool(s.int("batch_normalize", 0, 0, 1)),
             activation=_activation(s, "logistic"))
    return [prev], outputs, 1, 1, p


def _deconv(s, i, c, h, w, prev):
    """Transposed convolution (pjreddie's [deconvolutional]): output (h - 1) * stride + size - 2 * pad."""
    filters = s.int("filters", 1, 1, MAX_CHANNELS)
    size = s.int("size", 1, 1, MAX_KERNEL)
    stride = s.int("stride", 1, 1, MAX_KERNEL)
    padding = s.int("padding", 0, 0, MAX_KERNEL)
    if s.int("pad", 0, 0, 1):
        padding = size // 2
    oh, ow = (h - 1) * stride + size - 2 * padding, (w - 1) * stride + size - 2 * padding
    if oh < 1 or ow < 1:
        raise s.error(f"padding {padding} leaves no output of the {w}x{h} input", "padding")
    return [prev], filters, oh, ow, dict(filters=filters, size=size, stride=stride, pad=padding, in_c=c,
                                         bn=bool(s.int("batch_normalize", 0, 0, 1)),
                                         activation=_activation(s, "logistic"))


def _local(s, i, c, h, w, prev):
    """Locally connected ([local], YOLOv1): a convolution with its own filters at every output pixel."""
    filters = s.int("filters", 1, 1, MAX_CHANNELS)
    size = s.int("size", 1, 1, MAX_KERNEL)
    stride = s.int("stride", 1, 1, MAX_KERNEL)
    pad = s.int("pad", 0, 0, MAX_KERNEL)
    # local_out_height sizes the output as (h - (size if not pad else 1)) / stride + 1, but im2col
    # pads by `pad` pixels: the two agree only in these cases, and only then is Darknet's result defined.
    oh, ow = (h - (1 if pad else size)) // stride + 1, (w - (1 if pad else size)) // stride + 1
    if (oh, ow) != ((h + 2 * pad - size) // stride + 1, (w + 2 * pad - size) // stride + 1) or oh < 1 or ow < 1:
        raise s.error(f"size={size} with pad={pad} and stride={stride} does not fit the {w}x{h} input the way "
                      "Darknet sizes it; use pad=0, or pad=size/2 with an odd size", "pad")
    return [prev], filters, oh, ow, dict(filters=filters, size=size, stride=stride, pad=pad, in_c=c,
                                         activation=_activation(s, "logistic"))


def _crop(s, i, c, h, w, prev):
    """Inference crop: the centred crop_width x crop_height window, scaled to [-1, 1] unless noadjust."""
    ch = s.int("crop_height", 1, 1, MAX_SIDE)
    cw = s.int("crop_width", 1, 1, MAX_SIDE)
    if ch > h or cw > w:
        raise s.error(f"a {cw}x{ch} crop does not fit the {w}x{h} input", "crop_height")
    _heard(s, ("flip", "angle", "saturation", "exposure", "shift"))   # training-time augmentation
    noadjust = bool(s.int("noadjust", 0, 0, 1))
    return [prev], c, ch, cw, dict(dy=(h - ch) // 2, dx=(w - cw) // 2, scale=1.0 if noadjust else 2.0,
                                   shift=0.0 if noadjust else -1.0)


def _batchnorm(s, i, c, h, w, prev):
    return [prev], c, h, w, dict(activation="linear")


def _activation_layer(s, i, c, h, w, prev):
    return [prev], c, h, w, dict(activation=_activation(s, "linear"))


def _logistic_layer(s, i, c, h, w, prev):
    """pjreddie's [logistic]: the logistic function (its cross-entropy cost is training only)."""
    return [prev], c, h, w, dict(activation="logistic")


def _local_avgpool(s, i, c, h, w, prev):
    """[local_avgpool]: maxpool's windows, each the mean of the cells inside the input."""
    stride = s.int("stride", 1, 1, MAX_KERNEL)
    sx = s.int("stride_x", stride, 1, MAX_KERNEL)
    sy = s.int("stride_y", stride, 1, MAX_KERNEL)
    size = s.int("size", stride, 1, MAX_KERNEL)
    padding = s.int("padding", size - 1, 0, MAX_KERNEL)
    oh = (h + padding - size) // sy + 1
    ow = (w + padding - size) // sx + 1
    if oh < 1 or ow < 1 or size <= padding - padding // 2:   # else a window lies wholly in the padding
        raise s.error(f"a {size}x{size} pool with padding {padding} does not fit the {w}x{h} input", "size")
    return [prev], c, oh, ow, dict(size=size, stride_x=sx, stride_y=sy, padding=padding)


def _reorg3d(s, i, c, h, w, prev):
    """[reorg3d]: space to depth, output channel k = offset * c + input channel."""
    stride = s.int("stride", 1, 1, 64)
    if s.int("reverse", 0) != 0:
        raise s.error("reverse reorg3d is not supported", "reverse")
    if h % stride or w % stride:
        raise s.error(f"stride {stride} does not divide the {w}x{h} input", "stride")
    return [prev], c * stride * stride, h // stride, w // stride, dict(stride=stride)


def _normalization(s, i, c, h, w, prev):
    """[normalization]/[lrn]: local response normalisation across channels (forward_normalization_layer)."""
    size = s.int("size", 5, 1, MAX_CHANNELS)
    if size // 2 > c:   # Darknet's first window would read past the channels
        raise s.error(f"size={size} is more than twice the {c} input channels", "size")
    return [prev], c, h, w, dict(alpha=s.float("alpha", 0.0001), beta=s.float("beta", 0.75),
                                 kappa=s.float("kappa", 1.0), size=size)


def _l2norm(s, i, c, h, w, prev):
    return [prev], c, h, w, {}


def _empty(s, i, c, h, w, prev):
    return [prev], c, h, w, {}


def _cost(s, i, c, h, w, prev):
    """[cost] computes a training loss; at inference Darknet's network output skips it, so it passes through."""
    _heard(s, ("type", "scale", "ratio"))
    return [prev], c, h, w, {}


def _implicit(s, i, c, h, w, prev):
    """A learned constant of (filters, atoms, 1), no input ([implicit]; YOLOR's [implicit_add]/[implicit_mul])."""
    _heard(s, ("mean", "std"))   # the initialisation; the weights file holds the values
    filters = s.int("filters", 128, 1, MAX_CHANNELS)
    atoms = s.int("atoms", 1, 1, MAX_SIDE)
    return [], filters, atoms, 1, dict(filters=filters, atoms=atoms)


_SIMPLE: dict = {"convolutional": _conv, "maxpool": _maxpool, "avgpool": _avgpool, "upsample": _upsample,
                 "reorg": _reorg, "dropout": _dropout, "softmax": _softmax, "yolo": _yolo, "region": _region,
                 "gaussian_yolo": _gaussian_yolo, "detection": _detection, "connected": _connected,
                 "deconvolutional": _deconv, "local": _local, "crop": _crop, "batchnorm": _batchnorm, "activation": _activation_layer,
                 "logistic": _logistic_layer, "local_avgpool": _local_avgpool, "reorg3d": _reorg3d,
                 "l2norm": _l2norm, "normalization": _normalization, "empty": _empty, "cost": _cost, "implicit": _implicit, "implicit_add": _implicit,
                 "implicit_mul": _implicit}
_WITH_LAYERS: dict = {"route": _route, "shortcut": _shortcut, "scale_channels": _scale_channels, "sam": _sam}


def build_layers(sections: list, net: NetInfo) -> list:
    """Turn parsed sections (after [net]) into layers with inferred shapes."""
    layers: list = []
    c, h, w = net.channels, net.height, net.width
    cap = max_bytes()
    if 4 * c * h * w > cap:
        raise LimitError(f"the {w}x{h}x{c} network input would need {gib(4 * c * h * w)}, "
                         f"more than the {gib(cap)} limit ({cap_source()})")
    for s in sections[1:]:
        i = s.index
        prev = i - 1
        if s.kind in _SIMPLE:
            inputs, oc, oh, ow, p = _SIMPLE[s.kind](s, i, c, h, w, prev)
        else:
            try:
                inputs, oc, oh, ow, p = _WITH_LAYERS[s.kind](s, i, c, h, w, prev, layers)
            except RouteSizeError as e:
                if net.width % 32 == 0 and net.height % 32 == 0:
                    raise
                raise CfgError(f"{e} (the input size {net.width}x{net.height} is not a multiple of 32, "
                               "which YOLO networks' strides need)") from None
        if not (1 <= oc <= MAX_CHANNELS * 64 and 1 <= oh <= MAX_SIDE * 4 and 1 <= ow <= MAX_SIDE * 4):
            raise s.error(f"output shape {oc}x{oh}x{ow} is not valid")
        layer = Layer(i, s.kind, s, inputs, oc, oh, ow, p)
        try:
            check_layer(layer, cap)
        except LimitError as e:
            raise LimitError(f"{s.where()}: {e}") from None
        layers.append(layer)
        c, h, w = oc, oh, ow
    return layers


HEADS = ("yolo", "region", "gaussian_yolo", "detection")


def head_layers(layers: list) -> list:
    """The detection heads ([yolo], [region], [Gaussian_yolo], [detection]), in cfg order."""
    return [l for l in layers if l.kind in HEADS]
