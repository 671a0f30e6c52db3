/* C[m][n] = epilogue(sum_k A[m][k] * B[k][n]) on NVIDIA tensor cores: mma.sync through inline PTX.
 *
 * Same role, arguments and epilogue as yc_gemm_local (cl/gemm_local.cl), so the conv binding is
 * shared; only A's layout differs:
 *   A  weights packed once at load time as [G][Mp][Kp], ROW-major (k contiguous), zero-padded to
 *      Mp = M rounded up to MPAD and Kp = K rounded up to KPAD: half for MMA_F16, float rounded
 *      to TF32 for MMA_TF32. Every A tile is in bounds and read as 16-byte vectors;
 *   B  (k, n) at b_off + b*b_bstride + g*b_gstride + k*ldb + n, or with IMPLICIT the conv input
 *      (im2col gathered on the fly); staged TRANSPOSED into local memory ([n][k]), which is the
 *      "col" operand layout mma wants;
 *   C, R  (m, n) at off + b*bstride + (g*M + m)*ldc + n (a conv can write into a concat slice).
 *
 * Precision (one of):
 *   MMA_F16    mma.sync.m16n8k16.row.col.f32.f16.f16.f32: half inputs (needs HALF_STORAGE),
 *              float accumulation
 *   MMA_TF32   mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32: float storage, inputs rounded to
 *              TF32 (10-bit mantissa, round to nearest, ties away: PTX cvt.rna) when staged
 * Both instructions take the same register shapes: A 4 x 32-bit, B 2 x 32-bit, C/D 4 floats,
 * and 8 32-bit words of K per instruction (16 halves or 8 tf32). Local tiles are kept in 32-bit
 * words ("k-words"), so one fragment loader serves both.
 *
 * Tiling (the tuner's space; engine/kernels/gemm_mma.py enumerates legal sets):
 *   MWG NWG KWG    work-group tile of C and the k-slice staged per iteration
 *   WM WN          warps per work-group along M and N: each warp owns a (MWG/WM) x (NWG/WN) tile
 *                  of m16n8 fragments
 *   SK             split K over SK work-groups per tile (more work-groups where M x N gives few);
 *                  each writes raw partial sums as [SK][Z][M][N] planes; with SK_FIX (trailing args
 *                  P, counters) into P, and the last work-group of each tile adds them and runs the
 *                  epilogue; without, into C's buffer, for gemm_local.cl's yc_gemm_splitk
 *   CHECK_M CHECK_N CHECK_K  bounds checks, emitted only where the tile does not divide
 *   IMPLICIT KS SX SY PAD DIL  B gathered from the NCHW input (trailing args H, W, OW)
 *   STAGES         (config key "ST") local-memory stages. 1: one A/B buffer, the next tile
 *                  prefetched into registers, two barriers per k-step, B staged transposed ([n][k-word]). 2..4: a ring of STAGES
 *                  buffers, one barrier per k-step; A (and B with BVEC) copied global -> local by
 *                  cp.async STAGES-1 tiles ahead, B otherwise through registers one tile ahead; B kept
 *                  [k][n] (n contiguous, rows padded by 8 elements: conflict-free stores and
 *                  ldmatrix.trans rows), its f16 fragments read with ldmatrix.x4.trans
 *   BVEC           (STAGES > 1, not IMPLICIT; needs N and every B offset/stride a multiple of the
 *                  elements of 16 bytes: 8 halves, 4 floats) B rows copied as 16-byte chunks by
 *                  cp.async too; TF32 B then reaches local memory as plain floats, rounded to TF32
 *                  as its fragments are loaded (the same values the register path stages)
 *   B_SHIFT        (config key "BS"; STAGES > 1, not IMPLICIT, where BVEC cannot: N or B's offsets not
 *                  multiples of a chunk, as a 13x13 map's 169-pixel planes) each B row copied as the
 *                  aligned 16-byte chunks that cover its NWG columns, by cp.async with A (STAGES-1
 *                  tiles ahead, not through registers one tile ahead): a row lands shifted by its
 *                  misalignment (its first column's element index within a chunk), its fragments
 *                  read with scalar local loads at that shift; bytes past N, and rows past K, zeroed
 *   GATHER         (config key "GA"; STAGES > 1 and IMPLICIT) how the im2col B tile is gathered:
 *                  0  element by element, each finding its (c, ky, kx) and pixel by division;
 *                  1  the same coalesced element order, the tile's per-k offsets (c, ky, kx) computed
 *                     once per k-tile into a small local table (double-buffered: built one tile
 *                     ahead of its use, so the main loop's barrier orders it) and each column's
 *                     window found once per work-group;
 *                  2  (f16) runs of 8 neighbouring columns per work-item: (c, ky, kx) once per run,
 *                     each column's window once per work-group, a run inside one output row read
 *                     from one row offset (stride 1), and stored as one 16-byte local write;
 *                  3  as 2, a run inside one row read as the two aligned 16-byte blocks that cover
 *                     it and shifted into place (needs B's offset and strides multiples of 8: a
 *                     block that holds an element of the row is read whole, within the row's
 *                     tensor up to the 16-byte granule of its last element);
 *                  4  (tf32) element by element as 0, each float copied global -> local by its own
 *                     4-byte cp.async (zero-filled outside the image) STAGES-1 tiles ahead with A,
 *                     not through registers, and rounded to TF32 as fragments are loaded
 *   LDSM           load fragments with ldmatrix (1) or scalar local loads (0; always under MMA_EMULATE)
 *   POOL2 POOL_PIX (IMPLICIT, SK 1, warp tiles of whole 16-column blocks; the host checks) the conv
 *                  writes through the 2x2 stride-2 [maxpool] that reads it: C is the pooled output
 *                  (ldc its plane of POOL_PIX pixels). Columns then come in blocks of 16 (yc_pixel):
 *                  block b, column 8dy + 2t + e is pixel (2px + e, 2py + dy) of pooled pixel 4b + t,
 *                  so the work-item holding columns 2t, 2t + 1 of a fragment pair holds a whole
 *                  window and stores its max (after bias and ACT, as the pool layer sees them). N is
 *                  whole blocks: columns of pooled pixels past POOL_PIX compute nothing stored
 *   POOL_KEEP      (POOL2) the conv's own output is read elsewhere too: also stored, through the
 *                  trailing args C2, c2_off, c2_bstride
 *   UP_S UP_OW     (gemm_epilogue.h) the conv writes through the [upsample] that alone reads it
 *   MMA_EMULATE    compute each mma in plain OpenCL C with the PTX fragment layout, the lanes'
 *                  registers exchanged through local memory (CI on PoCL, which has no PTX); a
 *                  "warp" is then 32 consecutive work-items of the work-group
 */
