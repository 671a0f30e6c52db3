/* Non-convolution layers, Darknet semantics. Each tensor argument is a view:
 * (buffer, element offset of image 0 / channel 0, batch stride in elements).
 * Global size is (spatial, channels, batch) unless stated. Kernel names carry the
 * yc_ prefix: some OpenCL compilers reserve names such as `upsample`. */
#include "common.h"

/* Maxpool with the window as defines (MP_SIZE, MP_SX, MP_SY, MP_PAD = padding / 2). One work-item
 * per output row, global size (OH, C, batch): a plain loop over the row with the window unrolled
 * runs 2-5x faster on PoCL than one work-item per output pixel with the window as arguments.
 * With MP_PIXELS one work-item per output pixel, global size (OH * OW, C, batch): on a GPU a row
 * per work-item leaves it nearly idle (yolov3-tiny's first pool: 3328 rows, 0.157 ms on an H100)
 * and its neighbours read W apart; pixels are many, and neighbours read neighbours. */
#ifdef MP_SIZE
__kernel void yc_maxpool_rows(__global const dtype* restrict X, const int x_off, const int x_bstride,
                              const int H, const int W,
                              __global dtype* restrict Y, const int y_off, const int y_bstride,
                              const int OH, const int OW)
{
    YC_POOL_SPAN(OW, oy, first, last);
    const int c = get_global_id(1), b = get_global_id(2);
    const int y0 = oy * MP_SY - MP_PAD;
    const __global dtype* Xc = X + x_off + (size_t)b * x_bstride + (size_t)c * H * W;
    const size_t yr = y_off + (size_t)b * y_bstride + ((size_t)c * OH + oy) * OW;
    for (int ox = first; ox < last; ++ox) {
        const int x0 = ox * MP_SX - MP_PAD;
        float m = -FLT_MAX;
        #pragma unroll
        for (int dy = 0; dy < MP_SIZE; ++dy) {
            const int iy = y0 + dy;
            if (iy >= 0 && iy < H) {
                #pragma unroll
                for (int dx = 0; dx < MP_SIZE; ++dx) {
                    const int ix = x0 + dx;
                    if (ix >= 0 && ix < W) {
                        const float v = LD(Xc, iy * W + ix);
                        m = v > m ? v : m;
                    }
                }
            }
        }
        ST(Y, yr + ox, m);
    }
}
#endif

/* maxpool_depth: output channel g is the max over input channels g, g+OC, g+2*OC, ... */
__kernel void yc_maxpool_depth(__global const dtype* restrict X, const int x_off, const int x_bstride,
                               const int C, const int HW,
                               __global dtype* restrict Y, const int y_off, const int y_bstride, const int OC)
{
    const int n = get_global_id(0), g = get_global_id(1), b = get_global_id(2);
    float m = -FLT_MAX;
    for (int k = g; k < C; k += OC) {
        const float v = LD(X, x_off + b * x_bstride + k * HW + n);
        m = v > m ? v : m;
    }
    ST(Y, y_off + b * y_bstride + g * HW + n, m);
}

/* Global average pool; global size (channels, batch). */
__kernel void yc_avgpool(__global const dtype* restrict X, const int x_off, const int x_bstride, const int HW,
                         __global dtype* restrict Y, const int y_off, const int y_bstride)
{
    const int c = get_global_id(0), b = get_global_id(1);
    const int base = x_off + b * x_bstride + c * HW;
    float s = 0.0f;
    for (int i = 0; i < HW; ++i) s += LD(X, base + i);
    ST(Y, y_off + b * y_bstride + c, s / HW);
}

__kernel void yc_upsample(__global const dtype* restrict X, const int x_off, const int x_bstride,
                          const int H, const int W,
                          __global dtype* restrict Y, const int y_off, const int y_bstride,
                          const int S, const float scale)
{
    const int n = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    const int OW = W * S;
    const int oy = n / OW, ox = n - oy * OW;
    const float v = LD(X, x_off + b * x_bstride + (c * H + oy / S) * W + ox / S);
    ST(Y, y_off + b * y_bstride + c * H * S * OW + n, scale * v);
}

