/* [yolo] head decoding on the device, as engine/postprocess.py decode_yolo does it: logistic
 * on x, y, objectness and classes (none with new_coords), scale_x_y, box size from the anchor
 * (exp, or 4 t^2 with new_coords), the threshold on objectness and on each class probability.
 * Every head of the network is decoded by one launch: work-item g of image b belongs to the
 * head whose first index is the largest one <= g. Each anchor-cell whose objectness passes
 * takes a row of the candidate buffer through an atomic counter per image:
 *   (g as int bits, x, y, w, h relative to the network input, objectness, CLASSES probs)
 * g = head's first index + anchor * HW + cell orders candidates as the host decode does.
 * Rows past `cap` are counted but not written. Global size: (anchor-cells of all heads, images):
 * a batch's padding inputs (fewer images than the executor's batch) are not decoded.
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

/* Per-class NMS over one image's candidates, as engine/postprocess.py nms does it on the host
 * (Darknet's do_nms_sort / diounms_sort): for each class, candidates in order of falling
 * probability (ties in the host decode's order, g), each one that no earlier kept candidate
 * suppresses is kept; a suppressed candidate's probability of that class is zeroed in place.
 * One work-group per image (global size: local size x images); an image with more than NMS_MAX
 * candidates (or more than the buffer holds) is left to the host, and so is a network of more
 * than NMS_CLASSES classes. Boxes are compared in the image's relative coordinates, where
 * correct_boxes puts them on the host: x and w scaled by sx, y and h by sy (offsets cancel).
 * kind: 0 IoU, 1 greedynms (IoU - (d^2/c^2)^0.6), 2 diounms (IoU - (d^2/c^2)^beta). Candidates
 * whose box or probabilities are not finite take no part (the host drops them).
 * Ranks (the host's order by g) are made unique by the row index, so the visiting order is a
 * permutation whatever the rows hold: the pass never follows an unset entry out of bounds.
 * Everything the greedy pass reads is in local memory: the suppression bits of every pair, and
 * per class (only the classes some candidate has) its probabilities and their visiting order;
 * one work-item walks that order with the kept candidates as a bit mask, so a candidate's test
 * is NMS_WORDS ANDs of its row of bits (suppression is symmetric: IoU and DIoU's term are).
 * The pass also lists what it keeps, so the host maps a frame's few detections without a pass
 * over the candidate rows: per image, `listed` holds (entries, candidates left out as
 * non-finite) and `dets` up to `dmax` rows (rank as int bits, class as int bits, probability,
 * x, y, w, h as the decode wrote them, 0), one per kept (candidate, class), per class in
 * visiting order; entries is dmax + 1 where more were kept than the list holds (the rows are
 * still NMSed), -1 where this kernel left the image to the host. */
#ifndef NMS_MAX
#define NMS_MAX 128
#endif
#ifndef NMS_CLASSES
#define NMS_CLASSES 1024
#endif
#ifndef NMS_CACHE
#define NMS_CACHE 2048          /* probabilities (candidates x classes) kept in local memory, when they fit */
#endif
#define NMS_WORDS (NMS_MAX / 32)

