/* Winograd F(m x m, 3x3) for 3x3 stride-1 convolutions (m = WINO_M: 2 or 4).
 *
 * Three steps; the middle one is the generated GEMM (cl/gemm_local.cl) batched over the
 * T2 = (m+2)^2 transform points, with weights transformed once at load time (U = G g G^T):
 *   yc_wino_input   V[b][xi][c][p] = (B^T d B)[xi] for each m x m output tile p of channel c
 *   GEMM            Mt[b][xi][f][p] = sum_c U[xi][f][c] * V[b][xi][c][p]
 *   yc_wino_output  Y = A^T Mt A per tile, fused with the conv epilogue (bias, ACT, residual + ACT2),
 *                   written into the output view (which may be a concat slice).
 * Matrices are Lavin & Gray's. Tiles are numbered row-major over a TH x TW grid. On a CPU the
 * three can be one kernel, yc_wino_fused (at the end), which keeps V and Mt in private memory.
 */
#include "common.h"

#ifndef WINO_M
#define WINO_M 2
#endif
#define WT (WINO_M + 2)
#define T2 (WT * WT)

/* A tile row as a vector: WVEC, its activation yc_act_w, and WROW(p, i) = p[i .. i+WINO_M). */
#if WINO_M == 2
#define WVEC float2
#define WROW(p, i) ((float2)((p)[i], (p)[(i) + 1]))
YC_DEFINE_ACTIVATE_VEC(yc_act_w, float2, as_int2, as_float2)
#else
#define WVEC float4
#define WROW(p, i) ((float4)((p)[i], (p)[(i) + 1], (p)[(i) + 2], (p)[(i) + 3]))
YC_DEFINE_ACTIVATE_VEC(yc_act_w, float4, as_int4, as_float4)
#endif

/* NAME_BT(in, s, out, so): out = B^T in, over WT elements spaced `s` apart; NAME_AT: out = A^T in,
 * WT elements spaced `s` apart -> WINO_M elements spaced `so` apart. Defined for a float and, in
 * the tile-vector kernels below, for a vector T whose lanes are neighbouring tiles. */
#if WINO_M == 2
#define YC_DEFINE_WINO_TRANSFORMS(NAME_BT, NAME_AT, T)                                          \
    inline void NAME_BT(const T* in, const int s, T* out, const int so) {                       \
        out[0 * so] = in[0] - in[2 * s];                                                        \
        out[1 * so] = in[s] + in[2 * s];                                                        \
        out[2 * so] = in[2 * s] - in[s];                                                        \
        out[3 * so] = in[s] - in[3 * s];                                                        \
    }                                                                                           \
    inline void NAME_AT(const T* in, const int s, T* out, const int so) {                       \
        out[0] = in[0] + in[s] + in[2 * s];                                                     \
        out[so] = in[s] - in[2 * s] - in[3 * s];                                                \
    }
#else
#define YC_DEFINE_WINO_TRANSFORMS(NAME_BT, NAME_AT, T)                                          \
    inline void NAME_BT(const T* in, const int s, T* out, const int so) {                       \
        const T d0 = in[0], d1 = in[s], d2 = in[2 * s], d3 = in[3 * s], d4 = in[4 * s], d5 = in[5 * s]; \
        out[0 * so] = 4.0f * d0 - 5.0f * d2 + d4;                                              \
        out[1 * so] = -4.0f * (d1 + d2) + d3 + d4;                                              \
        out[2 * so] = 4.0f * (d1 - d2) - d3 + d4;                                               \
        out[3 * so] = 2.0f * (d3 - d1) - d2 + d4;                                               \
        out[4 * so] = 2.0f * (d1 - d3) - d2 + d4;                                               \
        out[5 * so] = 4.0f * d1 - 5.0f * d3 + d5;                                               \
    }                                                                                           \
    inline void NAME_AT(const T* in, const int s, T* out, const int so) {                       \
        const T m0 = in[0], m1 = in[s], m2 = in[2 * s], m3 = in[3 * s], m4 = in[4 * s], m5 = in[5 * s]; \
        const T a = m1 + m2, b = m1 - m2, c = m3 + m4, d = m3 - m4;                             \
        out[0] = m0 + a + c;                                                                    \
        out[so] = b + 2.0f * d;                                                                 \
        out[2 * so] = a + 4.0f * c;                                                             \
        out[3 * so] = b + 8.0f * d + m5;                                                        \
    }
#endif
YC_DEFINE_WINO_TRANSFORMS(yc_bt, yc_at, float)

/* u = B^T d B (BT: a tile's input transform, WT x WT -> WT x WT) and y = A^T m A (AT: its output
 * transform, WT x WT -> WINO_M x WINO_M), through t, for either element type. */
