/* C[m][n] = sum_k A[m][k] * B[k][n] on Hopper's warpgroup MMA (wgmma.mma_async, sm_90a): half
 * inputs (or with TF32 float ones read as TF32: k-contiguous B only), float accumulation, the
 * storage's output. NVIDIA's OpenCL C compiler will not emit wgmma, so each
 * sm_90a instruction is written as an inline-asm comment marker ("// YC_PTX ..."), which the
 * compiler fills with the operands' registers; engine/ptx.py turns the markers into instructions
 * in the built PTX and raises its target to sm_90a, and the runtime loads that PTX as a binary.
 *
 *   A   the packed weights [Mp][Kp] half (k contiguous, zero-padded: gemm_mma.pack_weights), with
 *       TF32 float rounded to TF32; or with A_REG (config key AR) each work-item's wgmma
 *       A fragments, [Mp/MT][Kp/KSTEP][THREADS] uint4 (gemm_wgmma.pack_fragments), loaded straight
 *       into registers one k-tile ahead and read from there by the wgmma: the stages then hold B
 *       alone, and local memory carries only B's copies and reads (4096^3 on an H200: 412 TFLOP/s
 *       against 281 with A staged, BENCHMARKS.md twenty-fifth session)
 *   B   [N][K] half (B transposed: k contiguous; ldb, K and offsets multiples of 8), with TF32
 *       float (the tensor cores take each float's TF32 bits: its low 13 mantissa bits dropped),
 *       or with B_KN [K][N] (n contiguous: a conv's input planes, gemm1x1 or im2col), read by wgmma in its
 *       transposed-B ("MN-major") layout; with IMPLICIT (B_KN too) the conv's input itself, the
 *       im2col matrix gathered element by element (trailing args H, W, OW; defines KS SX SY PAD DIL);
 *       with NHWC (k-contiguous B) the conv's input transposed to [H][W][C] (conv.cl's
 *       yc_nchw_to_nhwc; C padded to a multiple of 8 with zeros, k ordered (ky, kx, c) in A too, so K
 *       is KS * KS * C), each row of B's tile an output pixel's window copied 16 bytes at a time
 *       by cp.async (same trailing args)
 *   C   as the other GPU GEMM families store it, through the shared epilogue (gemm_epilogue.h:
 *       bias, activation, shortcut, concat slice, upsample written through), any M, N, K
 *
 * Tiling: a work-group of MT / 64 warpgroups (128 work-items each) owns an MT x NT tile of C;
 * warpgroup w computes rows 64w .. 64w + 63 with one m64nNTk16 wgmma per 16 of k (m64nNTk8 per 8
 * with TF32: 32 bytes of k either way), both operands
 * read by the tensor cores straight from local memory through 64-bit matrix descriptors.
 * Local memory holds STAGES stages of KT of k of A's and B's tiles, filled by cp.async
 * STAGES - 1 tiles ahead; one barrier per stage, after which the stage STAGES - 1 ahead is
 * staged into the slot the last stage's wgmma read (wgmma.wait_group 0 ended each stage), then
 * this stage's wgmma issued; or with INFLIGHT (config key WI; one warpgroup, MT 64) wait_group 1
 * after the wgmma: a stage's wgmma runs on while the next is staged, and only the previous
 * stage's, whose slot is refilled after this stage's wgmma, must be done.
 *
 *   MT NT   64, 128 or 256 (MT: 1, 2 or 4 warpgroups)
 *   SWZ     the operand layout, which fixes KT = SWZ / ES (ES = 2, or 4 with TF32): tile rows
 *           of SWZ bytes (32, 64 or 128),
 *           eight rows a group, 16-byte chunk c of row r stored at chunk c ^ ((r >> s) & (SWZ/16 - 1))
 *           with s = 2, 1, 0 for SWZ 32, 64, 128 -- the hardware's 32/64/128-byte swizzles, which
 *           read without bank conflicts (the unswizzled "interleave" layout ran at half the speed:
 *           BENCHMARKS.md, seventeenth session). With B_KN, B's tile is kept n-contiguous: atoms
 *           of 8 k-rows x SWZ bytes of n, swizzled alike, atom (k-group kg, n-atom na) at
 *           (na * KT / 8 + kg) * 8 * SWZ (the descriptor's LBO: the n-atom stride, SBO: the k-group's)
 *   STAGES  local-memory stages (config key ST), 2 or more (STAGES x (MT + NT) x KT halves <= 48 KB)
 *   SK      K split over SK work-groups (a whole number of k-tiles each, none empty: the host
 *           checks): with SK > 1 each stores its raw float sums to P = (float*)C as [SK][images][M][N]
 *           and gemm_local.cl's yc_gemm_splitk adds them and runs the epilogue. Grid z: images x SK
 *   PATCH   (config key PT; NHWC, KS 3, stride and dilation 1, A_REG, SWZ 128) a stride-1 3x3
 *           conv's B from one input patch per channel slice (KT: 64, or 32 with TF32): the tile is
 *           NT / 8 output rows of 8 pixels, a stage holds the (NT / 8 + 2) x 10 input pixels under
 *           it (23 KB at NT 128), and each of the nine taps reads its B rows straight from that
 *           patch -- row group g (output row g) at patch line (g + ky) * 10 + kx, the descriptor's
 *           stride byte offset one patch row -- so a slice's input is copied once instead of once
 *           per tap (16 KB per tap and 128 pixels otherwise). With PFLAT (PT 2; define PW = the
 *           map's width + 2) a tile is NT consecutive pixels of the output on a grid of PW columns,
 *           each tap's B rows one run of the patch's NT + 2 PW + 2 lines
 *   WGMMA_EMULATE  each wgmma computed in plain OpenCL C from the same descriptors and local
 *           layout, cp.async as plain copies (CI on PoCL, which has no PTX)
 */
#include "gemm_epilogue.h"

