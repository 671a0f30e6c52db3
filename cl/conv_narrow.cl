/* The narrow family's direct conv (engine/kernels/narrow.py). Defines: CIN, KS, SX, SY, PAD, DIL
 * (the conv), FPW (filters per work-group), WG (work-items per work-group), PX (pixels a work-item
 * sums in registers, or 0: sums through local memory), and the GEMM epilogue's. */
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

#if PX == 0
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
#if defined(NHWC_OUT) && NHWC_OUT == FPW && !defined(RESIDUAL) && !defined(UP_S)
#define NARROW_VECTOR_STORE 1
#define EP16 (16 / (int)sizeof(dtype))     /* elements of a 16-byte store */
#else
#define NARROW_VECTOR_STORE 0
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
