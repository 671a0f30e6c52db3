/* The narrow family's direct conv (engine/kernels/narrow.py). Defines: CIN, KS, SX, SY, PAD, DIL
 * (the conv), FPW (filters per work-group), WG (work-items per work-group), PX (pixels a work-item
 * sums in registers, or 0: sums through local memory), TC and NB (tensor cores; blocks of 8 pixels a
 * warp), and the GEMM epilogue's. */
#include "gemm_epilogue.h"

#define NARROW_K (CIN * KS * KS)
#define NARROW_KP ((NARROW_K + 3) / 4 * 4)      /* k padded to whole float4s */

/* A conv of a narrow input (CIN <= 4 channels: a network's RGB input) computed directly, where a
 * GEMM's k-tiles (K = 27) would be mostly padding and its gather the bottleneck. A work-group
 * computes WG output pixels of image b for filters m0 .. m0 + FPW - 1: the filters' weights (k =
 * (c, ky, kx), as stored) go to local memory once, each work-item reads its pixel's CIN x KS x KS
 * window into registers (zeros in the padding) and sums each filter four weights a local load;
 * the raw sums then leave through local memory in the output's order -- a pixel's filters side by
 * side where it is stored channels-last (NHWC_OUT), a filter's pixels side by side in planes -- so
 * neighbouring work-items store neighbouring elements, each through the GEMM families' epilogue.
 * The GEMM families' arguments (B: the input view; ldb, b_gstride and G unused), then the input's
 * H, W and the output's OW. Grid (N rounded up to WG, filters / FPW rounded up, images). */
#ifndef PX
#define PX 0
#endif

/* Output pixel n's CIN x KS x KS window of the input X into x[0 .. NARROW_K), k = (c, ky, kx) as
 * the weights are stored (zeros in the padding, and for n past N). */
inline void yc_narrow_window(float* x, const __global dtype* X, const int n, const int N, const int H, const int W,
                             const int OW)
{
    const int oy = n / OW, ox = n - oy * OW;
#pragma unroll
    for (int c = 0; c < CIN; ++c)
#pragma unroll
        for (int ky = 0; ky < KS; ++ky) {
            const int iy = oy * SY - PAD + ky * DIL;
#pragma unroll
            for (int kx = 0; kx < KS; ++kx) {
                const int ix = ox * SX - PAD + kx * DIL;
                x[(c * KS + ky) * KS + kx] = n < N && iy >= 0 && iy < H && ix >= 0 && ix < W
                                             ? LD(X, (c * H + iy) * W + ix) : 0.0f;
            }
        }
}

#ifndef TC
#define TC 0
#endif
/* Where the output is stored channels-last and a work-group has every filter (FPW = M = NHWC_OUT,
 * no shortcut or upsample), a pixel's channels are contiguous: they can leave as 16-byte stores. */
#if defined(NHWC_OUT) && NHWC_OUT == FPW && !defined(RESIDUAL) && !defined(UP_S)
#define NARROW_VECTOR_STORE 1
#define EP16 (16 / (int)sizeof(dtype))     /* elements of a 16-byte store */
#else
#define NARROW_VECTOR_STORE 0
#endif
#if TC
/* With TC 1 (f16 tensor cores: HALF_STORAGE, MMA_F16) the sums are mma.sync products: A the
 * work-group's FPW filters' weights (k padded to 16 with zeros), read once into local memory and
 * held in registers as mma fragments for the whole launch; B the windows of 8 output pixels,
 * gathered straight from the input into fragment registers, each work-item its 4 k of its pixel
 * per 16 of k (no FMAs: a window of 27 is 2 k-steps, 32 filters 2 M-tiles, so 4 mma instructions
 * for 8 pixels' 864 sums each). A warp takes NB blocks of 8 consecutive pixels in turn; a
 * work-group WG / 32 warps. A work-item holds filters g, g + 8 of each 16 for pixels 2t, 2t + 1 of
 * a block: where the output is channels-last with every filter in the work-group, the block's sums
 * are staged in local memory and leave as coalesced 16-byte stores (16-byte stores a pixel apart
 * took 2.9x the time of coalesced ones on an H200), else each through the GEMM epilogue. Grid (N over
 * 8 NB WG / 32 pixels a work-group, in WG work-items; filters / FPW; images). */