#ifndef MT
#define MT 128
#endif
#ifndef NT
#define NT 128
#endif
#ifndef SWZ
#define SWZ 64
#endif
#ifndef STAGES
#define STAGES 3
#endif
#if SWZ != 32 && SWZ != 64 && SWZ != 128
#error "SWZ is 32, 64 or 128"
#endif
#ifndef KPAD
#define KPAD 64
#endif
#ifndef SK
#define SK 1
#endif
#ifndef INFLIGHT
#define INFLIGHT 0
#endif
#if INFLIGHT && MT != 64
#error "INFLIGHT keeps one warpgroup's wgmma in flight: MT 64"
#endif
#if defined(IMPLICIT) && !defined(B_KN)
#error "IMPLICIT gathers the n-contiguous B: B_KN"
#endif
#if defined(NHWC) && defined(B_KN)
#error "NHWC reads a k-contiguous B: not B_KN"
#endif
#if STAGES < 2
#error "STAGES is 2 or more"
#endif
#ifdef TF32
#if defined(B_KN)
#error "TF32 wgmma reads both operands k-contiguous: not B_KN"
#endif
#define ES 4                           /* bytes of an operand element */
typedef uint yc_elem;
#else
#define ES 2
typedef ushort yc_elem;
#endif
#define EPC (16 / ES)                  /* elements of a 16-byte chunk */
#define KT (SWZ / ES)                  /* k per stage: one swizzled row */
#define KSTEP (32 / ES)                /* k of one wgmma: 32 bytes */
#define KSTEPS (SWZ / 32)              /* wgmma per stage */
#define CHUNKS (SWZ / 16)              /* 16-byte chunks per row */
#define THREADS (2 * MT)               /* MT / 64 warpgroups of 128 */
#ifdef A_REG
#define ACOPY 0                        /* A's rows copied into a stage: none, A goes to registers */
#else
#define ACOPY MT
#endif
#if defined(A_REG) && !defined(WGMMA_EMULATE)
#define AROWS 0                        /* A's rows held in a stage (the emulation reads A from one) */
#else
#define AROWS MT
#endif
#define STAGE ((AROWS + NT) * SWZ)     /* bytes of a stage: A's MT rows of KT (unless A_REG), then B's KT x NT */
#define NA (SWZ / 2)                   /* B_KN: n of a swizzle atom's row */
#ifdef B_KN
#define B_TRANS "1"
#define B_LBO (KT * SWZ)               /* between n-atoms */
#else
#define B_TRANS "0"
#define B_LBO 16                       /* unused by swizzled k-major layouts: 1 */
#endif
#define SWZ_SHIFT (SWZ == 128 ? 0 : SWZ == 64 ? 1 : 2)
#define LAYOUT_TYPE (SWZ == 128 ? 1 : SWZ == 64 ? 2 : 3)     /* descriptor bits 62-63 */

/* Where chunk c of tile row r goes in a stage (bytes). */
#define CHUNK_AT(r, c) ((r) * SWZ + (((c) ^ (((r) >> SWZ_SHIFT) & (CHUNKS - 1))) << 4))

/* A matrix descriptor: start address, leading byte offset (lbo: see B_LBO), stride byte offset
 * (sbo: between 8-row groups), layout type. The hardware swizzles by the address's own bits, so a
 * start anywhere in the swizzle's period reads what the stores put there (PATCH's taps start at
 * any patch line; setting the base offset field to the start's place in the period gave wrong sums
 * on an H200). */
inline ulong yc_desc_sbo(const uint addr, const uint lbo, const uint sbo)
{
    return (ulong)((addr >> 4) & 0x3fff) | ((ulong)((lbo >> 4) & 0x3fff) << 16)
           | ((ulong)((sbo >> 4) & 0x3fff) << 32) | ((ulong)LAYOUT_TYPE << 62);
}

/* ... with 8-row groups of 8 rows of SWZ bytes after each other */
inline ulong yc_desc(const uint addr, const uint lbo) { return yc_desc_sbo(addr, lbo, 8 * SWZ); }

#ifdef WGMMA_EMULATE
/* Local addresses are offsets into the kernel's stage array. */
#define SMEM_BASE(p) 0u
#define CP_ASYNC16(dst, src, ok)                                                                 \
    (*(__local uint4*)(smem_b + (dst)) = (ok) ? *(const __global uint4*)(src) : (uint4)(0u))
#define CP_COMMIT()
#define CP_WAIT()
#define PREFETCH_L2(p)
#define PROXY_FENCE()
/* The byte of operand element (r, k) a descriptor names: rows of SWZ bytes, 8-row groups SBO
 * apart, then the swizzle applied to the address, as the hardware does. */
inline uint yc_swizzled(const uint at) { return at ^ (((at >> 7) & (CHUNKS - 1)) << 4); }
inline uint yc_operand_at(const ulong d, const int r, const int k)
{
    const uint start = (uint)(d & 0x3fff) << 4, sbo = (uint)((d >> 32) & 0x3fff) << 4;
    return yc_swizzled(start + (uint)(r >> 3) * sbo + (uint)(r & 7) * SWZ + ES * k);
}
/* ... and of B's element (n, k) in the MN-major layout: n-atoms LBO apart, k-groups SBO apart. */
inline uint yc_operand_mn_at(const ulong d, const int n, const int k)
{
    const uint start = (uint)(d & 0x3fff) << 4, lbo = (uint)((d >> 16) & 0x3fff) << 4,
               sbo = (uint)((d >> 32) & 0x3fff) << 4;
    return yc_swizzled(start + (uint)(n / NA) * lbo + (uint)(k >> 3) * sbo + (uint)(k & 7) * SWZ + 2 * (n % NA));
}
#ifdef B_KN
#define B_AT(d, c, k) yc_operand_mn_at(d, c, k)
#else
#define B_AT(d, c, k) yc_operand_at(d, c, k)
#endif
#ifdef TF32
/* an operand as the tensor cores read it: the float's TF32 bits */
#define OPERAND(p) as_float(*(__local const uint*)(p) & 0xffffe000u)
#else
#define OPERAND(p) vload_half(0, (__local const half*)(p))
#endif
/* One m64nNTk16 (k8) wgmma of this work-item's warpgroup: its accumulator elements are those of
 * stacked m16n8 fragments (warp w: rows 16w + g and + 8; column block i: columns 8i + 2t, + 1). */
