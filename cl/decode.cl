/* [yolo] head decoding on the device, as engine/postprocess.py decode_yolo does it: logistic
 * on x, y, objectness and classes (none with NEW_COORDS), scale_x_y, box size from the
 * anchor (exp, or 4 t^2 with NEW_COORDS), the threshold on objectness and on each class
 * probability. Each anchor-cell whose objectness passes takes a row of the candidate buffer
 * through an atomic counter per image:
 *   (index as int bits, x, y, w, h relative to the network input, objectness, CLASSES probs)
 * where index = idx_base + anchor * HW + cell orders candidates as the host decode does.
 * Global size: (HW, anchors, batch). Rows past `cap` are counted but not written. */
#include "common.h"

__kernel void yc_decode_yolo(__global const dtype* restrict X, const int x_off, const int x_bstride,
                             const int LW, const int LH, const int CLASSES,
                             __global const float* restrict anchors, const float scale, const float shift,
                             const int net_w, const int net_h, const float thresh, const int idx_base,
                             __global int* restrict count, __global float* restrict rows, const int cap)
{
    const int cell = get_global_id(0), n = get_global_id(1), b = get_global_id(2);
    const int HW = LW * LH;
    const int base = x_off + b * x_bstride + n * (CLASSES + 5) * HW + cell;
    float obj = LD(X, base + 4 * HW);
#ifndef NEW_COORDS
    obj = yc_logistic(obj);
#endif
    if (!(obj > thresh))
        return;
    const int slot = atomic_inc(count + b);
    if (slot >= cap)
        return;
    __global float* r = rows + ((size_t)b * cap + slot) * (CLASSES + 6);
    const int row = cell / LW, col = cell - row * LW;
    float tx = LD(X, base), ty = LD(X, base + HW);
    const float tw = LD(X, base + 2 * HW), th = LD(X, base + 3 * HW);
#ifndef NEW_COORDS
    tx = yc_logistic(tx);
    ty = yc_logistic(ty);
#endif
    tx = tx * scale - shift;
    ty = ty * scale - shift;
    r[0] = as_float(idx_base + n * HW + cell);
    r[1] = ((float)col + tx) / (float)LW;
    r[2] = ((float)row + ty) / (float)LH;
#ifdef NEW_COORDS
    r[3] = tw * tw * 4.0f * anchors[2 * n] / (float)net_w;
    r[4] = th * th * 4.0f * anchors[2 * n + 1] / (float)net_h;
#else
    r[3] = exp(tw) * anchors[2 * n] / (float)net_w;
    r[4] = exp(th) * anchors[2 * n + 1] / (float)net_h;
#endif
    r[5] = obj;
    for (int k = 0; k < CLASSES; ++k) {
        float c = LD(X, base + (5 + k) * HW);
#ifndef NEW_COORDS
        c = yc_logistic(c);
#endif
        const float p = obj * c;
        r[6 + k] = p > thresh ? p : 0.0f;
    }
}
