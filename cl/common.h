/* Shared by every kernel: storage type (float or half), activations.
 * Specialised with -D defines at build time:
 *   HALF_STORAGE   tensors and weights stored as half, math in float (vload_half/vstore_half)
 *   ACT, ACT2      activations by name (A_LEAKY, ...; engine/kernels act_id), folded at compile time
 *   HALF_MATH      (with HALF_STORAGE) the FMA GEMM families multiply and sum in half (hreal below)
 *   HALF_EMULATE   (with HALF_MATH) half arithmetic mapped onto float, each result rounded to half
 */
#ifndef YC_COMMON_H
#define YC_COMMON_H

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#ifdef HALF_STORAGE
typedef half dtype;
#define LD(p, i) vload_half((i), (p))
#define ST(p, i, v) vstore_half((v), (i), (p))
#else
typedef float dtype;
#define LD(p, i) ((p)[(i)])
#define ST(p, i, v) ((p)[(i)] = (v))
#endif

/* The arithmetic type of the FMA GEMM families' products and k-block sums (gemm.cl,
 * gemm_local.cl), HREAL (a type name, for CAT(HREAL, 4) = half4 / float4) and hreal:
 *   default              float;
 *   HALF_MATH            half, on a device listing cl_khr_fp16 (HLD loads a stored half as is);
 *   HALF_MATH+EMULATE    float registers that only ever hold half values: every product-plus-sum
 *                        is rounded to half by yc_hround (HROUND), so a device without the
 *                        extension (PoCL, in CI) computes what a half device computes.
 * What the emulation reproduces exactly: round-to-nearest-even to half's 11-bit significand,
 * half's subnormals (multiples of 2^-24 below 2^-14) and overflow to infinity past 65504, for
 * a fused multiply-add (a * b + c rounded once: a half product is exact in float). Not
 * reproduced: the float sum is rounded to float before it is rounded to half (a double rounding
 * that can differ from one rounding in the last bit, for sums that need more than 24 bits), a
 * device that rounds the product separately (a * b + c uncontracted: two roundings), and one
 * that flushes half subnormals to zero. */
#if defined(HALF_MATH) && !defined(HALF_STORAGE)
#error "HALF_MATH needs HALF_STORAGE"
#endif
#if defined(HALF_MATH) && !defined(HALF_EMULATE)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#define HREAL half
#define HLD(p, i) ((p)[(i)])
#else
#define HREAL float
#define HLD(p, i) LD(p, i)
#endif
typedef HREAL hreal;
#define HREALN__(t, n) t##n
#define HREALN_(t, n) HREALN__(t, n)
#define HREALN(n) HREALN_(HREAL, n)     /* hreal's n-vector (not CAT: usable inside CAT's expansion) */

/* NAME(x): float or floatN T (UT its uint type, ASU/ASF the bit casts) rounded to the nearest
 * half value, ties to even, in integer and float arithmetic that vectorises: normal values drop
 * float's 13 low significand bits with the carry rounding up; below 2^-14 (half's subnormals)
 * adding and taking away 0.75 rounds to a multiple of 2^-24 (float's spacing at 0.75); past
 * 65504 the result is infinity; NaN stays NaN. */
#define YC_DEFINE_HROUND(NAME, T, UT, ASU, ASF)                                                  \
    inline T NAME(const T x) {                                                                 \
        const UT u = ASU(x);                                                                   \
        const T n = ASF((u + (UT)(0xFFFu) + ((u >> 13) & (UT)(1u))) & (UT)(0xFFFFE000u));        \
        const T s = (x + (T)(0.75f)) - (T)(0.75f);                                              \
        const T r = fabs(x) < (T)(0x1p-14f) ? s : n;                                            \
        const T o = fabs(r) > (T)(65504.0f) ? copysign((T)(INFINITY), x) : r;                  \
        return x != x ? x : o;                                                                 \
    }

#ifdef HALF_EMULATE
YC_DEFINE_HROUND(yc_hround, float, uint, as_uint, as_float)
#define HROUND(x) yc_hround(x)
#else
#define HROUND(x) (x)
#endif