#ifdef UP_S
/* The same as yc_upsample, an input row per work-item (CPUs): each value is scaled once and
 * written UP_S times along x into UP_S output rows, with no division per output element.
 * Global size (H, C, batch). */
__kernel void yc_upsample_rows(__global const dtype* restrict X, const int x_off, const int x_bstride,
                               const int H, const int W,
                               __global dtype* restrict Y, const int y_off, const int y_bstride,
                               const int S, const float scale)
{
    const int y = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    const int OW = W * UP_S;
    const size_t xr = x_off + (size_t)b * x_bstride + ((size_t)c * H + y) * W;
    const size_t yr = y_off + (size_t)b * y_bstride + ((size_t)c * H + y) * UP_S * OW;
    for (int x = 0; x < W; ++x) {
        const float v = scale * LD(X, xr + x);
        #pragma unroll
        for (int dy = 0; dy < UP_S; ++dy)
            #pragma unroll
            for (int dx = 0; dx < UP_S; ++dx) ST(Y, yr + (size_t)dy * OW + x * UP_S + dx, v);
    }
}
#endif

/* Darknet's reorg (forward=0 flavour of reorg_cpu, which OpenCV reproduces): output element
 * at the input's flat index i (over C x H x W) takes the input element at the index it would
 * have in a (C/S^2) x (H*S) x (W*S) layout. Global size (W*H, C, batch) of the INPUT dims. */
__kernel void yc_reorg(__global const dtype* restrict X, const int x_off, const int x_bstride,
                       const int C, const int H, const int W,
                       __global dtype* restrict Y, const int y_off, const int y_bstride, const int S)
{
    const int n = get_global_id(0), k = get_global_id(1), b = get_global_id(2);
    const int j = n / W, i = n - j * W;
    const int oc = C / (S * S);
    const int c2 = k % oc, offset = k / oc;
    const int w2 = i * S + offset % S, h2 = j * S + offset / S;
    const int src = w2 + W * S * (h2 + H * S * c2);
    ST(Y, y_off + b * y_bstride + (k * H + j) * W + i, LD(X, x_off + b * x_bstride + src));
}

/* Shortcut: out = ACT(x + sum of up to 3 other inputs), each added only where its flat
 * per-image index exists (Darknet's rule for inputs with fewer channels). With SC_ALPHA and
 * SC_BETA defined: out = ACT(SC_ALPHA * x + SC_BETA * A1); with SC_WEIGHTS, each input is scaled
 * by its per-channel factor from SW first. Global (size, batch). */
__kernel void yc_add(__global const dtype* restrict X, const int x_off, const int x_bstride,
                     __global dtype* restrict Y, const int y_off, const int y_bstride,
                     __global const dtype* restrict A1, const int a1_off, const int a1_bstride, const int a1_size,
                     __global const dtype* restrict A2, const int a2_off, const int a2_bstride, const int a2_size,
                     __global const dtype* restrict A3, const int a3_off, const int a3_bstride, const int a3_size
#if defined(SC_WEIGHTS)
                     , __global const float* restrict SW, const int sw_c, const int hw
#endif
                     )
{
    const int i = get_global_id(0), b = get_global_id(1);
    float v = LD(X, x_off + b * x_bstride + i);
#if defined(SC_WEIGHTS)
    /* AlexeyAB's weighted shortcut (shortcut_multilayer_cpu): every input times its factor for the
     * output channel, summed in input order. SW rows: this launch's source, A1, A2, A3. */
    const int ch = i / hw;
    v *= SW[ch];
    if (i < a1_size) v += LD(A1, a1_off + b * a1_bstride + i) * SW[sw_c + ch];
    if (i < a2_size) v += LD(A2, a2_off + b * a2_bstride + i) * SW[2 * sw_c + ch];
    if (i < a3_size) v += LD(A3, a3_off + b * a3_bstride + i) * SW[3 * sw_c + ch];
#elif defined(SC_ALPHA)
    /* pjreddie's weighted shortcut (shortcut_cpu): out = alpha * out + beta * add, one add. */
    v *= SC_ALPHA;
    if (i < a1_size) v += SC_BETA * LD(A1, a1_off + b * a1_bstride + i);
#else
    if (i < a1_size) v += LD(A1, a1_off + b * a1_bstride + i);
    if (i < a2_size) v += LD(A2, a2_off + b * a2_bstride + i);
    if (i < a3_size) v += LD(A3, a3_off + b * a3_bstride + i);
#endif
    ST(Y, y_off + b * y_bstride + i, yc_activate(v, ACT));
}

