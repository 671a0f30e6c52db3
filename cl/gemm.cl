/* The barrier-free GEMM family for CPU devices: C[m][n] = epilogue(sum_k A[m][k] * B[k][n]).
 *
 * On a CPU OpenCL device (PoCL) a work-group is a loop and a barrier splits it, so this family
 * has none: each work-item owns a register block of C, streams its own panel of A and strip of
 * B, and writes the block once. Two orientations, both explicitly vectorised:
 *
 *   yc_gemm     N-vectorised: block TM rows x (VW*NV) columns; each k step loads NV vectors of
 *               B and broadcasts TM scalars of A. Best when N is large (early layers).
 *   yc_gemm_mv  M-vectorised: block (VW*NV) rows x TN columns; each k step loads NV vectors of
 *               A (weights packed so the TM... rows of one k are contiguous) and broadcasts TN
 *               scalars of B. Best when N is small and M large (late layers, N = 169).
 *
 * Operands (one GEMM per z = b*G + g):
 *   A  yc_gemm without PACK_A: [G][M][K] row-major (the plain weight layout).
 *      yc_gemm with PACK_A:    [G][MB][K][TM], MB = ceil(M/TM), rows >= M zero: a k step's TM
 *                              weights are contiguous and no row check is needed in the loop.
 *      yc_gemm_mv:             [G][MB][K][VW*NV] the same way, so one k step is NV vector loads.
 *   B  (k, n) at b_off + b*b_bstride + g*b_gstride + k*ldb + n (an im2col workspace, or the
 *      input itself for a 1x1 stride-1 conv).
 *   C, R (residual): (m, n) at off + b*bstride + (g*M + m)*ldc + n, so a conv can write into a
 *      concat slice.
 * Epilogue: + bias (unless NO_BIAS), ACT, [+ R, ACT2], store (float or half).
 *
 * Defines: TM, TN, VW (1, 2, 4, 8, 16), NV (vectors per block), KU (k unroll), PACK_A,
 * CHECK_M / CHECK_N (emitted only when M / N do not divide the block), RESIDUAL, ACT, ACT2,
 * NO_BIAS (the batched GEMM inside Winograd: the bias is added after the output transform),
 * HALF_MATH (common.h: products and sums in half, each block of HK k steps summed in half and
 * then added to float accumulators, so rounding grows with HK, not with K; the epilogue is float),
 * MFIRST (global dimension 0 walks the row blocks, 1 the column blocks: consecutive work-items,
 * which a CPU driver runs back to back, then share their B strip instead of their A panel).
 *
 * IMPLICIT (yc_gemm only; stride-1 convs, with IM_KS, IM_SY, IM_PAD, IM_DIL): B is the conv input,
 * (c, iy, ix) at b_off + b*b_bstride + g*b_gstride + (c*H + iy)*W + ix, and the im2col matrix is
 * never built: a work-item's VW*NV columns are consecutive pixels of one output row (the host
 * requires OW % (VW*NV) == 0), so each (c, ky, kx) step loads one contiguous input run; rows
 * above or below the image contribute nothing and are skipped. Extra arguments: H, W, OW.
 *
 * PoCL notes that shape this code: its fma()/mad() and vloadN/vstoreN builtins compile to
 * out-of-line calls, so products are written a * b + c (contracted to FMA instructions) and
 * vectors are assembled from scalars (one unaligned vector load after optimisation); every
 * loop over the register block is fully unrolled so the accumulators live in registers.
 */
#include "common.h"

#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 4
#endif
#ifndef VW
#define VW 8
#endif
#ifndef NV
#define NV 1
#endif
#ifndef KU
#define KU 1
#endif

#ifdef MFIRST
#define COL_BLOCK get_global_id(1)
#define ROW_BLOCK get_global_id(0)
#define ROW_BLOCKS get_global_size(0)
#else
#define COL_BLOCK get_global_id(0)
#define ROW_BLOCK get_global_id(1)
#define ROW_BLOCKS get_global_size(1)
#endif

#if VW == 1
#define VECT float
#define HVECT HREAL
#else
#define VECT CAT(float, VW)
#define HVECT HREALN(VW)
#endif

/* FVEC: VW consecutive floats at p[i..i+VW) as one vector, assembled from scalars (becomes one
 * unaligned vector load); HFVEC the same of the arithmetic type (hreal). VLOAD: the same from
 * storage (half storage converts on load); HVLOAD as the arithmetic type. */
