#!/usr/bin/env python3
"""What NVIDIA's OpenCL lets a kernel reach, beyond mma.sync (issue 17's remaining targets).

    python3 tools/probe_nv_limits.py

Prints, for the first GPU (or ``YOLO_CL_DEVICE``):
  * whether kernels using Hopper's sm_90a-only instructions (``wgmma.fence``, ``setmaxnreg``)
    build, without and with ``-cl-nv-arch sm_90a``, and which PTX ``.target`` the build emits;
  * the largest dynamic local memory (``__local`` kernel argument) and static ``__local`` array a
    work-group can launch with (the mma family's tiles are static arrays, up to exactly 48 KB);
  * the L2 read bandwidth: 256 work-groups of 256 items summing a 16 MB buffer (it stays in the
    50 MB L2) with 16-byte loads, best of 5; the bound of a GEMM whose tiles re-read A and B from L2;
  * the floor of a kernel: the event time of a trivial kernel (a work-group of 256 per compute
    unit) with no, 16 KB or 47 KB of static local memory, 60 in a row, and alternating between
    none and 47 KB (a network alternates GEMMs that stage tiles with pools and sums that do not:
    a cost of switching the local-memory carve-out would show there). Medians;
  * whether thread-block clusters reach a kernel (what TMA multicast and distributed local memory
    need): its PTX patched to sm_90a with ``.reqnctapercluster 2, 1, 1`` in the entry, each
    work-group reads ``%cluster_nctarank``; then with ``.explicitcluster`` as well (last: its
    launch may fail and take the context with it).
"""
from __future__ import annotations

import numpy as np

from yolo_cl.ptx import raise_to_sm90a
from yolo_cl.runtime import Runtime

KERNELS = {
    "plain": "__kernel void k(__global float* x) { x[get_global_id(0)] += 1.0f; }",
    "wgmma.fence (sm_90a)": '__kernel void k(__global float* x) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); '
                            'x[get_global_id(0)] += 1.0f; }',
    "setmaxnreg (sm_90a)": '__kernel void k(__global float* x) { asm volatile("setmaxnreg.inc.sync.aligned.u32 240;"); '
                           'x[get_global_id(0)] += 1.0f; }',
}
LOCAL = """__kernel void k(__global float* x, __local float* s, int n) {
    for (int i = get_local_id(0); i < n; i += get_local_size(0)) s[i] = i;
    barrier(CLK_LOCAL_MEM_FENCE);
    x[get_global_id(0)] = s[n - 1 - get_local_id(0)];
}"""
STATIC = """__kernel void k(__global float* x) {
    __local float s[N];
    for (int i = get_local_id(0); i < N; i += get_local_size(0)) s[i] = i;
    barrier(CLK_LOCAL_MEM_FENCE);
    x[get_global_id(0)] = s[N - 1 - get_local_id(0)];
}"""
TRIVIAL = """__kernel void k(__global float* x) {
#if N
    __local float s[N];
    for (int i = get_local_id(0); i < N; i += get_local_size(0)) s[i] = i;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (get_global_id(0) == 0) x[0] += s[N - 1];
#else
    if (get_global_id(0) == 0) x[0] += 1.0f;
#endif
}"""
L2 = """__kernel void k(__global const uint4* x, int n, int rounds, __global uint* out) {
    uint4 acc = (uint4)(0u);
    for (int r = 0; r < rounds; ++r)      /* each round reads every element at another place of its
                                             loop (a rotation by r * 4099): nothing to reuse or fold */
        for (int i = get_global_id(0); i < n; i += get_global_size(0)) acc += x[(i + r * 4099) & (n - 1)] * (uint)(r + 1);
    out[get_global_id(0)] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}"""

CLUSTER = """__kernel __attribute__((reqd_work_group_size(32, 1, 1))) void k(__global uint* out) {
    uint n;
    asm volatile("// YC_PTX mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    if (get_local_id(0) == 0) out[get_group_id(0)] = n;
}"""


def builds(rt, name: str, src: str) -> None:
    cl = rt.cl
    for opts in ("", "-cl-nv-arch sm_90a"):
        try:
            prg = cl.Program(rt.context, src).build(options=opts)
            ptx = prg.get_info(cl.program_info.BINARIES)[0].decode(errors="replace")
            target = next((l.split()[1] for l in ptx.splitlines() if l.startswith(".target")), "?")
            print(f"{name} [{opts or 'no options'}]: builds, PTX .target {target}")
        except cl.Error as e:
            why = next((l.strip() for l in str(e).splitlines() if "error" in l.lower() or "understand" in l.lower()),
                       str(e).splitlines()[0])
            print(f"{name} [{opts or 'no options'}]: does not build: {why[:160]}")


def with_args(kernel, *args):
    """``kernel`` with ``args`` set."""
    kernel.set_args(*args)
    return kernel