/* scale_channels: out = ACT(S * F), S per channel ([C,1,1]) or, with SCALE_WH, per pixel ([1,H,W]).
 * Also [sam] (SAM: S has F's shape). Global (HW, C, batch). */
__kernel void yc_scale(__global const dtype* restrict S, const int s_off, const int s_bstride,
                       __global const dtype* restrict F, const int f_off, const int f_bstride,
                       __global dtype* restrict Y, const int y_off, const int y_bstride, const int HW)
{
    const int n = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
#if defined(SAM)
    const float s = LD(S, s_off + b * s_bstride + c * HW + n);
#elif defined(SCALE_WH)
    const float s = LD(S, s_off + b * s_bstride + n);
#else
    const float s = LD(S, s_off + b * s_bstride + c);
#endif
    ST(Y, y_off + b * y_bstride + c * HW + n, yc_activate(s * LD(F, f_off + b * f_bstride + c * HW + n), ACT));
}

/* Softmax over each group of `n` consecutive elements, Darknet's softmax_cpu with temperature.
 * Global (groups, batch). */
__kernel void yc_softmax(__global const dtype* restrict X, const int x_off, const int x_bstride,
                         __global dtype* restrict Y, const int y_off, const int y_bstride,
                         const int n, const float temp)
{
    const int g = get_global_id(0), b = get_global_id(1);
    const int xb = x_off + b * x_bstride + g * n, yb = y_off + b * y_bstride + g * n;
    float largest = -FLT_MAX;
    for (int i = 0; i < n; ++i) largest = fmax(largest, LD(X, xb + i));
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) sum += exp((LD(X, xb + i) - largest) / temp);
    for (int i = 0; i < n; ++i) ST(Y, yb + i, exp((LD(X, xb + i) - largest) / temp) / sum);
}

/* Copy a view into a slice of another (route concat fallback). Global (size, batch). */
__kernel void yc_copy(__global const dtype* restrict X, const int x_off, const int x_bstride,
                      __global dtype* restrict Y, const int y_off, const int y_bstride)
{
    const int i = get_global_id(0), b = get_global_id(1);
    ST(Y, y_off + b * y_bstride + i, LD(X, x_off + b * x_bstride + i));
}

/* [activation] / [logistic]: out = ACT(x). Global (size, batch). */
__kernel void yc_act(__global const dtype* restrict X, const int x_off, const int x_bstride,
                     __global dtype* restrict Y, const int y_off, const int y_bstride)
{
    const int i = get_global_id(0), b = get_global_id(1);
    ST(Y, y_off + b * y_bstride + i, yc_activate(LD(X, x_off + b * x_bstride + i), ACT));
}

/* [batchnorm] folded to a per-channel affine map: out = ACT(x * S[c] + B[c]). Global (HW, C, batch). */
__kernel void yc_affine(__global const dtype* restrict X, const int x_off, const int x_bstride,
                        __global dtype* restrict Y, const int y_off, const int y_bstride,
                        __global const float* restrict S, __global const float* restrict Bias, const int HW)
{
    const int n = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    const float v = LD(X, x_off + b * x_bstride + c * HW + n) * S[c] + Bias[c];
    ST(Y, y_off + b * y_bstride + c * HW + n, yc_activate(v, ACT));
}

/* [crop] at inference (forward_crop_layer, train=0): the window at (DX, DY), times scale plus shift.
 * Global (OH*OW, C, batch). */
__kernel void yc_crop(__global const dtype* restrict X, const int x_off, const int x_bstride,
                      const int H, const int W,
                      __global dtype* restrict Y, const int y_off, const int y_bstride,
                      const int OH, const int OW, const int DY, const int DX, const float scale, const float shift)
{
    const int n = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    const int oy = n / OW, ox = n - oy * OW;
    const float v = LD(X, x_off + b * x_bstride + (c * H + oy + DY) * W + ox + DX);
    ST(Y, y_off + b * y_bstride + c * OH * OW + n, v * scale + shift);
}

