/* The narrow family's direct conv (engine/kernels/narrow.py). Defines: CIN, KS, SX, SY, PAD, DIL
 * (the conv), FPW (filters per work-item), and the GEMM epilogue's. */
#include "gemm_epilogue.h"
/* A conv of a narrow input (CIN <= 4 channels: a network's RGB input) computed directly, where a
 * GEMM's k-tiles (K = 27) would be mostly padding and its gather the bottleneck: each work-item
 * one output pixel n of image b and filters m0 .. m0 + FPW - 1, its CIN x KS x KS window read once
 * into registers (zeros in the padding), A[m][k] (k = (c, ky, kx), as the weights are stored) the
 * same for the whole work-group (broadcast loads), the GEMM families' fused epilogue. The GEMM
 * families' arguments (B: the input view; ldb, b_gstride and G unused), then the input's H, W and
 * the output's OW. Grid (N rounded up to the work-group, filters / FPW rounded up, images). */
#define NARROW_K (CIN * KS * KS)
__kernel void yc_conv_narrow(YC_GEMM_PARAMS, const int H, const int W, const int OW)
{
    const int n = get_global_id(0), m0 = get_global_id(1) * FPW, b = get_global_id(2);
    if (n >= N) return;
    const int oy = n / OW, ox = n - oy * OW;
    const __global dtype* X = B + b_off + (size_t)b * b_bstride;
    float x[NARROW_K];
#pragma unroll
    for (int c = 0; c < CIN; ++c)
#pragma unroll
        for (int ky = 0; ky < KS; ++ky) {
            const int iy = oy * SY - PAD + ky * DIL;
#pragma unroll
            for (int kx = 0; kx < KS; ++kx) {
                const int ix = ox * SX - PAD + kx * DIL;
                x[(c * KS + ky) * KS + kx] = iy >= 0 && iy < H && ix >= 0 && ix < W
                                             ? LD(X, (c * H + iy) * W + ix) : 0.0f;
            }
        }
    YC_EPILOGUE_BASES(b)
#pragma unroll
    for (int j = 0; j < FPW; ++j) {
        const int m = m0 + j;
        if (m < M) {
            float acc = 0.0f;
#pragma unroll
            for (int k = 0; k < NARROW_K; ++k)
                acc = fma(LD(A, m * NARROW_K + k), x[k], acc);
            yc_gemm_store(acc, m, n, 0, M, ldc, bias, C, cb, R, rbase);
        }
    }
}
