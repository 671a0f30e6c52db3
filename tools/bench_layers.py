"""Time the non-convolution weighted layers at the sizes real Darknet nets give them: each layer
alone on a random input, median of several forward passes (input upload and output read included).
[connected] runs in both kernel shapes: a float8 row walk per work-item (CPU default) and 64 lanes
per output with a local reduction (GPU default).

    PYTHONPATH=... python tools/bench_layers.py [--repeat N]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import yolo_cl
from yolo_cl.bench import random_params
from yolo_cl.cfg import parse_cfg
from yolo_cl.kernels import simple
from yolo_cl.layers import build_layers, parse_net
from yolo_cl.weights import save_weights

CASES = {   # name: (input c, h, w, layer section)
    "connected 50176->4096 (YOLOv1)": (1024, 7, 7, "[connected]\noutput=4096\nactivation=leaky\n"),
    "connected 4096->1470 (YOLOv1)": (4096, 1, 1, "[connected]\noutput=1470\nactivation=linear\n"),
    "local 7x7x1024->256 3x3 (YOLOv1)": (1024, 7, 7, "[local]\nfilters=256\nsize=3\nstride=1\npad=1\nactivation=leaky\n"),
    "deconvolutional 26x26x256->128 4x4/2": (256, 26, 26, "[deconvolutional]\nfilters=128\nsize=4\nstride=2\npad=1\n"
                                                          "activation=leaky\n"),
}


def time_case(c: int, h: int, w: int, body: str, repeat: int, tmp: Path) -> float:
    cfg = tmp / "layer.cfg"
    cfg.write_text(f"[net]\nwidth={w}\nheight={h}\nchannels={c}\n\n{body}")
    sections = parse_cfg(cfg)
    layers = build_layers(sections, parse_net(sections[0]))
    weights = tmp / "layer.weights"
    save_weights(weights, layers, random_params(layers))
    det = yolo_cl.Detector(cfg, weights)
    blob = np.random.default_rng(0).random((1, c, h, w), dtype=np.float32)
    det.forward(blob)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        det.forward(blob)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    default = dict(simple.CONN_WG)
    with tempfile.TemporaryDirectory(prefix="bench-layers-") as d:
        for name, (c, h, w, body) in CASES.items():
            shapes = [("", None)] if "connected" not in name else [(" [1 lane/output]", 1), (" [64 lanes/output]", 64)]
            for label, lanes in shapes:
                simple.CONN_WG = {"cpu": lanes, "gpu": lanes} if lanes else default
                ms = time_case(c, h, w, body, args.repeat, Path(d))
                print(f"{name}{label}: median of {args.repeat} {ms:.1f} ms")
            simple.CONN_WG = default


if __name__ == "__main__":
    main()