#include "common.h"
#include "gemm_epilogue.h"

#ifndef MWG
#define MWG 64
#endif
#ifndef NWG
#define NWG 64
#endif
#ifndef KWG
#define KWG 32
#endif
#ifndef WM
#define WM 2
#endif
#ifndef WN
#define WN 2
#endif
#ifndef MPAD
#define MPAD 256
#endif
#ifndef KPAD
#define KPAD 64
#endif
#ifndef SK
#define SK 1
#endif
#ifndef STAGES
#define STAGES 1
#endif
#if STAGES > 4
#error "STAGES is 1 to 4"
#endif
#if defined(BVEC) && (STAGES == 1 || defined(IMPLICIT))
#error "BVEC needs STAGES > 1 and an explicit B"
#endif
#if defined(B_SHIFT) && (STAGES == 1 || defined(IMPLICIT) || defined(BVEC))
#error "B_SHIFT needs STAGES > 1 and an explicit B that BVEC cannot copy"
#endif
#ifndef GATHER
#define GATHER 0
#endif
#if GATHER && (STAGES == 1 || !defined(IMPLICIT) || defined(BVEC))
#error "GATHER needs STAGES > 1 and IMPLICIT"
#endif
#if (GATHER == 2 || GATHER == 3) && defined(MMA_TF32)
#error "GATHER 2 and 3 pack runs of halves: MMA_F16 only"
#endif
#if GATHER == 4 && !defined(MMA_TF32)
#error "GATHER 4 copies single floats: MMA_TF32 only"
#endif
/* B reaches local memory by cp.async (no registers): its rows (BVEC, B_SHIFT) or its gathered floats (GATHER 4). */
#if defined(BVEC) || defined(B_SHIFT) || GATHER == 4
#define B_ASYNC 1
#else
#define B_ASYNC 0
#endif
#if !defined(LDSM) || defined(MMA_EMULATE)
#undef LDSM
#define LDSM 0
#endif

#if defined(MMA_TF32)
#define KPW 1                  /* k values per 32-bit word */
#else
#define MMA_F16 1
#define KPW 2
#ifndef HALF_STORAGE
#error "MMA_F16 needs HALF_STORAGE"
#endif
#endif

#define KU (KWG / KPW)         /* k-words per staged tile row */
#define LDS (KU + 4)           /* local row stride in words: 8g + t lands on 32 distinct banks */
#define WARPS (WM * WN)
#define THREADS (32 * WARPS)
#define WTM (MWG / WM)         /* a warp's tile */
#define WTN (NWG / WN)
#define FM (WTM / 16)          /* its fragments */
#define FN (WTN / 8)
#if defined(POOL2) && (SK > 1 || !defined(IMPLICIT) || ((NWG / WN) % 16))
#error "POOL2 needs SK 1, IMPLICIT and warp tiles of whole 16-column blocks"
#endif
#define NA4 (MWG * KU / 4)     /* uint4 loads per A tile */
#define NB (NWG * KU)          /* words per B tile */
#define LA_PER ((NA4 + THREADS - 1) / THREADS)
#define LB_PER ((NB + THREADS - 1) / THREADS)
#ifdef MMA_F16
#define btype ushort           /* a B element in the STAGES > 1 local layout */
#define BBYTES 2
#else
#define btype uint
#define BBYTES 4
#endif
#define LDB (NWG + 8)          /* STAGES > 1: B row stride in elements */
#define BTILE (KWG * LDB)      /* ... and a B stage in elements */
#define NBE (KWG * NWG)        /* B elements per tile */
#define LBE_PER ((NBE + THREADS - 1) / THREADS)
#define VE (16 / BBYTES)       /* B elements per 16-byte chunk */
#define NBV (KWG * NWG / VE)   /* BVEC: 16-byte chunks per B tile; GATHER 2, 3 (f16): runs of 8 columns */
#define BV_PER ((NBV + THREADS - 1) / THREADS)
#define ROUND_UP(x, r) ((((x) + (r) - 1) / (r)) * (r))

/* B_SHIFT: the element index of B's element e within its aligned 16-byte chunk (buffers are at
 * least chunk-aligned, so this is where a row starting at e lands in its staged copy). */
#define yc_b_shift(Bg, e) ((int)(((size_t)((Bg) + (e)) / BBYTES) & (VE - 1)))

/* A float as TF32 bits: round to nearest, ties away from zero (cvt.rna.tf32.f32). */
inline uint yc_tf32(const float x) { return (as_uint(x) + 0x1000u) & 0xffffe000u; }

#include "mma.h"

/* Fragments from local memory with ldmatrix (one instruction for a whole A or B fragment instead
 * of 4 or 2 scalar loads); the address is the __local pointer's shared-window offset. */
#if LDSM
#define LDSM_X4(r, p)                                                                            \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"                \
                 : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3]) : "r"((uint)(size_t)(p)))