#include "mma.h"
#if FPW % 16 || !defined(HALF_STORAGE) || !defined(MMA_F16)
#error "TC: FPW a multiple of 16, half storage, MMA_F16"
#endif
#define NARROW_STEPS ((NARROW_K + 15) / 16)      /* k-steps of 16 */
#define NARROW_MT (FPW / 16)                      /* M-tiles of 16 filters */
#define NARROW_WARPS (WG / 32)

/* The half bits of input element k of pixel (iy0, ix0)'s window (its top-left tap), 0 outside the
 * input, past K or for a pixel past N. */
inline uint yc_narrow_tap(const __global ushort* X, const int k, const bool live, const int iy0, const int ix0,
                          const int H, const int W)
{
    const int c = k / (KS * KS), r = k - c * KS * KS, ky = r / KS, kx = r - ky * KS;
    const int iy = iy0 + ky * DIL, ix = ix0 + kx * DIL;
    return live && k < NARROW_K && iy >= 0 && iy < H && ix >= 0 && ix < W ? X[(c * H + iy) * W + ix] : 0u;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void yc_conv_narrow(YC_GEMM_PARAMS, const int H, const int W, const int OW)
{
    const int tid = get_local_id(0), warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
#ifdef MMA_EMULATE
    __local uint xchg[NARROW_WARPS * 32 * 6];
    __local uint* xch = xchg + warp * 32 * 6;
#endif
    const int m0 = get_group_id(1) * FPW, b = get_group_id(2);
    /* The work-group's weights once into local memory as [filter][k-word] (two halves a word, the
     * lower k low, zeros past M and K), then each work-item's A fragments from there: a[i][s] holds
     * filters m0 + 16i + g (words 0, 2) and + 8 (1, 3) at k = 16s + 2t, + 1 (words 0, 1) and + 8,
     * + 9 (2, 3), the m16n8k16 layout */
#define NARROW_KW (NARROW_STEPS * 8)              /* k-words of a filter */
    __local uint aw[FPW * NARROW_KW];
    const __global ushort* Ah = (const __global ushort*)A;
    for (int e = tid; e < FPW * NARROW_KW; e += WG) {
        const int j = e / NARROW_KW, k = 2 * (e - j * NARROW_KW), m = m0 + j;
        const uint lo = m < M && k < NARROW_K ? Ah[m * NARROW_K + k] : 0u;
        const uint hi = m < M && k + 1 < NARROW_K ? Ah[m * NARROW_K + k + 1] : 0u;
        aw[e] = lo | (hi << 16);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    uint a[NARROW_MT][NARROW_STEPS][4];
#pragma unroll
    for (int i = 0; i < NARROW_MT; ++i)
#pragma unroll
        for (int s = 0; s < NARROW_STEPS; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q)
                a[i][s][q] = aw[(16 * i + g + 8 * (q & 1)) * NARROW_KW + 8 * s + t + 4 * (q >> 1)];
    const __global ushort* X = (const __global ushort*)(B + b_off + (size_t)b * b_bstride);
    YC_EPILOGUE_BASES(b)
#if NARROW_VECTOR_STORE
    /* A block's 8 pixels x FPW channels are one contiguous run of the output: staged here as
     * half, then stored by the warp as 16-byte chunks side by side (coalesced; a pixel's channels
     * straight from the fragments would be 2-byte stores scattered over 8 pixels). */
    __local uint4 staged[NARROW_WARPS * FPW];
    __local half* mine = (__local half*)(staged + warp * FPW);
    const bool vec = M == FPW && cb % EP16 == 0;         /* the same for the whole work-group */
#endif
    const int n_first = (get_group_id(0) * NARROW_WARPS + warp) * NB * 8;
    for (int blk = 0; blk < NB; ++blk) {
        const int nb = n_first + blk * 8, n = nb + g;          /* this work-item's B column: pixel n */
        const int oy = n / OW, ox = n - oy * OW, iy0 = oy * SY - PAD, ix0 = ox * SX - PAD;
        uint bf[NARROW_STEPS][2];                             /* k = 16s + 2t, + 1 and + 8, + 9 */
#pragma unroll
        for (int s = 0; s < NARROW_STEPS; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int k = 16 * s + 2 * t + 8 * h;
                bf[s][h] = yc_narrow_tap(X, k, n < N, iy0, ix0, H, W)
                           | (yc_narrow_tap(X, k + 1, n < N, iy0, ix0, H, W) << 16);
            }
        float acc[NARROW_MT][4];
#pragma unroll
        for (int i = 0; i < NARROW_MT; ++i) {
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][q] = 0.0f;
#pragma unroll
            for (int s = 0; s < NARROW_STEPS; ++s)
                MMA(acc[i], a[i][s], bf[s]);
        }
#if NARROW_VECTOR_STORE
        if (vec) {
#pragma unroll
            for (int i = 0; i < NARROW_MT; ++i)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int m = 16 * i + g + 8 * (q >> 1);
                    vstore_half(yc_gemm_value(acc[i][q], m, 0, M, bias), (2 * t + (q & 1)) * FPW + m, mine);
                }
            barrier(CLK_LOCAL_MEM_FENCE);
            const int p = nb + lane / (FPW / 8);        /* chunk lane: pixel lane / (FPW / 8) of the block */
            if (lane < FPW && p < N)
                *(__global uint4*)(C + cb + (size_t)p * NHWC_OUT + lane % (FPW / 8) * 8) = staged[warp * FPW + lane];
            barrier(CLK_LOCAL_MEM_FENCE);
            continue;
        }
#endif
#pragma unroll
        for (int i = 0; i < NARROW_MT; ++i)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int m = m0 + 16 * i + g + 8 * (q >> 1), nn = nb + 2 * t + (q & 1);
                if (m < M && nn < N)
                    yc_gemm_store(acc[i][q], m, nn, 0, M, ldc, bias, C, cb, R, rbase);
            }
    }
}
#elif PX == 0
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void yc_conv_narrow(YC_GEMM_PARAMS, const int H, const int W, const int OW)
{
    __local float w[FPW * NARROW_KP];
    __local float sums[FPW][WG + 1];
    const int t = get_local_id(0), n0 = get_group_id(0) * WG, m0 = get_group_id(1) * FPW, b = get_group_id(2);
    for (int i = t; i < FPW * NARROW_KP; i += WG) {
        const int j = i / NARROW_KP, k = i - j * NARROW_KP;
        w[i] = m0 + j < M && k < NARROW_K ? LD(A, (m0 + j) * NARROW_K + k) : 0.0f;
    }
    const int n = n0 + t;
    const __global dtype* X = B + b_off + (size_t)b * b_bstride;
    float x[NARROW_KP];
#pragma unroll
    for (int k = NARROW_K; k < NARROW_KP; ++k) x[k] = 0.0f;
    yc_narrow_window(x, X, n, N, H, W, OW);
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int j = 0; j < FPW; ++j) {
        float acc = 0.0f;
#pragma unroll
        for (int k = 0; k < NARROW_KP; k += 4) {
            const float4 wk = vload4(0, w + j * NARROW_KP + k);
            acc = fma(wk.x, x[k], acc);
            acc = fma(wk.y, x[k + 1], acc);
            acc = fma(wk.z, x[k + 2], acc);
            acc = fma(wk.w, x[k + 3], acc);
        }
        sums[j][t] = acc;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    YC_EPILOGUE_BASES(b)
    for (int e = t; e < FPW * WG; e += WG) {
#ifdef NHWC_OUT
        const int p = e / FPW, j = e - p * FPW;
#else
        const int j = e / WG, p = e - j * WG;
#endif
        if (m0 + j < M && n0 + p < N)
            yc_gemm_store(sums[j][p], m0 + j, n0 + p, 0, M, ldc, bias, C, cb, R, rbase);
    }
}
#else
/* With PX (1 or 2) each work-item keeps its PX pixels' (n0 + t + i WG) sums of the FPW filters in
 * registers and stores them itself: no local round trip and no second barrier. The weights sit in
 * local memory as [k][FPW], four filters of one k a float4 load (each feeding 4 PX FMAs). Where
 * the output is stored channels-last and this work-group has every filter (FPW = M = NHWC_OUT, no
 * shortcut or upsample), a pixel's channels are contiguous: they leave as 16-byte stores. Else each
 * sum goes through the epilogue (planes: neighbouring work-items store neighbouring pixels).
 * Grid (N over WG x PX pixels a work-group, rounded up to WG work-items; filters / FPW; images). */
