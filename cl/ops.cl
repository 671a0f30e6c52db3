/* Standalone convolution ops for yolo_cl.ops (float32 only).
 *
 * One source, several kernel families; exactly one is compiled per build, chosen by a define:
 *   YC_CORR2D    yc_corr2d: single-channel 2-D correlation (not flipped, like PyTorch and
 *                Darknet), batched over planes, stride 1, zero padding.
 *   YC_IM2COL    yc_im2col2d: im2col for rectangular kernels, strides, dilations and padding,
 *                feeding yc_gemm (cl/gemm.cl).
 *   YC_SUM       yc_sum_planes: folds the partial sums of a split reduction.
 *   YC_CAUSAL1D  yc_causal1d: causal depthwise 1-D convolution and both halves of its backward.
 *
 * Images are addressed as (buffer, element offset, plane stride) plus a row shift, so a row band
 * of a taller image is just another image: the host tiles images of any size through bands that
 * fit one device allocation.
 *
 * The correlation and causal kernels have two inner loops each, picked by VEC:
 *   VEC == 0  GPU style: scalar work-items in lock-step, aligned float4 reads of local memory,
 *             register blocks of scalars, loops over compile-time sizes fully unrolled.
 *   VEC == n  CPU style: each work-item runs n-wide vectors itself (n = the SIMD width), since
 *             CPU drivers such as PoCL do not reliably vectorise across work-items.
 * Multiply-adds are written a * b + c (contracted to FMA by the compiler): some CPU drivers
 * compile fma() and vloadn() as out-of-line calls, which costs an order of magnitude.
 */
#include "common.h"

#ifndef VEC
#define VEC 0
#endif
#if VEC
/* n-wide vectors and their unaligned (4-byte aligned) twins, for loads at any offset. */
typedef float vecf __attribute__((ext_vector_type(VEC)));
typedef float vecu __attribute__((ext_vector_type(VEC), aligned(4)));
#define LDV(space, p) (*(const space vecu*)(p))
#endif


#if defined(YC_CORR2D)
/* Tunables:  LX, LY  work-group shape;  RY  output rows per work-item;
 *            VEC == 0: RX output columns per work-item (a multiple of 4 reads float4s);
 *            VEC  > 0: NV vectors of VEC columns per work-item;
 *            KH, KW  the kernel size compiled in (optional: else taken from kh, kw);
 *            ROLL_R  (VEC == 0) do not unroll the input-row loop (smaller code, weights indexed);
 *            SINGLE_W  every plane uses weight plane 0, kept in __constant memory;
 *            WLOCAL  (VEC == 0, KH/KW compiled in) the taps are staged in local memory. */
#ifndef LX
#define LX 16
#endif
#ifndef LY
#define LY 4
#endif
#ifndef RY
#define RY 4
#endif
#if VEC
#ifndef NV
#define NV 1
#endif
#define RXW (VEC * NV)                  /* output columns per work-item */
#else
#ifndef RX
#define RX 4
#endif
#define RXW RX
#endif
#define TW (LX * RXW)                   /* output tile width and height */
#define TH (LY * RY)

#ifdef KH
#define KH_ KH
#define KW_ KW
#else
#define KH_ kh
#define KW_ kw
#endif

#if !VEC && defined(KW) && RX % 4 == 0
#define SEG4                            /* a work-item's row segment lives in registers, read as float4s */
#define SEGN (((RX + KW - 1) + 3) / 4 * 4)
#define PITCH (((TW - RX + SEGN) + 3) / 4 * 4)
#elif VEC
#define PITCH (((TW + KW_ - 1) + VEC - 1) / VEC * VEC)
#else
#define PITCH (((TW + KW_ - 1) + 3) / 4 * 4)
#endif
#define IH (TH + KH_ - 1)               /* input tile rows: the tile and its halo */

#ifdef SINGLE_W
#define WSPACE __constant
#else
#define WSPACE __global const
#endif

/* Y[z][oy][ox] = bias[f] + sum_{ky,kx} Wt[f][ky][kx] * X[p][oy + ky + y_shift][ox + kx + x_shift]
 * for plane z = n*F + f reading input plane p = n*C + f / (F / C); reads outside H x W are zero.
 * Global size (ceil(OW/TW)*LX, ceil(OH/TH)*LY, planes), local size (LX, LY, 1); `tile` holds
 * IH * PITCH floats, 16-byte aligned. */