#define E(p, i, j) (p)[(i) + j]
#if VW == 1
#define TVEC(T, p, i) ((p)[i])
#elif VW == 2
#define TVEC(T, p, i) ((CAT(T, 2))(E(p, i, 0), E(p, i, 1)))
#elif VW == 4
#define TVEC(T, p, i) ((CAT(T, 4))(E(p, i, 0), E(p, i, 1), E(p, i, 2), E(p, i, 3)))
#elif VW == 8
#define TVEC(T, p, i) ((CAT(T, 8))(E(p, i, 0), E(p, i, 1), E(p, i, 2), E(p, i, 3), \
                                   E(p, i, 4), E(p, i, 5), E(p, i, 6), E(p, i, 7)))
#elif VW == 16
#define TVEC(T, p, i) ((CAT(T, 16))(E(p, i, 0), E(p, i, 1), E(p, i, 2), E(p, i, 3), \
                                    E(p, i, 4), E(p, i, 5), E(p, i, 6), E(p, i, 7), \
                                    E(p, i, 8), E(p, i, 9), E(p, i, 10), E(p, i, 11), \
                                    E(p, i, 12), E(p, i, 13), E(p, i, 14), E(p, i, 15)))
#else
#error "VW must be 1, 2, 4, 8 or 16"
#endif
#define FVEC(p, i) TVEC(float, p, i)
#define HFVEC(p, i) TVEC(HREAL, p, i)

#ifdef HALF_STORAGE
#if VW == 1
#define VLOAD(p, i) vload_half(0, (p) + (i))
#else
#define VLOAD(p, i) CAT(vload_half, VW)(0, (p) + (i))
#endif
#else
#define VLOAD(p, i) FVEC(p, i)
#endif
#if defined(HALF_MATH) && !defined(HALF_EMULATE) && VW == 1
#define HVLOAD(p, i) ((p)[i])
#elif defined(HALF_MATH) && !defined(HALF_EMULATE)
#define HVLOAD(p, i) CAT(vload, VW)(0, (p) + (i))
#else
#define HVLOAD(p, i) VLOAD(p, i)
#endif

/* The register block's multiply-add, HACC its accumulators. With HALF_MATH the k loop runs in
 * blocks of HK steps (K_BLOCK_BEGIN/END; without it they leave the loop as it was): a block is
 * summed in half (hacc, HMAC: one rounding to half per step when emulated), then FLUSH adds it
 * to the float accumulators (acc) and clears it. */
#ifdef HALF_MATH
#ifndef HK
#define HK 16
#endif
#define HACC hacc
#define IM_HC (HK / (IM_KS * IM_KS) > 0 ? HK / (IM_KS * IM_KS) : 1)   /* channels per implicit block */
#define K_BLOCK_BEGIN for (int kb_ = 0; kb_ < K; kb_ += HK) { const int ke_ = min(K, kb_ + HK);
#define K_LO kb_
#define K_HI ke_
#define K_BLOCK_END(ROWS) FLUSH(ROWS) }
#define FLUSH(ROWS)                                                                           \
    _Pragma("unroll")                                                                         \
    for (int i_ = 0; i_ < (ROWS); ++i_)                                                       \
        _Pragma("unroll")                                                                     \
        for (int j_ = 0; j_ < NV; ++j_) {                                                     \
            acc[i_][j_] += CAT(convert_, VECT)(hacc[i_][j_]);                                 \
            hacc[i_][j_] = (HVECT)(0.0f);                                                     \
        }
#define DECLARE_HACC(ROWS)                                                                    \
    HVECT hacc[ROWS][NV];                                                                     \
    _Pragma("unroll")                                                                         \
    for (int i_ = 0; i_ < (ROWS); ++i_)                                                       \
        _Pragma("unroll")                                                                     \
        for (int j_ = 0; j_ < NV; ++j_) hacc[i_][j_] = (HVECT)(0.0f);
#else
#define HACC acc
#define K_BLOCK_BEGIN
#define K_LO 0
#define K_HI K
#define K_BLOCK_END(ROWS)
#define FLUSH(ROWS)
#define DECLARE_HACC(ROWS)
#endif
#ifdef HALF_EMULATE
#if VW == 1
YC_DEFINE_HROUND(yc_hround_v, VECT, uint, as_uint, as_float)
#else
YC_DEFINE_HROUND(yc_hround_v, VECT, CAT(uint, VW), CAT(as_uint, VW), CAT(as_float, VW))
#endif
#define HMAC(a, b, c) yc_hround_v((a) * (b) + (c))
#else
#define HMAC(a, b, c) ((a) * (b) + (c))
#endif

/* Lane v of a vector (VW == 1: the scalar itself). */
#if VW == 1
#define LANE(x, v) (x)
#else
#define LANE(x, v) ((x)[v])
#endif

