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

#define YC_DECODE_ARGS __global const dtype* restrict X, __global const int* restrict heads, \
    __global const float* restrict fheads, __global const float* restrict anchors, const int NHEADS, \
    const int CLASSES, const int net_w, const int net_h, const float thresh, __global int* restrict count, \
    __global float* restrict rows, const int cap

/* Anchor-cell g of image b: its row, if its objectness passes. */
inline void yc_decode_cell(const int g, const int b, YC_DECODE_ARGS)
{
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

__kernel void yc_decode_yolo(YC_DECODE_ARGS)
{
    yc_decode_cell(get_global_id(0), get_global_id(1), X, heads, fheads, anchors, NHEADS, CLASSES, net_w, net_h,
                   thresh, count, rows, cap);
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
 * The host orders candidates by g, then row: so does every comparison here, which makes the
 * visiting order of a class strict whatever the rows hold (two rows may share a g).
 * The suppression bits of every pair are computed once, in local memory; then each class some
 * candidate has is walked by one work-item of its own (no barrier per class), in its visiting
 * order (falling p, then g, then row): where every live class's probabilities fit in local
 * memory (NMS_CACHE) the whole group first places each (class, candidate) in its class's
 * order; else the work-item picks the next candidate after the last one visited, step by step,
 * from the rows. Each visited candidate is tested against the kept ones as a bit mask,
 * NMS_WORDS ANDs of its row of bits (suppression is symmetric: IoU and DIoU's term are).
 * The pass also lists what it keeps, so the host maps a frame's few detections without a pass
 * over the candidate rows: per image, `listed` holds (entries, candidates left out as
 * non-finite) and `dets` up to `dmax` rows (g as int bits, class as int bits, probability,
 * x, y, w, h as the decode wrote them, row as int bits), one per kept (candidate, class), in no
 * particular order; entries is dmax + 1 where more were kept than the list holds (the rows are
 * still NMSed, the list's rows some of the kept ones), -1 where this kernel left the image to
 * the host. */
#ifndef NMS_MAX
#define NMS_MAX 128
#endif
#ifndef NMS_CLASSES
#define NMS_CLASSES 1024
#endif
#ifndef NMS_CACHE
#define NMS_CACHE 2048          /* probabilities (candidates x live classes) kept in local memory, when they fit */
#endif
#define NMS_WORDS (NMS_MAX / 32)

#define YC_NMS_ARGS __global int* restrict count, __global float* restrict rows, const int cap, \
    const int CLASSES, const float thresh, const int kind, const float beta, const float sx, const float sy, \
    __global int* restrict listed, __global float* restrict dets, const int dmax
/* The group's local tables (declared by each kernel, at kernel scope as OpenCL C asks). */
#define YC_NMS_LOCALS \
    __local float bx[NMS_MAX], by[NMS_MAX], bw[NMS_MAX], bh[NMS_MAX]; \
    __local float4 raw[NMS_MAX];                 /* x, y, w, h as the decode wrote them */ \
    __local int gs[NMS_MAX], ok[NMS_MAX]; \
    __local uint sup[NMS_MAX * NMS_WORDS];       /* bit j of row i: candidate i suppresses j */ \
    __local uint live[NMS_CLASSES / 32];         /* the classes some finite probability has */ \
    __local float pc[NMS_CACHE];                 /* the live classes' probabilities, if they fit */ \
    __local int ord[NMS_CACHE];                  /* and their visiting orders */ \
    __local int live_k[NMS_CLASSES];             /* the live classes, in order */ \
    __local int counts[2];                       /* entries kept so far; live classes */
#define YC_NMS_TABLES bx, by, bw, bh, raw, gs, ok, sup, live, pc, ord, live_k, counts

/* The NMS of image b by the whole work-group (every work-item calls it: it holds barriers). The
 * rows are read through volatile loads: in yc_decode_nms other work-groups wrote them in the same
 * launch, past this compute unit's non-coherent L1. */
void yc_nms_image(const int b, YC_NMS_ARGS, __local float* bx, __local float* by, __local float* bw,
                  __local float* bh, __local float4* raw, __local int* gs, __local int* ok, __local uint* sup,
                  __local uint* live, __local float* pc, __local int* ord, __local int* live_k,
                  __local int* counts)
{
    const int lid = get_local_id(0), lsz = get_local_size(0);
    const int n = ((volatile __global int*)count)[b];
    if (n > NMS_MAX || n > cap || CLASSES > NMS_CLASSES) {
        if (lid == 0)
            listed[2 * b] = -1;
        return;
    }
    const int rowlen = CLASSES + 6;
    volatile __global float* R = rows + (size_t)b * cap * rowlen;
    for (int w = lid; w < NMS_CLASSES / 32; w += lsz)
        live[w] = 0;
    for (int i = lid; i < n; i += lsz) {             /* each row's g and box read once */
        volatile __global const float* r = R + i * rowlen;
        const float4 v = (float4)(r[1], r[2], r[3], r[4]);
        const float x = v.x * sx, y = v.y * sy, w = v.z * sx, h = v.w * sy;
        gs[i] = as_int(r[0]);
        raw[i] = v;
        bx[i] = x; by[i] = y; bw[i] = w; bh[i] = h;
        ok[i] = isfinite(x) && isfinite(y) && isfinite(w) && isfinite(h);
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* every probability once, by the whole group: a non-finite one takes its row out (a plain
     * store: every writer writes 0), a positive one marks its class live (a superset of the
     * classes of finite rows: a class left without one keeps nothing below) */
    for (int t = lid; t < n * CLASSES; t += lsz) {
        const int i = t / CLASSES, k = t - i * CLASSES;
        const float p = R[i * rowlen + 6 + k];
        if (!isfinite(p))
            ok[i] = 0;
        else if (p > 0)
            atomic_or(live + (k >> 5), 1u << (k & 31));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int words = (n + 31) / 32;
    __global float* D = dets + (size_t)b * dmax * 8;
    __local int* listed_n = counts;                     /* entries kept so far */
    __local int* nlive = counts + 1;                    /* live classes */
    if (lid == 0)
        *listed_n = 0;
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
    /* the live classes in order, and their probabilities [live class][candidate] in local memory
     * where they fit (else each is read from the rows when visited) */
    if (lid == 0) {
        int c = 0;
        for (int w = 0; w < (CLASSES + 31) / 32; ++w)
            for (uint m = live[w]; m; m &= m - 1)
                live_k[c++] = w * 32 + (31 - clz(m & (0u - m)));
        *nlive = c;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int L = *nlive, cached = L * n <= NMS_CACHE;
    if (cached)
        for (int t = lid; t < L * n; t += lsz) {
            const int c = t / n, i = t - c * n;
            pc[t] = R[i * rowlen + 6 + live_k[c]];
        }
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    /* where they fit, every live class's visiting order (falling p, then g, then row), each
     * (class, candidate) placed by the whole group at once: ord[class][place] = candidate */
    for (int t = lid; t < (cached ? L * n : 0); t += lsz) {    /* (PoCL lost these stores under an if) */
        const int c = t / n, i = t - c * n;
        const float p = pc[t];
        const int g = gs[i];
        int pos = 0;
        for (int j = 0; j < n; ++j) {
            const float q = pc[c * n + j];
            pos += ok[j] && q > 0 && (q > p || (q == p && (gs[j] < g || (gs[j] == g && j < i))));
        }
        if (ok[i] && p > 0)
            ord[c * n + pos] = i;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    /* one work-item per live class: it visits the class's candidates in that order (or, where
     * the orders did not fit, picks at each step the next one after the last visited), and
     * keeps each one that no kept candidate suppresses (suppression is symmetric: row i's bits
     * are who suppresses i) */
    for (int c0 = 0; c0 < L; c0 += lsz) {
        const int c = c0 + lid;
        if (c >= L)
            continue;
        const int k = live_k[c];
        uint keep[NMS_WORDS];
        for (int w2 = 0; w2 < NMS_WORDS; ++w2)
            keep[w2] = 0;
        int m = 0;                                     /* the class's candidates, where ordered */
        if (cached)
            for (int i = 0; i < n; ++i)
                m += ok[i] && pc[c * n + i] > 0;
        float lp = INFINITY;                           /* the last visited: (p, g, row) */
        int lg = 0, li = -1;
        for (int step = 0; step < n; ++step) {         /* at most n candidates to visit */
            int best = -1, bg = 0;
            float bp = 0.0f;
            if (cached) {
                if (step >= m)
                    break;
                best = ord[c * n + step];
                bp = pc[c * n + best];
                bg = gs[best];
            } else {
                for (int i = 0; i < n; ++i) {
                    const float p = R[i * rowlen + 6 + k];
                    const int g = gs[i];
                    const int after = p < lp || (p == lp && (g > lg || (g == lg && i > li)));
                    if (ok[i] && p > 0 && after && (best < 0 || p > bp || (p == bp && g < bg))) {
                        best = i;      /* i ascending: the first of equal (p, g) stays */
                        bp = p;
                        bg = g;
                    }
                }
                if (best < 0)
                    break;
                lp = bp;
                lg = bg;
                li = best;
            }
            uint hit = 0;
            for (int w2 = 0; w2 < words; ++w2)
                hit |= sup[best * NMS_WORDS + w2] & keep[w2];
            if (hit) {
                R[best * rowlen + 6 + k] = 0.0f;
            } else {
                keep[best / 32] |= 1u << (best % 32);
                const int slot = atomic_inc(listed_n);
                if (slot < dmax) {
                    __global float* d = D + slot * 8;
                    d[0] = as_float(bg);
                    d[1] = as_float(k);
                    d[2] = bp;
                    d[3] = raw[best].x;
                    d[4] = raw[best].y;
                    d[5] = raw[best].z;
                    d[6] = raw[best].w;
                    d[7] = as_float(best);
                }
            }
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int dropped = 0;
    for (int i = 0; i < n; ++i)
        dropped += !ok[i];
    const int entries = min(*listed_n, dmax + 1);
    if (lid == 0) {
        listed[2 * b] = entries;
        listed[2 * b + 1] = dropped;
    }
}

__kernel void yc_nms(YC_NMS_ARGS)
{
    YC_NMS_LOCALS
    yc_nms_image(get_group_id(0), count, rows, cap, CLASSES, thresh, kind, beta, sx, sy, listed, dets, dmax,
                 YC_NMS_TABLES);
}

/* A fence that orders this work-item's global stores before its later ones for the whole device:
 * PTX membar.gl on NVIDIA (NV_MEMBAR), where OpenCL C 1.2's mem_fence need not reach past the
 * work-group; mem_fence elsewhere (PoCL's work-groups share the host's coherent caches). */
#ifdef NV_MEMBAR
#define YC_DEVICE_FENCE() asm volatile("membar.gl;" ::: "memory")
#else
#define YC_DEVICE_FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#endif

/* yc_decode_yolo and yc_nms in one launch: global size (anchor-cells rounded up to the local
 * size, images), local size (the NMS's work-group, 1). Each work-group decodes its cells; the
 * one that finishes image b last (a count per image in `done`, reset to 0 by that group for the
 * next launch) runs image b's NMS. Every work-item fences its row stores device-wide before the
 * count (YC_DEVICE_FENCE). */
__kernel void yc_decode_nms(YC_DECODE_ARGS, const int cells, const float nms_thresh, const int kind,
                            const float beta, const float sx, const float sy, __global int* restrict listed,
                            __global float* restrict dets, const int dmax, __global int* restrict done)
{
    YC_NMS_LOCALS
    __local int last[1];
    const int g = get_global_id(0), b = get_global_id(1);
    if (g < cells)
        yc_decode_cell(g, b, X, heads, fheads, anchors, NHEADS, CLASSES, net_w, net_h, thresh, count, rows, cap);
    YC_DEVICE_FENCE();
    barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE);
    if (get_local_id(0) == 0) {
        last[0] = atomic_inc(done + b) == (int)get_num_groups(0) - 1;
        if (last[0])
            done[b] = 0;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last[0])
        return;
    YC_DEVICE_FENCE();
    yc_nms_image(b, count, rows, cap, CLASSES, nms_thresh, kind, beta, sx, sy, listed, dets, dmax, YC_NMS_TABLES);
}