inline void yc_wgmma(float* acc, __local const uchar* sm, const ulong da, const ulong db, const int wtid)
{
    const int w = wtid >> 5, lane = wtid & 31, g = lane >> 2, t = lane & 3;
    for (int i = 0; i < NT / 8; ++i)
        for (int q = 0; q < 4; ++q) {
            const int r = 16 * w + g + 8 * (q >> 1), c = 8 * i + 2 * t + (q & 1);
            float s = acc[4 * i + q];
            for (int k = 0; k < KSTEP; ++k)
                s = fma(OPERAND(sm + yc_operand_at(da, r, k)), OPERAND(sm + B_AT(db, c, k)), s);
            acc[4 * i + q] = s;
        }
}
#define WGMMA_STAGE()                                                                            \
    for (int j = 0; j < KSTEPS; ++j) yc_wgmma(acc, smem_b, da[j], db[j], wtid);
#define WG_FENCE()
#define WG_COMMIT_WAIT(n)
#define WG_WAIT_ALL()
#else
#define SMEM_BASE(p) ((uint)(size_t)(p))
/* 16 bytes global -> local, zero-filled where !ok (its source then not read) */
#define CP_ASYNC16(dst, src, ok)                                                                 \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"                                \
                 :: "r"(base + (dst)), "l"((ulong)(size_t)(src)), "r"((ok) ? 16 : 0) : "memory")
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
/* the 128-byte line at p into the L2 (no register, no wait) */
#define PREFETCH_L2(p) asm volatile("prefetch.global.L2 [%0];" :: "l"((ulong)(size_t)(p)))
#define CP_WAIT() asm volatile("cp.async.wait_group %0;" :: "n"(STAGES - 2) : "memory")
/* cp.async writes through the generic proxy, wgmma reads through the async one */
#define PROXY_FENCE() asm volatile("fence.proxy.async.shared::cta;" ::: "memory")
#define STR_(x) #x
#define STR(x) STR_(x)
#ifdef TF32
#define WG_INSN "wgmma.mma_async.sync.aligned.m64n" STR(NT) "k8.f32.tf32.tf32 "
#define WG_TAIL ", p, 1, 1; "              /* scale-d, scale-a, scale-b: no transposes for tf32 */
#else
#define WG_INSN "wgmma.mma_async.sync.aligned.m64n" STR(NT) "k16.f32.f16.f16 "
#define WG_TAIL ", p, 1, 1, 0, " B_TRANS "; "   /* ... and A, B transposed */
#endif
/* The accumulators as operands 0 .. NT/2 - 1 (WG_R<c>: their numbers, 16 a macro), then da[0..3] and
 * db[0..3] (WG_AB<j>: step j's). */
#define WG_R0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_R1 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_R2 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define WG_R3 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_R4 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define WG_R5 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_R6 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define WG_R7 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_ACC8(i) "+f"(acc[(i)]), "+f"(acc[(i) + 1]), "+f"(acc[(i) + 2]), "+f"(acc[(i) + 3]),      \
                   "+f"(acc[(i) + 4]), "+f"(acc[(i) + 5]), "+f"(acc[(i) + 6]), "+f"(acc[(i) + 7])
#define WG_ACC32(i) WG_ACC8(i), WG_ACC8((i) + 8), WG_ACC8((i) + 16), WG_ACC8((i) + 24)
#if NT == 64
#define WG_D "{" WG_R0 ", " WG_R1 "}"
#define WG_ACC WG_ACC32(0)
#define WG_AB0 ", %32, %36" WG_TAIL
#define WG_AB1 ", %33, %37" WG_TAIL
#define WG_AB2 ", %34, %38" WG_TAIL
#define WG_AB3 ", %35, %39" WG_TAIL
#elif NT == 128
#define WG_D "{" WG_R0 ", " WG_R1 ", " WG_R2 ", " WG_R3 "}"
#define WG_ACC WG_ACC32(0), WG_ACC32(32)
#define WG_AB0 ", %64, %68" WG_TAIL
#define WG_AB1 ", %65, %69" WG_TAIL
#define WG_AB2 ", %66, %70" WG_TAIL
#define WG_AB3 ", %67, %71" WG_TAIL
#else
#define WG_D "{" WG_R0 ", " WG_R1 ", " WG_R2 ", " WG_R3 ", " WG_R4 ", " WG_R5 ", " WG_R6 ", " WG_R7 "}"
#define WG_ACC WG_ACC32(0), WG_ACC32(32), WG_ACC32(64), WG_ACC32(96)
#define WG_AB0 ", %128, %132" WG_TAIL
#define WG_AB1 ", %129, %133" WG_TAIL
#define WG_AB2 ", %130, %134" WG_TAIL
#define WG_AB3 ", %131, %135" WG_TAIL
#endif
#define WG_ONE(j) WG_INSN WG_D WG_AB##j
#if KSTEPS == 1
#define WG_ALL WG_ONE(0)
#elif KSTEPS == 2
#define WG_ALL WG_ONE(0) WG_ONE(1)
#else
#define WG_ALL WG_ONE(0) WG_ONE(1) WG_ONE(2) WG_ONE(3)
#endif
/* One stage's wgmmas as one statement (the scale-d predicate p is 1: accumulate). */
#define WGMMA_STAGE()                                                                            \
    asm volatile("// YC_PTX { .reg .pred p; setp.ne.b32 p, 1, 0; " WG_ALL "}"                    \
                 : WG_ACC : "l"(da[0]), "l"(da[1]), "l"(da[2]), "l"(da[3]),                      \
                   "l"(db[0]), "l"(db[1]), "l"(db[2]), "l"(db[3]) : "memory")