#ifdef NO_BIAS
#define BIAS(i) 0.0f
#else
#define BIAS(i) bias[i]
#endif

/* The epilogue runs on whole vectors of the register block: bias, ACT, [+ R, ACT2]. The common
 * activations (and mish's exp, in plain arithmetic) are written for VECT, so they compile to
 * SIMD instructions; the rest go lane by lane through yc_activate. */
#if VW == 1
YC_DEFINE_ACTIVATE_VEC(yc_act_v, VECT, as_int, as_float)
#else
YC_DEFINE_ACTIVATE_VEC(yc_act_v, VECT, CAT(as_int, VW), CAT(as_float, VW))
#endif

/* Vector v of the epilogue: v = ACT(acc + bias) [then ACT2(v + R), R read lane by lane where
 * `in` (a lane's bounds check) holds], stored lane by lane at C[ci + lane * cs] where `in` holds. */
#ifdef RESIDUAL
#define RES_ADD(ri, rs, in)                                                                   \
    {                                                                                         \
        float r[VW];                                                                          \
        _Pragma("unroll")                                                                     \
        for (int e = 0; e < VW; ++e) r[e] = (in) ? LD(R, (ri) + (size_t)e * (rs)) : 0.0f;      \
        v = yc_act_v(v + FVEC(r, 0), ACT2);                                                   \
    }
#else
#define RES_ADD(ri, rs, in)
#endif
#define STORE_V(x, bv, ci, ri, cs, in)                                                        \
    {                                                                                         \
        VECT v = yc_act_v((x) + (bv), ACT);                                                   \
        RES_ADD(ri, cs, in)                                                                   \
        _Pragma("unroll")                                                                     \
        for (int e = 0; e < VW; ++e)                                                          \
            if (in) ST(C, (ci) + (size_t)e * (cs), LANE(v, e));                               \
    }

/* ---------------------------------------------------------------------------------------- */
/* N-vectorised: work-item (n block, m block, z) owns C[m0 .. m0+TM)[n0 .. n0+VW*NV).        */
/* ---------------------------------------------------------------------------------------- */
#ifdef PACK_A
#define A_AT(i, k) HLD(Ap, (size_t)(k) * TM + (i))
#else
#define A_AT(i, k) HLD(Ap, (size_t)(i) * K + (k))
#endif

/* Row i's A value at k; rows past M read as 0 (only an unpacked A needs the check). */
#if defined(CHECK_M) && !defined(PACK_A)
#define A_ROW(i, k) ((m0 + (i) < M) ? A_AT(i, k) : 0.0f)
#else
#define A_ROW(i, k) A_AT(i, k)
#endif

/* One k step of the N-vectorised block with B vectors loaded by LOADB(j). */
#define NV_STEP(LOADB)                                                   \
    {                                                                    \
        HVECT bv[NV];                                                    \
        _Pragma("unroll")                                                \
        for (int j = 0; j < NV; ++j) bv[j] = LOADB(j);                   \
        _Pragma("unroll")                                                \
        for (int i = 0; i < TM; ++i) {                                   \
            const HVECT a = (HVECT)(A_ROW(i, k));                        \
            _Pragma("unroll")                                            \
            for (int j = 0; j < NV; ++j) HACC[i][j] = HMAC(a, bv[j], HACC[i][j]); \
        }                                                                \
    }

#define B_FULL(j) HVLOAD(Bk, (j) * VW)
#define B_PART(j) HFVEC(t, (j) * VW)

__kernel void yc_gemm(YC_GEMM_PARAMS)
{
    const int n0 = COL_BLOCK * (VW * NV);
    const int mb = ROW_BLOCK;
    const int m0 = mb * TM;
    const int z = get_global_id(2);
    const int b = z / G, g = z - b * G;
#if defined(CHECK_M) && !defined(PACK_A)
    if (m0 >= M) return;
#endif
#ifdef CHECK_N
    if (n0 >= N) return;
#endif
#ifdef PACK_A
    const __global dtype* Ap = A + ((size_t)g * (size_t)ROW_BLOCKS + mb) * (size_t)K * TM;
#else
    const __global dtype* Ap = A + (size_t)(g * M + m0) * K;
#endif

    VECT acc[TM][NV];
    #pragma unroll
    for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < NV; ++j) acc[i][j] = (VECT)(0.0f);
    DECLARE_HACC(TM)

