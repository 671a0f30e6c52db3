/* C[m][n] = epilogue(sum_k A[m][k] * B[k][n]): the GPU GEMM family (work-group tiles,
 * optional local-memory staging, per-work-item register blocks).
 *
 * Arguments are yc_gemm's (cl/gemm.cl), so the same binding code drives both families:
 *   A  weights, stored once at load time TRANSPOSED and zero-padded: [G][Kp][Mp] with
 *      Mp = M rounded up to MPAD and Kp = K rounded up to KPAD, so every A tile is in
 *      bounds, 16-byte aligned and read with coalesced vector loads;
 *   B  (k, n) at b_off + b*b_bstride + g*b_gstride + k*ldb + n (im2col workspace or a 1x1
 *      conv's input), or with IMPLICIT the conv input itself (im2col on the fly);
 *   C, R  (m, n) at off + b*bstride + (g*M + m)*ldc + n: a conv can write into a concat slice.
 * Epilogue: + bias (unless NO_BIAS), ACT, [+ R, ACT2], store (float or half).
 *
 * Defines (the tuner's search space; engine/kernels/gemm_local.py enumerates legal sets):
 *   MWG NWG KWG    work-group tile: rows of C, columns of C, k-slice per iteration
 *   MDIMC NDIMC    work-group shape (gty, gtx); each work-item owns MWI x NWI = (MWG/MDIMC) x (NWG/NDIMC)
 *   SA SB          stage the A / B tile in local memory (1) or read it straight from global (0)
 *   VWA VWB        vector width of the global loads that fill the A / B tile
 *   VA VB          vector width of the register-fragment reads; a work-item's columns are
 *                  VB-wide chunks NDIMC chunks apart, so neighbouring work-items read
 *                  neighbouring words (no bank conflicts, coalesced stores)
 *   PF             prefetch the next tile into registers while computing this one
 *   SK             split K over SK work-groups per tile (more work-groups for small M x N); each
 *                  writes raw partial sums to P = (float*)C as [SK][Z][M][N] and yc_gemm_splitk
 *                  (same program) sums them and applies the epilogue
 *   CHECK_M CHECK_N CHECK_K  bounds checks, emitted only for dimensions the tile does not divide
 *   IMPLICIT KS SX SY PAD DIL  B is gathered from the NCHW input (trailing args H, W, OW)
 *   HALF_MATH      (common.h) tiles, fragments and products in half; each KWG k-slice is summed
 *                  in half (hacc) and then added to the float accumulators, so rounding grows
 *                  with KWG, not with K; the epilogue and split-K partial sums stay float
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
#define KWG 16
#endif
#ifndef MDIMC
#define MDIMC 8
#endif
#ifndef NDIMC
#define NDIMC 8
#endif
#ifndef SA
#define SA 1
#endif
#ifndef SB
#define SB 1
#endif
#ifndef VWA
#define VWA 1
#endif
#ifndef VWB
#define VWB 1
#endif
#ifndef VA
#define VA 1
#endif
#ifndef VB
#define VB 1
#endif
#ifndef PF
#define PF 0
#endif
#ifndef SK
#define SK 1
#endif
#ifndef MPAD
#define MPAD 128
#endif
#ifndef KPAD
#define KPAD 32
#endif

#define MWI (MWG / MDIMC)
#define NWI (NWG / NDIMC)
#define THREADS (MDIMC * NDIMC)
#define ROUND_UP(x, r) ((((x) + (r) - 1) / (r)) * (r))

/* Vector helpers of the arithmetic type, by width (OpenCL has no float1). */
#define YV_1 HREAL
#define YV_2 HREALN(2)
#define YV_4 HREALN(4)
#define YV_8 HREALN(8)
#define VEC(w) CAT(YV_, w)