__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void yc_corr2d(__global const float* restrict X, const long x_off, const long x_pstride,
               const int H, const int W, const int y_shift, const int x_shift,
               WSPACE float* restrict Wt, __global const float* restrict bias,
               __global float* restrict Y, const long y_off, const long y_pstride,
               const int OH, const int OW, const int C, const int F, const int kh, const int kw,
               __local float4* restrict tile4)
{
    __local float* tile = (__local float*)tile4;   /* typed float4 so the driver aligns it for float4 reads */
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int z = get_global_id(2);
    const int n = z / F, f = z - n * F;
    const int p = n * C + f / (F / C);
    const int tx0 = get_group_id(0) * TW, ty0 = get_group_id(1) * TH;
    const __global float* Xp = X + x_off + (long)p * x_pstride;

    /* Cooperative load of the input tile and its halo (whole vectors where the rows are inside). */
    const int gx0 = tx0 + x_shift;
    for (int r = ly; r < IH; r += LY) {
        const int gy = ty0 + r + y_shift;
        const bool row_ok = gy >= 0 && gy < H;
        const __global float* src = Xp + (long)gy * W + gx0;
        __local float* dst = tile + r * PITCH;
#if VEC
        if (row_ok && gx0 >= 0 && gx0 + PITCH <= W) {
            for (int c = lx * VEC; c < PITCH; c += LX * VEC) *(__local vecu*)(dst + c) = LDV(__global, src + c);
            continue;
        }
#endif
        for (int c = lx; c < PITCH; c += LX)
            dst[c] = (row_ok && gx0 + c >= 0 && gx0 + c < W) ? src[c] : 0.0f;
    }
#ifdef SINGLE_W
    WSPACE float* w = Wt;
#else
    WSPACE float* w = Wt + (long)f * (KH_ * KW_);
#endif
#if defined(WLOCAL) && !VEC && defined(KH)
    /* The taps in local memory: every work-item reads the same one (a broadcast), at an offset
     * compiled into the load, instead of a constant-cache load per tap. */
    __local float wloc[KH * KW];
    for (int i = ly * LX + lx; i < KH * KW; i += LX * LY) wloc[i] = w[i];
#define WTAP(i) wloc[i]
#else
#define WTAP(i) w[i]
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    const int cx = lx * RXW;
    const float b = bias[f];
    __global float* Yp = Y + y_off + (long)z * y_pstride;

#if VEC
    /* Input row r feeds output rows ry with ky = r - ry: each row vector is loaded once for up to
     * RY multiply-adds (the weights are broadcast). Rows RY-1 .. KH-1 feed all RY rows. */
    vecf acc[RY][NV];
    #pragma unroll
    for (int i = 0; i < RY; ++i)
        #pragma unroll
        for (int j = 0; j < NV; ++j) acc[i][j] = (vecf)(0.0f);
    for (int r = RY - 1; r < KH_; ++r) {
        __local const float* rowp = tile + (ly * RY + r) * PITCH + cx;
        WSPACE float* wr = w + r * KW_;       /* w[r - ry][kx] = wr[kx - ry * KW] */
        for (int kx = 0; kx < KW_; ++kx) {
            vecf v[NV];
            #pragma unroll
            for (int j = 0; j < NV; ++j) v[j] = LDV(__local, rowp + kx + VEC * j);
            #pragma unroll
            for (int ry = 0; ry < RY; ++ry) {
                const float wv = wr[kx - ry * KW_];
                #pragma unroll
                for (int j = 0; j < NV; ++j) acc[ry][j] += wv * v[j];
            }
        }
    }
    /* The first RY-1 and the last rows feed fewer output rows: per output row, its taps there. */
    const int bottom = KH_ > RY - 1 ? KH_ : RY - 1;       /* rows from here on are past the full ones */
    #pragma unroll
    for (int ry = 0; ry < RY; ++ry) {
        const int top_end = KH_ < RY - 1 - ry ? KH_ : RY - 1 - ry;
        const int bottom_start = bottom - ry;
        for (int part = 0; part < 2; ++part) {
            const int ky_end = part ? KH_ : top_end;
            for (int ky = part ? bottom_start : 0; ky < ky_end; ++ky) {
                WSPACE float* wk = w + ky * KW_;
                __local const float* rp = tile + (ly * RY + ry + ky) * PITCH + cx;
                for (int kx = 0; kx < KW_; ++kx) {
                    const float wv = wk[kx];
                    #pragma unroll
                    for (int j = 0; j < NV; ++j) acc[ry][j] += wv * LDV(__local, rp + kx + VEC * j);
                }
            }
        }
    }
    #pragma unroll
    for (int ry = 0; ry < RY; ++ry) {
        const int oy = ty0 + ly * RY + ry;
        if (oy >= OH) break;
        __global float* dst = Yp + (long)oy * OW;
        #pragma unroll
        for (int j = 0; j < NV; ++j) {
            const int ox = tx0 + cx + VEC * j;
            const vecf v = acc[ry][j] + b;
            if (ox + VEC <= OW) {
                *(__global vecu*)(dst + ox) = v;
            } else {
                float t[VEC];
                *(vecu*)t = v;
                for (int e = 0; e < VEC && ox + e < OW; ++e) dst[ox + e] = t[e];
            }
        }
    }
#else
    float acc[RY][RX];
    #pragma unroll
    for (int i = 0; i < RY; ++i)
        #pragma unroll
        for (int j = 0; j < RX; ++j) acc[i][j] = 0.0f;

    /* Input row r of this work-item's window feeds output rows ry with ky = r - ry, so each
     * row segment is read from local memory once for up to RY output rows. Unrolled (taps
     * compiled in), every weight index is a constant; ROLL_R keeps the row loop a loop. */
#ifdef ROLL_R
    #pragma unroll 1
#else
    #pragma unroll
#endif
    for (int r = 0; r < RY + KH_ - 1; ++r) {
        __local const float* row = tile + (ly * RY + r) * PITCH + cx;
#ifdef SEG4
        float seg[SEGN];
        __local const float4* row4 = (__local const float4*)row;
        #pragma unroll
        for (int q = 0; q < SEGN / 4; ++q) {
            const float4 v = row4[q];
            seg[4 * q] = v.x; seg[4 * q + 1] = v.y; seg[4 * q + 2] = v.z; seg[4 * q + 3] = v.w;
        }
#define SEG(i) seg[i]
#else
#define SEG(i) row[i]
#endif
        #pragma unroll
        for (int ry = 0; ry < RY; ++ry) {
            const int ky = r - ry;
            if (ky >= 0 && ky < KH_) {
                #pragma unroll
                for (int kx = 0; kx < KW_; ++kx) {
                    const float wv = WTAP(ky * KW_ + kx);
                    #pragma unroll
                    for (int rx = 0; rx < RX; ++rx) acc[ry][rx] += wv * SEG(rx + kx);
                }
            }
        }
    }
    #pragma unroll
    for (int ry = 0; ry < RY; ++ry) {
        const int oy = ty0 + ly * RY + ry;
        #pragma unroll
        for (int rx = 0; rx < RX; ++rx) {
            const int ox = tx0 + cx + rx;
            if (oy < OH && ox < OW) Yp[(long)oy * OW + ox] = acc[ry][rx] + b;
        }
    }
#endif
}
#endif /* YC_CORR2D */