#ifdef A_REG
/* A from registers: one m64nNTk16 per k-step j, its A fragment ar[j] (four registers of two halves:
 * rows g and g + 8 of the warp's 16, k 2t, 2t + 1 and 2t + 8, 2t + 9; with TF32 one m64nNTk8, four
 * floats: rows g and g + 8 at k t, then at k t + 4), B by descriptor db[j]. */
#if NT > 128 || INFLIGHT
#error "A_REG: NT 64 or 128, each stage's wgmma waited for (its A registers are refilled)"
#endif
#ifdef TF32
#define WGR_TAIL ", p, 1, 1; "
#else
#define WGR_TAIL ", p, 1, 1, " B_TRANS "; "
#endif
#if NT == 64
#define WGR_AB0 ", {%32, %33, %34, %35}, %48" WGR_TAIL
#define WGR_AB1 ", {%36, %37, %38, %39}, %49" WGR_TAIL
#define WGR_AB2 ", {%40, %41, %42, %43}, %50" WGR_TAIL
#define WGR_AB3 ", {%44, %45, %46, %47}, %51" WGR_TAIL
#else
#define WGR_AB0 ", {%64, %65, %66, %67}, %80" WGR_TAIL
#define WGR_AB1 ", {%68, %69, %70, %71}, %81" WGR_TAIL
#define WGR_AB2 ", {%72, %73, %74, %75}, %82" WGR_TAIL
#define WGR_AB3 ", {%76, %77, %78, %79}, %83" WGR_TAIL
#endif
#define WGR_ONE(j) WG_INSN WG_D WGR_AB##j
#if KSTEPS == 1
#define WGR_ALL WGR_ONE(0)
#elif KSTEPS == 2
#define WGR_ALL WGR_ONE(0) WGR_ONE(1)
#else
#define WGR_ALL WGR_ONE(0) WGR_ONE(1) WGR_ONE(2) WGR_ONE(3)
#endif
#define AR4(j) "r"(ar[j].x), "r"(ar[j].y), "r"(ar[j].z), "r"(ar[j].w)
#undef WGMMA_STAGE
#define WGMMA_STAGE()                                                                            \
    asm volatile("// YC_PTX { .reg .pred p; setp.ne.b32 p, 1, 0; " WGR_ALL "}"                   \
                 : WG_ACC : AR4(0), AR4(1), AR4(2), AR4(3),                                      \
                   "l"(db[0]), "l"(db[1]), "l"(db[2]), "l"(db[3]) : "memory")
