#!/usr/bin/env python3
"""List the launches a GPU's plan binds, on any machine: a tuned device's records, this device's kernels.

A plan's launch list on the GPU (which family each conv takes, which tensors are stored
channels-last and so which transposes remain, where K is split) follows the tuning database's
records for that GPU. This binds the same plan here: the tensor-core families emulated in plain
OpenCL C (``YOLO_CL_MMA_EMULATE=1``, ``YOLO_CL_WGMMA_EMULATE=1``, set unless given), the
look-ups filed under the named device instead of this one. So a CPU-only machine shows what the
H200 runs, launch by launch, before a device call is spent on a change to it. A stored config
this device cannot run (its local memory, its work-group size) falls back to the heuristic and is
marked ``(heuristic)``; such lines may differ on the GPU.

    python tools/plan_list.py yolov3 --size 416 --precision fp16                    # NVIDIA H200
    python tools/plan_list.py yolov3-tiny --device-name "NVIDIA H100 80GB HBM3"
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ.setdefault("YOLO_CL_MMA_EMULATE", "1")
os.environ.setdefault("YOLO_CL_WGMMA_EMULATE", "1")

from yolo_cl import Detector                                     # noqa: E402
from yolo_cl.kernels.family import tuning_database              # noqa: E402
from yolo_cl.kernels.gemm_mma import mode_for                   # noqa: E402
from yolo_cl.precision import precision_named                   # noqa: E402
from yolo_cl.runtime import Runtime                             # noqa: E402
from yolo_cl.tuning_db import DeviceId                          # noqa: E402
from yolo_cl.zoo import resolve                                 # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from bench_gpu import write_weights                             # noqa: E402  (random weights, finite heads)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="zoo name or cfg path")
    ap.add_argument("--size", type=int, default=416)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "tf32"])
    ap.add_argument("--device-name", default="NVIDIA H200", help="the device whose records to bind")
    ap.add_argument("--driver", default="580.159.04")
    ap.add_argument("--vendor", default="NVIDIA Corporation")
    args = ap.parse_args()
    found = resolve(args.model)
    cfg, wts = (found if found is not None else (args.model, None))
    precision = precision_named(args.precision)
    rt = Runtime()
    mma = mode_for(rt, precision)
    db = tuning_database(rt, precision, mma)
    db.id = DeviceId(args.device_name, args.driver, args.vendor, "GPU", db.id.precision)
    with tempfile.TemporaryDirectory(prefix="plan-list-") as td:
        if wts is None or not Path(wts).is_file():
            wts = Path(td) / "random.weights"
            write_weights(Path(cfg), wts)
        det = Detector(cfg, wts, input_size=args.size, precision=args.precision, device=rt.device, tuning=db,
                       device_preprocess=False, device_decode=False)
        ex = det.executor(args.batch)
    print(f"{args.model} {args.size} batch {args.batch} {args.precision} with {args.device_name}'s records "
          f"on {rt.device_name} (tensor cores: {mma or 'none'}): {len(ex.launches)} launches")
    stored = {n.label for n in ex.graph.nodes if n.op == "conv" and db.conv_config(n, args.batch) is not None}
    for i, l in enumerate(ex.launches):
        cfg_text = " ".join(f"{k}={v}" for k, v in sorted(l.config.items()))
        mark = "" if l.node.op != "conv" or l.node.label in stored else "  (heuristic)"
        print(f"{i:4d}  {str(l.node.label):>6}  {l.name:<14} {l.node.describe():<28} {cfg_text}{mark}")
    kinds = Counter(l.name for l in ex.launches)
    print("by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))


if __name__ == "__main__":
    main()