#if defined(YC_IM2COL)
/* col[z][k][n] for z = b*G + g, k = (c, ky, kx), n = band-local (oy, ox):
 * X[b][g*CG + c][oy*SY + ky*DY + y_shift][ox*SX + kx*DX + x_shift], zero outside the image. */
__kernel void yc_im2col2d(__global const float* restrict X, const long x_off, const long x_bstride,
                          const long x_pstride, const int CG, const int H, const int W,
                          const int y_shift, const int x_shift,
                          __global float* restrict col, const int OH, const int OW,
                          const int KH, const int KW, const int SY, const int SX,
                          const int DY, const int DX, const int G)
{
    const int n = get_global_id(0), k = get_global_id(1), z = get_global_id(2);
    const int N = OH * OW, K = CG * KH * KW;
    if (n >= N) return;
    const int b = z / G, g = z - b * G;
    const int c = k / (KH * KW), r = k - c * KH * KW;
    const int ky = r / KW, kx = r - ky * KW;
    const int oy = n / OW, ox = n - oy * OW;
    const int iy = oy * SY + ky * DY + y_shift, ix = ox * SX + kx * DX + x_shift;
    float v = 0.0f;
    if (iy >= 0 && iy < H && ix >= 0 && ix < W)
        v = X[x_off + (long)b * x_bstride + (long)(g * CG + c) * x_pstride + (long)iy * W + ix];
    col[(long)z * K * N + (long)k * N + n] = v;
}
#endif /* YC_IM2COL */


