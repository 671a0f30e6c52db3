/* Winograd F(m x m, 3x3) for 3x3 stride-1 convolutions (m = WINO_M: 2 or 4).
 *
 * Three steps; the middle one is the generated GEMM (cl/gemm_local.cl) batched over the
 * T2 = (m+2)^2 transform points, with weights transformed once at load time (U = G g G^T):
 *   yc_wino_input   V[b][xi][c][p] = (B^T d B)[xi] for each m x m output tile p of channel c
 *   GEMM            Mt[b][xi][f][p] = sum_c U[xi][f][c] * V[b][xi][c][p]
 *   yc_wino_output  Y = A^T Mt A per tile, fused with the conv epilogue (bias, ACT, residual + ACT2),
 *                   written into the output view (which may be a concat slice).
 * Matrices are Lavin & Gray's. Tiles are numbered row-major over a TH x TW grid.
 */
#include "common.h"

#ifndef WINO_M
#define WINO_M 2
#endif
#define WT (WINO_M + 2)
#define T2 (WT * WT)

/* A tile row as a vector: WVEC, its activation yc_act_w, and WROW(p, i) = p[i .. i+WINO_M). */
#if WINO_M == 2
#define WVEC float2
#define WROW(p, i) ((float2)((p)[i], (p)[(i) + 1]))
YC_DEFINE_ACTIVATE_VEC(yc_act_w, float2, as_int2, as_float2)
#else
#define WVEC float4
#define WROW(p, i) ((float4)((p)[i], (p)[(i) + 1], (p)[(i) + 2], (p)[(i) + 3]))
YC_DEFINE_ACTIVATE_VEC(yc_act_w, float4, as_int4, as_float4)
#endif

/* out = B^T in, over WT elements spaced `s` apart. */
inline void yc_bt(const float* in, const int s, float* out, const int so)
{
#if WINO_M == 2
    out[0 * so] = in[0] - in[2 * s];
    out[1 * so] = in[s] + in[2 * s];
    out[2 * so] = in[2 * s] - in[s];
    out[3 * so] = in[s] - in[3 * s];
#else
    const float d0 = in[0], d1 = in[s], d2 = in[2 * s], d3 = in[3 * s], d4 = in[4 * s], d5 = in[5 * s];
    out[0 * so] = 4.0f * d0 - 5.0f * d2 + d4;
    out[1 * so] = -4.0f * (d1 + d2) + d3 + d4;
    out[2 * so] = 4.0f * (d1 - d2) - d3 + d4;
    out[3 * so] = 2.0f * (d3 - d1) - d2 + d4;
    out[4 * so] = 2.0f * (d1 - d3) - d2 + d4;
    out[5 * so] = 4.0f * d1 - 5.0f * d3 + d5;
#endif
}

/* out = A^T in: WT elements spaced `s` apart -> WINO_M elements spaced `so` apart. */
inline void yc_at(const float* in, const int s, float* out, const int so)
{
#if WINO_M == 2
    out[0] = in[0] + in[s] + in[2 * s];
    out[so] = in[s] - in[2 * s] - in[3 * s];
#else
    const float m0 = in[0], m1 = in[s], m2 = in[2 * s], m3 = in[3 * s], m4 = in[4 * s], m5 = in[5 * s];
    const float a = m1 + m2, b = m1 - m2, c = m3 + m4, d = m3 - m4;
    out[0] = m0 + a + c;
    out[so] = b + 2.0f * d;
    out[2 * so] = a + 4.0f * c;
    out[3 * so] = b + 8.0f * d + m5;
#endif
}

/* The tail of every input transform: u = B^T d B for the WT x WT input tile d, stored as T2
 * planes of C x P (element xi of the tile at base + xi * C * P). */
inline void yc_wino_tile_store(const float* d, __global dtype* restrict V, const size_t base, const int C,
                               const int P)
{
    float t[T2], u[T2];
    #pragma unroll
    for (int j = 0; j < WT; ++j) yc_bt(d + j, WT, t + j, WT);        /* columns: t = B^T d */
    #pragma unroll
    for (int i = 0; i < WT; ++i) yc_bt(t + i * WT, 1, u + i * WT, 1); /* rows: u = t B */
    #pragma unroll
    for (int xi = 0; xi < T2; ++xi) ST(V, base + (size_t)xi * C * P, u[xi]);
}

