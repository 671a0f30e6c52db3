#!/usr/bin/env python3
"""Whether a kernel reads a pinned host buffer in place, and what a frame's resize pays either way.

    python3 tools/probe_zero_copy.py [--reps 200]

A ``frame_array`` frame lives in pinned host memory (``ALLOC_HOST_PTR``, mapped) and goes to the
device by one DMA of the whole frame before the preprocessing kernel reads it (1280x720: 2.8 MB,
about 60 us on an H100 host). The resize reads only two source rows per input row (a letterbox
to 234 rows: 468 of 720), so a kernel reading the pinned buffer in place would move a third less
over the bus and save a command. This probe times, on a plain queue (wall, median of ``--reps``):

  * ``dma + kernel``: the frame's DMA into a device buffer, then a kernel copying the 468 rows;
  * ``in place``: the same kernel reading the pinned buffer itself;
  * ``kernel alone`` and ``dma alone``;

and checks that the in-place kernel sees what the host wrote through the mapping since the last
launch (a new value each time): a driver that copies the buffer to the device once and keeps
that copy would read stale rows, and then reading in place is no use.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from yolo_cl.runtime import Runtime
from yolo_cl.staging import pinned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_host import median_ms               # noqa: E402

GATHER = """__kernel void k(__global const uchar* restrict src, __global const int* restrict rows, int row_bytes,
                        __global uchar* restrict dst) {
    const int x = get_global_id(0), r = get_global_id(1);
    dst[r * row_bytes + x] = src[rows[r] * row_bytes + x];
}"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--size", default="1280x720", help="frame WIDTHxHEIGHT")
    ap.add_argument("--out-rows", type=int, default=234, help="network input rows the resize makes")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    rt = Runtime()
    cl, q = rt.cl, rt.queue
    print(f"device: {rt.device.name}; frame {w}x{h}, {args.out_rows} input rows", flush=True)
    row_bytes = w * 3
    scale = h / args.out_rows
    ys = np.floor((np.arange(args.out_rows) + 0.5) * scale - 0.5).clip(0, h - 2).astype(np.int32)
    rows = np.unique(np.concatenate([ys, ys + 1])).astype(np.int32)
    print(f"rows read: {len(rows)} of {h} ({len(rows) * row_bytes / 1e6:.2f} of {h * row_bytes / 1e6:.2f} MB)")
    host_buf, frame = pinned(rt, (h, w, 3), np.uint8)
    frame[...] = np.random.default_rng(0).integers(0, 255, frame.shape, dtype=np.uint8)
    dev = rt.alloc(frame.nbytes, "frame")
    table = rt.upload(rows, "rows")
    out = rt.alloc(len(rows) * row_bytes, "rows out")
    k = cl.Kernel(cl.Program(rt.context, GATHER).build(), "k")
    gs = (row_bytes, len(rows))

    def launch(src) -> None:
        k.set_args(src, table, np.int32(row_bytes), out)
        cl.enqueue_nd_range_kernel(q, k, gs, None)

    def dma_kernel() -> None:
        cl.enqueue_copy(q, dev, frame, is_blocking=False)
        launch(dev)
        q.finish()

    def in_place() -> None:
        launch(host_buf)
        q.finish()

    def kernel_alone() -> None:
        launch(dev)
        q.finish()

    def dma_alone() -> None:
        cl.enqueue_copy(q, dev, frame, is_blocking=False)
        q.finish()

    got = np.empty((len(rows), w, 3), np.uint8)
    stale = 0
    for i in range(20):          # the host writes a new value through the mapping before each launch
        frame[rows, 0, 0] = i
        in_place()
        cl.enqueue_copy(q, got, out)
        stale += int(not np.array_equal(got[:, 0, 0], np.full(len(rows), i, np.uint8)))
    print(f"in place sees the host's writes: {'yes' if stale == 0 else f'no (stale in {stale} of 20)'}")
    for name, fn in (("dma + kernel", dma_kernel), ("in place", in_place), ("kernel alone", kernel_alone),
                     ("dma alone", dma_alone)):
        print(f"{name:14s} {median_ms(fn, args.reps, warm=10) * 1e3:8.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
