/* [yolo] head decoding on the device, as engine/postprocess.py decode_yolo does it: logistic
 * on x, y, objectness and classes (none with new_coords), scale_x_y, box size from the anchor
 * (exp, or 4 t^2 with new_coords), the threshold on objectness and on each class probability.
 * Every head of the network is decoded by one launch: work-item g of image b belongs to the
 * head whose first index is the largest one <= g. Each anchor-cell whose objectness passes
 * takes a row of the candidate buffer through an atomic counter per image:
 *   (g as int bits, x, y, w, h relative to the network input, objectness, CLASSES probs)
 * g = head's first index + anchor * HW + cell orders candidates as the host decode does.
 * Rows past `cap` are counted but not written. Global size: (anchor-cells of all heads, batch).
 *
 * heads: HEAD_INTS ints per head (x_off, x_bstride, LW, LH, new_coords, first index, anchor
 * offset into `anchors`, 0); fheads: (scale_x_y, 0.5 (scale_x_y - 1)) per head. */
#include "common.h"

#define HEAD_INTS 8

__kernel void yc_decode_yolo(__global const dtype* restrict X, __global const int* restrict heads,
                             __global const float* restrict fheads, __global const float* restrict anchors,
                             const int NHEADS, const int CLASSES, const int net_w, const int net_h,
                             const float thresh, __global int* restrict count, __global float* restrict rows,
                             const int cap)
{
    const int g = get_global_id(0), b = get_global_id(1);
    int h = 0;
    while (h + 1 < NHEADS && g >= heads[(h + 1) * HEAD_INTS + 5])
        ++h;
    __global const int* hd = heads + h * HEAD_INTS;
    const int LW = hd[2], LH = hd[3], new_coords = hd[4];
    const int HW = LW * LH, j = g - hd[5];
    const int n = j / HW, cell = j - n * HW;
    const int base = hd[0] + b * hd[1] + n * (CLASSES + 5) * HW + cell;
    float obj = LD(X, base + 4 * HW);
    if (!new_coords)
        obj = yc_logistic(obj);
    if (!(obj > thresh))
        return;
    const int slot = atomic_inc(count + b);
    if (slot >= cap)
        return;
    __global float* r = rows + ((size_t)b * cap + slot) * (CLASSES + 6);
    const int row = cell / LW, col = cell - row * LW;
    float tx = LD(X, base), ty = LD(X, base + HW);
    const float tw = LD(X, base + 2 * HW), th = LD(X, base + 3 * HW);
    if (!new_coords) {
        tx = yc_logistic(tx);
        ty = yc_logistic(ty);
    }
    const float scale = fheads[2 * h], shift = fheads[2 * h + 1];
    tx = tx * scale - shift;
    ty = ty * scale - shift;
    const float aw = anchors[hd[6] + 2 * n], ah = anchors[hd[6] + 2 * n + 1];
    r[0] = as_float(g);
    r[1] = ((float)col + tx) / (float)LW;
    r[2] = ((float)row + ty) / (float)LH;
    r[3] = (new_coords ? tw * tw * 4.0f : exp(tw)) * aw / (float)net_w;
    r[4] = (new_coords ? th * th * 4.0f : exp(th)) * ah / (float)net_h;
    r[5] = obj;
    for (int k = 0; k < CLASSES; ++k) {
        float c = LD(X, base + (5 + k) * HW);
        if (!new_coords)
            c = yc_logistic(c);
        const float p = obj * c;
        r[6 + k] = p > thresh ? p : 0.0f;
    }
}