#define LDSM_X2(r, p)                                                                            \
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"                      \
                 : "=r"((r)[0]), "=r"((r)[1]) : "r"((uint)(size_t)(p)))
#endif

/* This warp's FM A fragments of k-word kw from an [m][k-word] tile As (rows of LDS words), and the
 * FM x FN products into acc: both main loops (single-buffered and staged) step through k so.
 * ldmatrix: lane l names row l % 8 of 8x4-word matrix l / 8; matrix q lands in register q, each
 * lane receiving word t of row g: exactly the fragments' layout, in word units. */
#if LDSM
#define LOAD_A_FRAGS(af, As, kw)                                                                 \
    _Pragma("unroll") for (int i = 0; i < FM; ++i)                                               \
        LDSM_X4(af[i], (As) + (wm * WTM + i * 16 + (lane & 7) + 8 * ((lane >> 3) & 1)) * LDS     \
                       + (kw) + 4 * (lane >> 4));
#else
#define LOAD_A_FRAGS(af, As, kw)                                                                 \
    _Pragma("unroll") for (int i = 0; i < FM; ++i) {                                             \
        const __local uint* pa = (As) + (wm * WTM + i * 16 + g) * LDS + (kw) + t;                \
        af[i][0] = pa[0];                                                                        \
        af[i][1] = pa[8 * LDS];                                                                  \
        af[i][2] = pa[4];                                                                        \
        af[i][3] = pa[8 * LDS + 4];                                                              \
    }
#endif
#define MMA_ALL(acc, af, bf)                                                                     \
    _Pragma("unroll") for (int i = 0; i < FM; ++i)                                               \
        _Pragma("unroll") for (int j = 0; j < FN; ++j)                                           \
            MMA(acc[i][j], af[i], bf[j]);

/* Global -> local copies that bypass registers (cp.async, sm_80+): 16 bytes, zero-filled where !ok;
 * a commit closes a group, a wait leaves at most CP_PENDING of this work-item's groups in flight
 * (the barrier after it makes every work-item's copies visible). Plain copies under emulation. */
#if STAGES > 1
#define CP_PENDING_(x) #x
#define CP_PENDING_STR(x) CP_PENDING_(x)
#if STAGES == 2
#define CP_PENDING 0
#elif STAGES == 3
#define CP_PENDING 1
#else
#define CP_PENDING 2
#endif
#ifdef MMA_EMULATE
#define CP_ASYNC16(dst, src, ok) (*(__local uint4*)(dst) = (ok) ? *(const __global uint4*)(src) : (uint4)(0u))
#define CP_ASYNC4(dst, src, ok) (*(__local uint*)(dst) = (ok) ? *(const __global uint*)(src) : 0u)
#define CP_ASYNC16N(dst, src, bytes)                                                             \
    for (int i_ = 0; i_ < 16; ++i_)                                                              \
        ((__local uchar*)(dst))[i_] = i_ < (bytes) ? ((const __global uchar*)(src))[i_] : (uchar)0;
#define CP_COMMIT()
#define CP_WAIT()
#else
#define CP_ASYNC16(dst, src, ok)                                                                 \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"                                \
                 :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(src)), "r"((ok) ? 16 : 0) : "memory")
#define CP_ASYNC4(dst, src, ok)                                                                  \
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;"                                 \
                 :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(src)), "r"((ok) ? 4 : 0) : "memory")
/* 16 bytes of which the first `bytes` are copied, the rest zeroed */
#define CP_ASYNC16N(dst, src, bytes)                                                             \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"                                \
                 :: "r"((uint)(size_t)(dst)), "l"((ulong)(size_t)(src)), "r"(bytes) : "memory")
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define CP_WAIT() asm volatile("cp.async.wait_group " CP_PENDING_STR(CP_PENDING) ";" ::: "memory")
#endif
#if LDSM
#define LDSM_X4T(r, p)                                                                           \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"          \
                 : "=r"((r)[0]), "=r"((r)[1]), "=r"((r)[2]), "=r"((r)[3]) : "r"((uint)(size_t)(p)))
#define LDSM_X2T(r, p)                                                                           \
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"                \
                 : "=r"((r)[0]), "=r"((r)[1]) : "r"((uint)(size_t)(p)))
#endif
#endif

/* One element of B as mma input bits (0 outside the matrix). */
#ifdef MMA_F16
#define BBITS(i) ((uint)((__global const ushort*)Bg)[i])
#else
#define BBITS(i) yc_tf32(Bg[i])
#endif
#ifdef CHECK_M
#define CHECK_M_ON 1
#else
#define CHECK_M_ON 0
#endif
#ifdef CHECK_N
#define CHECK_N_ON 1
#else
#define CHECK_N_ON 0
#endif
#ifdef CHECK_K
#define K_OK(k) ((k) < K)
#else
#define K_OK(k) true
#endif
#ifdef IMPLICIT
/* The output pixel (x, y) of GEMM column n: row-major, or with POOL2 in 16-column blocks, each
 * the four 2x2 windows of pooled pixels 4b .. 4b + 3 (OW / 2 of them per pooled row). */
inline int2 yc_pixel(const int n, const int OW)
{
#ifdef POOL2
    const int w = ((n >> 4) << 2) + ((n >> 1) & 3), PW = OW >> 1, py = w / PW;
    return (int2)(2 * (w - py * PW) + (n & 1), 2 * py + ((n >> 3) & 1));
#else
    const int oy = n / OW;
    return (int2)(n - oy * OW, oy);
#endif
}
/* Where B[k][n] of the implicit im2col matrix lies in the input, or -1 where it is padding (or
 * !ok); (iy0, ix0) is column n's first pixel. */