#define A_LINEAR 0
#define A_LEAKY 1
#define A_RELU 2
#define A_RELU6 3
#define A_LOGISTIC 4
#define A_TANH 5
#define A_MISH 6
#define A_SWISH 7
#define A_HARD_MISH 8
#define A_ELU 9
#define A_SELU 10
#define A_GELU 11
#define A_HARDTAN 12
#define A_LHTAN 13
#define A_RAMP 14
#define A_PLSE 15
#define A_STAIR 16
#define A_LOGGY 17
#define A_RELIE 18
#define A_REVLEAKY 19

#ifndef ACT
#define ACT A_LINEAR
#endif
#ifndef ACT2
#define ACT2 A_LINEAR
#endif

inline float yc_logistic(float x) { return 1.0f / (1.0f + exp(-x)); }

/* exp(x) for float or floatN T (IT its int type, ASI/ASF the bit casts) in plain arithmetic:
 * on CPU devices (PoCL) exp() is an out-of-line library call per element that nothing
 * vectorises, and behind a mish it cost 5x the GEMM it follows. Cephes' expf: x = n ln2 + r,
 * |r| <= ln2/2, e^r by a degree-7 polynomial (1-2 ulp), 2^n built in the exponent bits;
 * x is clamped to [-87, 88] (2^-126 .. 2^127: no denormals, no overflow before the scale). */
#define YC_DEFINE_EXP(NAME, T, ASI, ASF)                                                         \
    inline T NAME(T x) {                                                                       \
        x = x < (T)(-87.0f) ? (T)(-87.0f) : x;                                                  \
        x = x > (T)(88.0f) ? (T)(88.0f) : x;                                                    \
        const T t = x * (T)(1.44269504088896341f) + (T)(12582912.0f); /* round(x log2 e) + 1.5*2^23 */ \
        const T n = t - (T)(12582912.0f);                                                       \
        const T r = (x - n * (T)(0.693359375f)) + n * (T)(2.12194440e-4f);                      \
        T p = (T)(1.9875691500e-4f);                                                            \
        p = p * r + (T)(1.3981999507e-3f);                                                      \
        p = p * r + (T)(8.3334519073e-3f);                                                      \
        p = p * r + (T)(4.1665795894e-2f);                                                      \
        p = p * r + (T)(1.6666665459e-1f);                                                      \
        p = p * r + (T)(5.0000001201e-1f);                                                      \
        p = p * (r * r) + r + (T)(1.0f);                                                        \
        return p * ASF((ASI(t) - 0x4B400000 + 127) << 23);                                      \
    }

/* Darknet's mish, x * tanh(softplus(x)) with softplus's threshold 20, with one exp instead of
 * exp + log1p + tanh: tanh(log(1 + e)) = n / (n + 2) with n = e (e + 2), e = exp(x). Same
 * function to float rounding (below -20 Darknet's softplus is e, and n / (n + 2) -> e too).
 * Branch-free, so it vectorises; past 20 the select returns x. */
#define YC_DEFINE_MISH(NAME, T, EXP)                                                             \
    inline T NAME(const T x) {                                                                 \
        const T e = EXP(x < (T)(20.0f) ? x : (T)(20.0f));                                       \
        const T n = e * (e + (T)(2.0f));                                                        \
        return x > (T)(20.0f) ? x : x * n / (n + (T)(2.0f));                                    \
    }

YC_DEFINE_EXP(yc_exp, float, as_int, as_float)
YC_DEFINE_MISH(yc_mish, float, yc_exp)

/* Darknet's stair_activate: floor(x/2), plus x's fractional part where floor(x) is odd. */
inline float yc_stair(float x) {
    const int n = (int)floor(x);
    return n % 2 == 0 ? floor(x / 2.0f) : (x - n) + floor(x / 2.0f);
}

/* `a` is always a compile-time constant, so the switch folds away. The formulas (and their
 * constants) are Darknet's src/activations.h. */