#if defined(YC_SUM)
/* Y[i] = sum_s P[s*n + i]. */
__kernel void yc_sum_planes(__global const float* restrict P, __global float* restrict Y,
                            const int n, const int S)
{
    const int i = get_global_id(0);
    if (i >= n) return;
    float s = 0.0f;
    for (int j = 0; j < S; ++j) s += P[(long)j * n + i];
    Y[i] = s;
}
#endif /* YC_SUM */


#if defined(YC_CAUSAL1D)
/* Causal depthwise 1-D convolution over rows of length T (defines R, RB, VEC, ROW_WINDOWS):
 *
 *   out[t] = sum_{u <= t} Wrow[T-1-t+u] * A[u]          (a dot product of two contiguous slices)
 *
 *   forward    reverse=0: A = k[b][c], Wrow = w[c];             Y[b][c][t] = eps + out[t]
 *   grad of k  reverse=1: A = reversed grad[b][c], Wrow = w[c]; Y[b][c][T-1-t] = out[t]
 *   grad of w  ROW_WINDOWS: A = k[b][c], Wrow = grad[b][c];     Y[s][c][t] = sum over split s's rows
 *
 * Rows are padded to TP (a multiple of 2R): A with zeros after T, Wrow with TP-T zeros in front
 * and R behind, so the causal mask is multiplication by padding.  Outputs come in blocks of R;
 * pair i is blocks i and 2*NP-1-i (NP = TP/(2R)), which cost t0+R and TP-t0 multiply-adds per
 * output: TP+R for every pair, so every work-item does the same work and there is no tail.
 * A work-group is one group of RB rows of one channel; its work-items take the pairs in turn.
 * With LOCAL_ROWS the group stages its padded rows in local memory (al, wl); without, it reads
 * global memory (rows too long for local memory).
 *
 * VEC == 0  (GPU) R outputs of RB rows per work-item as scalars; each float4 step of u reads one
 *           float4 of A per row and one new float4 of the window. The window (R/4+1 float4s)
 *           rotates through registers: the step loop is unrolled by R/4+1 so every index is a
 *           compile-time constant and nothing is moved. RB rows share the window (not ROW_WINDOWS).
 * VEC  > 0  (CPU) the vector lanes are RB = VEC rows, staged transposed (al[u][row], and with
 *           ROW_WINDOWS wl[slot][row]). A chunk of R values of u against R outputs touches 2R-1
 *           window slots (slot = R + t - u, the window stored reversed): R + 2R-1 vector loads
 *           for R*R vector multiply-adds. LOCAL_ROWS is required.
 */
#ifndef R
#define R 4
#endif
#if VEC
#undef RB
#define RB VEC
#ifndef LOCAL_ROWS
#error "the CPU variant of yc_causal1d stages its rows in local memory"
#endif
#endif
#ifndef RB
#define RB 4
#endif
#ifdef ROW_WINDOWS
#define NWIN RB                          /* one window per row */
#define WSEL(b) (b)
#else
#define NWIN 1                           /* one window per channel, shared by the rows */
#define WSEL(b) 0
#endif
#define NC (R / 4 + 1)                   /* float4 chunks in the GPU variant's window */
#define F4(v, i) ((i) == 0 ? (v).x : (i) == 1 ? (v).y : (i) == 2 ? (v).z : (v).w)

/* Padded row values: A (reversed for grad of k) and the window. */
inline float yc_a_at(const __global float* row, const bool ok, const int u, const int T, const int reverse) {
    return (ok && u < T) ? row[reverse ? T - 1 - u : u] : 0.0f;
}
inline float yc_w_at(const __global float* row, const bool ok, const int i, const int T, const int TP) {
    const int s = i - (TP - T);
    return (ok && s >= 0 && s < T) ? row[s] : 0.0f;
}

