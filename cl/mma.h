/* One warp's mma.sync through inline PTX (MMA_F16: m16n8k16 f32.f16.f16.f32; else MMA_TF32:
 * m16n8k8 f32.tf32.tf32.f32), or under MMA_EMULATE the same in plain OpenCL C: MMA(d, a, b) adds
 * the product of fragments a (4 words) and b (2 words) into d (4 floats). The emulation needs,
 * where MMA is used, `xch` (32 x 6 words of local memory for this warp) and `lane` (0..31). Shared
 * by the tensor-core GEMM (gemm_mma.cl) and the narrow conv's tensor-core path (conv_narrow.cl). */
#ifndef YC_MMA_H
#define YC_MMA_H
#ifdef MMA_EMULATE
/* One mma of a warp in plain C: each lane publishes its A and B registers, then computes its
 * four C elements from the published registers, locating each A/B element by the PTX ISA's
 * fragment layout (g = lane / 4, t = lane % 4):
 *   f16  m16n8k16: a0 A[g][2t,2t+1] a1 A[g+8][2t,2t+1] a2 A[g][2t+8,2t+9] a3 A[g+8][2t+8,2t+9]
 *                  b0 B[2t,2t+1][g] b1 B[2t+8,2t+9][g]           (low half = lower k)
 *   tf32 m16n8k8:  a0 A[g][t] a1 A[g+8][t] a2 A[g][t+4] a3 A[g+8][t+4]  b0 B[t][g] b1 B[t+4][g]
 *   both:          c0 C[g][2t] c1 C[g][2t+1] c2 C[g+8][2t] c3 C[g+8][2t+1]
 * Every work-item of the work-group calls this the same number of times (the barriers). */
inline void yc_mma(float* d, const uint* a, const uint* b, __local uint* xch, const int lane)
{
    __local uint* me = xch + lane * 6;
    for (int i = 0; i < 4; ++i) me[i] = a[i];
    me[4] = b[0];
    me[5] = b[1];
    barrier(CLK_LOCAL_MEM_FENCE);
    const int g = lane >> 2, t = lane & 3;
    for (int q = 0; q < 4; ++q) {
        const int r = g + 8 * (q >> 1), c = 2 * t + (q & 1);
        float s = d[q];
#ifdef MMA_F16
        for (int k = 0; k < 16; ++k) {
            const int aw = ((r & 7) * 4 + ((k & 7) >> 1)) * 6 + (r >> 3) + 2 * (k >> 3);
            const int bw = (c * 4 + ((k & 7) >> 1)) * 6 + 4 + (k >> 3);
            s = fma(vload_half(2 * aw + (k & 1), (__local const half*)xch),
                    vload_half(2 * bw + (k & 1), (__local const half*)xch), s);
        }
#else
        for (int k = 0; k < 8; ++k) {
            const int aw = ((r & 7) * 4 + (k & 3)) * 6 + (r >> 3) + 2 * (k >> 2);
            const int bw = (c * 4 + (k & 3)) * 6 + 4 + (k >> 2);
            s = fma(as_float(xch[aw]), as_float(xch[bw]), s);
        }
#endif
        d[q] = s;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}
#define MMA(d, a, b) yc_mma((d), (a), (b), xch, lane)
#elif defined(MMA_F16)
#define MMA(d, a, b)                                                                             \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "                           \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                        \
                 : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3])                       \
                 : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"((b)[0]), "r"((b)[1]))
#else
#define MMA(d, a, b)                                                                             \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "                          \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                        \
                 : "+f"((d)[0]), "+f"((d)[1]), "+f"((d)[2]), "+f"((d)[3])                       \
                 : "r"((a)[0]), "r"((a)[1]), "r"((a)[2]), "r"((a)[3]), "r"((b)[0]), "r"((b)[1]))
#endif
#endif