/* [local_avgpool]: maxpool's windows (starting at -PADDING/2), the mean of the cells inside the input.
 * Global (OH*OW, C, batch). */
__kernel void yc_local_avgpool(__global const dtype* restrict X, const int x_off, const int x_bstride,
                               const int H, const int W,
                               __global dtype* restrict Y, const int y_off, const int y_bstride,
                               const int OH, const int OW, const int SIZE, const int SX, const int SY,
                               const int PADDING)
{
    const int n = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    const int oy = n / OW, ox = n - oy * OW;
    const int y0 = oy * SY - PADDING / 2, x0 = ox * SX - PADDING / 2;
    const int base = x_off + b * x_bstride + c * H * W;
    float s = 0.0f;
    int count = 0;
    for (int dy = 0; dy < SIZE; ++dy) {
        const int iy = y0 + dy;
        if (iy < 0 || iy >= H) continue;
        for (int dx = 0; dx < SIZE; ++dx) {
            const int ix = x0 + dx;
            if (ix < 0 || ix >= W) continue;
            s += LD(X, base + iy * W + ix);
            ++count;
        }
    }
    ST(Y, y_off + b * y_bstride + c * OH * OW + n, s / count);
}

/* [reorg3d] (reorg_cpu, forward=0, on the OUTPUT dims): output channel k, pixel (j, i) takes input
 * channel k % C at (j*S + off/S, i*S + off%S), off = k / C. Global (OH*OW, C*S*S, batch). */
__kernel void yc_reorg3d(__global const dtype* restrict X, const int x_off, const int x_bstride,
                         const int C, const int H, const int W,
                         __global dtype* restrict Y, const int y_off, const int y_bstride, const int S)
{
    const int n = get_global_id(0), k = get_global_id(1), b = get_global_id(2);
    const int OW = W / S, OH = H / S;
    const int j = n / OW, i = n - j * OW;
    const int c = k % C, off = k / C;
    const int src = (c * H + j * S + off / S) * W + i * S + off % S;
    ST(Y, y_off + b * y_bstride + k * OH * OW + n, LD(X, x_off + b * x_bstride + src));
}

/* [l2norm] (l2normalize_cpu): each pixel's channel vector divided by its Euclidean norm.
 * Global (HW, batch). */
__kernel void yc_l2norm(__global const dtype* restrict X, const int x_off, const int x_bstride,
                        __global dtype* restrict Y, const int y_off, const int y_bstride, const int C, const int HW)
{
    const int n = get_global_id(0), b = get_global_id(1);
    const int xb = x_off + b * x_bstride + n, yb = y_off + b * y_bstride + n;
    float sum = 0.0f;
    for (int c = 0; c < C; ++c) {
        const float v = LD(X, xb + c * HW);
        sum += v * v;
    }
    const float norm = sqrt(sum);
    for (int c = 0; c < C; ++c) ST(Y, yb + c * HW, LD(X, xb + c * HW) / norm);
}

/* Darknet's cross-channel activations on a conv output, in place, per pixel (global (HW, batch)):
 * normalize_channels: positive values over their sum (+1e-4), the rest 0; with SOFTMAX,
 * exp(x - m) / (1e-4 + sum exp(x - m)), m the channels' max with MAXVAL, else 0. */
__kernel void yc_norm_channels(__global dtype* restrict Y, const int y_off, const int y_bstride,
                               const int C, const int HW)
{
    const int n = get_global_id(0), b = get_global_id(1);
    const int yb = y_off + b * y_bstride + n;
    const float eps = 0.0001f;
    float sum = eps;
#ifdef SOFTMAX
    float m = 0.0f;
#ifdef MAXVAL
    m = -FLT_MAX;
    for (int c = 0; c < C; ++c) m = fmax(m, LD(Y, yb + c * HW));
#endif
    for (int c = 0; c < C; ++c) sum += exp(LD(Y, yb + c * HW) - m);
    for (int c = 0; c < C; ++c) ST(Y, yb + c * HW, exp(LD(Y, yb + c * HW) - m) / sum);
#else
    for (int c = 0; c < C; ++c) {
        const float v = LD(Y, yb + c * HW);
        if (v > 0.0f) sum += v;
    }
    for (int c = 0; c < C; ++c) {
        const float v = LD(Y, yb + c * HW);
        ST(Y, yb + c * HW, v > 0.0f ? v / sum : 0.0f);
    }
#endif
}