#define YC_WINO_FORWARD(BT, d, t, u)                                                             \
    _Pragma("unroll") for (int j = 0; j < WT; ++j) BT((d) + j, WT, (t) + j, WT);      /* t = B^T d */ \
    _Pragma("unroll") for (int i = 0; i < WT; ++i) BT((t) + i * WT, 1, (u) + i * WT, 1); /* u = t B */
#define YC_WINO_INVERSE(AT, m, t, y)                                                             \
    _Pragma("unroll") for (int j = 0; j < WT; ++j) AT((m) + j, WT, (t) + j, WT);      /* t = A^T m */ \
    _Pragma("unroll") for (int i = 0; i < WINO_M; ++i) AT((t) + i * WT, 1, (y) + i * WINO_M, 1); /* y = t A */

/* The tail of every input transform: u = B^T d B for the WT x WT input tile d, stored as T2
 * planes of C x P (element xi of the tile at base + xi * C * P). */
inline void yc_wino_tile_store(const float* d, __global dtype* restrict V, const size_t base, const int C,
                               const int P)
{
    float t[T2], u[T2];
    YC_WINO_FORWARD(yc_bt, d, t, u)
    #pragma unroll
    for (int xi = 0; xi < T2; ++xi) ST(V, base + (size_t)xi * C * P, u[xi]);
}

/* d[i * WT + j] = EXPR, the input at pixel (y, x) of the WT x WT tile whose corner is (y0, x0),
 * or 0 outside the H x W input (the conv's zero padding). */
#define YC_WINO_GATHER(d, y0, x0, H, W, EXPR)                                                    \
    _Pragma("unroll") for (int i = 0; i < WT; ++i) {                                             \
        const int y = (y0) + i;                                                                  \
        _Pragma("unroll") for (int j = 0; j < WT; ++j) {                                         \
            const int x = (x0) + j;                                                              \
            d[i * WT + j] = (y >= 0 && y < (H) && x >= 0 && x < (W)) ? (EXPR) : 0.0f;            \
        }                                                                                        \
    }

/* Global size (P, C, batch): one work-item per (tile, channel, image). */
__kernel void yc_wino_input(__global const dtype* restrict X, const int x_off, const int x_bstride,
                            const int C, const int H, const int W,
                            __global dtype* restrict V, const int v_off, const int TW, const int P, const int PAD)
{
    const int p = get_global_id(0), c = get_global_id(1), b = get_global_id(2);
    if (p >= P) return;
    const int ty = p / TW, tx = p - ty * TW;
    const int y0 = ty * WINO_M - PAD, x0 = tx * WINO_M - PAD;
    const __global dtype* Xc = X + x_off + (size_t)b * x_bstride + (size_t)c * H * W;
    float d[T2];
    YC_WINO_GATHER(d, y0, x0, H, W, LD(Xc, y * W + x))
    yc_wino_tile_store(d, V, (size_t)v_off + ((size_t)b * T2 * C + c) * P + p, C, P);
}

/* yb (and rb with RESIDUAL): image b's base in the output view (and the residual's). */
#ifdef RESIDUAL
#define YC_WINO_OUT_BASES                                                                        \
    const size_t yb = (size_t)y_off + (size_t)b * y_bstride, rb = (size_t)r_off + (size_t)b * r_bstride;
#else
#define YC_WINO_OUT_BASES const size_t yb = (size_t)y_off + (size_t)b * y_bstride, rb = 0;
#endif

/* Global size (P, F, batch): one work-item per (tile, filter, image). */
__kernel void yc_wino_output(__global const dtype* restrict Mt, const int m_off, const int F, const int P,
                             const int TW, __global const float* restrict bias,
                             __global dtype* restrict Y, const int y_off, const int y_bstride,
                             const int OH, const int OW,
                             __global const dtype* restrict R, const int r_off, const int r_bstride)
{
    const int p = get_global_id(0), f = get_global_id(1), b = get_global_id(2);
    if (p >= P) return;
    const int ty = p / TW, tx = p - ty * TW;
    const size_t base = (size_t)m_off + ((size_t)b * T2 * F + f) * P + p;
    float m[T2], t[WINO_M * WT], y[WINO_M * WINO_M];
    #pragma unroll
    for (int xi = 0; xi < T2; ++xi) m[xi] = LD(Mt, base + (size_t)xi * F * P);
    YC_WINO_INVERSE(yc_at, m, t, y)
    YC_WINO_OUT_BASES
    /* The epilogue a tile row at a time, as one WINO_M-wide vector (the activation vectorises). */
    #pragma unroll
    for (int i = 0; i < WINO_M; ++i) {
        const int oy = ty * WINO_M + i;
        if (oy >= OH) break;
        const size_t pix = (size_t)f * OH * OW + (size_t)oy * OW + tx * WINO_M;
        WVEC v = yc_act_w(WROW(y, i * WINO_M) + (WVEC)(bias[f]), ACT);
#ifdef RESIDUAL
        float r[WINO_M];
        #pragma unroll
        for (int j = 0; j < WINO_M; ++j) r[j] = tx * WINO_M + j < OW ? LD(R, rb + pix + j) : 0.0f;
        v = yc_act_w(v + WROW(r, 0), ACT2);
#endif
        #pragma unroll
        for (int j = 0; j < WINO_M; ++j)
            if (tx * WINO_M + j < OW) ST(Y, yb + pix + j, v[j]);
    }
}