#ifdef IMPLICIT
    const __global dtype* Xg = B + b_off + (size_t)b * b_bstride + (size_t)g * b_gstride;
    const int oy = n0 / OW, ox0 = n0 - oy * OW;
    for (int c = 0, kb = 0; kb < K; ++c) {
        for (int ky = 0; ky < IM_KS; ++ky, kb += IM_KS) {
            const int iy = oy * IM_SY - IM_PAD + ky * IM_DIL;
            if (iy < 0 || iy >= H) continue;          /* a zero row: nothing to add */
            const __global dtype* Xr = Xg + ((size_t)c * H + iy) * W;
            #pragma unroll
            for (int kx = 0; kx < IM_KS; ++kx) {
                const int k = kb + kx, x0 = ox0 + kx * IM_DIL - IM_PAD;
                if (x0 >= 0 && x0 + VW * NV <= W) {
                    const __global dtype* Bk = Xr + x0;
                    NV_STEP(B_FULL)
                } else {                               /* the run crosses the left or right edge */
                    hreal t[VW * NV];
                    for (int e = 0; e < VW * NV; ++e) t[e] = (x0 + e >= 0 && x0 + e < W) ? HLD(Xr, x0 + e) : (hreal)0.0f;
                    NV_STEP(B_PART)
                }
            }
        }
#ifdef HALF_MATH
        if ((c + 1) % IM_HC == 0) { FLUSH(TM) }   /* half blocks of whole channels */
#endif
    }
#else
    const __global dtype* Bp = B + b_off + (size_t)b * b_bstride + (size_t)g * b_gstride + n0;
#ifdef CHECK_N
    if (n0 + VW * NV > N) {
        /* The ragged last column block: element loads, columns past N read as 0. */
        K_BLOCK_BEGIN
        for (int k = K_LO; k < K_HI; ++k) {
            const __global dtype* Bk = Bp + (size_t)k * ldb;
            hreal t[VW * NV];
            for (int e = 0; e < VW * NV; ++e) t[e] = (n0 + e < N) ? HLD(Bk, e) : (hreal)0.0f;
            NV_STEP(B_PART)
        }
        K_BLOCK_END(TM)
    } else
#endif
    {
        K_BLOCK_BEGIN
        #pragma unroll KU
        for (int k = K_LO; k < K_HI; ++k) {
            const __global dtype* Bk = Bp + (size_t)k * ldb;
            NV_STEP(B_FULL)
        }
        K_BLOCK_END(TM)
    }
#endif
    FLUSH(TM)

    const size_t cb = c_off + (size_t)b * c_bstride, rb = r_off + (size_t)b * r_bstride;
    #pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + i;
#ifdef CHECK_M
        if (m < M)
