/* A BGR uint8 frame -> the network input, in one pass: bilinear resize equal to OpenCV's
 * cv2.resize(INTER_LINEAR) on uint8 (its 11-bit fixed-point weights and its vectorised
 * vertical pass), placement in the input (letterbox / crop padding is 0.5 grey), BGR -> RGB,
 * scaling to [0, 1], CHW layout, stored as dtype (float or half).
 *
 * The coordinate tables come from the host (engine/kernels/preprocess.py resize_tables),
 * one int4 per output column (sx0, sx1, alpha0, alpha1) and per output row
 * (sy0, sy1, beta0, beta1), so the float arithmetic that picks the source pixels is the
 * host's double precision, as in OpenCV. Work-item (0, 0) also zeroes count[count_index] (when
 * >= 0): the frame's candidate counter of the decode (cl/decode.cl), which so needs no separate
 * fill command. Global size: (net_w, net_h). */
#include "common.h"

__kernel void yc_preprocess(__global const uchar* restrict S, const int src_stride,
                            __global const int4* restrict xtab, __global const int4* restrict ytab,
                            __global dtype* restrict Y, const int y_off,
                            const int net_w, const int net_h,
                            const int new_w, const int new_h, const int x0, const int y0,
                            __global int* restrict count, const int count_index)
{
    const int gx = get_global_id(0), gy = get_global_id(1);
    if (gx == 0 && gy == 0 && count_index >= 0)
        count[count_index] = 0;
    const int dx = gx - x0, dy = gy - y0;
    const int plane = net_w * net_h, o = y_off + gy * net_w + gx;
    if (dx < 0 || dy < 0 || dx >= new_w || dy >= new_h) {
        ST(Y, o, 0.5f);
        ST(Y, o + plane, 0.5f);
        ST(Y, o + 2 * plane, 0.5f);
        return;
    }
    const int4 xt = xtab[dx], yt = ytab[dy];
    __global const uchar* r0 = S + (size_t)yt.x * src_stride;
    __global const uchar* r1 = S + (size_t)yt.y * src_stride;
    const int c0 = 3 * xt.x, c1 = 3 * xt.y;
    for (int c = 0; c < 3; ++c) {
        const int h0 = r0[c0 + c] * xt.z + r0[c1 + c] * xt.w;   /* horizontal pass, x 2048 */
        const int h1 = r1[c0 + c] * xt.z + r1[c1 + c] * xt.w;
        /* OpenCV's VResizeLinearVec_32s8u: (beta * (h >> 4)) >> 16 per row, then (+2) >> 2 */
        int v = ((((yt.z * (h0 >> 4)) >> 16) + ((yt.w * (h1 >> 4)) >> 16) + 2) >> 2);
        v = clamp(v, 0, 255);
        ST(Y, o + (2 - c) * plane, (float)v * (1.0f / 255.0f));   /* BGR -> RGB planes */
    }
}

/* A float32 blob already on the device -> the network input in dtype (half under
 * HALF_STORAGE): the conversion a half executor's forward(blob) would otherwise do on the host.
 * Global size: (elements). */
__kernel void yc_store_input(__global const float* restrict X, __global dtype* restrict Y, const int y_off)
{
    const int i = get_global_id(0);
    ST(Y, y_off + i, X[i]);
}

/* The reverse, for the outputs: a network output in dtype (half under HALF_STORAGE), images
 * y_bstride elements apart in the arena -> dense float32 (batch, n), so the host reads float32
 * in one copy instead of converting half itself or reading image by image. Global size: (n, batch). */
__kernel void yc_load_output(__global const dtype* restrict Y, const int y_off, const int y_bstride,
                             __global float* restrict X, const int n)
{
    const int i = get_global_id(0), b = get_global_id(1);
    if (i >= n) return;
    X[(size_t)b * n + i] = LD(Y, y_off + b * y_bstride + i);
}

/* A head as the arena holds it, packed image after image (y_bstride apart in the arena, n apart
 * in X), the half storage's bits copied as they are: for a caller taking the plan's own type
 * (Executor.outputs_as). */
__kernel void yc_pack_output(__global const ushort* restrict Y, const int y_off, const int y_bstride,
                             __global ushort* restrict X, const int n)
{
    const int i = get_global_id(0), b = get_global_id(1);
    if (i >= n) return;
    X[(size_t)b * n + i] = Y[y_off + b * y_bstride + i];
}