__kernel void yc_nms(__global const int* restrict count, __global float* restrict rows, const int cap,
                     const int CLASSES, const float thresh, const int kind, const float beta,
                     const float sx, const float sy, __global int* restrict listed,
                     __global float* restrict dets, const int dmax)
{
    const int b = get_group_id(0), lid = get_local_id(0), lsz = get_local_size(0);
    const int n = count[b];
    if (n > NMS_MAX || n > cap || CLASSES > NMS_CLASSES) {
        if (lid == 0)
            listed[2 * b] = -1;
        return;
    }
    const int rowlen = CLASSES + 6;
    __global float* R = rows + (size_t)b * cap * rowlen;
    __local float bx[NMS_MAX], by[NMS_MAX], bw[NMS_MAX], bh[NMS_MAX], pk[NMS_MAX];
    __local float4 raw[NMS_MAX];                    /* x, y, w, h as the decode wrote them */
    __local int gs[NMS_MAX], rank[NMS_MAX], ok[NMS_MAX], ord[NMS_MAX];
    __local uint sup[NMS_MAX * NMS_WORDS];          /* bit j of row i: candidate i suppresses j */
    __local uint live[NMS_CLASSES / 32];            /* the classes some finite probability has */
    __local float pc[NMS_CACHE];                    /* the probabilities, [candidate][class], if they fit */
    const int cached = n * CLASSES <= NMS_CACHE;
    for (int w = lid; w < NMS_CLASSES / 32; w += lsz)
        live[w] = 0;
    for (int i = lid; i < n; i += lsz) {             /* each row's g and box read once */
        __global const float* r = R + i * rowlen;
        const float4 v = (float4)(r[1], r[2], r[3], r[4]);
        const float x = v.x * sx, y = v.y * sy, w = v.z * sx, h = v.w * sy;
        gs[i] = as_int(r[0]);
        raw[i] = v;
        bx[i] = x; by[i] = y; bw[i] = w; bh[i] = h;
        ok[i] = isfinite(x) && isfinite(y) && isfinite(w) && isfinite(h);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = lid; i < n; i += lsz) {
        const int g = gs[i];
        int before = 0;                                /* unique even if two rows share a g */
        for (int j = 0; j < n; ++j)
            before += gs[j] < g || (gs[j] == g && j < i);
        rank[i] = before;
    }
    /* every probability once, by the whole group: a non-finite one takes its row out (a plain
     * store: every writer writes 0), a positive one marks its class live (a superset of the
     * classes of finite rows: a class left without one keeps nothing below) */
    for (int t = lid; t < n * CLASSES; t += lsz) {
        const int i = t / CLASSES, k = t - i * CLASSES;
        const float p = R[i * rowlen + 6 + k];
        if (cached)
            pc[t] = p;
        if (!isfinite(p))
            ok[i] = 0;
        else if (p > 0)
            atomic_or(live + (k >> 5), 1u << (k & 31));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int words = (n + 31) / 32;
    __global float* D = dets + (size_t)b * dmax * 8;
    __local int listed_n;                               /* entries kept so far (lid 0 counts) */
    if (lid == 0)
        listed_n = 0;
    for (int t = lid; t < n * words; t += lsz) {
        const int i = t / words, w0 = (t - i * words) * 32;
        const float ax1 = bx[i] - bw[i] / 2, ay1 = by[i] - bh[i] / 2;
        const float ax2 = bx[i] + bw[i] / 2, ay2 = by[i] + bh[i] / 2;
        uint bits = 0;
        for (int j = w0; j < min(w0 + 32, n); ++j) {
            const float cx1 = bx[j] - bw[j] / 2, cy1 = by[j] - bh[j] / 2;
            const float cx2 = bx[j] + bw[j] / 2, cy2 = by[j] + bh[j] / 2;
            const float iw = fmin(ax2, cx2) - fmax(ax1, cx1), ih = fmin(ay2, cy2) - fmax(ay1, cy1);
            const float inter = fmax(iw, 0.0f) * fmax(ih, 0.0f);
            const float uni = bw[i] * bh[i] + bw[j] * bh[j] - inter;
            float score = uni > 0 ? inter / uni : 0.0f;
            if (kind) {
                const float cw = fmax(ax2, cx2) - fmin(ax1, cx1), ch = fmax(ay2, cy2) - fmin(ay1, cy1);
                const float c2 = cw * cw + ch * ch;
                const float dx = bx[i] - bx[j], dy = by[i] - by[j];
                const float d = c2 > 0 ? (dx * dx + dy * dy) / c2 : 0.0f;
                score -= pow(d, kind == 1 ? 0.6f : beta);
            }
            if (score > thresh)
                bits |= 1u << (j - w0);
        }
        sup[i * NMS_WORDS + w0 / 32] = bits;
    }
    for (int w = 0; w < (CLASSES + 31) / 32; ++w) {      /* the same classes, in the same order, on every work-item */
        barrier(CLK_LOCAL_MEM_FENCE);
        uint m = live[w];
        while (m) {
            const int k = w * 32 + (31 - clz(m & (0u - m)));
            m &= m - 1;
            for (int i = lid; i < n; i += lsz)
                pk[i] = !ok[i] ? 0.0f : cached ? pc[i * CLASSES + k] : R[i * rowlen + 6 + k];
            barrier(CLK_LOCAL_MEM_FENCE);
            for (int i = lid; i < n; i += lsz) {         /* place in the visiting order: falling p, then rank */
                const float p = pk[i];
                if (!(p > 0))
                    continue;
                int pos = 0;
                for (int j = 0; j < n; ++j)
                    pos += pk[j] > p || (pk[j] == p && rank[j] < rank[i]);
                ord[pos] = i;
            }
            barrier(CLK_LOCAL_MEM_FENCE);
            if (lid == 0) {     /* suppression is symmetric: row i's bits are who suppresses i */
                uint keep[NMS_WORDS];
                int live_n = 0;
                for (int w2 = 0; w2 < NMS_WORDS; ++w2)
                    keep[w2] = 0;
                for (int i = 0; i < n; ++i)
                    live_n += pk[i] > 0;
                for (int t = 0; t < live_n; ++t) {
                    const int i = ord[t];
                    uint hit = 0;
                    for (int w2 = 0; w2 < words; ++w2)
                        hit |= sup[i * NMS_WORDS + w2] & keep[w2];
                    if (hit) {
                        R[i * rowlen + 6 + k] = 0.0f;
                        continue;
                    }
                    keep[i / 32] |= 1u << (i % 32);
                    if (listed_n < dmax) {
                        __global float* d = D + listed_n * 8;
                        d[0] = as_float(rank[i]);
                        d[1] = as_float(k);
                        d[2] = pk[i];
                        d[3] = raw[i].x;
                        d[4] = raw[i].y;
                        d[5] = raw[i].z;
                        d[6] = raw[i].w;
                        d[7] = 0.0f;
                    }
                    ++listed_n;
                }
            }
            barrier(CLK_LOCAL_MEM_FENCE);
        }
    }
    if (lid == 0) {
        int dropped = 0;
        for (int i = 0; i < n; ++i)
            dropped += !ok[i];
        listed[2 * b] = listed_n <= dmax ? listed_n : dmax + 1;
        listed[2 * b + 1] = dropped;
    }
}