#if defined(HALF_MATH) && !defined(HALF_EMULATE)
/* Half arithmetic on half storage: loads keep the halves as they are. */
#define GLOAD_1(p, o) ((p)[o])
#define GLOAD_2(p, o) vload2(0, (p) + (o))
#define GLOAD_4(p, o) vload4(0, (p) + (o))
#define GLOAD_8(p, o) vload8(0, (p) + (o))
#define ULOAD_2(p, o) vload2(0, (p) + (o))
#define ULOAD_4(p, o) vload4(0, (p) + (o))
#define ULOAD_8(p, o) vload8(0, (p) + (o))
#elif defined(HALF_STORAGE)
#define GLOAD_1(p, o) vload_half(0, (p) + (o))
#define GLOAD_2(p, o) vload_half2(0, (p) + (o))
#define GLOAD_4(p, o) vload_half4(0, (p) + (o))
#define GLOAD_8(p, o) vload_half8(0, (p) + (o))
#define ULOAD_2(p, o) vload_half2(0, (p) + (o))
#define ULOAD_4(p, o) vload_half4(0, (p) + (o))
#define ULOAD_8(p, o) vload_half8(0, (p) + (o))
#else
/* Aligned loads: the padded A layout guarantees alignment, so a typed load is legal. */
#define GLOAD_1(p, o) ((p)[o])
#define GLOAD_2(p, o) (*(__global const float2*)((p) + (o)))
#define GLOAD_4(p, o) (*(__global const float4*)((p) + (o)))
#define GLOAD_8(p, o) (*(__global const float8*)((p) + (o)))
#define ULOAD_2(p, o) vload2(0, (p) + (o))
#define ULOAD_4(p, o) vload4(0, (p) + (o))
#define ULOAD_8(p, o) vload8(0, (p) + (o))
#endif
#define ULOAD_1(p, o) HLD(p, o)
#define GLOAD(w, p, o) CAT(GLOAD_, w)(p, o)
#define ULOAD(w, p, o) CAT(ULOAD_, w)(p, o)

/* Scatter a vector into an hreal array (private or local) at element i. */
#define VSTORE_1(v, p, i) ((p)[i] = (v))
#define VSTORE_2(v, p, i) vstore2((v), 0, (p) + (i))
#define VSTORE_4(v, p, i) vstore4((v), 0, (p) + (i))
#define VSTORE_8(v, p, i) vstore8((v), 0, (p) + (i))
#define VSTORE(w, v, p, i) CAT(VSTORE_, w)(v, p, i)

#if SA
#define LA_PER ((KWG * MWG / VWA) / THREADS)      /* A vectors each work-item loads per tile */
#endif
#if SB
#define LB_PER ((KWG * NWG / VWB) / THREADS)      /* B vectors each work-item loads per tile */
#endif

/* The multiply-add of the register block into HACC: the float accumulators, or with HALF_MATH
 * the k-slice's half sums (one rounding to half per step when emulated). */
#ifdef HALF_MATH
#define HACC hacc
#else
#define HACC acc
#endif
#define HMAC(a, b, c) HROUND(fma((a), (b), (c)))

