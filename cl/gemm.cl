/* C[m][n] = epilogue(sum_k A[m][k] * B[k][n]) for convolutions as GEMM.
 *
 * A: weights [G][M][K] row-major.  B: (k, n) at b_off + b*b_bstride + g*b_gstride + k*ldb + n
 * (an im2col workspace, or the input itself for a 1x1 stride-1 conv).  C and the residual R:
 * (m, n) at off + b*bstride + (g*M + m)*ldc + n, so a conv can write into a concat slice.
 * Epilogue: + bias, ACT, [+ R, ACT2], store (float or half).
 *
 * Specialised by defines (one source, many kernels):
 *   TM       rows of C per work-item (register block)
 *   VW       columns per work-item, loaded as one vector (1, 2, 4, 8, 16)
 *   KU       k-loop unroll
 *   CHECK_M  emit row bounds checks (only when M % TM != 0)
 *   CHECK_N  emit column bounds checks (only when N % VW != 0)
 *   RESIDUAL fused shortcut add
 * This is the barrier-free family: each work-item owns a TM x VW block in registers and
 * streams its own A and B; no local memory. It suits CPU devices, where work-groups are
 * loops and barriers are expensive, and small GPUs.
 */
#include "common.h"

#ifndef TM
#define TM 4
#endif
#ifndef VW
#define VW 8
#endif
#ifndef KU
#define KU 1
#endif

#if VW == 1
#define VECT float
#ifdef HALF_STORAGE
#define VLOAD(p, off) vload_half(0, (p) + (off))
#else
#define VLOAD(p, off) ((p)[(off)])
#endif
#define VSTORE_TMP(v, tmp) ((tmp)[0] = (v))
#else
#define VECT CAT(float, VW)
#ifdef HALF_STORAGE
#define VLOAD(p, off) CAT(vload_half, VW)(0, (p) + (off))
#else
#define VLOAD(p, off) CAT(vload, VW)(0, (p) + (off))
#endif
#define VSTORE_TMP(v, tmp) CAT(vstore, VW)((v), 0, (tmp))
#endif

__kernel void yc_gemm(__global const dtype* restrict A, __global const float* restrict bias,
                      __global const dtype* restrict B, const int b_off, const int b_bstride,
                      const int b_gstride, const int ldb,
                      __global dtype* restrict C, const int c_off, const int c_bstride, const int ldc,
                      __global const dtype* restrict R, const int r_off, const int r_bstride,
                      const int M, const int N, const int K, const int G)
{
    const int n0 = get_global_id(0) * VW;
    const int m0 = get_global_id(1) * TM;
    const int z = get_global_id(2);
    const int b = z / G, g = z - b * G;
#ifdef CHECK_M
    if (m0 >= M) return;
#endif
#ifdef CHECK_N
    if (n0 >= N) return;
    const bool full = n0 + VW <= N;
#endif
    const __global dtype* Ap = A + (size_t)(g * M + m0) * K;
    const __global dtype* Bp = B + b_off + (size_t)b * b_bstride + (size_t)g * b_gstride + n0;

    VECT acc[TM];
    for (int i = 0; i < TM; ++i) acc[i] = (VECT)(0.0f);

    #pragma unroll KU
    for (int k = 0; k < K; ++k) {
        VECT bv;
#ifdef CHECK_N
        if (full) {
            bv = VLOAD(Bp, (size_t)k * ldb);
        } else {
            float t[VW];
            for (int j = 0; j < VW; ++j) t[j] = (n0 + j < N) ? LD(Bp, (size_t)k * ldb + j) : 0.0f;
#if VW == 1
            bv = t[0];
#else
            bv = CAT(vload, VW)(0, t);
#endif
        }
#else
        bv = VLOAD(Bp, (size_t)k * ldb);
#endif
        #pragma unroll
        for (int i = 0; i < TM; ++i) {
#ifdef CHECK_M
            const float a = (m0 + i < M) ? LD(Ap, (size_t)i * K + k) : 0.0f;
#else
            const float a = LD(Ap, (size_t)i * K + k);
#endif
            acc[i] = fma((VECT)(a), bv, acc[i]);
        }
    }

    for (int i = 0; i < TM; ++i) {
        const int m = m0 + i;
#ifdef CHECK_M
        if (m >= M) break;
#endif
        const float bi = bias[g * M + m];
        float t[VW];
        VSTORE_TMP(acc[i], t);
        const size_t row = (size_t)(g * M + m) * ldc + n0;
        for (int j = 0; j < VW; ++j) {
#ifdef CHECK_N
            if (n0 + j >= N) break;
#endif
            float v = yc_activate(t[j] + bi, ACT);
#ifdef RESIDUAL
            v = yc_activate(v + LD(R, r_off + (size_t)b * r_bstride + row + j), ACT2);
#endif
            ST(C, c_off + (size_t)b * c_bstride + row + j, v);
        }
    }
}