/* Tile-vector transforms (WINO_VT > 1, the CPU family's): a work-item transforms a group of
 * WINO_VT consecutive tiles (row-major, continuing on the next tile row), lane k holding tile
 * p0 + k, so the arithmetic is SIMD across tiles, an input row is read as contiguous runs and each
 * transform point's plane is written (and read back) as one vector. The one-tile kernels above
 * leave the vectorising to the driver, which on PoCL gathers every element of every tile with a
 * bounds check. Same V and Mt layouts. Global size (ceil(P / WINO_VT), C or F, batch); only the
 * last group may be partial (groups cut at row ends had left half the lanes idle at 13x13).
 * WINO_ROWS (output transform only) cuts the groups at row ends instead, TH * ceil(TW / WINO_VT)
 * of them: the host's choice where that leaves at most one lane of a row's groups idle (7 tiles a
 * row at 26x26 F(4x4)), as the continued groups store each output row in two parts. */
#ifndef WINO_VT
#define WINO_VT 1
#endif
#if WINO_VT > 1
#define TV CAT(float, WINO_VT)
/* A TV at any float's address: one unaligned vector load or store, where PoCL's vloadN/vstoreN
 * are out-of-line calls. */
typedef TV yc_tv_u __attribute__((aligned(4)));
#define TV_PACK(l) (*(const yc_tv_u*)(l))                /* private lanes -> vector */
#define TV_UNPACK(v, l) (*(yc_tv_u*)(l) = (v))           /* vector -> private lanes */
#ifdef HALF_STORAGE
#define TV_GLD(p, i) CAT(vload_half, WINO_VT)(0, (p) + (i))
#define TV_GST(p, i, v) CAT(vstore_half, WINO_VT)(v, 0, (p) + (i))
#else
#define TV_GLD(p, i) (*(const __global yc_tv_u*)((p) + (i)))
#define TV_GST(p, i, v) (*(__global yc_tv_u*)((p) + (i)) = (v))
#endif
#define SPAN (WINO_VT * WINO_M + 2)       /* input columns a group's tiles read */
#define RUN (WINO_VT * WINO_M)            /* output columns a group's tiles write */
YC_DEFINE_WINO_TRANSFORMS(yc_bt_v, yc_at_v, TV)
YC_DEFINE_ACTIVATE_VEC(yc_act_tv, TV, CAT(as_int, WINO_VT), CAT(as_float, WINO_VT))

/* A tile group: WINO_VT consecutive tiles in row-major order (lane k = tile p0 + k), continuing on
 * the next tile row where one ends, so only the last group of the grid leaves lanes idle and its
 * transform points' planes are whole vectors. (ty, tx0): the row and column of its first tile;
 * YC_FOR_NEXT_ROWS walks the later rows r it continues on, whose tile 0 is lane k. */
#define YC_FOR_NEXT_ROWS(r, k, ty, tx0, TW, TH)                                                   \
    for (int r = (ty) + 1, k = (TW) - (tx0); k < WINO_VT && r < (TH); ++r, k += (TW))

/* s[j] = lanes k of row[j + k * WINO_M], j < WT: one input row's values for the WT tile columns
 * of 8 neighbouring tiles, from contiguous loads (ROW8: 8 floats at 8 * i, ROW2: 2 at i) and
 * swizzles (WINO_VT 8 only). */
#ifdef HALF_STORAGE
#define YC_ROW8(row, i) vload_half8((i), (row))
#define YC_ROW2(row, i) vload_half2(0, (row) + (i))
#else
#define YC_ROW8(row, i) (*(const __global yc_tv_u*)((row) + 8 * (i)))
#define YC_ROW2(row, i) ((float2)((row)[i], (row)[(i) + 1]))
#endif
#define YC_PRIV8(row, i) (*(const yc_tv_u*)((row) + 8 * (i)))
#define YC_PRIV2(row, i) ((float2)((row)[i], (row)[(i) + 1]))
#if WINO_M == 2
#define YC_STRIDED_LANES(s, row, ROW8, ROW2) {                                                   \
        const float8 v0 = ROW8(row, 0), v1 = ROW8(row, 1);                                       \
        const float2 e = ROW2(row, 16);                                                       \
        (s)[0] = (float8)(v0.s0246, v1.s0246);                                                   \
        (s)[1] = (float8)(v0.s1357, v1.s1357);                                                   \
        (s)[2] = (float8)(v0.s246, v1.s0246, e.s0);                                              \
        (s)[3] = (float8)(v0.s357, v1.s1357, e.s1);                                              \
    }