inline int yc_b_offset(const int k, const bool ok, const int iy0, const int ix0, const int H, const int W)
{
    const int c = k / (KS * KS), r = k - c * (KS * KS);
    const int ky = r / KS, kx = r - ky * KS;
    const int iy = iy0 + ky * DIL, ix = ix0 + kx * DIL;
    return (ok && iy >= 0 && iy < H && ix >= 0 && ix < W) ? (c * H + iy) * W + ix : -1;
}
/* B[k][n] as mma input bits (0 in the padding). */
inline uint yc_b_implicit(const __global dtype* Bg, const int k, const bool ok, const int iy0, const int ix0,
                          const int H, const int W)
{
    const int a = yc_b_offset(k, ok, iy0, ix0, H, W);
    return a >= 0 ? BBITS(a) : 0u;
}
#define B_AT(k, n) yc_b_implicit(Bg, (k), bok && K_OK(k), iy0, ix0, H, W)
#else
#define B_AT(k, n) ((bok && K_OK(k)) ? BBITS((size_t)(k) * ldb + (n)) : 0u)
#endif

#ifdef MMA_F16
#define B_WORD(k, n) (B_AT(k, n) | (B_AT((k) + 1, n) << 16))
#else
#define B_WORD(k, n) B_AT(k, n)
#endif
/* The B column a work-item stages for load slot v (found once where it never changes). */
#if THREADS % NWG == 0
#define B_COL_FIXED 1
#define B_COLUMN(v)
#elif defined(IMPLICIT)
#define B_COLUMN(v)                                                                              \
    const int bn = n0 + (v) % NWG;                                                               \
    const bool nok = bn < N;                                                                     \
    const int2 bp = yc_pixel(bn, OW);                                                            \
    const int iy0 = bp.y * SY - PAD, ix0 = bp.x * SX - PAD;
#else
#define B_COLUMN(v)                                                                              \
    const int bn = n0 + (v) % NWG;                                                               \
    const bool nok = bn < N;
#endif
#if GATHER == 1 && !defined(B_COL_FIXED)
#error "GATHER 1 needs NWG to divide the work-group (one column per work-item)"
#endif
#define GNONE (-16384)          /* GATHER: a window row no kernel offset brings inside the image */

#if GATHER == 1
/* Table entry of k for the GATHER 1 tile: (offset of (c, ky, kx) in the input, (dx, dy) as two
 * shorts); a k past K gets a dy that no column's window row survives. */
inline int2 yc_gather_k(const int k, const int K, const int H, const int W)
{
    const int c = k / (KS * KS), r = k - c * (KS * KS);
    const int ky = r / KS, kx = r - ky * KS;
    return k < K ? (int2)(c * H * W + ky * DIL * W + kx * DIL, as_int((short2)(kx * DIL, ky * DIL)))
                 : (int2)(0, as_int((short2)(0, GNONE)));
}
#endif

