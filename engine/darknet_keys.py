"""Which ``[section]`` keys Darknet reads: the table behind yolo-cl's "unused key" warnings.

Darknet marks every option it looks up (``option_find`` in ``src/option_list.c``) and, after
parsing each layer, prints ``Unused field`` for the rest (``option_unused``, called from
``parse_network_cfg_custom`` in ``src/parser.c``). Many keys it reads only to train (``jitter``,
``ignore_thresh``, ``learning_rate``...); yolo-cl does not need them, but must stay as silent
about them as Darknet is. This table is the union of what AlexeyAB's fork (commit 59596d7) and
pjreddie's (commit f6afaab) read for each section, taken from their ``parse_*`` functions; a key
yolo-cl itself reads is heard whether it is listed here or not.
"""
from __future__ import annotations

# Read for every layer by parse_network_cfg(_custom) after the layer's own parse_* function.
EVERY_LAYER = frozenset({
    "clip", "onlyforward", "dont_update", "burnin_update", "stopbackward", "train_only_bn", "dontload",
    "dontloadscales", "learning_rate", "truth", "dontsave", "numload", "smooth",
})

# Keys that change which numbers Darknet reads from the weights file (load_weights_upto skips a
# layer with dontload, load_convolutional_weights its batchnorm with dontloadscales; pjreddie's
# numload reads fewer filters). yolo-cl reads every layer in full, so these must be 0 or absent.
WEIGHT_SKIPS = ("dontload", "dontloadscales", "numload")

_CONV = {"filters", "groups", "size", "stride", "stride_x", "stride_y", "dilation", "antialiasing", "pad",
         "padding", "activation", "assisted_excitation", "share_index", "batch_normalize", "cbn", "binary", "xnor",
         "bin_output", "sway", "rotate", "stretch", "stretch_sway", "flipped", "dot", "angle", "grad_centr",
         "reverse", "coordconv", "stream", "wait_stream"}
_YOLO = {"classes", "num", "mask", "max", "show_details", "max_delta", "counters_per_class", "label_smooth_eps",
         "scale_x_y", "objectness_smooth", "new_coords", "iou_normalizer", "obj_normalizer", "cls_normalizer",
         "delta_normalizer", "iou_loss", "iou_thresh_kind", "beta_nms", "nms_kind", "jitter", "resize",
         "focal_loss", "ignore_thresh", "truth_thresh", "iou_thresh", "random", "track_history_size",
         "sim_thresh", "dets_for_track", "dets_for_show", "track_ciou_norm", "embedding_layer", "map", "anchors"}
_POOL = {"stride", "stride_x", "stride_y", "size", "padding"}