#endif
#define WG_FENCE() asm volatile("// YC_PTX wgmma.fence.sync.aligned;" ::: "memory")
#define WG_WAIT_ALL() asm volatile("// YC_PTX wgmma.wait_group.sync.aligned 0;" ::: "memory")
#define WG_COMMIT_WAIT(n)                                                                        \
    asm volatile("// YC_PTX wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned " #n ";" ::: "memory")
#endif

#if defined(A_REG) && defined(WGMMA_EMULATE)
/* The emulated wgmma reads A from the stage's A tile: each work-item writes its fragments there
 * (ar[j].x: rows g, k 2t and 2t + 1; .y rows g + 8; .z and .w the same at k + 8; with TF32 one
 * float each: rows g, g + 8 at k t, then at k t + 4), then a barrier.
 * PATCH has one A tile for every tap: the previous tap's reads of it must be done first. */
#ifdef PATCH
#define A_TILE_FREE() barrier(CLK_LOCAL_MEM_FENCE)
#else
#define A_TILE_FREE()
#endif
#ifdef TF32
#define A_FRAGMENT_STORE(j, v, q)                                                                \
    *(__local uint*)(smem_b + yc_operand_at(da[j], 16 * w + g + 8 * (q & 1), t + 4 * (q >> 1))) = v[q];
#else
#define A_FRAGMENT_STORE(j, v, q)                                                                \
    for (int h = 0; h < 2; ++h)                                                                  \
        *(__local ushort*)(smem_b + yc_operand_at(da[j], 16 * w + g + 8 * (q & 1), 2 * t + h + 8 * (q >> 1))) \
            = (ushort)(v[q] >> (16 * h));
#endif
#define A_FRAGMENTS_TO_LOCAL()                                                                   \
    {                                                                                            \
        A_TILE_FREE();                                                                           \
        const int w = wtid >> 5, g = (tid & 31) >> 2, t = tid & 3;                               \
        for (int j = 0; j < KSTEPS; ++j) {                                                       \
            const uint v[4] = {ar[j].x, ar[j].y, ar[j].z, ar[j].w};                              \
            for (int q = 0; q < 4; ++q) { A_FRAGMENT_STORE(j, v, q) }                            \
        }                                                                                        \
        barrier(CLK_LOCAL_MEM_FENCE);                                                            \
    }
#else
#define A_FRAGMENTS_TO_LOCAL()
#endif

/* Stage s <- k-tile kt of A's and B's tiles, each work-item copying 16-byte chunks (zeros past
 * K or N): A's (and a k-contiguous B's) rows of KT; with B_KN, B's KT rows of NT, chunk c8 of
 * k-row k to its atom, by cp.async or, with B_SCALAR (B's offsets or N not multiples of 8
 * halves), element by element through registers; with IMPLICIT (and B_KN) B is the conv's
 * input and each element is gathered from its (c, ky, kx) and output pixel, as im2col would. */
#ifdef B_KN
#if defined(IMPLICIT)
/* B[k][n] of the conv's im2col matrix, gathered from its input (0 in the padding and past K, N):
 * k = (c, ky, kx), n = output pixel (x, y) of OW a row. */
inline ushort yc_im2col(const __global ushort* Bg, const int k, const int n, const int K, const int N,
                        const int H, const int W, const int OW)
{
    if (k >= K || n >= N) return 0;
    const int c = k / (KS * KS), r = k - c * (KS * KS), ky = r / KS, kx = r - ky * KS;
    const int oy = n / OW, ox = n - oy * OW;
    const int iy = oy * SY - PAD + ky * DIL, ix = ox * SX - PAD + kx * DIL;
    return (iy >= 0 && iy < H && ix >= 0 && ix < W) ? Bg[((size_t)c * H + iy) * W + ix] : (ushort)0;
}
#define B_CHUNK(dst, k, n)                                                                       \
    {                                                                                            \
        ushort h[8];                                                                             \
        for (int e = 0; e < 8; ++e) h[e] = yc_im2col(Bg, (k), (n) + e, K, N, H, W, OW);          \
        *(__local uint4*)(smem_b + (dst)) = (uint4)(h[0] | ((uint)h[1] << 16), h[2] | ((uint)h[3] << 16), \
                                                    h[4] | ((uint)h[5] << 16), h[6] | ((uint)h[7] << 16)); \
    }
#elif defined(B_SCALAR)
#define B_CHUNK(dst, k, n)                                                                       \
    {                                                                                            \
        ushort h[8];                                                                             \
        for (int e = 0; e < 8; ++e)                                                              \
            h[e] = ((k) < K && (n) + e < N) ? Bg[(size_t)(k) * ldb + (n) + e] : (ushort)0;       \
        *(__local uint4*)(smem_b + (dst)) = (uint4)(h[0] | ((uint)h[1] << 16), h[2] | ((uint)h[3] << 16), \
                                                    h[4] | ((uint)h[5] << 16), h[6] | ((uint)h[7] << 16)); \
    }
#else
#define B_CHUNK(dst, k, n)                                                                       \
    {                                                                                            \
        const bool ok = (k) < K && (n) < N;                                                      \
        CP_ASYNC16(dst, ok ? Bg + (size_t)(k) * ldb + (n) : Bg, ok);                             \
    }
#endif
#define LOAD_B(s, kt, q)                                                                         \
    {                                                                                            \
        const int k = (q) / (NT / 8), c8 = (q) - k * (NT / 8), na = c8 / (NA / 8);               \
        B_CHUNK((s) * STAGE + AROWS * SWZ + (na * (KT / 8) + (k >> 3)) * 8 * SWZ                    \
                + CHUNK_AT(k & 7, c8 - na * (NA / 8)), (kt) * KT + k, n0 + 8 * c8)               \
    }
#else
#define LOAD_B(s, kt, q)                                                                         \
    {                                                                                            \
        const int r = (q) / CHUNKS, c = (q) - r * CHUNKS, k = (kt) * KT + c * EPC;               \
        const bool ok = n0 + r < N && k < K;                                                     \
        CP_ASYNC16((s) * STAGE + CHUNK_AT(AROWS + r, c), ok ? Bg + (size_t)(n0 + r) * ldb + k : Bg, ok); \
    }
#endif
#ifdef NHWC
/* B[n][k] = the input's [H][W][C] element (iy, ix, c) under output pixel n for k = (ky, kx, c):
 * chunk column c8 of a k-tile is the same for every B chunk a work-item copies (THREADS is a
 * multiple of CHUNKS), so each work-item keeps its rows' window corners (iy0, ix0; far outside
 * the input for rows past N) and walks its k's (ky, kx, c) forward one tile at a time, the tiles
 * being staged in order, instead of dividing per chunk. */
#define BROWS ((NT * CHUNKS + THREADS - 1) / THREADS)     /* B chunks a work-item copies a stage */
#define NHWC_NEXT_TAP()                                                                          \
    while (cc >= cin) { cc -= cin; if (++kx == KS) { kx = 0; ++ky; } }
#define NHWC_START()                                                                             \
    const int cin = K / (KS * KS), kfirst = kt0 * KT + (tid % CHUNKS) * EPC, tap0 = kfirst / cin; \
    int cc = kfirst - tap0 * cin, ky = tap0 / KS, kx = tap0 - ky * KS, iy0[BROWS], ix0[BROWS];   \
    for (int i = 0; i < BROWS; ++i) {                                                            \
        const int n = n0 + (tid + i * THREADS) / CHUNKS, oy = n / OW, ox = n - oy * OW;          \
        iy0[i] = n < N ? oy * SY - PAD : -(1 << 28);                                             \
        ix0[i] = ox * SX - PAD;                                                                  \
    }
#define LOAD_STAGE(s, kt)                                                                        \
    for (int q = tid; q < ACOPY * CHUNKS; q += THREADS) {                                        \
        const int r = q / CHUNKS, c = q - r * CHUNKS;                                            \
        CP_ASYNC16((s) * STAGE + CHUNK_AT(r, c), Ag + (size_t)r * lda + (kt) * KT + c * EPC, true); \
    }                                                                                            \
    for (int i = 0; i < BROWS; ++i) {                                                            \
        const int q = tid + i * THREADS, iy = iy0[i] + ky * DIL, ix = ix0[i] + kx * DIL;         \
        const bool ok = ky < KS && iy >= 0 && iy < H && ix >= 0 && ix < W;                       \
        if (q < NT * CHUNKS)                                                                     \
            CP_ASYNC16((s) * STAGE + CHUNK_AT(AROWS + q / CHUNKS, q % CHUNKS),                      \
                       ok ? Bg + ((size_t)iy * W + ix) * cin + cc : Bg, ok);                     \
    }                                                                                            \
    CP_COMMIT();                                                                                 \
    cc += KT;                                                                                    \
    NHWC_NEXT_TAP()
#else
#define NHWC_START()
#define LOAD_STAGE(s, kt)                                                                        \
    for (int q = tid; q < (ACOPY + NT) * CHUNKS; q += THREADS) {                                 \
        if (q < ACOPY * CHUNKS) {                                                                \
            const int r = q / CHUNKS, c = q - r * CHUNKS;                                        \
            CP_ASYNC16((s) * STAGE + CHUNK_AT(r, c), Ag + (size_t)r * lda + (kt) * KT + c * EPC, true); \
        } else                                                                                   \
            LOAD_B(s, kt, q - ACOPY * CHUNKS)                                                    \
    }                                                                                            \
    CP_COMMIT();
#endif

/* Where a work-item's sums go (split ks of image b): with SK > 1 its split's raw float sums to P =
 * (float*)C as [SK][images][M][N] (gemm_local.cl's yc_gemm_splitk adds them and runs the
 * epilogue), else through the shared epilogue. */
#if SK > 1
#define SUMS_SETUP() __global float* P = (__global float*)C + ((size_t)ks * (get_num_groups(2) / SK) + b) * M * N;
#define STORE_C(v, m, n) (P[(size_t)(m) * N + (n)] = (v))
#else
#define SUMS_SETUP() YC_EPILOGUE_BASES(b)
#define STORE_C(v, m, n) yc_gemm_store((v), (m), (n), 0, M, ldc, bias, C, cb, R, rbase)
#endif

#ifndef APREFETCH
#define APREFETCH 0
#endif
/* COUNT lines into the L2, shared out among the work-groups of this M tile (no two prefetch one
 * line): line v's address is ADDR, an expression of v */
#define PREFETCH_SPREAD(COUNT, ADDR)                                                             \
    for (int v = (int)get_group_id(0) * THREADS + tid; v < (COUNT); v += (int)get_num_groups(0) * THREADS) \
        PREFETCH_L2(ADDR);

#ifdef PATCH
#if !defined(NHWC) || !defined(A_REG) || SWZ != 128 || INFLIGHT || KS != 3
#error "PATCH: an nhwc 3x3 conv, A in registers, the 128-byte swizzle"
#endif
#ifdef PFLAT
/* PFLAT (config PT 2): a tile is NT consecutive pixels p0 .. of the output on a grid of PW = W + 2
 * columns (the last two of each row computed, never stored), and patch line l the input pixel
 * ((p0 + l) / PW - 1, (p0 + l) % PW - 1): output p's tap (ky, kx) is line p - p0 + ky * PW + kx,
 * so each tap's B rows are one run of lines (no tile of 8 columns wasting a ragged map's edge) */
#define PLINES (NT + (KS - 1) * PW + KS - 1)
#else
#define TH (NT / 8)                    /* output rows of a tile, 8 pixels each */
#define PC (8 + KS - 1)                /* patch columns */
#define PLINES ((TH + KS - 1) * PC)    /* patch pixels: lines of SWZ bytes (a slice of KT channels) */
#endif
#define PSTAGE ((PLINES * SWZ + 1023) / 1024 * 1024)     /* a stage, whole swizzle periods */
#ifdef WGMMA_EMULATE
#define PATCH_A (STAGES * PSTAGE)      /* the emulated wgmma reads A from a tile after the stages */
#define SMEM_BYTES (STAGES * PSTAGE + MT * SWZ)
#else
#define PATCH_A 0
#define SMEM_BYTES (STAGES * PSTAGE)
#endif

/* Stage slot <- the input patch of channel slice sl under this tile (zeros outside the input):
 * patch pixel l = (row, column) at line l (PFLAT: grid pixel p0 + l, i.e. input pixel (row - 1,
 * column - 1) of the padded grid), its 16-byte chunks swizzled by the line. */
#ifdef PFLAT
#define PATCH_PIXEL(l, iy, ix)                                                                   \
    const int gp_ = p0 + (l), gy_ = gp_ / PW, iy = gy_ - PAD, ix = gp_ - gy_ * PW - PAD;
#else
#define PATCH_PIXEL(l, iy, ix)                                                                   \
    const int pr_ = (l) / PC, iy = y0 - PAD + pr_, ix = x0 - PAD + (l) - pr_ * PC;
#endif
#define PATCH_LOAD(slot, sl)                                                                     \
    for (int q = tid; q < PLINES * CHUNKS; q += THREADS) {                                       \
        const int l = q / CHUNKS, c = q - l * CHUNKS;                                            \
        PATCH_PIXEL(l, iy, ix)                                                                   \
        const bool ok = iy >= 0 && iy < H && ix >= 0 && ix < W;                                  \
        CP_ASYNC16((slot) * PSTAGE + CHUNK_AT(l, c),                                             \
                   ok ? Bg + ((size_t)iy * W + ix) * cin + (sl) * KT + c * EPC : Bg, ok);        \
    }                                                                                            \
    CP_COMMIT();

/* With APREFETCH (config key AP), slice sl's A fragments (every tap's) into the L2, one line per 8
 * work-items, a slice ahead: a tap's wgmmas take less time than a fragment's load from memory, and
 * a network's weights do not stay in the L2 from one frame to the next. Where a conv has few tiles
 * that pays (yolov3 416 fp16's c256 f512 3x3 at 26x26 in the network on an H200: 0.030 -> 0.025
 * ms); where it has many, the tiles' redundant prefetches cost more (608 batch 8's at 38x38: 0.100
 * -> 0.115 ms). A tuner timing a conv alone, its weights warm in the L2, cannot see the gain. */
#define PATCH_PREFETCH_A(sl)                                                                     \
    if (APREFETCH == 1 && (tid & 7) == 0)                                                        \
        for (int t = 0; t < taps; ++t)                                                           \
            for (int j = 0; j < KSTEPS; ++j)                                                     \
                PREFETCH_L2(Af + (size_t)((t * slices + (sl)) * KSTEPS + j) * THREADS);
/* With APREFETCH 2, every slice's A fragments of this split at the start instead, the lines shared
 * out among the work-groups of the M tile (no tile prefetches a line another does): in the network
 * on an H200, 416's patch convs at 52x52 0.020 -> 0.017 ms and 26x26 0.025 -> 0.023 (against 1),
 * 608 batch 8's at 38x38 0.101 -> 0.096 (against none; 1 had cost it 0.015). */
#define PATCH_PREFETCH_ALL()                                                                     \
    if (APREFETCH == 2) {                                                                        \
        const int per_tap = (s1 - s0) * KSTEPS * THREADS / 8;     /* lines of 8 fragments */     \
        const __global uint4* a0 = (const __global uint4*)A + (size_t)get_group_id(1) * (lda / KSTEP) * THREADS; \
        PREFETCH_SPREAD(taps * per_tap,                                                          \
                        a0 + (size_t)((v / per_tap) * slices + s0) * KSTEPS * THREADS + (size_t)(v % per_tap) * 8) \
    }

/* Grid: (tiles of NT / 8 rows x 8 columns of the output, row-major, x THREADS, M tiles, images);
 * the output is H x OW (pad (KS - 1) / 2). Slices of the input's channels are staged STAGES - 1
 * ahead, each tap's A fragments (k-tile tap * slices + slice of the (ky, kx, c) order) one tap ahead.
 * With SK > 1 (grid z: images x SK) split ks takes slices [ks * per, ks * per + per) and stores its
 * raw sums to P as the other splits do. */
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void yc_gemm_wgmma(YC_GEMM_PARAMS)
{
    __local uint4 smem[SMEM_BYTES / 16] __attribute__((aligned(1024)));
    __local uchar* smem_b = (__local uchar*)smem;
    const uint base = SMEM_BASE(smem);
    const int tid = get_local_id(0), wg = tid >> 7, wtid = tid & 127;
#ifdef PFLAT
    const int p0 = get_group_id(0) * NT, m0 = get_group_id(1) * MT;
#else
    const int tiles_x = (OW + 7) / 8, ty = get_group_id(0) / tiles_x, tx = get_group_id(0) - ty * tiles_x;
    const int y0 = ty * TH, x0 = tx * 8, m0 = get_group_id(1) * MT;
#endif
    const int b = get_group_id(2) / SK, ks = get_group_id(2) - b * SK;
    const int cin = K / (KS * KS), slices = cin / KT, taps = KS * KS;
    const int per = (slices + SK - 1) / SK, s0 = ks * per, s1 = min(slices, s0 + per);
    const int lda = (K + KPAD - 1) / KPAD * KPAD;
    const __global yc_elem* Bg = (const __global yc_elem*)B + b_off + (size_t)b * b_bstride;
    const __global uint4* Af = (const __global uint4*)A + (size_t)get_group_id(1) * (lda / KSTEP) * THREADS + tid;
    float acc[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
    uint4 ar[4], an[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) ar[j] = an[j] = (uint4)(0u);
#pragma unroll
    for (int j = 0; j < KSTEPS; ++j) ar[j] = Af[(size_t)(s0 * KSTEPS + j) * THREADS];    /* tap 0 of slice s0 */
    ulong da[4] = {0, 0, 0, 0};
#pragma unroll
    for (int j = 0; j < KSTEPS; ++j) da[j] = yc_desc(base + (uint)(PATCH_A + wg * 64 * SWZ + 32 * j), 16);
    PATCH_PREFETCH_A(s0)
    PATCH_PREFETCH_ALL()
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s0 + s < s1) { PATCH_LOAD(s, s0 + s) } else { CP_COMMIT(); }
    }
    for (int s = s0; s < s1; ++s) {
        if (s + 1 < s1) { PATCH_PREFETCH_A(s + 1) }
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        PROXY_FENCE();
        /* the slot refilled is slice s - 1's, whose taps every warpgroup finished before the barrier */
        const int next = s + STAGES - 1;
        if (next < s1) { PATCH_LOAD((next - s0) % STAGES, next) } else { CP_COMMIT(); }
        const uint sb = base + (uint)(((s - s0) % STAGES) * PSTAGE);
        for (int t = 0; t < taps; ++t) {
            const int ky = t / KS, kx = t - ky * KS;
            const int tn = t + 1 < taps ? t + 1 : 0, sn = t + 1 < taps ? s : s + 1;
            if (sn < s1) {
#pragma unroll
                for (int j = 0; j < KSTEPS; ++j) an[j] = Af[(size_t)((tn * slices + sn) * KSTEPS + j) * THREADS];
            }
            ulong db[4] = {0, 0, 0, 0};
#pragma unroll
            for (int j = 0; j < KSTEPS; ++j)
#ifdef PFLAT
                db[j] = yc_desc(sb + (uint)((ky * PW + kx) * SWZ + 32 * j), 16);    /* one run of lines */
#else
                db[j] = yc_desc_sbo(sb + (uint)((ky * PC + kx) * SWZ + 32 * j), 16, PC * SWZ);
#endif
            A_FRAGMENTS_TO_LOCAL();
            WG_FENCE();
            WGMMA_STAGE();
            WG_COMMIT_WAIT(0);
#pragma unroll
            for (int j = 0; j < KSTEPS; ++j) ar[j] = an[j];
        }
    }
    SUMS_SETUP()
    const int w = wtid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < NT / 8; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
#ifdef PFLAT
            const int p = p0 + 8 * i + 2 * t4 + (q & 1), y = p / PW, x = p - y * PW;
#else
            const int x = x0 + 2 * t4 + (q & 1), y = y0 + i;
#endif
            const int m = m0 + wg * 64 + 16 * w + g + 8 * (q >> 1);
            if (m < M && y < H && x < OW)
                STORE_C(acc[4 * i + q], m, y * OW + x);
        }
}
#else
/* With APREFETCH (config key AP) and no patch: at the start, this work-group's A over its k-tiles
 * into the L2, the lines shared out among the work-groups of its M tile (a network's weights are
 * cold: each stage would otherwise wait for its A from memory where K is long and tiles few). */