__kernel __attribute__((reqd_work_group_size(THREADS, 1, 1)))
void yc_gemm_mma(YC_GEMM_PARAMS
#ifdef POOL_KEEP
                 , __global dtype* restrict C2, const int c2_off, const int c2_bstride
#endif
#ifdef SK_FIX
                 , __global float* restrict P, volatile __global int* restrict counters
#endif
                 )
{
    const int tid = get_local_id(0);
    const int lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WN, wn = warp - wm * WN;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = get_group_id(0) * NWG, m0 = get_group_id(1) * MWG;
    YC_K_SPLIT(z, ks, kbeg, kend)
    const int b = z / G, grp = z - b * G;
    const int Mp = ROUND_UP(M, MPAD), KpW = ROUND_UP(K, KPAD) / KPW;    /* A row stride in words */
    const __global uint* Aw = (const __global uint*)A + ((size_t)grp * Mp + m0) * KpW;
    const __global dtype* Bg = B + b_off + (size_t)b * b_bstride + (size_t)grp * b_gstride;

#ifdef SK_FIX
    __local int sk_last[1];
#endif
#ifdef MMA_EMULATE
    __local uint xchg[WARPS * 32 * 6];
    __local uint* xch = xchg + warp * 32 * 6;
#endif

    /* Each work-item stages the same B columns every tile: n = (tid + p*THREADS) % NWG. */
#ifdef B_COL_FIXED
    const int bn = n0 + tid % NWG;
    const bool nok = bn < N;
#ifdef IMPLICIT
    const int2 bp = yc_pixel(bn, OW);
    const int iy0 = bp.y * SY - PAD, ix0 = bp.x * SX - PAD;
#if GATHER == 1
    const int goff = iy0 * W + ix0;           /* the window's corner; + a table offset = the element */
#endif
#endif
#endif

    float acc[FM][FN][4];
    #pragma unroll
    for (int i = 0; i < FM; ++i)
        #pragma unroll
        for (int j = 0; j < FN; ++j)
            #pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

#if STAGES == 1
    __local uint4 As4[MWG * LDS / 4];          /* uint4: 16-byte aligned for the vector stores */
    __local uint4 Bs4[NWG * LDS / 4];
    __local uint* As = (__local uint*)As4;
    __local uint* Bs = (__local uint*)Bs4;
    uint4 ra[LA_PER];
    uint rb[LB_PER];

/* Global -> registers for the tile at k0: A as 16-byte vectors, B one word (two k for f16) per column. */
#define LOAD_TILE(k0)                                                                            \
    for (int p = 0; p < LA_PER; ++p) {                                                           \
        const int v = tid + p * THREADS;                                                         \
        if (NA4 % THREADS == 0 || v < NA4) {                                                     \
            const int r = v / (KU / 4), c = v - r * (KU / 4);                                    \
            ra[p] = *(const __global uint4*)(Aw + (size_t)r * KpW + (k0) / KPW + c * 4);          \
        }                                                                                        \
    }                                                                                            \
    for (int p = 0; p < LB_PER; ++p) {                                                           \
        const int v = tid + p * THREADS;                                                         \
        B_COLUMN(v)                                                                              \
        const bool bok = nok && (NB % THREADS == 0 || v < NB);                                   \
        rb[p] = B_WORD((k0) + (v / NWG) * KPW, bn);                                              \
    }
/* Registers -> local memory: A as [m][k-word], B transposed to [n][k-word]. */
#define STORE_TILE()                                                                             \
    for (int p = 0; p < LA_PER; ++p) {                                                           \
        const int v = tid + p * THREADS;                                                         \
        if (NA4 % THREADS == 0 || v < NA4) {                                                     \
            const int r = v / (KU / 4), c = v - r * (KU / 4);                                    \
            *(__local uint4*)(As + r * LDS + c * 4) = ra[p];                                     \
        }                                                                                        \
    }                                                                                            \
    for (int p = 0; p < LB_PER; ++p) {                                                           \
        const int v = tid + p * THREADS;                                                         \
        if (NB % THREADS == 0 || v < NB)                                                         \
            Bs[(v % NWG) * LDS + v / NWG] = rb[p];                                               \
    }

    /* The next tile is fetched into registers while this one is multiplied. */
    LOAD_TILE(kbeg)
    for (int k0 = kbeg; k0 < kend; k0 += KWG) {
        STORE_TILE()
        barrier(CLK_LOCAL_MEM_FENCE);
        if (k0 + KWG < kend) {
            LOAD_TILE(k0 + KWG)
        }

        #pragma unroll
        for (int kw = 0; kw < KU; kw += 8) {
            uint af[FM][4], bf[FN][2];
            LOAD_A_FRAGS(af, As, kw)
#if LDSM
            #pragma unroll
            for (int j = 0; j < FN; ++j)
                LDSM_X2(bf[j], Bs + (wn * WTN + j * 8 + (lane & 7)) * LDS + kw + 4 * ((lane >> 3) & 1));
#else
            #pragma unroll
            for (int j = 0; j < FN; ++j) {
                const __local uint* p = Bs + (wn * WTN + j * 8 + g) * LDS + kw + t;
                bf[j][0] = p[0];
                bf[j][1] = p[4];
            }
#endif
            MMA_ALL(acc, af, bf)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

#else
    /* STAGES-stage ring: A [m][k-word] rows of LDS words, B [k][n] rows of LDB elements. */
    __local uint4 As4[STAGES * MWG * LDS / 4];
    __local uint4 Bs4[STAGES * BTILE * BBYTES / 16];
    __local uint* As0 = (__local uint*)As4;
    __local btype* Bs0 = (__local btype*)Bs4;
    const int KT = (kend - kbeg + KWG - 1) / KWG;       /* k-tiles of this split */
#if GATHER == 2 || GATHER == 3
    uint4 rg[BV_PER];
    /* This work-item's run: columns gn .. gn + 7 in every tile (NWG / 8 divides the work-group),
     * each column's window corner (ix0, iy0) as two shorts (a GNONE row past N). */
    const int gn = n0 + (tid % (NWG / 8)) * 8;
    short2 gyx[8];
    #pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int2 p = yc_pixel(gn + i, OW);
        gyx[i] = (short2)((short)(p.x * SX - PAD), (short)(gn + i < N ? p.y * SY - PAD : GNONE));
    }
    /* A run inside one output row (stride 1): element i is the row offset's i-th neighbour. */
    const int2 first = yc_pixel(gn, OW), last = yc_pixel(gn + 7, OW);
    const bool grow = SX == 1 && gn + 7 < N && last.y == first.y && last.x == first.x + 7;
    const __global ushort* Bh = (const __global ushort*)Bg;
#elif !B_ASYNC
    uint rb[LBE_PER];
#endif
#if GATHER == 1
    __local int2 gtab[2 * KWG];               /* per-k offsets of two k-tiles: this one's next, and the one after */
#define GTAB_BUILD(s, k0)                                                                        \
    for (int i = tid; i < KWG; i += THREADS)                                                     \
        gtab[(s) * KWG + i] = yc_gather_k((k0) + i, K, H, W);
#endif

/* Tile kt's asynchronous copies into stage s: A as 16-byte chunks (always in bounds: A is padded),
 * with BVEC B's rows too (a chunk is wholly inside or outside C's N, since N % VE == 0). */
#ifdef BVEC
#define ASYNC_B(s, k0)                                                                           \
    for (int p = 0; p < BV_PER; ++p) {                                                           \
        const int v = tid + p * THREADS;                                                         \
        if (NBV % THREADS == 0 || v < NBV) {                                                     \
            const int r = v / (NWG / VE), c = v - r * (NWG / VE);                                 \
            const int kk = (k0) + r, nn = n0 + c * VE;                                           \
            const bool ok = K_OK(kk) && (nn < N);                                                \
            CP_ASYNC16(Bs0 + (s) * BTILE + r * LDB + c * VE, Bg + (ok ? (size_t)kk * ldb + nn : 0), ok); \
        }                                                                                        \
    }
#elif defined(B_SHIFT)
/* Row r: the NWG / VE + 1 aligned chunks from its first column's chunk on, so that the row lands
 * shifted by yc_b_shift; the bytes past the row's last column (N), and rows past K, zero-filled.
 * The chunk before a row's first column may hold another tensor's bytes (never read). */
#define BS_CHUNKS (NWG / VE + 1)
#define NBS (KWG * BS_CHUNKS)
#define BS_PER ((NBS + THREADS - 1) / THREADS)
#define ASYNC_B(s, k0)                                                                           \
    for (int p = 0; p < BS_PER; ++p) {                                                           \
        const int v = tid + p * THREADS;                                                         \
        if (NBS % THREADS == 0 || v < NBS) {                                                     \
            const int r = v / BS_CHUNKS, c = v - r * BS_CHUNKS, kk = (k0) + r;                   \
            const long e0 = (long)kk * ldb + n0;                                                 \
            const long first = e0 - yc_b_shift(Bg, e0) + c * VE;                                  \
            const long left = K_OK(kk) ? e0 + (N - n0) - first : 0L;                             \
            const int bytes = (int)clamp(left, 0L, (long)VE) * BBYTES;                           \
            CP_ASYNC16N(Bs0 + (s) * BTILE + r * LDB + c * VE,                                   \
                        bytes ? Bg + first : Bg - yc_b_shift(Bg, 0), bytes);                    \
        }                                                                                        \
    }
#elif GATHER == 4
/* Element v is (k = v / NWG, n = v % NWG), as the register gathers order them; outside the image,
 * past K or past N, a zero-filled copy. */
#define ASYNC_B(s, k0)                                                                           \
    for (int p = 0; p < LBE_PER; ++p) {                                                          \
        const int v = tid + p * THREADS;                                                         \
        if (NBE % THREADS == 0 || v < NBE) {                                                     \
            B_COLUMN(v)                                                                          \
            const int k = (k0) + v / NWG;                                                        \
            const int a = yc_b_offset(k, nok && K_OK(k), iy0, ix0, H, W);                        \
            CP_ASYNC4(Bs0 + (s) * BTILE + (v / NWG) * LDB + v % NWG, Bg + max(a, 0), a >= 0);     \
        }                                                                                        \
    }
#else
#define ASYNC_B(s, k0)
#endif
#define ASYNC_TILE(s, k0)                                                                        \
    for (int p = 0; p < LA_PER; ++p) {                                                           \
        const int v = tid + p * THREADS;                                                         \
        if (NA4 % THREADS == 0 || v < NA4) {                                                     \
            const int r = v / (KU / 4), c = v - r * (KU / 4);                                    \
            CP_ASYNC16(As0 + (s) * MWG * LDS + r * LDS + c * 4,                                  \
                       Aw + (size_t)r * KpW + (k0) / KPW + c * 4, true);                          \
        }                                                                                        \
    }                                                                                            \
    ASYNC_B(s, k0)
/* B through registers (gathered, or ragged): LOAD_B(k0, kt) fetches tile kt (at k0) into registers,
 * STORE_B(s) stores them into stage s. */
#if GATHER == 2 || GATHER == 3
#if GATHER == 3
/* A row run's 8 halves from a (index of element 0; ix its column, iy's row valid): the aligned
 * blocks at a & ~7 and 8 past it that hold an element of the row, shifted by a & 7 halves, the
 * elements outside the row (padding) zeroed. */
#define ROW_RUN(h, a, ix)                                                                        \
    {                                                                                            \
        const int a8 = (a) & ~7, q = ((a) & 7) >> 1, rs = (a) - (ix), re = rs + W - 1;           \
        const uint4 lo = rok && a8 + 7 >= rs && a8 <= re ? *(const __global uint4*)(Bh + a8) : (uint4)(0u); \
        const uint4 hi = rok && ((a) & 7) && a8 + 15 >= rs && a8 + 8 <= re                      \
                         ? *(const __global uint4*)(Bh + a8 + 8) : (uint4)(0u);                  \
        const uint w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};                      \
        uint x[6], y[5];                                                                         \
        _Pragma("unroll") for (int j = 0; j < 6; ++j) x[j] = q & 2 ? w[j + 2] : w[j];            \
        _Pragma("unroll") for (int j = 0; j < 5; ++j) y[j] = q & 1 ? x[j + 1] : x[j];            \
        _Pragma("unroll") for (int j = 0; j < 4; ++j)                                            \
            h[j] = (a) & 1 ? y[j] >> 16 | y[j + 1] << 16 : y[j];                                 \
        if ((ix) < 0 || (ix) > W - 8) {                                                          \
            _Pragma("unroll") for (int j = 0; j < 4; ++j)                                        \
                h[j] &= ((uint)((ix) + 2 * j) < (uint)W ? 0xffffu : 0u)                          \
                        | ((uint)((ix) + 2 * j + 1) < (uint)W ? 0xffff0000u : 0u);               \
        }                                                                                        \
    }
#else
/* A row run's 8 halves from a (index of element 0; ix its column), one load each. */
#define ROW_RUN(h, a, ix)                                                                        \
    {                                                                                            \
        uint e[8];                                                                               \
        _Pragma("unroll") for (int i = 0; i < 8; ++i)                                            \
            e[i] = rok && (uint)((ix) + i) < (uint)W ? (uint)Bh[(a) + i] : 0u;                   \
        _Pragma("unroll") for (int j = 0; j < 4; ++j) h[j] = e[2 * j] | e[2 * j + 1] << 16;      \
    }
#endif
/* Runs: slot v is run v % (NWG / 8) (this work-item's) of k-row v / (NWG / 8); (c, ky, kx) once
 * per run, then 8 halves from the row offset (a run inside one row) or each column's corner. */
#define LOAD_B(k0, kt)                                                                           \
    for (int p = 0; p < BV_PER; ++p) {                                                           \
        const int v = tid + p * THREADS, k = (k0) + v / (NWG / 8);                               \
        const bool kok = (NBV % THREADS == 0 || v < NBV) && K_OK(k);                             \
        const int c = k / (KS * KS), r = k - c * (KS * KS), ky = r / KS, kx = r - ky * KS;       \
        const int dy = ky * DIL, dx = kx * DIL, chw = c * H * W;                                 \
        uint h[4];                                                                               \
        if (grow) {                                                                              \
            const int iy = gyx[0].y + dy, ix = gyx[0].x + dx, a = chw + iy * W + ix;             \
            const bool rok = kok && (uint)iy < (uint)H;                                          \
            ROW_RUN(h, a, ix)                                                                    \
        } else {                                                                                 \
            uint e[8];                                                                           \
            _Pragma("unroll") for (int i = 0; i < 8; ++i) {                                      \
                const int iy = gyx[i].y + dy, ix = gyx[i].x + dx;                                \
                e[i] = kok && (uint)iy < (uint)H && (uint)ix < (uint)W ? (uint)Bh[chw + iy * W + ix] : 0u; \
            }                                                                                    \
            _Pragma("unroll") for (int j = 0; j < 4; ++j) h[j] = e[2 * j] | e[2 * j + 1] << 16;  \
        }                                                                                        \
        rg[p] = (uint4)(h[0], h[1], h[2], h[3]);                                                 \
    }
#define STORE_B(s)                                                                               \
    for (int p = 0; p < BV_PER; ++p) {                                                           \
        const int v = tid + p * THREADS;                                                         \
        if (NBV % THREADS == 0 || v < NBV)                                                       \
            *(__local uint4*)(Bs0 + (s) * BTILE + (v / (NWG / 8)) * LDB + (v % (NWG / 8)) * 8) = rg[p]; \
    }
#else
/* Element v is (k = v / NWG, n = v % NWG), so a warp's work-items read consecutive n (coalesced)
 * and store consecutive local elements (no bank conflict). */
#if GATHER == 1
/* Element v's k offsets from tile kt's table: one add and two bounds per element. */
#define B_ELEM(k0, kt, v)                                                                        \
    const int2 e = (NBE % THREADS == 0 || v < NBE) ? gtab[((kt) & 1) * KWG + v / NWG]             \
                                                   : (int2)(0, as_int((short2)(0, GNONE)));      \
    const short2 d = as_short2(e.y);                                                             \
    const int iy = iy0 + d.y, ix = ix0 + d.x;                                                    \
    rb[p] = nok && (uint)iy < (uint)H && (uint)ix < (uint)W ? BBITS(e.x + goff) : 0u;
#else
#define B_ELEM(k0, kt, v)                                                                        \
    B_COLUMN(v)                                                                                  \
    const bool bok = nok && (NBE % THREADS == 0 || v < NBE);                                     \
    rb[p] = B_AT((k0) + v / NWG, bn);
#endif
#define LOAD_B(k0, kt)                                                                           \
    for (int p = 0; p < LBE_PER; ++p) {                                                          \
        const int v = tid + p * THREADS;                                                         \
        B_ELEM(k0, kt, v)                                                                        \
    }
#define STORE_B(s)                                                                               \
    for (int p = 0; p < LBE_PER; ++p) {                                                          \
        const int v = tid + p * THREADS;                                                         \
        if (NBE % THREADS == 0 || v < NBE)                                                       \
            Bs0[(s) * BTILE + (v / NWG) * LDB + v % NWG] = (btype)rb[p];                         \
    }
#endif

    #pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < KT) {
            ASYNC_TILE(s, kbeg + s * KWG)
        }
        CP_COMMIT();
    }
