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

/* The fused epilogue of one element: bias, ACT, [+ R, ACT2], store. */
inline void yc_gemm_store(const float acc, const int m, const int n, const int g, const int M, const int ldc,
                          __global const float* restrict bias, __global dtype* restrict C, const size_t cb,
                          __global const dtype* restrict R, const size_t rbase)
{
#ifdef NO_BIAS
    const float bi = 0.0f;
#else
    const float bi = bias[g * M + m];
#endif
    const size_t row = (size_t)(g * M + m) * ldc;
    float v = yc_activate(acc + bi, ACT);
#ifdef RESIDUAL
    v = yc_activate(v + LD(R, rbase + row + n), ACT2);
#endif
    ST(C, cb + row + n, v);
}

#endif