#else
#define YC_STRIDED_LANES(s, row, ROW8, ROW2) {                                                   \
        const float8 v0 = ROW8(row, 0), v1 = ROW8(row, 1), v2 = ROW8(row, 2), v3 = ROW8(row, 3); \
        const float2 e = ROW2(row, 32);                                                       \
        (s)[0] = (float8)(v0.s04, v1.s04, v2.s04, v3.s04);                                       \
        (s)[1] = (float8)(v0.s15, v1.s15, v2.s15, v3.s15);                                       \
        (s)[2] = (float8)(v0.s26, v1.s26, v2.s26, v3.s26);                                       \
        (s)[3] = (float8)(v0.s37, v1.s37, v2.s37, v3.s37);                                       \
        (s)[4] = (float8)(v0.s4, v1.s04, v2.s04, v3.s04, e.s0);                                  \
        (s)[5] = (float8)(v0.s5, v1.s15, v2.s15, v3.s15, e.s1);                                  \
    }
#endif

/* d = the WT x WT input tiles (lane k: tile tx0 + k) of the tile group whose input corner is
 * (y0, x0), read from channel plane Xc (H x W), zero outside it. */
inline void yc_wino_gather_vt(const __global dtype* restrict Xc, const int y0, const int x0, const int H,
                              const int W, TV* d)
{
    const bool inside_x = x0 >= 0 && x0 + SPAN <= W;
    #pragma unroll
    for (int i = 0; i < WT; ++i) {
        const int y = y0 + i;
        if (y < 0 || y >= H) {
            #pragma unroll
            for (int j = 0; j < WT; ++j) d[i * WT + j] = (TV)(0.0f);
        } else if (inside_x) {
            YC_STRIDED_LANES(d + i * WT, Xc + y * W + x0, YC_ROW8, YC_ROW2)
        } else {                              /* a row's edge group: its run, zero-padded, in private memory */
            float r[SPAN + 6];
            #pragma unroll
            for (int q = 0; q < SPAN + 6; ++q) r[q] = 0.0f;
            const int qa = max(0, -x0), qb = min(SPAN, W - x0);
            for (int q = qa; q < qb; ++q) r[q] = LD(Xc, y * W + x0 + q);
            YC_STRIDED_LANES(d + i * WT, r, YC_PRIV8, YC_PRIV2)
        }
    }
}

/* d = the input tiles of the tile group whose first tile is (ty, tx0) on a TH x TW tile grid:
 * yc_wino_gather_vt per tile row it covers, blended by lane. */
inline void yc_wino_gather_group(const __global dtype* restrict Xc, const int ty, const int tx0, const int TW,
                                 const int TH, const int PAD, const int H, const int W, TV* d)
{
    const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
    TV t[T2];
    yc_wino_gather_vt(Xc, ty * WINO_M - PAD, tx0 * WINO_M - PAD, H, W, d);
    YC_FOR_NEXT_ROWS(r, k, ty, tx0, TW, TH) {
        yc_wino_gather_vt(Xc, r * WINO_M - PAD, -k * WINO_M - PAD, H, W, t);
        const int8 next = lane >= (int8)(k);
        #pragma unroll
        for (int i = 0; i < T2; ++i) d[i] = next ? t[i] : d[i];
    }
}

/* u = B^T d B of a tile group's input tiles d, stored as the T2 planes of V (point xi's at
 * o + xi * C * P) for its n tiles: whole vectors, or lane by lane in a partial last group. */
inline void yc_wino_forward_store(const TV* d, __global dtype* restrict V, const size_t o, const int C, const int P,
                                  const int n)
{
    TV t[T2], u[T2];
    YC_WINO_FORWARD(yc_bt_v, d, t, u)
    #pragma unroll
    for (int xi = 0; xi < T2; ++xi) {
        const size_t oi = o + (size_t)xi * C * P;
        if (n == WINO_VT) {
            TV_GST(V, oi, u[xi]);
        } else {
            float l[WINO_VT];
            TV_UNPACK(u[xi], l);
            for (int k = 0; k < n; ++k) ST(V, oi + k, l[k]);
        }
    }
}

