"""Run Darknet-format test cases that nobody on yolo-cl wrote, and say for each: pass, fail, and why.

The cases live in tests/outside/ (cases.json lists them; README.md there says where each file
comes from and under which license). Nothing is fetched at run time. A case has a cfg, the input
shape and the expected output shape; where its source published the input and expected output
values, they are vendored as raw little-endian float32 and compared too.

Statuses:
  PASS   values (and shape) match the outside expectation within the case's tolerance;
  SHAPE  the output shape matches; the source's values are not vendored (why is printed);
  FAIL   the shape or the values differ (the largest difference is printed);
  ERROR  yolo-cl refuses the case (its one-line error is printed).

Usage: python tools/outside_suite.py [--cases tests/outside/cases.json] [--device SPEC] [--json]
Exit status: 0 if no case FAILs (ERROR cases are listed, not counted as failures), 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import yolo_cl
from yolo_cl.cfg import parse_cfg
from yolo_cl.layers import build_layers, parse_net
from yolo_cl.outputs import layer_indices
from yolo_cl.weights import needs_weights

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = ROOT / "tests" / "outside" / "cases.json"


@dataclass
class Result:
    name: str
    status: str
    why: str


def _squeezed(shape) -> tuple:
    """A shape without its size-1 axes after the batch: OpenCV writes a [connected] output as (N, C)."""
    return (shape[0],) + tuple(n for n in shape[1:] if n != 1)


def run_case(case: dict, base: Path, device=None) -> Result:
    """Run one case; never raises for a yolo-cl error (that is the ERROR status)."""
    name, cfg = case["name"], base / case["cfg"]
    n, c, h, w = case["input_shape"]
    want = tuple(case["expected_shape"])
    try:
        sections = parse_cfg(cfg)
        net = parse_net(sections[0], (w, h))
        layers = build_layers(sections, net)
        out_layer = layers[layer_indices(layers, [case.get("output", -1)])[0]]
    except yolo_cl.YoloClError as e:
        return Result(name, "ERROR", str(e))
    shape = (n, out_layer.c, out_layer.h, out_layer.w)
    if _squeezed(shape) != _squeezed(want):
        return Result(name, "FAIL", f"output shape {shape}, expected {want}")
    if needs_weights(layers):
        return Result(name, "SHAPE", "shape matches; the case's .weights and .npy values are binary files not "
                                     "vendored here")
    try:
        det = yolo_cl.Detector(cfg, input_size=(w, h), device=device)
        if "input" not in case:
            got = det.forward(np.zeros((n, c, h, w), np.float32), outputs=[out_layer.index])[0]
            if got.shape != shape:
                return Result(name, "FAIL", f"ran to shape {got.shape}, expected {shape}")
            return Result(name, "SHAPE", "shape matches (and the net runs); the case's .npy values are binary files "
                                         "not vendored here")
        x = np.fromfile(base / case["input"], "<f4").reshape(case["input_shape"])
        ref = np.fromfile(base / case["expected"], "<f4").reshape(want)
        got = det.forward(x, outputs=[case.get("output", out_layer.index)])[0].reshape(want)
    except yolo_cl.YoloClError as e:
        return Result(name, "ERROR", str(e))
    diff = float(np.abs(got.astype(np.float64) - ref).max())
    tol = float(case.get("tolerance", 1e-5)) * max(1.0, float(np.abs(ref).max()))
    if diff <= tol:
        return Result(name, "PASS", f"max |diff| {diff:.3g} <= {tol:.3g} over {ref.size} values")
    return Result(name, "FAIL", f"max |diff| {diff:.3g} > {tol:.3g} over {ref.size} values")


def run_suite(path: Path = DEFAULT_CASES, device=None) -> list:
    """Every case of a cases.json, in its order."""
    spec = json.loads(Path(path).read_text())
    return [run_case(case, Path(path).parent, device) for case in spec["cases"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=Path, default=DEFAULT_CASES, help="cases.json to run")
    ap.add_argument("--device", help="OpenCL device (as for yolo-cl --device)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    results = run_suite(args.cases, args.device)
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=1))
    else:
        for r in results:
            print(f"{r.status:<6} {r.name:<28} {r.why}")
        counts = {s: sum(r.status == s for r in results) for s in ("PASS", "SHAPE", "FAIL", "ERROR")}
        print(", ".join(f"{v} {k.lower()}" for k, v in counts.items()))
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