#if GATHER == 1
    GTAB_BUILD(0, kbeg)
    GTAB_BUILD(1, kbeg + KWG)
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
#if !B_ASYNC
    LOAD_B(kbeg, 0)
    STORE_B(0)
#endif
    for (int kt = 0; kt < KT; ++kt) {
        CP_WAIT();                          /* tile kt's copies (this work-item's) have landed */
        barrier(CLK_LOCAL_MEM_FENCE);       /* ... everyone's, and stage (kt - 1) % STAGES is free */
        {
            const int kn = kt + STAGES - 1;
            if (kn < KT) {
                ASYNC_TILE(kn % STAGES, kbeg + kn * KWG)
            }
            CP_COMMIT();
        }
#if GATHER == 1
        /* Tile kt + 2's table into tile kt's slot, which LOAD_B read before the barrier above. */
        GTAB_BUILD(kt & 1, kbeg + (kt + 2) * KWG)
#endif
#if !B_ASYNC
        const bool more = kt + 1 < KT;
        if (more) {
            LOAD_B(kbeg + (kt + 1) * KWG, kt + 1)
        }
#endif
        const __local uint* As = As0 + (kt % STAGES) * MWG * LDS;
        const __local btype* Bs = Bs0 + (kt % STAGES) * BTILE;
#ifdef B_SHIFT
        /* row r of this tile lands shifted by ROW_SHIFT(r) elements (ASYNC_B) */
        const int sh0 = yc_b_shift(Bg, (long)(kbeg + kt * KWG) * ldb + n0);
#define ROW_SHIFT(r) ((sh0 + (r) * ldb) & (VE - 1))
#else
#define ROW_SHIFT(r) 0
#endif

        #pragma unroll
        for (int kw = 0; kw < KU; kw += 8) {
            uint af[FM][4], bf[FN][2];
            const int kb = kw * KPW;            /* the B row (k) of this step */
            LOAD_A_FRAGS(af, As, kw)
#if LDSM && defined(MMA_F16) && !defined(B_SHIFT)
            /* ldmatrix.trans of [k][n] rows: matrix q = (k half q & 1, n block q >> 1), and lane
             * (g, t) receives B[kb + 2t, 2t + 1][n + g]: the col fragment, low half the lower k. */
            #pragma unroll
            for (int j = 0; j + 1 < FN; j += 2) {
                uint r4[4];
                LDSM_X4T(r4, Bs + (kb + (lane & 15)) * LDB + wn * WTN + j * 8 + 8 * (lane >> 4));
                bf[j][0] = r4[0];
                bf[j][1] = r4[1];
                bf[j + 1][0] = r4[2];
                bf[j + 1][1] = r4[3];
            }
            if (FN & 1)
                LDSM_X2T(bf[FN - 1], Bs + (kb + (lane & 15)) * LDB + wn * WTN + (FN - 1) * 8);
#endif
#if !LDSM || defined(MMA_TF32) || defined(B_SHIFT)
            #pragma unroll
            for (int j = 0; j < FN; ++j) {
                const __local btype* p = Bs + kb * LDB + wn * WTN + j * 8 + g;
#define B_ROW(r) p[(r) * LDB + ROW_SHIFT(kb + (r))]
#ifdef MMA_F16
                bf[j][0] = (uint)B_ROW(2 * t) | ((uint)B_ROW(2 * t + 1) << 16);
                bf[j][1] = (uint)B_ROW(2 * t + 8) | ((uint)B_ROW(2 * t + 9) << 16);
#elif B_ASYNC
                bf[j][0] = yc_tf32(as_float(B_ROW(t)));      /* copied as floats: rounded here */
                bf[j][1] = yc_tf32(as_float(B_ROW(t + 4)));
#else
                bf[j][0] = B_ROW(t);
                bf[j][1] = B_ROW(t + 4);
#endif
#undef B_ROW
            }
#endif
#undef ROW_SHIFT
            MMA_ALL(acc, af, bf)
        }
#if !B_ASYNC
        if (more) {
            STORE_B((kt + 1) % STAGES)
        }
#endif
    }