__kernel void yc_wino_input_vt(__global const dtype* restrict X, const int x_off, const int x_bstride,
                               const int C, const int H, const int W,
                               __global dtype* restrict V, const int v_off, const int TW, const int P, const int PAD)
{
    const int c = get_global_id(1), b = get_global_id(2), p0 = get_global_id(0) * WINO_VT;
    if (p0 >= P) return;
    const int ty = p0 / TW, tx0 = p0 - ty * TW, n = min(WINO_VT, P - p0);
    const __global dtype* Xc = X + x_off + (size_t)b * x_bstride + (size_t)c * H * W;
    TV d[T2];
    yc_wino_gather_group(Xc, ty, tx0, TW, P / TW, PAD, H, W, d);
    yc_wino_forward_store(d, V, (size_t)v_off + ((size_t)b * T2 * C + c) * P + p0, C, P, n);
}

/* Small maps (the host's choice where W < SPAN, so that every group's runs cross an edge and
 * yc_wino_gather_vt assembles each row from scalars): a work-item transforms every tile group of
 * one channel plane, which it first copies into private memory with a zero border (input (y, x)
 * at row y + PAD, column WP_L + x of a WP_H x WP_W array: WP_L zero columns on the left, as a
 * continued group's next-row runs start up to WINO_VT * WINO_M to the left), so every run is read
 * by whole-vector loads and swizzles without a bounds check. Global size (1, C, batch). */
#ifdef WP_W
#define WP_L (WINO_VT * WINO_M)
__kernel void yc_wino_input_plane(__global const dtype* restrict X, const int x_off, const int x_bstride,
                                  const int C, const int H, const int W,
                                  __global dtype* restrict V, const int v_off, const int TW, const int P, const int PAD)
{
    const int c = get_global_id(1), b = get_global_id(2), TH = P / TW;
    const __global dtype* Xc = X + x_off + (size_t)b * x_bstride + (size_t)c * H * W;
    float pl[WP_H * WP_W];
    for (int i = 0; i < WP_H * WP_W; i += WINO_VT) TV_UNPACK((TV)(0.0f), pl + i);
    for (int y = 0; y < H; ++y) {
        const __global dtype* row = Xc + y * W;
        float* dst = pl + (y + PAD) * WP_W + WP_L;
        int x = 0;
        for (; x + WINO_VT <= W; x += WINO_VT) TV_UNPACK(TV_GLD(row, x), dst + x);
        for (; x < W; ++x) dst[x] = LD(row, x);
    }
    const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
    const size_t vb = (size_t)v_off + ((size_t)b * T2 * C + c) * P;
    for (int p0 = 0; p0 < P; p0 += WINO_VT) {
        const int ty = p0 / TW, tx0 = p0 - ty * TW;
        TV d[T2], t[T2];
        #pragma unroll
        for (int i = 0; i < WT; ++i)
            YC_STRIDED_LANES(d + i * WT, pl + (ty * WINO_M + i) * WP_W + WP_L - PAD + tx0 * WINO_M, YC_PRIV8, YC_PRIV2)
        YC_FOR_NEXT_ROWS(r, k, ty, tx0, TW, TH) {
            #pragma unroll
            for (int i = 0; i < WT; ++i)
                YC_STRIDED_LANES(t + i * WT, pl + (r * WINO_M + i) * WP_W + WP_L - PAD - k * WINO_M, YC_PRIV8, YC_PRIV2)
            const int8 next = lane >= (int8)(k);
            #pragma unroll
            for (int i = 0; i < T2; ++i) d[i] = next ? t[i] : d[i];
        }
        yc_wino_forward_store(d, V, vb + p0, C, P, min(WINO_VT, P - p0));
    }
}
#endif

/* YC_PIXEL_ORDER(o, y, i): o[0 .. WINO_M) = output row i of the group's tiles in pixel order, as
 * float8 values (pixel q of the row's RUN = tile q / WINO_M, column q % WINO_M), from the tile-lane
 * vectors y[i * WINO_M + j] (column j of every tile): a transpose by swizzles (WINO_VT 8 only). */
#if WINO_M == 2
#define YC_PIXEL_ORDER(o, y, i) {                                                                \
        const float8 c0 = (y)[(i) * 2], c1 = (y)[(i) * 2 + 1];                                   \
        (o)[0] = (float8)(c0.s0, c1.s0, c0.s1, c1.s1, c0.s2, c1.s2, c0.s3, c1.s3);               \
        (o)[1] = (float8)(c0.s4, c1.s4, c0.s5, c1.s5, c0.s6, c1.s6, c0.s7, c1.s7);               \
    }