# Section name (as written between brackets, lower-case) -> keys its parse_* function reads (case-sensitive).
READS: dict = {
    "net": {
        "max_batches", "batch", "learning_rate", "learning_rate_min", "sgdr_cycle", "sgdr_mult", "momentum", "decay",
        "subdivisions", "time_steps", "track", "augment_speed", "sequential_subdivisions", "try_fix_nan",
        "weights_reject_freq", "equidistant_point", "badlabels_rejection_percentage", "num_sigmas_reject_badlabels",
        "ema_alpha", "use_cuda_graph", "loss_scale", "dynamic_minibatch", "optimized_memory",
        "workspace_size_limit_MB", "adam", "B1", "B2", "eps", "height", "width", "channels", "inputs", "max_crop",
        "min_crop", "flip", "blur", "gaussian_noise", "mixup", "cutmix", "mosaic", "letter_box", "mosaic_bound",
        "contrastive", "contrastive_jit_flip", "contrastive_color", "unsupervised", "label_smooth_eps",
        "resize_step", "attention", "adversarial_lr", "max_chart_loss", "angle", "aspect", "saturation",
        "exposure", "hue", "power", "policy", "burn_in", "step", "scale", "steps", "scales", "seq_scales", "gamma",
        "show_receptive_field",
        # pjreddie only
        "notruth", "random", "max_ratio", "min_ratio", "center", "clip",
    },
    "convolutional": _CONV,
    "local": {"filters", "size", "stride", "pad", "activation"},
    "deconvolutional": {"filters", "size", "stride", "activation", "batch_normalize", "pad", "padding"},
    "crnn": {"size", "stride", "dilation", "pad", "padding", "output", "hidden", "groups", "activation",
             "batch_normalize", "xnor", "shortcut", "output_filters", "hidden_filters"},
    "rnn": {"output", "hidden", "activation", "batch_normalize", "logistic", "shortcut"},
    "gru": {"output", "batch_normalize", "tanh"},
    "lstm": {"output", "batch_normalize"},
    "conv_lstm": {"size", "stride", "dilation", "pad", "padding", "output", "groups", "activation", "batch_normalize",
                  "xnor", "peephole", "bottleneck", "state_constrain", "shortcut", "lstm_activation",
                  "time_normalizer"},
    "history": {"history_size"},
    "connected": {"output", "activation", "batch_normalize"},
    "softmax": {"groups", "temperature", "tree", "spatial", "noloss"},
    "contrastive": {"classes", "yolo_layer", "temperature", "cls_normalizer", "max_delta", "contrastive_neg_max"},
    "yolo": _YOLO,
    "gaussian_yolo": _YOLO | {"uc_normalizer", "yolo_point"},
    "region": {"coords", "classes", "num", "max", "log", "sqrt", "softmax", "focal_loss", "jitter", "resize",
               "rescore", "thresh", "classfix", "absolute", "random", "coord_scale", "object_scale",
               "noobject_scale", "mask_scale", "class_scale", "bias_match", "tree", "map", "anchors", "background"},
    "detection": {"coords", "classes", "rescore", "num", "side", "softmax", "sqrt", "max", "coord_scale", "forced",
                  "object_scale", "noobject_scale", "class_scale", "jitter", "resize", "random", "reorg"},
    "cost": {"type", "scale", "ratio", "noobj", "thresh"},
    "crop": {"crop_height", "crop_width", "flip", "angle", "saturation", "exposure", "noadjust", "shift"},
    "reorg": {"stride", "reverse", "flatten", "extra"},
    "reorg3d": {"stride", "reverse"},
    "local_avgpool": _POOL,
    "maxpool": _POOL | {"maxpool_depth", "out_channels", "antialiasing", "maxpool_zero_nonmax"},
    "avgpool": set(),
    "dropout": {"probability", "dropblock", "dropblock_size_rel", "dropblock_size_abs"},
    "normalization": {"alpha", "beta", "kappa", "size"},
    "batchnorm": set(),
    # weights_type/weights_normalization: AlexeyAB; alpha/beta: pjreddie
    "shortcut": {"activation", "weights_type", "weights_normalization", "from", "alpha", "beta"},
    "scale_channels": {"from", "scale_wh", "activation"},
    "sam": {"from", "activation"},
    "implicit": {"mean", "std", "filters", "atoms"},
    "activation": {"activation"},
    "upsample": {"stride", "scale"},
    "route": {"layers", "groups", "group_id", "stream", "wait_stream"},
    "empty": set(),
    "l2norm": set(),
    "logistic": set(),
    "iseg": {"classes", "ids"},
}
# Darknet's other spellings of the same sections.
ALIASES = {"network": "net", "conv": "convolutional", "deconv": "deconvolutional", "conn": "connected",
           "max": "maxpool", "avg": "avgpool", "local_avg": "local_avgpool", "lrn": "normalization",
           "soft": "softmax", "silence": "empty", "implicit_add": "implicit", "implicit_mul": "implicit"}


def darknet_reads(kind: str) -> frozenset:
    """Keys some Darknet reads in a section of this kind (any spelling), the per-layer ones included."""
    kind = ALIASES.get(kind, kind)
    own = READS.get(kind, set())
    return frozenset(own) if kind == "net" else frozenset(own) | EVERY_LAYER