#if APREFETCH && defined(A_REG)
#define GEMM_PREFETCH_A()                                                                        \
    {                                                                                            \
        const __global uchar* p0 = (const __global uchar*)((const __global uint4*)A              \
            + ((size_t)get_group_id(1) * (lda / KSTEP) + (size_t)kt0 * KSTEPS) * THREADS);       \
        PREFETCH_SPREAD(tiles * KSTEPS * THREADS / 8, p0 + (size_t)v * 128)  /* 8 fragments a line */ \
    }
#elif APREFETCH
#define GEMM_PREFETCH_A()                                                                        \
    {                                                                                            \
        const int lines = (tiles * KT * ES + 127) / 128;                                          \
        PREFETCH_SPREAD(MT * lines,                                                              \
                        (const __global uchar*)(Ag + (size_t)(v / lines) * lda + (size_t)kt0 * KT) + (v % lines) * 128) \
    }
#else
#define GEMM_PREFETCH_A()
#endif

/* The GEMM families' arguments (cl/common.h): A the packed weights [Mp][Kp] (engine/kernels/
 * gemm_mma.pack_weights: rows padded to MPAD, k to KPAD with zeros), B at b_off + b * b_bstride,
 * C and R as gemm_epilogue.h stores them; G is 1. Grid: (N tiles x THREADS, M tiles, images). */