#else
#define YC_PIXEL_ORDER(o, y, i) {                                                                \
        const float8 c0 = (y)[(i) * 4], c1 = (y)[(i) * 4 + 1], c2 = (y)[(i) * 4 + 2], c3 = (y)[(i) * 4 + 3]; \
        const float8 l01 = (float8)(c0.s0, c1.s0, c0.s1, c1.s1, c0.s2, c1.s2, c0.s3, c1.s3);     \
        const float8 h01 = (float8)(c0.s4, c1.s4, c0.s5, c1.s5, c0.s6, c1.s6, c0.s7, c1.s7);     \
        const float8 l23 = (float8)(c2.s0, c3.s0, c2.s1, c3.s1, c2.s2, c3.s2, c2.s3, c3.s3);     \
        const float8 h23 = (float8)(c2.s4, c3.s4, c2.s5, c3.s5, c2.s6, c3.s6, c2.s7, c3.s7);     \
        (o)[0] = (float8)(l01.s01, l23.s01, l01.s23, l23.s23);                                   \
        (o)[1] = (float8)(l01.s45, l23.s45, l01.s67, l23.s67);                                   \
        (o)[2] = (float8)(h01.s01, h23.s01, h01.s23, h23.s23);                                   \
        (o)[3] = (float8)(h01.s45, h23.s45, h01.s67, h23.s67);                                   \
    }
#endif

/* The epilogue of a tile group's output channel, y = its WINO_M x WINO_M output values (lane k:
 * tile tx0 + k) before the bias: bias bf, ACT, with RESIDUAL the shortcut from R (rb + plane) and
 * ACT2, stored into the plane at yb + plane of the output view, for lanes k0 <= k < k1 (tx0 may be
 * negative when k0 > 0: the fused kernel's groups that continue on the next tile row). An output
 * row at a time, put in pixel order first (the epilogue is element-wise), so a full row is
 * WINO_M vector loads/stores. */
inline void yc_wino_store_vt(const TV* y, const float bf, const size_t plane, const int ty, const int tx0,
                             const int k0, const int k1, __global dtype* restrict Y, const size_t yb,
                             const int OH, const int OW, __global const dtype* restrict R, const size_t rb)
{
    const int ox0 = tx0 * WINO_M, qa = k0 * WINO_M, nx = min(k1 * WINO_M, OW - ox0);
    #pragma unroll
    for (int i = 0; i < WINO_M; ++i) {
        const int oy = ty * WINO_M + i;
        if (oy >= OH) break;
        const size_t pix = plane + (size_t)oy * OW + ox0;     /* modulo 2^64 where ox0 < 0: q >= qa is in the row */
        TV o[WINO_M];
        YC_PIXEL_ORDER(o, y, i)
        float l[WINO_VT];
        if (qa == 0 && nx == RUN) {
            #pragma unroll
            for (int j = 0; j < WINO_M; ++j) {
                TV v = yc_act_tv(o[j] + (TV)(bf), ACT);
#ifdef RESIDUAL
                v = yc_act_tv(v + TV_GLD(R, rb + pix + j * WINO_VT), ACT2);
#endif
                TV_GST(Y, yb + pix + j * WINO_VT, v);
            }
        } else {                              /* part of a row, columns qa <= q < nx: whole vectors inside it */
            #pragma unroll
            for (int j = 0; j < WINO_M; ++j) {
                const int q0 = j * WINO_VT, inside = q0 >= qa && q0 + WINO_VT <= nx;
                TV v = yc_act_tv(o[j] + (TV)(bf), ACT);
#ifdef RESIDUAL
                if (inside) {
                    v = yc_act_tv(v + TV_GLD(R, rb + pix + q0), ACT2);
                } else {
                    for (int q = 0; q < WINO_VT; ++q) l[q] = q0 + q >= qa && q0 + q < nx ? LD(R, rb + pix + q0 + q) : 0.0f;
                    v = yc_act_tv(v + TV_PACK(l), ACT2);
                }
#endif
                if (inside) {
                    TV_GST(Y, yb + pix + q0, v);
                } else {
                    TV_UNPACK(v, l);
                    for (int q = max(qa - q0, 0); q < min(nx - q0, WINO_VT); ++q) ST(Y, yb + pix + q0 + q, l[q]);
                }
            }
        }
    }
}

#ifdef WPOOL
/* With WPOOL the conv writes through the 2x2 stride-2 [maxpool] that alone reads it
 * (graph.mark_write_fusions; OH and OW even): tiles start at even pixels, so each holds
 * (WINO_M / 2)^2 whole windows. Their max after bias and ACT (yc_maxpool_rows' order: a later
 * value wins only if greater), for lanes k0 <= k < k1 as yc_wino_store_vt takes them, stored into
 * the pooled plane (OH / 2 x OW / 2) at yb + pplane of the output view: a whole group's pooled row
 * as vectors in pixel order (WINO_VT 8), else value by value. */