/* d[i * WT + j] = EXPR, the input at pixel (y, x) of the WT x WT tile whose corner is (y0, x0),
 * or 0 outside the H x W input (the conv's zero padding). */
#define YC_WINO_GATHER(d, y0, x0, H, W, EXPR)                                                    \
    _Pragma("unroll") for (int i = 0; i < WT; ++i) {                                             \
        const int y = (y0) + i;                                                                  \
        _Pragma("unroll") for (int j = 0; j < WT; ++j) {                                         \
            const int x = (x0) + j;                                                              \
            d[i * WT + j] = (y >= 0 && y < (H) && x >= 0 && x < (W)) ? (EXPR) : 0.0f;            \
        }                                                                                        \
    }

/* Global size (P, C, batch): one work-item per (tile, channel, image). */
__kernel void yc_wino_input(__global const dtype* restrict X, const int x_off, const int x_bstride,
                            const int C, const int H, const int W,
                            __global dtype* restrict V, const int v_off, const int TW, const int P, const int PAD)
{
    const int p = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    if (p >= P) return;
    const int ty = p / TW, tx = p - ty * TW;
    const int y0 = ty * WINO_M - PAD, x0 = tx * WINO_M - PAD;
    const __global dtype* Xc = X + x_off + (size_t)b * x_bstride + (size_t)c * H * W;
    float d[T2];
    YC_WINO_GATHER(d, y0, x0, H, W, LD(Xc, y * W + x))
    yc_wino_tile_store(d, V, (size_t)v_off + ((size_t)b * T2 * C + c) * P + p, C, P);
}

/* Global size (P, F, batch): one work-item per (tile, filter, image). */
__kernel void yc_wino_output(__global const dtype* restrict Mt, const int m_off, const int F, const int P,
                             const int TW, __global const float* restrict bias,
                             __global dtype* restrict Y, const int y_off, const int y_bstride,
                             const int OH, const int OW,
                             __global const dtype* restrict R, const int r_off, const int r_bstride)
{
    const int p = get_global_id(0), f = get_global_id(1), b = get_global_id(2);
    if (p >= P) return;
    const int ty = p / TW, tx = p - ty * TW;
    const size_t base = (size_t)m_off + ((size_t)b * T2 * F + f) * P + p;
    float m[T2], t[WINO_M * WT], y[WINO_M * WINO_M];
    #pragma unroll
    for (int xi = 0; xi < T2; ++xi) m[xi] = LD(Mt, base + (size_t)xi * F * P);
    #pragma unroll
    for (int j = 0; j < WT; ++j) yc_at(m + j, WT, t + j, WT);            /* columns: t = A^T m */
    #pragma unroll
    for (int i = 0; i < WINO_M; ++i) yc_at(t + i * WT, 1, y + i * WINO_M, 1); /* rows: y = t A */
    const size_t yb = (size_t)y_off + (size_t)b * y_bstride;
#ifdef RESIDUAL
    const size_t rb = (size_t)r_off + (size_t)b * r_bstride;
#endif
    /* The epilogue a tile row at a time, as one WINO_M-wide vector (the activation vectorises). */
    #pragma unroll
    for (int i = 0; i < WINO_M; ++i) {
        const int oy = ty * WINO_M + i;
        if (oy >= OH) break;
        const size_t pix = (size_t)f * OH * OW + (size_t)oy * OW + tx * WINO_M;
        WVEC v = yc_act_w(WROW(y, i * WINO_M) + (WVEC)(bias[f]), ACT);
#ifdef RESIDUAL
        float r[WINO_M];
        #pragma unroll
        for (int j = 0; j < WINO_M; ++j) r[j] = tx * WINO_M + j < OW ? LD(R, rb + pix + j) : 0.0f;
        v = yc_act_w(v + WROW(r, 0), ACT2);
#endif
        #pragma unroll
        for (int j = 0; j < WINO_M; ++j)
            if (tx * WINO_M + j < OW) ST(Y, yb + pix + j, v[j]);
    }
}