/* [implicit]: every image gets the same learned constant V. Global (size, batch). */
__kernel void yc_fill(__global const float* restrict V, __global dtype* restrict Y, const int y_off,
                      const int y_bstride)
{
    const int i = get_global_id(0), b = get_global_id(1);
    ST(Y, y_off + b * y_bstride + i, V[i]);
}

/* [connected]: out[o] = ACT(Bias[o] + sum_k Wt[o][k] x[k]) over the flattened input (batchnorm
 * folded into Wt and Bias). One work-group of CONN_WG lanes per output. GPUs (CONN_WG 64): lane l
 * sums k = l, l + 64, ... so neighbouring lanes read neighbouring weights (coalesced), then the
 * partial sums are added in local memory. CPUs (CONN_WG 1): one work-item walks its row with
 * float8 loads, 4x faster on PoCL than lanes striding across the row.
 * Global (outputs * CONN_WG, batch), local (CONN_WG, 1). */
#ifndef CONN_WG
#define CONN_WG 64
#endif
__kernel __attribute__((reqd_work_group_size(CONN_WG, 1, 1)))
void yc_connected(__global const dtype* restrict X, const int x_off, const int x_bstride,
                  __global dtype* restrict Y, const int y_off, const int y_bstride,
                  __global const float* restrict Wt, __global const float* restrict Bias, const int K)
{
    const int lane = get_local_id(0), o = get_group_id(0), b = get_global_id(1);
    const int xb = x_off + b * x_bstride;
    __global const float* w = Wt + (size_t)o * K;
#if CONN_WG == 1
    float8 acc = 0.0f;
    int k = 0;
    for (; k + 8 <= K; k += 8) {
#ifdef HALF_STORAGE
        acc += vload8(0, w + k) * vload_half8(0, X + xb + k);
#else
        acc += vload8(0, w + k) * vload8(0, X + xb + k);
#endif
    }
    float s = (acc.s0 + acc.s1) + (acc.s2 + acc.s3) + (acc.s4 + acc.s5) + (acc.s6 + acc.s7);
    for (; k < K; ++k) s += w[k] * LD(X, xb + k);
#else
    float s = 0.0f;
    for (int k = lane; k < K; k += CONN_WG) s += w[k] * LD(X, xb + k);
    __local float part[CONN_WG];
    part[lane] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int step = CONN_WG / 2; step > 0; step >>= 1) {
        if (lane < step) part[lane] += part[lane + step];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    s = part[0];
#endif
    if (lane == 0) ST(Y, y_off + b * y_bstride + o, yc_activate(s + Bias[o], ACT));
}

/* [deconvolutional] as a gather: output (f, oy, ox) sums Wt[f][c][ky][kx] x[c][iy][ix] over the taps
 * with oy = iy*S + ky - PAD (and the same in x): what Darknet's GEMM + col2im scatters there.
 * Work-items are ordered by output phase (oy % S, ox % S) so neighbours share their taps (no
 * divergence, contiguous input reads): n = phase * QH * QW + qy * QW + qx, oy = qy*S + py.
 * Batchnorm folded into Wt and Bias. Global (S*S*QH*QW, F, batch), QH = ceil(OH/S), QW = ceil(OW/S). */
