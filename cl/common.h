/* Shared by every kernel: storage type (float or half), activations.
 * Specialised with -D defines at build time:
 *   HALF_STORAGE   tensors and weights stored as half, math in float (vload_half/vstore_half)
 *   ACT, ACT2      activation ids (see engine/layers.py ACTIVATIONS), folded at compile time
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

#define A_LINEAR 0
#define A_LEAKY 1
#define A_RELU 2
#define A_RELU6 3
#define A_LOGISTIC 4
#define A_TANH 5
#define A_MISH 6
#define A_SWISH 7
#define A_HARD_MISH 8

#ifndef ACT
#define ACT A_LINEAR
#endif
#ifndef ACT2
#define ACT2 A_LINEAR
#endif

inline float yc_logistic(float x) { return 1.0f / (1.0f + exp(-x)); }

/* Darknet's mish, x * tanh(softplus(x)) with softplus's threshold 20, with one exp instead of
 * exp + log1p + tanh: tanh(log(1 + e)) = n / (n + 2) with n = e (e + 2), e = exp(x). Same
 * function to float rounding; on CPU devices the three calls cost 10x the GEMM they follow. */
inline float yc_mish(float x) {
    const float e = exp(fmin(x, 20.0f));  /* branch-free: vectorises; past 20 the select returns x */
    const float n = e * (e + 2.0f);
    return x > 20.0f ? x : x * n / (n + 2.0f);
}

/* `a` is always a compile-time constant, so the switch folds away. */
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
    default: return x;
    }
}

#endif