__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void yc_gemm_wgmma(YC_GEMM_PARAMS)
{
    __local uint4 smem[STAGES * STAGE / 16] __attribute__((aligned(1024)));   /* the swizzle's period */
    __local uchar* smem_b = (__local uchar*)smem;
    const uint base = SMEM_BASE(smem);
    const int tid = get_local_id(0), wg = tid >> 7, wtid = tid & 127;
    const int m0 = get_group_id(1) * MT, n0 = get_group_id(0) * NT;
    const int b = get_group_id(2) / SK, ks = get_group_id(2) - b * SK;
    /* this work-group's k-tiles [kt0, kt0 + tiles): all of them, or one split's */
    const int per = ((K + SK - 1) / SK + KT - 1) / KT, kt0 = ks * per;
    const int tiles = min((K + KT - 1) / KT, kt0 + per) - kt0;
    const int lda = (K + KPAD - 1) / KPAD * KPAD;
    const __global yc_elem* Ag = (const __global yc_elem*)A + (size_t)m0 * lda;
    const __global yc_elem* Bg = (const __global yc_elem*)B + b_off + (size_t)b * b_bstride;
    float acc[NT / 2];
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) acc[i] = 0.0f;
    GEMM_PREFETCH_A()
#ifdef A_REG
    /* A packed as [m-tile][k-step][THREADS] fragments (gemm_wgmma.pack_fragments): a k-step's are
     * THREADS consecutive 16-byte loads; each tile's are loaded one tile ahead */
    const __global uint4* Af = (const __global uint4*)A + (size_t)get_group_id(1) * (lda / KSTEP) * THREADS + tid;
    uint4 ar[4], an[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) ar[j] = an[j] = (uint4)(0u);
