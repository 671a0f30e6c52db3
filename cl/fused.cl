/* Kernels that do the work of several layers in one launch.
 *
 * yc_wino_input_fused: Winograd's input transform reading *through* layers the graph folded
 * into it (engine/graph.py mark_read_fusions), so they cost no launch and their outputs are
 * never written:
 *   POOL   the whole input is a [maxpool] of S0 (size MP_SIZE, strides MP_SX x MP_SY, padding
 *          MP_PAD): each input pixel is the window's maximum, as yc_maxpool_rows computes it;
 *   SEG_N  1 or 2 channel segments of the input come from elsewhere: channels
 *          [SEGk_C0, SEGk_C0 + SEGk_C) are scale_k * Sk(y / SEGk_S, x / SEGk_S), a nearest
 *          [upsample] as yc_upsample computes it (stride SEGk_S > 1) or a route's copy (stride 1,
 *          scale 1); the other channels come from X.
 * Everything else is yc_wino_input's (cl/winograd.cl): same tiles, same transform, same V layout.
 * Global size (P, C, batch): one work-item per (tile, channel, image).
 */
#include "winograd.cl"

#ifndef SEG_N
#define SEG_N 0
#endif

#ifdef POOL
/* The [maxpool]'s output at (y, x): the maximum of its window over S0 (pixels outside skipped). */
inline float yc_pool_at(const __global dtype* Sc, const int y, const int x, const int S0H, const int S0W)
{
    const int sy0 = y * MP_SY - MP_PAD, sx0 = x * MP_SX - MP_PAD;
    float m = -FLT_MAX;
    for (int dy = 0; dy < MP_SIZE; ++dy) {
        const int sy = sy0 + dy;
        if (sy < 0 || sy >= S0H) continue;
        for (int dx = 0; dx < MP_SIZE; ++dx) {
            const int sx = sx0 + dx;
            if (sx >= 0 && sx < S0W) {
                const float v = LD(Sc, sy * S0W + sx);
                m = v > m ? v : m;
            }
        }
    }
    return m;
}
#endif

__kernel void yc_wino_input_fused(__global const dtype* restrict X, const int x_off, const int x_bstride,
                                  const int C, const int H, const int W,
                                  __global dtype* restrict V, const int v_off, const int TW, const int P,
                                  const int PAD,
                                  __global const dtype* restrict S0, const int s0_off, const int s0_bstride,
                                  const int S0H, const int S0W, const float scale0,
                                  __global const dtype* restrict S1, const int s1_off, const int s1_bstride,
                                  const int S1H, const int S1W, const float scale1)
{
    const int p = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    if (p >= P) return;
    const int ty = p / TW, tx = p - ty * TW;
    const int y0 = ty * WINO_M - PAD, x0 = tx * WINO_M - PAD;
    float d[T2];
#ifdef POOL
    const __global dtype* Sc = S0 + s0_off + (size_t)b * s0_bstride + (size_t)c * S0H * S0W;
    YC_WINO_GATHER(d, y0, x0, H, W, yc_pool_at(Sc, y, x, S0H, S0W))
#else
    const __global dtype* Xc = X + x_off + (size_t)b * x_bstride + (size_t)c * H * W;
    int sw = W, st = 1;
    float sc = 1.0f;
#if SEG_N > 0
    if (c >= SEG0_C0 && c < SEG0_C0 + SEG0_C) {
        Xc = S0 + s0_off + (size_t)b * s0_bstride + (size_t)(c - SEG0_C0) * S0H * S0W;
        sw = S0W; st = SEG0_S; sc = scale0;
    }
#endif
#if SEG_N > 1
    if (c >= SEG1_C0 && c < SEG1_C0 + SEG1_C) {
        Xc = S1 + s1_off + (size_t)b * s1_bstride + (size_t)(c - SEG1_C0) * S1H * S1W;
        sw = S1W; st = SEG1_S; sc = scale1;
    }
#endif
    YC_WINO_GATHER(d, y0, x0, H, W, sc * LD(Xc, (y / st) * sw + x / st))
#endif
    yc_wino_tile_store(d, V, (size_t)v_off + ((size_t)b * T2 * C + c) * P + p, C, P);
}

#ifdef MP_N
#if MP_N < 3
#undef MP_R2
#define MP_R2 MP_R1                            /* two pools: the third window is the second */
#endif
/* Max over the in-image part of row `r`'s columns ox + dx, R_IN < |dx| <= R_OUT, into m. */
#define YC_ROW_MAX(r, ox, W, R_IN, R_OUT, m)                                       \
    _Pragma("unroll")                                                             \
    for (int dx = (R_IN) + 1; dx <= (R_OUT); ++dx) {                              \
        if ((ox) - dx >= 0) { const float v = LD(r, (ox) - dx); m = v > m ? v : m; } \
        if ((ox) + dx < (W)) { const float v = LD(r, (ox) + dx); m = v > m ? v : m; } \
    }

/* Sibling max-pools of one input in one pass (engine/graph.merge_sibling_pools: SPP's 5/9/13):
 * MP_N (2 or 3) centred stride-1 windows of radius MP_R0 < MP_R1 < MP_R2, each as
 * yc_maxpool_rows computes it (pixels outside the input are skipped), written to Y0, Y1, Y2
 * (Y2 unused with two). Each row of the largest window is read once: its maxima over the three
 * nested column ranges grow outwards, and each window takes the rows within its radius.
 * Global size (H, C, batch): one work-item per (row, channel, image); with MP_PIXELS (GPUs, as
 * yc_maxpool_rows) (H * W, C, batch), one per pixel. */
__kernel void yc_maxpool_nested(__global const dtype* restrict X, const int x_off, const int x_bstride,
                                const int H, const int W,
                                __global dtype* restrict Y0, const int y0_off, const int y0_bstride,
                                __global dtype* restrict Y1, const int y1_off, const int y1_bstride,
                                __global dtype* restrict Y2, const int y2_off, const int y2_bstride)
{
    YC_POOL_SPAN(W, oy, first, last);
    const int c = get_global_id(1), b = get_global_id(2);
    const __global dtype* Xc = X + x_off + (size_t)b * x_bstride + (size_t)c * H * W;
    const size_t row = ((size_t)c * H + oy) * W;
    for (int ox = first; ox < last; ++ox) {
        float m0 = -FLT_MAX, m1 = -FLT_MAX, m2 = -FLT_MAX;
        #pragma unroll
        for (int dy = -MP_R2; dy <= MP_R2; ++dy) {
            const int iy = oy + dy;
            if (iy < 0 || iy >= H) continue;
            const __global dtype* r = Xc + iy * W;
            float h = LD(r, ox);
            YC_ROW_MAX(r, ox, W, 0, MP_R0, h)
            if (dy >= -MP_R0 && dy <= MP_R0) m0 = h > m0 ? h : m0;
            YC_ROW_MAX(r, ox, W, MP_R0, MP_R1, h)
            if (dy >= -MP_R1 && dy <= MP_R1) m1 = h > m1 ? h : m1;
            YC_ROW_MAX(r, ox, W, MP_R1, MP_R2, h)
            m2 = h > m2 ? h : m2;
        }
        ST(Y0, y0_off + (size_t)b * y0_bstride + row + ox, m0);
        ST(Y1, y1_off + (size_t)b * y1_bstride + row + ox, m1);
#if MP_N > 2
        ST(Y2, y2_off + (size_t)b * y2_bstride + row + ox, m2);
#endif
    }
}
#endif