__kernel __attribute__((reqd_work_group_size(NDIMC, MDIMC, 1)))
void yc_gemm_local(YC_GEMM_PARAMS)
{
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int tid = ty * NDIMC + tx;
    const int n0 = get_group_id(0) * NWG, m0 = get_group_id(1) * MWG;
    YC_K_SPLIT(z, ks, kbeg, kend)
    const int b = z / G, g = z - b * G;
    const int Mp = ROUND_UP(M, MPAD), Kp = ROUND_UP(K, KPAD);
    const __global dtype* Ag = A + (size_t)g * Kp * Mp + m0;
    const __global dtype* Bg = B + b_off + (size_t)b * b_bstride + (size_t)g * b_gstride;

#if SA
    __local VEC(VA) As[KWG * MWG / VA];
    __local hreal* Asf = (__local hreal*)As;
    hreal ra[LA_PER * VWA];
#endif
#if SB
    __local VEC(VB) Bs[KWG * NWG / VB];
    __local hreal* Bsf = (__local hreal*)Bs;
    hreal rb[LB_PER * VWB];
#ifdef IMPLICIT
    /* Each work-item always loads the same tile column (THREADS % NWG == 0): find its pixel once. */
    const int nn = n0 + tid % NWG;
    const bool nvalid = nn < N;
    const int oy = nn / OW, ox = nn - (nn / OW) * OW;
    const int iy0 = oy * SY - PAD, ix0 = ox * SX - PAD;
#endif
#endif

    float acc[MWI * NWI];
    #pragma unroll
    for (int i = 0; i < MWI * NWI; ++i) acc[i] = 0.0f;
#ifdef HALF_MATH
    hreal hacc[MWI * NWI];
    #pragma unroll
    for (int i = 0; i < MWI * NWI; ++i) hacc[i] = (hreal)0.0f;
#endif

/* Global -> registers for the tile starting at k-offset kt. */
#if SA
#define LOAD_A(kt)                                                                      \
    for (int p = 0; p < LA_PER; ++p) {                                                  \
        const int v = tid + p * THREADS;                                                \
        const int r = v / (MWG / VWA), c = v - r * (MWG / VWA);                         \
        VSTORE(VWA, GLOAD(VWA, Ag, (size_t)((kt) + r) * Mp + c * VWA), ra, p * VWA);    \
    }
#else
#define LOAD_A(kt)
#endif

#if SB && defined(IMPLICIT)
#define LOAD_B(kt)                                                                      \
    for (int p = 0; p < LB_PER; ++p) {                                                  \
        const int k = (kt) + tid / NWG + p * (THREADS / NWG);                           \
        const int c = k / (KS * KS), rr = k - c * (KS * KS);                            \
        const int ky = rr / KS, kx = rr - ky * KS;                                      \
        const int iy = iy0 + ky * DIL, ix = ix0 + kx * DIL;                             \
        const bool ok = nvalid && k < K && iy >= 0 && iy < H && ix >= 0 && ix < W;     \
        rb[p] = ok ? HLD(Bg, (size_t)(c * H + iy) * W + ix) : (hreal)0.0f;              \
    }
#elif SB
#ifdef CHECK_K
#define K_OK(k) ((k) < K)
#define K_CLAMP(k) min((k), K - 1)
#else
#define K_OK(k) true
#define K_CLAMP(k) (k)
#endif
#ifdef CHECK_N
#define N_CLAMP(n) min((n), N - VWB)
#else
#define N_CLAMP(n) (n)
#endif
#define LOAD_B(kt)                                                                      \
    for (int p = 0; p < LB_PER; ++p) {                                                  \
        const int v = tid + p * THREADS;                                                \
        const int r = v / (NWG / VWB), c = v - r * (NWG / VWB);                         \
        const int k = (kt) + r;                                                         \
        VEC(VWB) x = ULOAD(VWB, Bg, (size_t)K_CLAMP(k) * ldb + N_CLAMP(n0 + c * VWB));  \
        VSTORE(VWB, K_OK(k) ? x : (VEC(VWB))(0.0f), rb, p * VWB);                       \
    }
#else
#define LOAD_B(kt)
#endif

/* Registers -> local memory. */
#if SA
#define STORE_A()                                                                       \
    for (int p = 0; p < LA_PER; ++p) {                                                  \
        const int v = tid + p * THREADS;                                                \
        const int r = v / (MWG / VWA), c = v - r * (MWG / VWA);                         \
        for (int e = 0; e < VWA; ++e) Asf[r * MWG + c * VWA + e] = ra[p * VWA + e];     \
    }
#else
#define STORE_A()
#endif
#if SB && defined(IMPLICIT)
#define STORE_B()                                                                       \
    for (int p = 0; p < LB_PER; ++p)                                                    \
        Bsf[(tid / NWG + p * (THREADS / NWG)) * NWG + tid % NWG] = rb[p];
#elif SB
#define STORE_B()                                                                       \
    for (int p = 0; p < LB_PER; ++p) {                                                  \
        const int v = tid + p * THREADS;                                                \
        const int r = v / (NWG / VWB), c = v - r * (NWG / VWB);                         \
        for (int e = 0; e < VWB; ++e) Bsf[r * NWG + c * VWB + e] = rb[p * VWB + e];     \
    }
#else
#define STORE_B()
#endif

#if PF
    LOAD_A(kbeg)
    LOAD_B(kbeg)
#endif
    for (int k0 = kbeg; k0 < kend; k0 += KWG) {
#if SA || SB
#if !PF
        LOAD_A(k0)
        LOAD_B(k0)
#endif
        STORE_A()
        STORE_B()
        barrier(CLK_LOCAL_MEM_FENCE);
#if PF
        if (k0 + KWG < kend) {
            LOAD_A(k0 + KWG)
            LOAD_B(k0 + KWG)
        }
#endif
#endif
        #pragma unroll
        for (int kk = 0; kk < KWG; ++kk) {
            hreal a[MWI], bv[NWI];
#if SA
            #pragma unroll
            for (int i = 0; i < MWI / VA; ++i)
                VSTORE(VA, As[kk * (MWG / VA) + i * MDIMC + ty], a, i * VA);
#else
            #pragma unroll
            for (int i = 0; i < MWI / VA; ++i)
                VSTORE(VA, GLOAD(VA, Ag, (size_t)(k0 + kk) * Mp + (i * MDIMC + ty) * VA), a, i * VA);
#endif
#if SB
            #pragma unroll
            for (int j = 0; j < NWI / VB; ++j)
                VSTORE(VB, Bs[kk * (NWG / VB) + j * NDIMC + tx], bv, j * VB);
#else
            {
                const int k = k0 + kk;
#ifdef CHECK_K
                const bool kin = k < K;
                const int kc = min(k, K - 1);
#else
                const bool kin = true;
                const int kc = k;
#endif
                #pragma unroll
                for (int j = 0; j < NWI; ++j) {
                    const int n = n0 + ((j / VB) * NDIMC + tx) * VB + j % VB;
#ifdef CHECK_N
                    const hreal x = HLD(Bg, (size_t)kc * ldb + min(n, N - 1));
#else
                    const hreal x = HLD(Bg, (size_t)kc * ldb + n);
#endif
                    bv[j] = kin ? x : (hreal)0.0f;
                }
            }
#endif
            #pragma unroll
            for (int i = 0; i < MWI; ++i)
                #pragma unroll
                for (int j = 0; j < NWI; ++j)
                    HACC[i * NWI + j] = HMAC(a[i], bv[j], HACC[i * NWI + j]);
        }
#ifdef HALF_MATH
        #pragma unroll
        for (int i = 0; i < MWI * NWI; ++i) {
            acc[i] += (float)hacc[i];
            hacc[i] = (hreal)0.0f;
        }
#endif
#if SA || SB
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }

#if SK > 1
    /* Raw partial sums of this K split; yc_gemm_splitk adds the splits and runs the epilogue. */
    __global float* P = (__global float*)C + ((size_t)ks * (get_global_size(2) / SK) + z) * M * N;
#define STORE_C(v, m, n) (P[(size_t)(m) * N + (n)] = (v))
#else
    /* Epilogue: bias, activation, optional residual add + ACT2, store. */
    YC_EPILOGUE_BASES(b)
#define STORE_C(v, m, n) yc_gemm_store((v), (m), (n), g, M, ldc, bias, C, cb, R, rbase)
#endif
    #pragma unroll
    for (int i = 0; i < MWI; ++i) {
        const int m = m0 + ((i / VA) * MDIMC + ty) * VA + i % VA;
#ifdef CHECK_M
        if (m >= M) continue;
#endif
        #pragma unroll
        for (int j = 0; j < NWI; ++j) {
            const int n = n0 + ((j / VB) * NDIMC + tx) * VB + j % VB;
#ifdef CHECK_N
            if (n >= N) continue;
#endif
            STORE_C(acc[i * NWI + j], m, n);
        }
    }
}