#endif

    YC_EPILOGUE_BASES(b)
#if SK > 1
    /* Raw partial sums of this K split, as planes [SK][Z][M][N]: into the workspace P (SK_FIX),
     * else into C's buffer for gemm_local.cl's yc_gemm_splitk to add up in a second launch. */
    const size_t plane = (size_t)M * N, zt = get_global_size(2) / SK;
#ifdef SK_FIX
    __global float* Pk = P + ((size_t)ks * zt + z) * plane;
#else
    __global float* Pk = (__global float*)C + ((size_t)ks * zt + z) * plane;
#endif
#endif
    /* BODY once per accumulator of this work-item inside C, with its row m, column n and value v
     * (the mma fragment layout: rows g and g + 8 of each 16-row block, columns 2t and 2t + 1). */
#define YC_EACH_ACC(BODY) \
    _Pragma("unroll") for (int i = 0; i < FM; ++i) \
    _Pragma("unroll") for (int q = 0; q < 4; ++q) { \
        const int m = m0 + wm * WTM + i * 16 + g + 8 * (q >> 1); \
        if (CHECK_M_ON && m >= M) continue; \
        _Pragma("unroll") for (int j = 0; j < FN; ++j) { \
            const int n = n0 + wn * WTN + j * 8 + 2 * t + (q & 1); \
            if (CHECK_N_ON && n >= N) continue; \
            const float v = acc[i][j][q]; \
            BODY \
        } \
    }
    /* Each accumulator: its partial (SK > 1) or its epilogue. */