inline float yc_activate(float x, const int a) {
    switch (a) {
    case A_LEAKY: return x > 0.0f ? x : 0.1f * x;
    case A_RELU: return x > 0.0f ? x : 0.0f;
    case A_RELU6: return fmin(fmax(x, 0.0f), 6.0f);
    case A_LOGISTIC: return yc_logistic(x);
    case A_TANH: return tanh(x);
    case A_MISH: return yc_mish(x);
    case A_SWISH: return x * yc_logistic(x);
    case A_HARD_MISH: return x > 0.0f ? x : (x > -2.0f ? x * x * 0.5f + x : 0.0f);
    case A_ELU: return x >= 0.0f ? x : exp(x) - 1.0f;
    case A_SELU: return x >= 0.0f ? 1.0507f * x : 1.0507f * 1.6732f * (exp(x) - 1.0f);
    case A_GELU: return 0.5f * x * (1.0f + tanh(0.797885f * x + 0.035677f * x * x * x));
    case A_HARDTAN: return fmin(fmax(x, -1.0f), 1.0f);
    case A_LHTAN: return x < 0.0f ? 0.001f * x : (x > 1.0f ? 0.001f * (x - 1.0f) + 1.0f : x);
    case A_RAMP: return (x > 0.0f ? x : 0.0f) + 0.1f * x;
    case A_PLSE: return x < -4.0f ? 0.01f * (x + 4.0f) : (x > 4.0f ? 0.01f * (x - 4.0f) + 1.0f : 0.125f * x + 0.5f);
    case A_STAIR: return yc_stair(x);
    case A_LOGGY: return 2.0f / (1.0f + exp(-x)) - 1.0f;
    case A_RELIE: return x > 0.0f ? x : 0.01f * x;
    case A_REVLEAKY: return x > 0.0f ? x : 0.1f * x;   /* Darknet's forward treats it as leaky */
    default: return x;
    }
}


/* NAME(x, a): yc_activate on a whole float or floatN T (ASI/ASF its bit casts, as for
 * YC_DEFINE_EXP): linear, leaky, relu and mish as SIMD arithmetic, the others lane by lane.
 * The CPU kernels' epilogues use it so the activation vectorises with the block. */
#define YC_DEFINE_ACTIVATE_VEC(NAME, T, ASI, ASF)                                                \
    YC_DEFINE_EXP(NAME##_exp, T, ASI, ASF)                                                     \
    YC_DEFINE_MISH(NAME##_mish, T, NAME##_exp)                                                 \
    inline T NAME(const T x, const int a) {                                                    \
        switch (a) {                                                                           \
        case A_LINEAR: return x;                                                               \
        case A_LEAKY: return x > (T)(0.0f) ? x : (T)(0.1f) * x;                                \
        case A_RELU: return x > (T)(0.0f) ? x : (T)(0.0f);                                     \
        case A_MISH: return NAME##_mish(x);                                                    \
        default: {                                                                             \
            union { T v; float s[sizeof(T) / sizeof(float)]; } u;                              \
            u.v = x;                                                                           \
            for (int i = 0; i < (int)(sizeof(T) / sizeof(float)); ++i) u.s[i] = yc_activate(u.s[i], a); \
            return u.v;                                                                        \
        }                                                                                      \
        }                                                                                      \
    }

/* The output pixels (oy, first..last-1 along the row) a pooling work-item computes: with
 * MP_PIXELS one (global id 0 is the pixel's index in the OW-wide map: GPUs), else the whole row
 * oy (global id 0 is the row: CPUs, engine/kernels/__init__.row_kernels). */
#ifdef MP_PIXELS
#define YC_POOL_SPAN(OW_, oy, first, last) \
    const int oy = (int)get_global_id(0) / (OW_), first = (int)get_global_id(0) - oy * (OW_), last = first + 1
#else
#define YC_POOL_SPAN(OW_, oy, first, last) const int oy = get_global_id(0), first = 0, last = (OW_)
#endif

/* The arguments of every GEMM kernel (gemm.cl, gemm_local.cl, gemm_mma.cl), in the order one host
 * binding passes them: A (packed weights), the bias, B with its offset, batch and group strides
 * and row length, C with its offset, batch stride and row length, the fused shortcut's R with its
 * offset and batch stride, the shape M, N, K, G, and for an implicit GEMM (IMPLICIT, or the wgmma
 * family's NHWC) the input's height and width and the output's width. */
#if defined(IMPLICIT) || defined(NHWC)
#define YC_IMPLICIT_PARAMS , const int H, const int W, const int OW
#else
#define YC_IMPLICIT_PARAMS
#endif
#define YC_GEMM_PARAMS                                                                               \
    __global const dtype* restrict A, __global const float* restrict bias,                          \
    __global const dtype* restrict B, const int b_off, const int b_bstride, const int b_gstride,    \
    const int ldb, __global dtype* restrict C, const int c_off, const int c_bstride, const int ldc, \
    __global const dtype* restrict R, const int r_off, const int r_bstride,                         \
    const int M, const int N, const int K, const int G YC_IMPLICIT_PARAMS

#endif