def launches(rt, what: str, make) -> None:
    """Print whether the kernel ``make()`` builds and sets up launches as one work-group of 256."""
    try:
        rt.cl.enqueue_nd_range_kernel(rt.queue, make(), (256,), (256,))
        rt.queue.finish()
        print(f"{what}: launches")
    except rt.cl.Error as e:
        print(f"{what}: refused ({str(e).splitlines()[0].split(':')[-1].strip()})")


def main() -> int:
    rt = Runtime(profiling=True, binary_cache=False)
    cl, d = rt.cl, rt.device
    print(f"device: {rt.device_name} (driver {rt.driver}); CL_DEVICE_LOCAL_MEM_SIZE {d.local_mem_size} bytes")
    for name, src in KERNELS.items():
        builds(rt, name, src)
    x = cl.Buffer(rt.context, cl.mem_flags.READ_WRITE, 4 * 256)
    k = cl.Kernel(cl.Program(rt.context, LOCAL).build(), "k")
    for kb in (32, 40, 44, 47, 48, 64):
        launches(rt, f"dynamic local memory {kb} KB", lambda n=kb * 256: with_args(k, x, cl.LocalMemory(4 * n), np.int32(n)))
    for kb in (47, 48):
        launches(rt, f"static local array of {kb} KB", lambda kb=kb: with_args(
            cl.Kernel(cl.Program(rt.context, STATIC).build(options=f"-DN={kb * 256}"), "k"), x))
    n = (16 << 20) // 16                  # a power of two: the rotation is a mask
    buf = cl.Buffer(rt.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                    hostbuf=np.arange(4 * n, dtype=np.uint32))
    out = cl.Buffer(rt.context, cl.mem_flags.WRITE_ONLY, 4 * 256 * 256)
    k2 = cl.Kernel(cl.Program(rt.context, L2).build(), "k")
    rounds = 20
    k2.set_args(buf, np.int32(n), np.int32(rounds), out)
    best = min(_time(rt, k2) for _ in range(6))
    print(f"L2 read bandwidth: {16 * n * rounds / best / 1e6:.0f} GB/s (16 MB read {rounds} times in {best:.3f} ms)")
    floors(rt, x)
    clusters(rt)
    return 0


def clusters(rt) -> None:
    """Print the cluster size work-groups see when the entry asks for clusters of two."""
    cl = rt.cl
    built = cl.Program(rt.context, CLUSTER).build().get_info(cl.program_info.BINARIES)[0]
    for directives in (".reqnctapercluster 2, 1, 1", ".explicitcluster\n.reqnctapercluster 2, 1, 1"):
        what = directives.replace("\n", " ")
        try:
            ptx = raise_to_sm90a(built).replace(b".reqntid", directives.encode() + b"\n.reqntid", 1)
            k = cl.Kernel(cl.Program(rt.context, [rt.device], [ptx]).build(), "k")
            out = cl.Buffer(rt.context, cl.mem_flags.WRITE_ONLY, 4 * 8)
            k.set_args(out)
            cl.enqueue_nd_range_kernel(rt.queue, k, (32 * 8,), (32,))
            seen = np.empty(8, np.uint32)
            cl.enqueue_copy(rt.queue, seen, out)
            rt.queue.finish()
            print(f"entry with {what}: work-groups see clusters of {sorted(set(seen.tolist()))}")
        except cl.Error as e:
            print(f"entry with {what}: fails ({str(e).splitlines()[0][:120]})")
            return


def floors(rt, x) -> None:
    """Print the event time of trivial kernels and the gaps between them (see the module's doc)."""
    cl = rt.cl
    ks = {kb: with_args(cl.Kernel(cl.Program(rt.context, TRIVIAL).build(options=f"-DN={kb * 256}"), "k"), x)
          for kb in (0, 16, 47)}
    grid = (256 * rt.device.max_compute_units,)
    runs = [(f"trivial kernel, {kb} KB of local memory, 60 in a row", [kb] * 60) for kb in ks]
    runs.append(("trivial kernel, 0 and 47 KB alternating", [0, 47] * 30))
    for what, seq in runs:           # seq: each launch's local memory (KB), which names its kernel
        evs = [cl.enqueue_nd_range_kernel(rt.queue, ks[kb], grid, (256,)) for kb in seq]
        rt.queue.finish()
        by_kb: dict = {}
        for kb, e in list(zip(seq, evs))[2:]:
            by_kb.setdefault(kb, []).append((e.profile.end - e.profile.start) / 1e3)
        gaps = sorted((b.profile.start - a.profile.end) / 1e3 for a, b in zip(evs[2:], evs[3:]))
        each = ", ".join(f"{sorted(v)[len(v) // 2]:.2f} us ({kb} KB)" for kb, v in by_kb.items())
        print(f"{what}: {each} each, {gaps[len(gaps) // 2]:.2f} us between")


def _time(rt, k) -> float:
    ev = rt.cl.enqueue_nd_range_kernel(rt.queue, k, (256 * 256,), (256,))
    ev.wait()
    return (ev.profile.end - ev.profile.start) * 1e-6


if __name__ == "__main__":
    raise SystemExit(main())