#if SK > 1
    YC_EACH_ACC(Pk[(size_t)m * N + n] = v;)
#elif defined(POOL2)
    /* Fragment pair (2jp, 2jp + 1) is one 16-column block: this work-item's columns 2t, 2t + 1 of
     * rows g and g + 8 in both are the windows of pooled pixel 4 * block + t; their max in the
     * pool layer's order (row by row, a later value winning only if greater). */
#ifdef POOL_KEEP
    const size_t c2b = (size_t)c2_off + (size_t)b * c2_bstride;
#endif
    _Pragma("unroll") for (int i = 0; i < FM; ++i)
    _Pragma("unroll") for (int r = 0; r < 2; ++r) {
        const int m = m0 + wm * WTM + i * 16 + g + 8 * r;
        if (CHECK_M_ON && m >= M) continue;
        _Pragma("unroll") for (int jp = 0; jp < FN / 2; ++jp) {
            const int nb = n0 + wn * WTN + jp * 16, w = (nb >> 2) + t;
            if (w >= POOL_PIX) continue;       /* past the map (or past N, a larger w still) */
            float mx = -FLT_MAX;
            _Pragma("unroll") for (int q = 0; q < 4; ++q) {
                const float v = yc_gemm_value(acc[i][2 * jp + (q >> 1)][2 * r + (q & 1)], m, grp, M, bias);
#ifdef POOL_KEEP
                const int2 p = yc_pixel(nb + 8 * (q >> 1) + 2 * t + (q & 1), OW);
                ST(C2, c2b + (size_t)(grp * M + m) * (4 * POOL_PIX) + p.y * OW + p.x, v);
#endif
                mx = v > mx ? v : mx;
            }
            ST(C, cb + (size_t)(grp * M + m) * ldc + w, mx);
        }
    }
#else
    YC_EACH_ACC(yc_gemm_store(v, m, n, grp, M, ldc, bias, C, cb, R, rbase);)
#endif
#if SK > 1
#ifdef SK_FIX
    /* The work-group that finishes a tile last (a count per tile, reset to 0 by that group for
     * the next launch) adds the planes in split order and runs the epilogue. Every work-item
     * fences its partial stores device-wide before the count; the sums read with volatile loads,
     * past the non-coherent L1. */
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (tid == 0) {
        const int tile = (z * (int)get_num_groups(1) + (int)get_group_id(1)) * (int)get_num_groups(0)
                         + (int)get_group_id(0);
        sk_last[0] = atomic_inc(counters + tile) == SK - 1;
        if (sk_last[0])
            counters[tile] = 0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!sk_last[0])
        return;
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    const volatile __global float* Pz = P + (size_t)z * plane;
    YC_EACH_ACC(
        float sum = 0.0f;
        for (int s = 0; s < SK; ++s)
            sum += s == ks ? v : Pz[(size_t)s * zt * plane + (size_t)m * N + n];
        yc_gemm_store(sum, m, n, grp, M, ldc, bias, C, cb, R, rbase);)
#endif
#endif
#undef YC_EACH_ACC
}