__kernel void yc_deconv(__global const dtype* restrict X, const int x_off, const int x_bstride,
                        const int C, const int H, const int W,
                        __global dtype* restrict Y, const int y_off, const int y_bstride, const int OH, const int OW,
                        __global const float* restrict Wt, __global const float* restrict Bias,
                        const int SIZE, const int S, const int PAD)
{
    const int n = get_global_id(0), f = get_global_id(1), b = get_global_id(2);
    const int QH = (OH + S - 1) / S, QW = (OW + S - 1) / S;
    const int phase = n / (QH * QW), q = n - phase * QH * QW;
    const int py = phase / S, px = phase - py * S;
    const int qy = q / QW, qx = q - qy * QW;
    const int oy = qy * S + py, ox = qx * S + px;
    if (oy >= OH || ox >= OW) return;
    const int xb = x_off + b * x_bstride;
    float s = Bias[f];
    for (int ky = (oy + PAD) % S; ky < SIZE; ky += S) {   /* the taps with (oy + PAD - ky) % S == 0 */
        const int iy = (oy + PAD - ky) / S;
        if (iy < 0 || iy >= H) continue;
        for (int kx = (ox + PAD) % S; kx < SIZE; kx += S) {
            const int ix = (ox + PAD - kx) / S;
            if (ix < 0 || ix >= W) continue;
            __global const float* w = Wt + ((size_t)f * C * SIZE + ky) * SIZE + kx;
            for (int c = 0; c < C; ++c) s += w[c * SIZE * SIZE] * LD(X, xb + (c * H + iy) * W + ix);
        }
    }
    ST(Y, y_off + b * y_bstride + f * OH * OW + oy * OW + ox, yc_activate(s, ACT));
}

/* [local] (forward_local_layer): output (f, oy, ox) = Bias[f][oy][ox] + the window at (oy*S - PAD,
 * ox*S - PAD) (zeros outside) dotted with that pixel's own filter Wt[oy*OW + ox][f][c][ky][kx].
 * Global (OH*OW, F, batch). */
__kernel void yc_local(__global const dtype* restrict X, const int x_off, const int x_bstride,
                       const int C, const int H, const int W,
                       __global dtype* restrict Y, const int y_off, const int y_bstride, const int OH, const int OW,
                       const int F, __global const float* restrict Wt, __global const float* restrict Bias,
                       const int SIZE, const int S, const int PAD)
{
    const int n = get_global_id(0), f = get_global_id(1), b = get_global_id(2);
    const int oy = n / OW, ox = n - oy * OW;
    const int xb = x_off + b * x_bstride;
    __global const float* w = Wt + ((size_t)n * F + f) * C * SIZE * SIZE;
    float s = Bias[f * OH * OW + n];
    for (int c = 0; c < C; ++c) {
        for (int ky = 0; ky < SIZE; ++ky) {
            const int iy = oy * S + ky - PAD;
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < SIZE; ++kx) {
                const int ix = ox * S + kx - PAD;
                if (ix < 0 || ix >= W) continue;
                s += w[(c * SIZE + ky) * SIZE + kx] * LD(X, xb + (c * H + iy) * W + ix);
            }
        }
    }
    ST(Y, y_off + b * y_bstride + f * OH * OW + n, yc_activate(s, ACT));
}

/* [normalization]/[lrn] (forward_normalization_layer): out = x * norm^-beta per pixel, with
 * Darknet's running window sum: norm_0 = kappa + alpha * sum_{j < SIZE/2} x_j^2, then
 * norm_k = norm_{k-1} - alpha x_{k-(SIZE-1)/2-1}^2 + alpha x_{k+SIZE/2}^2 (terms outside [0, C)
 * skipped). Global (HW, batch). */
__kernel void yc_lrn(__global const dtype* restrict X, const int x_off, const int x_bstride,
                     __global dtype* restrict Y, const int y_off, const int y_bstride,
                     const int C, const int HW, const int SIZE, const float alpha, const float beta,
                     const float kappa)
{
    const int n = get_global_id(0), b = get_global_id(1);
    const int xb = x_off + b * x_bstride + n, yb = y_off + b * y_bstride + n;
    float norm = kappa;
    for (int k = 0; k < SIZE / 2 && k < C; ++k) {
        const float v = LD(X, xb + k * HW);
        norm += alpha * v * v;
    }
    for (int k = 0; k < C; ++k) {
        if (k > 0) {
            const int prev = k - (SIZE - 1) / 2 - 1, next = k + SIZE / 2;
            if (prev >= 0) { const float v = LD(X, xb + prev * HW); norm -= alpha * v * v; }
            if (next < C) { const float v = LD(X, xb + next * HW); norm += alpha * v * v; }
        }
        ST(Y, yb + k * HW, LD(X, xb + k * HW) * pow(norm, -beta));
    }
}
