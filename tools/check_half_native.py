#!/usr/bin/env python3
"""Type-check the native half-arithmetic kernels with a clang front end that has ``cl_khr_fp16``.

    pip install libclang            # clang's Python bindings with their own libclang
    python3 tools/check_half_native.py [--headers DIR] [--shapes 19x220x189,64x256x576]

No device here lists ``cl_khr_fp16``, so ``HALF_MATH`` without ``HALF_EMULATE`` (real half
arithmetic) never builds in the tests. This script parses ``cl/gemm.cl`` and ``cl/gemm_local.cl``
as OpenCL C 1.2 for the SPIR target with ``cl_khr_fp16`` on (and every other extension off),
under the defines the two families give every config of their search spaces at the given
M x N x K shapes (plain, implicit and, for the CPU family, with a fused shortcut), and reports
clang's errors: syntax and types (a half vector where a float one is expected, a load that
needs the extension), not code generation or results. ``--headers``: the folder holding
``opencl-c.h`` (default: the one PoCL's wheel installs, next to the ``pocl_binary_distribution``
package).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from yolo_cl.kernels import gemm_cpu as gc
from yolo_cl.kernels import gemm_local as gl

CL = Path(__file__).resolve().parent.parent / "cl"
NATIVE = {"HALF_STORAGE": True, "HALF_MATH": True}


def pocl_headers() -> Path:
    import pocl_binary_distribution
    found = sorted(Path(pocl_binary_distribution.__file__).parent.glob("**/opencl-c.h"))
    if not found:
        raise SystemExit("no opencl-c.h found next to pocl_binary_distribution: give --headers")
    return found[0].parent


def define_sets(shapes: list) -> list:
    """(source, defines) for every config of both families' spaces at ``shapes``, deduplicated."""
    out = {}
    for M, N, K in shapes:
        for cfg in gc.space(M, N, K):
            for extra in ({}, {"IMPLICIT": True, "IM_KS": 3, "IM_SY": 1, "IM_PAD": 1, "IM_DIL": 1},
                          {"RESIDUAL": True, "ACT": "A_LEAKY", "ACT2": "A_MISH"}):
                if "IMPLICIT" in extra and cfg["kernel"] != "nv":
                    continue
                d = gc.defines({**NATIVE, **extra}, cfg, M, N)
                out[("gemm.cl", tuple(sorted(d.items())))] = None
        for implicit in (False, True):
            for cfg in gl.space(M, N, K, implicit):
                extra = {"IMPLICIT": True, "KS": 3, "SX": 1, "SY": 1, "PAD": 1, "DIL": 1} if implicit else \
                    {"RESIDUAL": True, "ACT": "A_LEAKY"}
                d = gl.defines({**NATIVE, **extra}, cfg, M, N, K)
                out[("gemm_local.cl", tuple(sorted(d.items())))] = None
    return list(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headers", help="folder holding opencl-c.h")
    ap.add_argument("--shapes", default="19x220x189,64x256x576")
    args = ap.parse_args()
    import clang.cindex as ci
    headers = Path(args.headers) if args.headers else pocl_headers()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    index = ci.Index.create()
    base = ["-x", "cl", "-cl-std=CL1.2", "--target=spir64", "-Xclang", "-cl-ext=-all,+cl_khr_fp16",
            f"-I{headers}", f"-I{CL}", "-include", "opencl-c.h"]
    checked, failed = 0, 0
    for source, defines in define_sets(shapes):
        opts = [f"-D{k}" if v is True else f"-D{k}={v}" for k, v in defines if v is not False]
        tu = index.parse(str(CL / source), args=base + opts)
        errors = [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]
        checked += 1
        if errors:
            failed += 1
            print(f"{source} {' '.join(opts)}:")
            for d in errors[:5]:
                print(f"  {d.location.file}:{d.location.line}: {d.spelling}")
    print(f"{checked} define sets parsed with cl_khr_fp16, {failed} with errors")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
