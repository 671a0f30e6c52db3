"""Hopper instructions NVIDIA's OpenCL C compiler will not emit, reached through a program binary.

NVIDIA's OpenCL builds OpenCL C into PTX for ``.target sm_90`` and its own assembly step refuses
what needs ``sm_90a`` (``wgmma``, the warpgroup MMA that cuDNN's Hopper kernels run on;
``setmaxnreg``). But the driver also loads PTX text as a program binary and compiles it for the
device, ``.target sm_90a`` included (BENCHMARKS.md, seventeenth session). So a kernel writes each
such instruction as a *marker*: an inline-asm comment ``// YC_PTX <instruction text>``. The
compiler fills in the operands' registers as in any inline asm, keeps the statement where it is
(``asm volatile``) and lets the comment through. :func:`raise_to_sm90a` then turns every marker
line into its instruction and raises the target; the runtime loads the result
(:meth:`yolo_cl.runtime.Runtime.program` with ``patch``).
"""
from __future__ import annotations

import re

MARK = "// YC_PTX "
_TARGET = re.compile(rb"^\.target sm_90(?=[,\s])", re.M)


class PtxError(ValueError):
    """The program is not PTX this patch applies to (another target, another vendor's binary)."""


def raise_to_sm90a(binary: bytes) -> bytes:
    """The PTX ``binary`` with each marker line replaced by the instruction text after its marker
    and ``.target sm_90`` raised to ``sm_90a``. Raises :class:`PtxError` where the binary is not
    PTX for sm_90 or holds no marker (nothing to patch means the kernel was built without them)."""
    if not _TARGET.search(binary):
        raise PtxError("not PTX for .target sm_90")
    mark = MARK.encode()
    lines = binary.split(b"\n")
    found = 0
    for i, line in enumerate(lines):
        at = line.find(mark)
        if at >= 0:
            lines[i] = line[:at] + line[at + len(mark):]
            found += 1
    if not found:
        raise PtxError(f"no {MARK.strip()} marker in the program")
    return _TARGET.sub(b".target sm_90a", b"\n".join(lines), count=1)