#ifdef LOCAL_ROWS
#define A4_AT(b, v) ((__local const float4*)al)[(b) * (TP / 4) + (v)]
#define W4_AT(q, v) ((__local const float4*)wl)[(q) * (WLEN / 4) + (v)]
#else
#define A_AT(b, u) yc_a_at(arow[b], aok[b], (u), T, reverse)
#define A4_AT(b, v) ((float4)(A_AT(b, 4 * (v)), A_AT(b, 4 * (v) + 1), A_AT(b, 4 * (v) + 2), A_AT(b, 4 * (v) + 3)))
#define WI_AT(q, x) yc_w_at(wrow[q], wok[q], (x), T, TP)
#define W4_AT(q, v) ((float4)(WI_AT(q, 4 * (v)), WI_AT(q, 4 * (v) + 1), WI_AT(q, 4 * (v) + 2), WI_AT(q, 4 * (v) + 3)))
#endif

/* A: [rows][C][T] (k, or grad for grad of k).  Wsrc: w [C][T], or grad [rows][C][T] with ROW_WINDOWS.
 * Y: [rows][C][T], or [S][C][T] partial sums with ROW_WINDOWS (S = get_global_size(2)).
 * Global size (L, C, row groups) (ROW_WINDOWS: (L, C, S)), local size (L, 1, 1), any L. */