inline void yc_wino_pool_vt(const TV* y, const float bf, const size_t pplane, const int ty, const int tx0,
                            const int k0, const int k1, __global dtype* restrict Y, const size_t yb,
                            const int OH, const int OW)
{
    const int PH = OH / 2, PW = OW / 2, px0 = tx0 * (WINO_M / 2);
    #pragma unroll
    for (int pi = 0; pi < WINO_M / 2; ++pi) {
        const int py = ty * (WINO_M / 2) + pi;
        if (py >= PH) break;
        TV mx[WINO_M / 2];
        #pragma unroll
        for (int pj = 0; pj < WINO_M / 2; ++pj) {
            mx[pj] = (TV)(-FLT_MAX);
            #pragma unroll
            for (int q = 0; q < 4; ++q) {
                const TV v = yc_act_tv(y[(2 * pi + (q >> 1)) * WINO_M + 2 * pj + (q & 1)] + (TV)(bf), ACT);
                mx[pj] = select(mx[pj], v, v > mx[pj]);
            }
        }
        const size_t row = yb + pplane + (size_t)py * PW;
#if WINO_VT == 8
        if (k0 == 0 && k1 == WINO_VT && px0 + RUN / 2 <= PW) {
#if WINO_M == 2
            TV_GST(Y, row + px0, mx[0]);
#else
            const TV a = mx[0], c = mx[1];
            TV_GST(Y, row + px0, (TV)(a.s0, c.s0, a.s1, c.s1, a.s2, c.s2, a.s3, c.s3));
            TV_GST(Y, row + px0 + WINO_VT, (TV)(a.s4, c.s4, a.s5, c.s5, a.s6, c.s6, a.s7, c.s7));
#endif
            continue;
        }
#endif
        #pragma unroll
        for (int pj = 0; pj < WINO_M / 2; ++pj) {
            float l[WINO_VT];
            TV_UNPACK(mx[pj], l);
            for (int k = k0; k < k1; ++k) {
                const int px = (tx0 + k) * (WINO_M / 2) + pj;
                if (px < PW)
                    ST(Y, row + px, l[k]);
            }
        }
    }
}
#define YC_WINO_STORE_ROW(y, bf, f, ty, tx0, k0, k1, Y, yb, OH, OW, R, rb)                      \
    yc_wino_pool_vt(y, bf, (size_t)(f) * ((OH) / 2) * ((OW) / 2), ty, tx0, k0, k1, Y, yb, OH, OW)
#else
#define YC_WINO_STORE_ROW(y, bf, f, ty, tx0, k0, k1, Y, yb, OH, OW, R, rb)                      \
    yc_wino_store_vt(y, bf, (size_t)(f) * (OH) * (OW), ty, tx0, k0, k1, Y, yb, OH, OW, R, rb)
#endif

/* The inverse transform and epilogue of output channel f for the tile group whose first tile is
 * (ty, tx0) on a TH x TW tile grid: y (lane k: tile p0 + k) stored into each tile row it covers. */
inline void yc_wino_store_group(const TV* m, const float bf, const int f, const int ty, const int tx0, const int TW,
                                const int TH, __global dtype* restrict Y, const size_t yb, const int OH,
                                const int OW, __global const dtype* restrict R, const size_t rb)
{
    TV t[WINO_M * WT], y[WINO_M * WINO_M];
    YC_WINO_INVERSE(yc_at_v, m, t, y)
    YC_WINO_STORE_ROW(y, bf, f, ty, tx0, 0, min(WINO_VT, TW - tx0), Y, yb, OH, OW, R, rb);
    YC_FOR_NEXT_ROWS(r, kr, ty, tx0, TW, TH)
        YC_WINO_STORE_ROW(y, bf, f, r, -kr, kr, min(WINO_VT, kr + TW), Y, yb, OH, OW, R, rb);
}