#endif
        {
            const VECT bi = (VECT)(BIAS(g * M + m));
            const size_t row = (size_t)(g * M + m) * ldc + n0;
            #pragma unroll
            for (int j = 0; j < NV; ++j) {
#ifdef CHECK_N
#define IN_N (n0 + j * VW + e < N)
#else
#define IN_N 1
#endif
                STORE_V(acc[i][j], bi, cb + row + j * VW, rb + row + j * VW, 1, IN_N)
#undef IN_N
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* M-vectorised: work-item (n block, m block, z) owns C[m0 .. m0+VW*NV)[n0 .. n0+TN).        */
/* ---------------------------------------------------------------------------------------- */
#define MV (VW * NV)

__kernel void yc_gemm_mv(YC_GEMM_PARAMS)
{
    const int n0 = COL_BLOCK * TN;
    const int mb = ROW_BLOCK;
    const int m0 = mb * MV;
    const int z = get_global_id(2);
    const int b = z / G, g = z - b * G;
    const __global dtype* Ap = A + ((size_t)g * (size_t)ROW_BLOCKS + mb) * (size_t)K * MV;
    const __global dtype* Bp = B + b_off + (size_t)b * b_bstride + (size_t)g * b_gstride;

    /* Columns past N re-read column N-1 (always in bounds); their results are never stored. */
    int col[TN];
    #pragma unroll
    for (int t = 0; t < TN; ++t) {
#ifdef CHECK_N
        col[t] = n0 + t < N ? n0 + t : N - 1;
#else
        col[t] = n0 + t;
#endif
    }

    VECT acc[TN][NV];
    #pragma unroll
    for (int t = 0; t < TN; ++t)
        #pragma unroll
        for (int j = 0; j < NV; ++j) acc[t][j] = (VECT)(0.0f);
    DECLARE_HACC(TN)

    K_BLOCK_BEGIN
    #pragma unroll KU
    for (int k = K_LO; k < K_HI; ++k) {
        const __global dtype* Ak = Ap + (size_t)k * MV;
        const __global dtype* Bk = Bp + (size_t)k * ldb;
        HVECT av[NV];
        #pragma unroll
        for (int j = 0; j < NV; ++j) av[j] = HVLOAD(Ak, j * VW);
        #pragma unroll
        for (int t = 0; t < TN; ++t) {
            const HVECT bs = (HVECT)(HLD(Bk, col[t]));
            #pragma unroll
            for (int j = 0; j < NV; ++j) HACC[t][j] = HMAC(av[j], bs, HACC[t][j]);
        }
    }
    K_BLOCK_END(TN)

    const size_t cb = c_off + (size_t)b * c_bstride, rb = r_off + (size_t)b * r_bstride;
    #pragma unroll
    for (int j = 0; j < NV; ++j) {
        float bs[VW];                     /* the lanes' biases; rows past M read as 0 */
        #pragma unroll
        for (int v = 0; v < VW; ++v) {
#ifdef CHECK_M
            bs[v] = m0 + j * VW + v < M ? BIAS(g * M + m0 + j * VW + v) : 0.0f;
#else
            bs[v] = BIAS(g * M + m0 + j * VW + v);
#endif
        }
        const VECT bv = FVEC(bs, 0);
        const size_t row = (size_t)(g * M + m0 + j * VW) * ldc;
        #pragma unroll
        for (int t = 0; t < TN; ++t) {
#if defined(CHECK_M) && defined(CHECK_N)
#define IN_MN (m0 + j * VW + e < M && n0 + t < N)
#elif defined(CHECK_M)
#define IN_MN (m0 + j * VW + e < M)
#elif defined(CHECK_N)
#define IN_MN (n0 + t < N)
#else
#define IN_MN 1
#endif
            STORE_V(acc[t][j], bv, cb + row + n0 + t, rb + row + n0 + t, (size_t)ldc, IN_MN)
#undef IN_MN
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* im2col for this family: one work-item writes one row of output pixels for one k.          */
/* col[z][k][n], z = b*G + g, k = (c, ky, kx), n = (oy, ox); a contiguous run per work-item   */
/* instead of one element (no per-element divisions, streaming stores), in float8 runs where  */
/* the stride is 1 or 2 (left element by element, PoCL vectorised the loop across work-items, */
/* i.e. rows, and wrote yolov4-tiny's 12.5 MB one at 12 GB/s).                               */
/* ---------------------------------------------------------------------------------------- */
__kernel void yc_im2col_rows(__global const dtype* restrict X, const int x_off, const int x_bstride,
                             const int CG, const int H, const int W,
                             __global dtype* restrict col, const int OH, const int OW,
                             const int KS, const int SX, const int SY, const int PAD, const int DIL,
                             const int G)
{
    const int oy = get_global_id(0), k = get_global_id(1), z = get_global_id(2);
    const int N = OH * OW, K = CG * KS * KS;
    const int b = z / G, g = z - b * G;
    const int c = k / (KS * KS), r = k - c * KS * KS;
    const int ky = r / KS, kx = r - ky * KS;
    const int iy = oy * SY - PAD + ky * DIL;
    const size_t out = (size_t)z * K * N + (size_t)k * N + (size_t)oy * OW;
    if (iy < 0 || iy >= H) {
        for (int ox = 0; ox < OW; ++ox) ST(col, out + ox, 0.0f);
        return;
    }
    const size_t in = x_off + (size_t)b * x_bstride + ((size_t)(g * CG + c) * H + iy) * W;
    const int x0 = kx * DIL - PAD;
    int ox = 0;
#ifndef HALF_STORAGE
    /* Runs of 8 outputs whose inputs lie inside the row as vectors: one load (stride 1) or two
     * and their even lanes (stride 2); the rest, and other strides, element by element. */
    typedef float8 f8_u __attribute__((aligned(4)));
    if (SX <= 2) {
        const int lo = min(OW, x0 >= 0 ? 0 : (-x0 + SX - 1) / SX);   /* the first ox with ix >= 0 */
        for (; ox < lo; ++ox) ST(col, out + ox, 0.0f);
        for (; ox + 8 <= OW && ox * SX + x0 + 8 * SX <= W; ox += 8) {
            const __global f8_u* p = (const __global f8_u*)(X + in + ox * SX + x0);
            *(__global f8_u*)(col + out + ox) = SX == 1 ? p[0] : (float8)(p[0].s0246, p[1].s0246);
        }
    }
#endif
    for (; ox < OW; ++ox) {
        const int ix = ox * SX + x0;
        ST(col, out + ox, (ix >= 0 && ix < W) ? LD(X, in + ix) : 0.0f);
    }
}