__kernel void yc_causal1d(__global const float* restrict A, __global const float* restrict Wsrc,
                          __global float* restrict Y, const int rows, const int C, const int T, const int TP,
                          const float eps, const int reverse,
                          __local float4* restrict al4, __local float4* restrict wl4)
{
    /* Typed float4 so the driver aligns both for float4 reads (NVIDIA aligns a float* argument to 4 bytes
     * only, and a misaligned float4 read faults there). */
    __local float* al = (__local float*)al4;
    __local float* wl = (__local float*)wl4;
    const int c = get_global_id(1);
    const int zg = get_global_id(2);
    const int lid = get_local_id(0), nl = get_local_size(0);
    const int NP = TP / (2 * R), WLEN = TP + R;
#ifdef ROW_WINDOWS
    const int ngroups = (rows + RB - 1) / RB;
    for (int g = zg, first = 1; g < ngroups; g += get_global_size(2), first = 0) {
#else
    {
        const int g = zg;
#endif
        const int r0 = g * RB;
#ifdef LOCAL_ROWS
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int b = 0; b < RB; ++b) {
            const bool ok = r0 + b < rows;
            const __global float* src = A + ((long)(ok ? r0 + b : 0) * C + c) * T;
#if VEC
            for (int u = lid; u < TP; u += nl) al[u * RB + b] = yc_a_at(src, ok, u, T, reverse);
#else
            for (int u = lid; u < TP; u += nl) al[b * TP + u] = yc_a_at(src, ok, u, T, reverse);
#endif
        }
        for (int q = 0; q < NWIN; ++q) {
#ifdef ROW_WINDOWS
            const bool ok = r0 + q < rows;
            const __global float* src = Wsrc + ((long)(ok ? r0 + q : 0) * C + c) * T;
#else
            const bool ok = true;
            const __global float* src = Wsrc + (long)c * T;
#endif
#if VEC
            for (int x = lid; x < WLEN; x += nl) wl[(WLEN - 1 - x) * NWIN + q] = yc_w_at(src, ok, x, T, TP);
#else
            for (int x = lid; x < WLEN; x += nl) wl[q * WLEN + x] = yc_w_at(src, ok, x, T, TP);
#endif
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#else
        const __global float* arow[RB];
        bool aok[RB];
        for (int b = 0; b < RB; ++b) {
            aok[b] = r0 + b < rows;
            arow[b] = A + ((long)(aok[b] ? r0 + b : 0) * C + c) * T;
        }
        const __global float* wrow[NWIN];
        bool wok[NWIN];
        for (int q = 0; q < NWIN; ++q) {
#ifdef ROW_WINDOWS
            wok[q] = r0 + q < rows;
            wrow[q] = Wsrc + ((long)(wok[q] ? r0 + q : 0) * C + c) * T;
#else
            wok[q] = true;
            wrow[q] = Wsrc + (long)c * T;
#endif
        }
#endif
        for (int i = lid; i < NP; i += nl) {
            for (int blk = 0; blk < 2; ++blk) {
                const int t0 = blk ? TP - R - i * R : i * R;
                float res[RB][R];          /* res[b][j] = out_{r0+b}[t0 + j] */
#if VEC
                vecf acc[R];
                #pragma unroll
                for (int j = 0; j < R; ++j) acc[j] = (vecf)(0.0f);
                for (int u0 = 0; u0 <= t0; u0 += R) {
                    vecf av[R];
                    #pragma unroll
                    for (int q = 0; q < R; ++q) av[q] = LDV(__local, al + (u0 + q) * RB);
                    const int s0 = R + t0 - u0;
                    #pragma unroll
                    for (int d = 1 - R; d < R; ++d) {
#ifdef ROW_WINDOWS
                        const vecf wv = LDV(__local, wl + (s0 + d) * RB);
#else
                        const vecf wv = (vecf)(wl[s0 + d]);
#endif
                        #pragma unroll
                        for (int q = 0; q < R; ++q)
                            if (q + d >= 0 && q + d < R) acc[q + d] += av[q] * wv;
                    }
                }
                #pragma unroll
                for (int j = 0; j < R; ++j) {
                    float lanes[VEC];
                    *(vecu*)lanes = acc[j];
                    #pragma unroll
                    for (int b = 0; b < RB; ++b) res[b][j] = lanes[b];
                }
#else /* VEC == 0 */
                /* Logical window element e of step s is index TP-t0-R + 4s + e, e < R+4; logical chunk
                 * e/4 of step s lives in physical chunk (e/4 + s) % NC. */
                float4 wq[NWIN][NC];
                const int vbase = (TP - t0 - R) / 4;
                #pragma unroll
                for (int q = 0; q < NWIN; ++q)
                    #pragma unroll
                    for (int e = 0; e < R / 4; ++e) wq[q][e] = W4_AT(q, vbase + e);
                #pragma unroll
                for (int b = 0; b < RB; ++b)
                    #pragma unroll
                    for (int j = 0; j < R; ++j) res[b][j] = 0.0f;
                const int steps = (t0 + R) / 4;
                for (int s0 = 0; s0 < steps; s0 += NC) {
                    #pragma unroll
                    for (int rho = 0; rho < NC; ++rho) {
                        const int s = s0 + rho;
                        if (s < steps) {
                            #pragma unroll
                            for (int q = 0; q < NWIN; ++q) wq[q][(R / 4 + rho) % NC] = W4_AT(q, vbase + s + R / 4);
                            #pragma unroll
                            for (int b = 0; b < RB; ++b) {
                                const float4 av = A4_AT(b, s);
                                #pragma unroll
                                for (int j = 0; j < R; ++j)
                                    #pragma unroll
                                    for (int qq = 0; qq < 4; ++qq) {
                                        const int e = R - 1 - j + qq;
                                        res[b][j] += F4(wq[WSEL(b)][(e / 4 + rho) % NC], e % 4) * F4(av, qq);
                                    }
                            }
                        }
                    }
                }
#endif /* VEC */
#ifdef ROW_WINDOWS
                /* Fold this group's rows into the split's partial sums (each t has one owner). */
                __global float* dst = Y + ((long)zg * C + c) * T;
                #pragma unroll
                for (int j = 0; j < R; ++j) {
                    float v = 0.0f;
                    #pragma unroll
                    for (int b = 0; b < RB; ++b) v += res[b][j];
                    if (t0 + j < T) dst[t0 + j] = first ? v : dst[t0 + j] + v;
                }
#else
                #pragma unroll
                for (int b = 0; b < RB; ++b) {
                    if (r0 + b >= rows) break;
                    __global float* dst = Y + ((long)(r0 + b) * C + c) * T;
                    #pragma unroll
                    for (int j = 0; j < R; ++j)
                        if (t0 + j < T) {
                            if (reverse) dst[T - 1 - (t0 + j)] = res[b][j];
                            else dst[t0 + j] = eps + res[b][j];
                        }
                }
#endif
            }
        }
    }
}
#endif /* YC_CAUSAL1D */