#if SK > 1
/* Element n of row m of matrix z: the sum of its SK partial planes, in split order. */
inline float yc_split_sum(__global const float* restrict P, const int z, const int Z, const int m, const int M,
                          const int N, const int n)
{
    float acc = 0.0f;
    for (int s = 0; s < SK; ++s) acc += P[((size_t)(s * Z + z) * M + m) * N + n];
    return acc;
}

/* Sum the SK partial planes of yc_gemm_local (or yc_gemm_mma) and apply the epilogue. P is
 * [SK][Z][M][N] (Z = batch * groups); global size (N rounded up, M, Z). With SUM_POOL the conv
 * writes through the [maxpool] that alone reads it (graph.mark_write_fusions): C is the pooled map
 * (SUM_PW wide, ldc pixels; the global size covers them), and each of its pixels is the max over
 * its window of the conv's SUM_OW x SUM_OH output, computed here from the sums, with
 * yc_maxpool_rows' window, bounds and order. */
__kernel void yc_gemm_splitk(__global const float* restrict P, __global const float* restrict bias,
                             __global dtype* restrict C, const int c_off, const int c_bstride, const int ldc,
                             __global const dtype* restrict R, const int r_off, const int r_bstride,
                             const int M, const int N, const int G)
{
    const int n = get_global_id(0), m = get_global_id(1), z = get_global_id(2);
    const int Z = get_global_size(2), b = z / G, g = z - b * G;
#ifdef SUM_POOL
    if (n >= ldc) return;
    const int py = n / SUM_PW, px = n - py * SUM_PW;
    const int y0 = py * MP_SY - MP_PAD, x0 = px * MP_SX - MP_PAD;
    float mx = -FLT_MAX;
    for (int dy = 0; dy < MP_SIZE; ++dy) {
        const int iy = y0 + dy;
        if (iy < 0 || iy >= SUM_OH)
            continue;
        for (int dx = 0; dx < MP_SIZE; ++dx) {
            const int ix = x0 + dx;
            if (ix >= 0 && ix < SUM_OW) {
                const float v = yc_gemm_value(yc_split_sum(P, z, Z, m, M, N, iy * SUM_OW + ix), m, g, M, bias);
                mx = v > mx ? v : mx;
            }
        }
    }
    ST(C, (size_t)c_off + (size_t)b * c_bstride + (size_t)(g * M + m) * ldc + n, mx);
#else
    if (n >= N) return;
    yc_gemm_store(yc_split_sum(P, z, Z, m, M, N, n), m, n, g, M, ldc, bias, C, (size_t)c_off + (size_t)b * c_bstride,
                  R, (size_t)r_off + (size_t)b * r_bstride);
#endif
}
#endif