#if FPW % 4
#error "FPW is a multiple of 4"
#endif
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void yc_conv_narrow(YC_GEMM_PARAMS, const int H, const int W, const int OW)
{
    __local float4 w4[NARROW_K * FPW / 4];
    __local float* w = (__local float*)w4;
    const int t = get_local_id(0), n0 = get_group_id(0) * WG * PX, m0 = get_group_id(1) * FPW, b = get_group_id(2);
    for (int i = t; i < FPW * NARROW_K; i += WG) {
        const int k = i / FPW, j = i - k * FPW;
        w[i] = m0 + j < M ? LD(A, (m0 + j) * NARROW_K + k) : 0.0f;
    }
    const __global dtype* X = B + b_off + (size_t)b * b_bstride;
    float x[PX][NARROW_K];
#pragma unroll
    for (int p = 0; p < PX; ++p)
        yc_narrow_window(x[p], X, n0 + t + p * WG, N, H, W, OW);
    barrier(CLK_LOCAL_MEM_FENCE);
    float acc[PX][FPW];
#pragma unroll
    for (int p = 0; p < PX; ++p)
#pragma unroll
        for (int j = 0; j < FPW; ++j) acc[p][j] = 0.0f;
#pragma unroll
    for (int k = 0; k < NARROW_K; ++k)
#pragma unroll
        for (int j = 0; j < FPW; j += 4) {
            const float4 wk = w4[(k * FPW + j) / 4];
#pragma unroll
            for (int p = 0; p < PX; ++p) {
                acc[p][j] = fma(wk.x, x[p][k], acc[p][j]);
                acc[p][j + 1] = fma(wk.y, x[p][k], acc[p][j + 1]);
                acc[p][j + 2] = fma(wk.z, x[p][k], acc[p][j + 2]);
                acc[p][j + 3] = fma(wk.w, x[p][k], acc[p][j + 3]);
            }
        }
    YC_EPILOGUE_BASES(b)
#pragma unroll
    for (int p = 0; p < PX; ++p) {
        const int n = n0 + t + p * WG;
        if (n >= N)
            continue;
#if NARROW_VECTOR_STORE
        const size_t at = cb + (size_t)n * NHWC_OUT;
        if (M == FPW && at % EP16 == 0) {
#pragma unroll
            for (int j = 0; j < FPW; j += EP16) {
                float v[EP16];
#pragma unroll
                for (int e = 0; e < EP16; ++e) v[e] = yc_gemm_value(acc[p][j + e], j + e, 0, M, bias);
#ifdef HALF_STORAGE
                ushort h[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) vstore_half(v[e], e, (__private half*)h);
                *(__global uint4*)(C + at + j) = (uint4)(h[0] | ((uint)h[1] << 16), h[2] | ((uint)h[3] << 16),
                                                         h[4] | ((uint)h[5] << 16), h[6] | ((uint)h[7] << 16));
#else
                *(__global float4*)(C + at + j) = (float4)(v[0], v[1], v[2], v[3]);
#endif
            }
            continue;
        }
#endif
#pragma unroll
        for (int j = 0; j < FPW; ++j)
            if (m0 + j < M)
                yc_gemm_store(acc[p][j], m0 + j, n, 0, M, ldc, bias, C, cb, R, rbase);
    }
}
#endif