__kernel void yc_wino_output_vt(__global const dtype* restrict Mt, const int m_off, const int F, const int P,
                                const int TW, __global const float* restrict bias,
                                __global dtype* restrict Y, const int y_off, const int y_bstride,
                                const int OH, const int OW,
                                __global const dtype* restrict R, const int r_off, const int r_bstride)
{
    const int f = get_global_id(1), b = get_global_id(2), g = get_global_id(0);
#ifdef WINO_ROWS       /* groups cut at tile-row ends, ceil(TW / WINO_VT) a row: tile p0 + k in row ty */
    const int gw = (TW + WINO_VT - 1) / WINO_VT, ty = g / gw, tx0 = (g - ty * gw) * WINO_VT;
    const int p0 = ty * TW + tx0, n = min(WINO_VT, TW - tx0), th = ty + 1;
#else
    const int p0 = g * WINO_VT, ty = p0 / TW, tx0 = p0 - ty * TW, n = min(WINO_VT, P - p0), th = P / TW;
#endif
    if (p0 >= P) return;
    const size_t base = (size_t)m_off + ((size_t)b * T2 * F + f) * P + p0;
    TV m[T2];
    float l[WINO_VT];
    #pragma unroll
    for (int xi = 0; xi < T2; ++xi) {
        const size_t o = base + (size_t)xi * F * P;
        if (n == WINO_VT) {
            m[xi] = TV_GLD(Mt, o);
        } else {
            for (int k = 0; k < WINO_VT; ++k) l[k] = k < n ? LD(Mt, o + k) : 0.0f;
            m[xi] = TV_PACK(l);
        }
    }
    YC_WINO_OUT_BASES
    yc_wino_store_group(m, bias[f], f, ty, tx0, TW, th, Y, yb, OH, OW, R, rb);
}

/* The fused CPU Winograd conv (WF_C defined: the input channels; WF_KB the register block): one
 * work-item takes a tile group (WINO_VT consecutive tiles in row-major order, lane k = tile
 * p0 + k, continuing on the next tile row where a row ends, so no lane idles but in the last
 * group) and KBS blocks of WF_KB output channels; it transforms all WF_C input channels of its
 * tiles into private memory (V, T2 x WF_C vectors), then per block and transform point multiplies
 * them by the pre-transformed weights (U packed [T2][MB][WF_C][WF_KB], float, MB = ceil(F / WF_KB):
 * a block's weights for one point are contiguous) with WF_KB accumulator vectors and broadcast
 * weights, and inverse-transforms the block's outputs straight into the output view with the
 * epilogue of yc_wino_output_vt. One launch per conv, and V and the products never leave the
 * core's caches. Global size (ceil(TH * TW / WINO_VT), ceil(MB / KBS), batch), work-groups of one. */
#ifdef WF_C
#ifndef WF_KB
#define WF_KB 8
#endif
__kernel void yc_wino_fused(__global const dtype* restrict X, const int x_off, const int x_bstride,
                            const int H, const int W, const int PAD, const int TW,
                            __global const float* restrict U, __global const float* restrict bias, const int F,
                            const int KBS, __global dtype* restrict Y, const int y_off, const int y_bstride,
                            const int OH, const int OW,
                            __global const dtype* restrict R, const int r_off, const int r_bstride)
{
    const int b = get_global_id(2);
    const int th = (OH + WINO_M - 1) / WINO_M, MB = (F + WF_KB - 1) / WF_KB;
    const int p0 = get_global_id(0) * WINO_VT;
    if (p0 >= th * TW) return;
    const int ty = p0 / TW, tx0 = p0 - ty * TW;
    const int kb0 = get_global_id(1) * KBS, kb1 = min(kb0 + KBS, MB);
    const __global dtype* Xb = X + x_off + (size_t)b * x_bstride;
    TV V[T2 * WF_C];
    for (int c = 0; c < WF_C; ++c) {
        TV d[T2], t[T2], u[T2];
        yc_wino_gather_group(Xb + (size_t)c * H * W, ty, tx0, TW, th, PAD, H, W, d);
        YC_WINO_FORWARD(yc_bt_v, d, t, u)
        #pragma unroll
        for (int xi = 0; xi < T2; ++xi) V[xi * WF_C + c] = u[xi];
    }
    YC_WINO_OUT_BASES
    for (int kb = kb0; kb < kb1; ++kb) {
        TV Mk[WF_KB * T2];                    /* the block's products, T2 per output channel */
        for (int xi = 0; xi < T2; ++xi) {
            const __global float* u = U + ((size_t)xi * MB + kb) * WF_C * WF_KB;
            const TV* v = V + xi * WF_C;
            TV a[WF_KB];
            #pragma unroll
            for (int k = 0; k < WF_KB; ++k) a[k] = (TV)(0.0f);
            for (int c = 0; c < WF_C; ++c) {
                const TV x = v[c];
                #pragma unroll
                for (int k = 0; k < WF_KB; ++k) a[k] = (TV)(u[c * WF_KB + k]) * x + a[k];
            }
            #pragma unroll
            for (int k = 0; k < WF_KB; ++k) Mk[k * T2 + xi] = a[k];
        }
        for (int k = 0; k < WF_KB; ++k) {
            const int f = kb * WF_KB + k;
            if (f >= F) break;
            yc_wino_store_group(Mk + k * T2, bias[f], f, ty, tx0, TW, th, Y, yb, OH, OW, R, rb);
        }
    }
}
#endif
#endif
