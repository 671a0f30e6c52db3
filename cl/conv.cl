/* Convolution building blocks: im2col and the depthwise direct kernel.
 * Tensors are NCHW; a "view" is (buffer, element offset, batch stride).
 */
#include "common.h"

/* col[z][k][n] for z = b*G + g, k = (c, ky, kx), n = (oy, ox). */
__kernel void yc_im2col(__global const dtype* restrict X, const int x_off, const int x_bstride,
                        const int CG, const int H, const int W,
                        __global dtype* restrict col, const int OH, const int OW,
                        const int KS, const int SX, const int SY, const int PAD, const int DIL, const int G)
{
    const int n = get_global_id(0), k = get_global_id(1), z = get_global_id(2);
    const int N = OH * OW, K = CG * KS * KS;
    const int b = z / G, g = z - b * G;
    const int c = k / (KS * KS), r = k - c * KS * KS;
    const int ky = r / KS, kx = r - ky * KS;
    const int oy = n / OW, ox = n - oy * OW;
    const int iy = oy * SY - PAD + ky * DIL, ix = ox * SX - PAD + kx * DIL;
    float v = 0.0f;
    if (iy >= 0 && iy < H && ix >= 0 && ix < W)
        v = LD(X, x_off + b * x_bstride + (g * CG + c) * H * W + iy * W + ix);
    ST(col, (size_t)z * K * N + (size_t)k * N + n, v);
}

/* Y[y_off + (b * HW + p) * CP + c] = X[b][c][p]: a conv's input planes as pixels of CP >= C channels
 * (NCHW -> NHWC, channels C .. CP - 1 zero), for the wgmma family's nhwc convs, whose B rows then
 * are 16-byte runs of channels (CP: C rounded up to 8). 32 x 32 tiles through local memory, read
 * along p and written along c. Grid (p rounded up to 32, 8 per 32 of CP, images), work-groups of
 * 32 x 8. */
__kernel __attribute__((reqd_work_group_size(32, 8, 1)))
void yc_nchw_to_nhwc(__global const dtype* restrict X, const int x_off, const int x_bstride,
                     const int C, const int HW, __global dtype* restrict Y, const int y_off, const int CP)
{
    __local float t[32][33];
    const int lx = get_local_id(0), ly = get_local_id(1), b = get_global_id(2);
    const int p0 = get_group_id(0) * 32, c0 = get_group_id(1) * 32;
    for (int i = ly; i < 32; i += 8)
        if (c0 + i < C && p0 + lx < HW)
            t[i][lx] = LD(X, x_off + (size_t)b * x_bstride + (size_t)(c0 + i) * HW + p0 + lx);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = ly; i < 32; i += 8)
        if (p0 + i < HW && c0 + lx < CP)
            ST(Y, y_off + ((size_t)b * HW + p0 + i) * CP + c0 + lx, c0 + lx < C ? t[lx][i] : 0.0f);
}

/* Depthwise conv (groups == channels == filters): one output element per work-item.
 * Weights W[c][KS][KS] (float), fused bias, activation and optional residual add. */
__kernel void yc_depthwise(__global const dtype* restrict X, const int x_off, const int x_bstride,
                           const int H, const int W,
                           __global const float* restrict Wt, __global const float* restrict bias,
                           __global dtype* restrict Y, const int y_off, const int y_bstride,
                           __global const dtype* restrict R, const int r_off, const int r_bstride,
                           const int OH, const int OW, const int KS, const int SX, const int SY,
                           const int PAD, const int DIL)
{
    const int n = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    if (n >= OH * OW) return;
    const int oy = n / OW, ox = n - oy * OW;
    const int base = x_off + b * x_bstride + c * H * W;
    float acc = 0.0f;
    for (int ky = 0; ky < KS; ++ky) {
        const int iy = oy * SY - PAD + ky * DIL;
        if (iy < 0 || iy >= H) continue;
        for (int kx = 0; kx < KS; ++kx) {
            const int ix = ox * SX - PAD + kx * DIL;
            if (ix < 0 || ix >= W) continue;
            acc = fma(Wt[(c * KS + ky) * KS + kx], LD(X, base + iy * W + ix), acc);
        }
    }
    float v = yc_activate(acc + bias[c], ACT);
#ifdef RESIDUAL
    v = yc_activate(v + LD(R, r_off + b * r_bstride + c * OH * OW + n), ACT2);
#endif
    ST(Y, y_off + b * y_bstride + c * OH * OW + n, v);
}
