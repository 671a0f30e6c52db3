/* Non-convolution layers, Darknet semantics. Each tensor argument is a view:
 * (buffer, element offset of image 0 / channel 0, batch stride in elements).
 * Global size is (spatial, channels, batch) unless stated. Kernel names carry the
 * yc_ prefix: some OpenCL compilers reserve names such as `upsample`. */
#include "common.h"

/* Maxpool with the window as defines (MP_SIZE, MP_SX, MP_SY, MP_PAD = padding / 2), one work-item
 * per output row: global size (OH, C, batch). A plain loop over the row with the window unrolled
 * runs 2-5x faster on PoCL than one work-item per output pixel with the window as arguments. */
#ifdef MP_SIZE
__kernel void yc_maxpool_rows(__global const dtype* restrict X, const int x_off, const int x_bstride,
                              const int H, const int W,
                              __global dtype* restrict Y, const int y_off, const int y_bstride,
                              const int OH, const int OW)
{
    const int oy = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    const int y0 = oy * MP_SY - MP_PAD;
    const __global dtype* Xc = X + x_off + (size_t)b * x_bstride + (size_t)c * H * W;
    const size_t yr = y_off + (size_t)b * y_bstride + ((size_t)c * OH + oy) * OW;
    for (int ox = 0; ox < OW; ++ox) {
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
 * per-image index exists (Darknet's rule for inputs with fewer channels). Global (size, batch). */
__kernel void yc_add(__global const dtype* restrict X, const int x_off, const int x_bstride,
                     __global dtype* restrict Y, const int y_off, const int y_bstride,
                     __global const dtype* restrict A1, const int a1_off, const int a1_bstride, const int a1_size,
                     __global const dtype* restrict A2, const int a2_off, const int a2_bstride, const int a2_size,
                     __global const dtype* restrict A3, const int a3_off, const int a3_bstride, const int a3_size)
{
    const int i = get_global_id(0), b = get_global_id(1);
    float v = LD(X, x_off + b * x_bstride + i);
    if (i < a1_size) v += LD(A1, a1_off + b * a1_bstride + i);
    if (i < a2_size) v += LD(A2, a2_off + b * a2_bstride + i);
    if (i < a3_size) v += LD(A3, a3_off + b * a3_bstride + i);
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
