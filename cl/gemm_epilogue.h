/* What the GPU GEMM families (gemm_local.cl, gemm_mma.cl) share: the K split, the fused epilogue. */
#ifndef YC_GEMM_EPILOGUE_H
#define YC_GEMM_EPILOGUE_H
#include "common.h"

/* The matrix z (image * groups + group) of this work-item and its K range [kbeg, kend): with
 * SK > 1 one of SK splits, each a multiple of KWG (the host makes every split non-empty). */
#define YC_K_SPLIT(z, ks, kbeg, kend)                                                            \
    const int z = get_global_id(2) / SK, ks = get_global_id(2) - z * SK;                         \
    const int kbeg = ks * ((((K + SK - 1) / SK) + KWG - 1) / KWG) * KWG;                          \
    const int kend = min(K, kbeg + ((((K + SK - 1) / SK) + KWG - 1) / KWG) * KWG);

/* cb and rbase: where image b's C and (with RESIDUAL) the fused shortcut's R start, for yc_gemm_store. */
#ifdef RESIDUAL
#define YC_EPILOGUE_BASES(b)                                                                     \
    const size_t cb = (size_t)c_off + (size_t)(b) * c_bstride;                                   \
    const size_t rbase = (size_t)r_off + (size_t)(b) * r_bstride;
#else
#define YC_EPILOGUE_BASES(b)                                                                     \
    const size_t cb = (size_t)c_off + (size_t)(b) * c_bstride;                                   \
    const size_t rbase = 0;
#endif

/* The value of C[m][*] from its sum: bias, then ACT (as the layer's own epilogue computes it). */
inline float yc_gemm_value(const float acc, const int m, const int g, const int M, __global const float* restrict bias)
{
#ifdef NO_BIAS
    return yc_activate(acc + 0.0f, ACT);        /* as with a zero bias: -0 becomes +0 */
#else
    return yc_activate(acc + bias[g * M + m], ACT);
#endif
}

/* The fused epilogue of one element: bias, ACT, [+ R, ACT2], store. With UP_S (a conv writing
 * through the [upsample] that alone reads it, graph.mark_write_fusions) C is the upsampled
 * output, ldc its plane, and column n (pixel (n % UP_OW, n / UP_OW) of the conv's output) is
 * stored UP_S x UP_S times, as the upsample layer would copy it. With NHWC_OUT (the number of
 * output channels; kernels/layout.py: the conv that alone reads C takes it as pixels of
 * channels) C is stored channels-last: pixel n's channels contiguous. */
inline void yc_gemm_store(const float acc, const int m, const int n, const int g, const int M, const int ldc,
                          __global const float* restrict bias, __global dtype* restrict C, const size_t cb,
                          __global const dtype* restrict R, const size_t rbase)
{
    const size_t row = (size_t)(g * M + m) * ldc;
    float v = yc_gemm_value(acc, m, g, M, bias);
#ifdef RESIDUAL
    v = yc_activate(v + LD(R, rbase + row + n), ACT2);
#endif
#ifdef UP_S
    const int oy = n / UP_OW, ox = n - oy * UP_OW;
    const size_t at = cb + row + (size_t)oy * UP_S * UP_S * UP_OW + (size_t)ox * UP_S;
    for (int dy = 0; dy < UP_S; ++dy)
        for (int dx = 0; dx < UP_S; ++dx)
            ST(C, at + (size_t)dy * UP_S * UP_OW + dx, v);
#elif defined(NHWC_OUT)
    ST(C, cb + (size_t)n * NHWC_OUT + g * M + m, v);
#else
    ST(C, cb + row + n, v);
#endif
}

#endif