#pragma unroll
    for (int j = 0; j < KSTEPS; ++j) ar[j] = Af[(size_t)(kt0 * KSTEPS + j) * THREADS];
#endif
    NHWC_START()
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles) { LOAD_STAGE(s, kt0 + s) } else { CP_COMMIT(); }
    }
    for (int kt = 0; kt < tiles; ++kt) {
        CP_WAIT();
        barrier(CLK_LOCAL_MEM_FENCE);
        PROXY_FENCE();
        const uint sb = base + (uint)((kt % STAGES) * STAGE);
        ulong da[4] = {0, 0, 0, 0}, db[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < KSTEPS; ++j) {
            da[j] = yc_desc(sb + (uint)(wg * 64 * SWZ + 32 * j), 16);
#ifdef B_KN
            db[j] = yc_desc(sb + (uint)(AROWS * SWZ + 2 * j * 8 * SWZ), B_LBO);   /* k-groups 2j, 2j + 1 */
#else
            db[j] = yc_desc(sb + (uint)(AROWS * SWZ + 32 * j), B_LBO);
#endif
        }
        const int next = kt + STAGES - 1;
#ifdef A_REG
        if (kt + 1 < tiles) {
#pragma unroll
            for (int j = 0; j < KSTEPS; ++j) an[j] = Af[(size_t)((kt0 + kt + 1) * KSTEPS + j) * THREADS];
        }
#endif
#if INFLIGHT
        WG_FENCE();
        WGMMA_STAGE();
        WG_COMMIT_WAIT(1);      /* the last stage's wgmma done: its slot is the one refilled below */
        if (next < tiles) { LOAD_STAGE(next % STAGES, kt0 + next) } else { CP_COMMIT(); }
#else
        /* the slot refilled is the last stage's, whose wgmma every warpgroup finished before this
         * stage's barrier: staged first, its copies run beside this stage's wgmma (with two
         * stages, staging after the wgmma left the copies and the tensor cores taking turns) */
        if (next < tiles) { LOAD_STAGE(next % STAGES, kt0 + next) } else { CP_COMMIT(); }
        A_FRAGMENTS_TO_LOCAL();
        WG_FENCE();
        WGMMA_STAGE();
        WG_COMMIT_WAIT(0);
#endif
#ifdef A_REG
#pragma unroll
        for (int j = 0; j < KSTEPS; ++j) ar[j] = an[j];
#endif
    }
#if INFLIGHT
    WG_WAIT_ALL();              /* the last stage's wgmma, before its sums are read */
#endif
    SUMS_SETUP()
    const int w = wtid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < NT / 8; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int m = m0 + wg * 64 + 16 * w + g + 8 * (q >> 1), n = n0 + 8 * i + 2 * t + (q & 1);
            if (m < M && n < N)
                STORE_C(acc[4 * i + q], m, n);
        }
}
#endif
