/* Compiled fast paths of block quantisation (fpsim/block_codec.py): float32 blocks into an
 * E8M0-scaled float element format (MX), in one pass over the input; NVFP4 further below.
 *
 * For each block of `block` consecutive float32 elements, while the block is in cache:
 *
 *   1. amax   the largest magnitude, on the bits (NaN above Inf above the finite values);
 *   2. scale  the scale rule's exponent s from the amax's bits (fpsim/blocks.py SCALE_RULES:
 *             floor, ceil, even, rceil), clamped to E8M0's 2^-127 .. 2^127, written as its E8M0
 *             code; a block with NaN or Inf, or whose scale overflows under a NaN-on-overflow rule,
 *             gets the NaN code and its elements the NaN fill;
 *   3. round  each element x / 2^s rounded once into the element format with saturation, in a
 *             deterministic mode. The division by 2^s is an exponent offset: the element's grid
 *             is found from x's exponent minus s and x's significand is rounded where that grid
 *             cuts it, all in integers, so that no quotient is formed and nothing leaves float32's
 *             range. The output is the element's code, or its dequantised value n * 2^(q + s) (n
 *             quanta of the element's grid 2^q) in float32 or float64. A block whose every nonzero
 *             quotient is normal in the element format (the band: most FP8 blocks) skips the search
 *             for each element's grid: x's bit pattern is rounded at the fixed bit 23 - man_bits.
 *
 * The input is prefetched ahead of the block being read: from memory, the hardware prefetcher alone
 * left the amax loop waiting.
 *
 * It covers (fpsim/_native_blocks.py covers) signed element formats with subnormals, a negative
 * zero, 1 to 19 mantissa bits and a finest spacing 2^quantum_exp with quantum_exp >= -21: the
 * element grid scaled by E8M0's smallest scale, 2^(quantum_exp - 127), is then at least twice
 * float32's 2^-149, so that every element drops at least one bit of x's significand. That is OCP
 * FP8, FP6 and FP4. tests/test_blocks.py checks it against fpsim/exact_blocks.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The rounding modes, in the order of their kernel ids in fpsim/modes.py (tests/test_blocks.py reads this list). */
#define FOR_EACH_MODE(X) X(NEAREST_EVEN) X(NEAREST_AWAY) X(TOWARD_ZERO) X(UP) X(DOWN) X(ODD) X(STOCHASTIC)
#define MODE_ENUM(MODE) MODE,
enum { FOR_EACH_MODE(MODE_ENUM) MODE_COUNT };
/* The scale rules and outputs, in the order of fpsim/_native_blocks.py's RULES and OUTPUTS. */
enum { RULE_FLOOR, RULE_CEIL, RULE_EVEN, RULE_RCEIL, RULE_COUNT };
enum { OUT_CODES8, OUT_CODES16, OUT_F32, OUT_F64, OUT_COUNT };

#define E8M0_LO (-127) /* E8M0's exponents; its code is exponent + 127, 0xFF is NaN */
#define E8M0_HI 127
#define E8M0_NAN 0xFFu
#define PIECE 64 /* elements rounded at a time */
#define PREFETCH_AHEAD 8192 /* bytes of input asked for ahead of the block being read */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HIGH_WORD 0 /* where a float64's high 32 bits are */
#else
#define HIGH_WORD 1
#endif

#include "_fastcompile.h"

typedef struct {
    int rule;             /* RULE_* */
    int man_bits;         /* the element format: M, */
    int emin;             /* its smallest normal exponent, */
    int bias;             /* its exponent bias, */
    int emax;             /* its largest exponent (the MX spec's emax_elem), */
    int top_exp;          /* max = max_significand * 2^top_exp, */
    uint32_t max_significand;
    uint32_t max_code;    /* max's code (without the sign) */
    int sign_shift;       /* a code's sign bit is 1 << sign_shift */
    float element_max;    /* max as a float32 (rceil divides by it) */
    uint32_t nan_code;    /* the element code of a NaN block's elements */
} mx_t;

static ALWAYS_INLINE uint32_t float_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static ALWAYS_INLINE float bits_float(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* floor(log2 a) and the significand normalised to 24 bits (2^23 <= sig < 2^24) of finite magnitude bits a > 0. */
static ALWAYS_INLINE int log2_parts(uint32_t a, uint32_t *sig) {
    const uint32_t field = a >> 23;
    if (field) {
        *sig = (a & 0x7fffffu) | 0x800000u;
        return (int)field - 127;
    }
    const int p = 31 - __builtin_clz(a); /* a float32 subnormal: a * 2^-149 */
    *sig = a << (23 - p);
    return p - 149;
}

/* Step 1: a block's largest magnitude, on the bits (NaN above Inf above the finite values). */
static ALWAYS_INLINE uint32_t amax_bits(const uint32_t *restrict xb, Py_ssize_t block) {
    uint32_t amax = 0;
    for (Py_ssize_t i = 0; i < block; i++) {
        const uint32_t a = xb[i] & 0x7fffffffu;
        amax = a > amax ? a : amax;
    }
    return amax;
}

/* Step 2: the block scale's exponent for the amax's bits, or E8M0_HI + 1 for a NaN scale. */
static ALWAYS_INLINE int scale_exponent(const mx_t *k, uint32_t amax) {
    if (amax >= 0x7f800000u) return E8M0_HI + 1; /* NaN or Inf in the block */
    if (amax == 0) return E8M0_LO;                /* every rule: the smallest scale */
    uint32_t sig;
    int e;
    switch (k->rule) {
    case RULE_FLOOR: /* 2^(floor(log2 amax) - emax_elem) */
        e = log2_parts(amax, &sig) - k->emax;
        break;
    case RULE_CEIL: /* 2^(ceil(log2 amax) - emax_elem) */
        e = log2_parts(amax, &sig);
        e += (sig != 0x800000u) - k->emax;
        break;
    case RULE_EVEN: /* amax rounded half up to man_bits + 1 significant bits carries into the next binade */
        e = log2_parts(amax, &sig);
        e += (sig >= (UINT32_C(1) << 24) - (UINT32_C(1) << (22 - k->man_bits))) - k->emax;
        break;
    default: { /* rceil: 2^ceil(log2(fl32(amax / max_elem))), saturating at E8M0's ends */
        const uint32_t descale = float_bits(bits_float(amax) / k->element_max);
        if (descale == 0) return E8M0_LO;
        e = log2_parts(descale, &sig);
        e += sig != 0x800000u;
        return e < E8M0_LO ? E8M0_LO : e > E8M0_HI ? E8M0_HI : e;
    }
    }
    return e < E8M0_LO ? E8M0_LO : e; /* above E8M0_HI: NaN (microxcaling), as returned */
}

/* floor(log2 |x|) from x's bits u (nonzero), a subnormal's from its integer value's conversion (exact
   below 2^24) where `subnormals`, else -127. Under a scale 2^s with s >= -126 - emin, every float32
   subnormal's quotient is below the element's normal range, where its exponent does not matter, so
   blocks of all but the tiniest amaxes skip the conversion. (It has a loop of its own: mixed with the
   narrow codes, the conversion stops the element loop from being vectorised.) */
static ALWAYS_INLINE int32_t exponent(uint32_t u, int subnormals) {
    const uint32_t a = u & 0x7fffffffu, field = a >> 23;
    if (!subnormals) return (int32_t)field - 127;
    const int32_t subnormal = (int32_t)(float_bits((float)(int32_t)a) >> 23) - 276;
    return field ? (int32_t)field - 127 : subnormal;
}

/* The one table of what each mode does: v (below 2^31) rounded at bit d (1 <= d <= 25), that is v >> d plus
   what carries into the kept bits where the mode rounds up; sign (0 or 1) for up and down. */
static ALWAYS_INLINE uint32_t round_at(int mode, uint32_t v, uint32_t d, uint32_t sign) {
    const uint32_t low = (UINT32_C(1) << d) - 1, half = (low >> 1) + 1; /* the dropped bits; their half */
    switch (mode) {
    case NEAREST_EVEN: return (v + (half - 1) + ((v >> d) & 1)) >> d;
    case NEAREST_AWAY: return (v + half) >> d;
    case TOWARD_ZERO: return v >> d;
    case UP: return (v + (low & (sign - 1))) >> d;
    case DOWN: return (v + (low & (0 - sign))) >> d;
    default: return (v >> d) | ((v & low) != 0); /* ODD */
    }
}

/* Step 3 for one element: x's bits u (of exponent ex) divided by 2^s and rounded in `mode`: n quanta
   of the element's grid 2^q (in *q_out) and the sign, as n | sign << 31. n may be 2^(M+1) (a carry
   into the next binade) or beyond the element's max: the outputs below saturate. */
static ALWAYS_INLINE uint32_t round_element(const mx_t *k, uint32_t u, int32_t ex, int s, int mode, int32_t *q_out) {
    const uint32_t a = u & 0x7fffffffu, field = a >> 23, sign = u >> 31;
    const uint32_t sig = field ? (a & 0x7fffffu) | 0x800000u : a;
    const int32_t eq = ex - s;                                        /* the quotient's exponent */
    const int32_t q = (eq > k->emin ? eq : k->emin) - k->man_bits;    /* its grid 2^q ... */
    const int32_t lsb = (int32_t)(field ? field : 1) - 150;           /* ... and x's last bit 2^lsb */
    int32_t D = q + s - lsb;                                          /* bits of x's significand to drop */
    D = D < 1 ? 1 : D > 25 ? 25 : D;                                  /* >= 1 where covered; 25: all */
    const uint32_t n = round_at(mode, sig, (uint32_t)D, sign);
    *q_out = q;
    return n | (sign << 31); /* n < 2^25 */
}

/* The magnitude of the element's code: a normal n (2^M <= n < 2^(M+1)) is the exponent field
   q + M + bias above its mantissa n - 2^M; below 2^M, q is emin - M and that field minus 1 is 0; a
   carry n = 2^(M+1) gives the next binade's code. One sum for all, without a branch, and it orders
   the results as their values do: above max_code they overflow (and saturate). */
static ALWAYS_INLINE uint32_t code_magnitude(const mx_t *k, uint32_t r, int32_t q) {
    return (r & 0x7fffffffu) + ((uint32_t)(q + k->man_bits + k->bias - 1) << k->man_bits);
}

static ALWAYS_INLINE uint32_t element_code(const mx_t *k, uint32_t r, int32_t q) {
    const uint32_t magnitude = code_magnitude(k, r, q);
    return (magnitude < k->max_code ? magnitude : k->max_code) | ((r >> 31) << k->sign_shift);
}

/* Dequantised values n * 2^(q + s), exact (the caller checks that the output type holds them); `top`:
   the bits of max * 2^s, where the element saturates. */
static ALWAYS_INLINE uint32_t value_bits_32(uint32_t r, int32_t q, int s, uint32_t top) {
    const uint32_t n = r & 0x7fffffffu, sign = r & 0x80000000u;
    const int32_t qx = q + s;
    const uint32_t nb = float_bits((float)(int32_t)n);
    const int32_t e = (int32_t)(nb >> 23) - 127 + qx; /* the value's exponent */
    const uint32_t normal = nb + ((uint32_t)qx << 23);
    const uint32_t subnormal = n << ((qx + 149) & 31);  /* qx >= -149 where a value is subnormal */
    const uint32_t bits = n == 0 ? 0 : e >= -126 ? normal : subnormal;
    return (bits < top ? bits : top) | sign; /* positive floats' bits order as their values */
}

/* The same in float64, as its high word: n has at most man_bits + 2 <= 21 significant bits, so that
   the low word is 0 (and the high words order as the values). */
static ALWAYS_INLINE uint32_t value_high_64(uint32_t r, int32_t q, int s, uint32_t top) {
    const uint32_t n = r & 0x7fffffffu;
    const uint32_t nb = float_bits((float)(int32_t)n); /* n's exponent and mantissa, then float64's */
    const uint32_t field = n == 0 ? 0 : (nb >> 23) + (uint32_t)(q + s) + (1023 - 127); /* normal in float64 */
    const uint32_t bits = (field << 20) | ((nb & 0x7fffffu) >> 3);
    return (bits < top ? bits : top) | (r & 0x80000000u);
}

/* Whether every nonzero element of a block is a float32 of exponent field `field` or more (field >= 1): then its
   quotient by the block's scale is normal in the element format, and step 3 is the band's (run_blocks). */
static ALWAYS_INLINE int in_band(const uint32_t *restrict xb, Py_ssize_t block, int field) {
    if (field < 1) return 0;
    uint32_t lowest = UINT32_MAX; /* the smallest |x| - 1 (bits), zeros wrapping to the top: a min that vectorises */
    for (Py_ssize_t i = 0; i < block; i++) {
        const uint32_t v = (xb[i] & 0x7fffffffu) - 1;
        lowest = v < lowest ? v : lowest;
    }
    return lowest >= ((uint32_t)field << 23) - 1;
}

/* Steps 1 to 3 for `blocks` blocks of `block` elements, in `mode` into `output` (constants where
   inlined, so that each combination's element loop is vectorised on its own). */
static ALWAYS_INLINE void run_blocks(const mx_t *k, const uint32_t *restrict x, void *restrict dst,
                                     uint8_t *restrict scales, Py_ssize_t blocks, Py_ssize_t block, int mode,
                                     int output) {
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint32_t *xb = x + b * block;
        for (Py_ssize_t i = 0; i < block; i += 16) __builtin_prefetch((const char *)(xb + i) + PREFETCH_AHEAD, 0, 3);
        const uint32_t amax = amax_bits(xb, block);
        const int s = scale_exponent(k, amax);
        const int nan = s > E8M0_HI;
        scales[b] = nan ? E8M0_NAN : (uint8_t)(s + 127);
        const Py_ssize_t at = b * block;
        if (nan) {
            for (Py_ssize_t i = 0; i < block; i++) {
                if (output == OUT_CODES8) ((uint8_t *)dst)[at + i] = (uint8_t)k->nan_code;
                else if (output == OUT_CODES16) ((uint16_t *)dst)[at + i] = (uint16_t)k->nan_code;
                else if (output == OUT_F32) ((uint32_t *)dst)[at + i] = 0x7fc00000u;
                else ((uint64_t *)dst)[at + i] = UINT64_C(0x7ff8000000000000);
            }
            continue;
        }
        const int subnormals = s < -126 - k->emin;
        const uint32_t max_r = k->max_significand; /* the element's max, as round_element gives it */
        /* the bits of max * 2^s in float32, where it is one (float64 values: 0 where it is not) */
        const uint32_t top_32 = output == OUT_F32 || (output == OUT_F64 && k->emax + s <= 127)
                                    ? value_bits_32(max_r, k->top_exp, s, UINT32_MAX) : 0;
        const uint32_t top_64 = output == OUT_F64 ? value_high_64(max_r, k->top_exp, s, UINT32_MAX) : 0;
        if ((output != OUT_F64 || top_32) && in_band(xb, block, s + k->emin + 127)) {
            /* The band: each quotient normal, so its grid is x's own at man_bits bits, and x's bit pattern is
               rounded at the fixed bit d (a carry renormalises); dividing by 2^s only moves the exponent field
               (rebias, modulo 2^32), and the value is the rounded x itself, a float32 up to max * 2^s (float64
               values take the band where that is a float32 too). Zeros give zeros. */
            const uint32_t d = 23 - (uint32_t)k->man_bits, rebias = (uint32_t)(127 + s - k->bias) << k->man_bits;
            const uint32_t max_code = k->max_code, sign_shift = (uint32_t)k->sign_shift;
            for (Py_ssize_t i = 0; i < block; i++) {
                const uint32_t u = xb[i], a = u & 0x7fffffffu, sign = u >> 31, r = round_at(mode, a, d, sign);
                if (output == OUT_F32 || output == OUT_F64) {
                    const uint32_t v = r << d, bits = (v < top_32 ? v : top_32) | (sign << 31);
                    if (output == OUT_F32) ((uint32_t *)dst)[at + i] = bits;
                    else ((double *)dst)[at + i] = (double)bits_float(bits);
                } else {
                    const uint32_t magnitude = a ? r - rebias : 0;
                    const uint32_t code = (magnitude < max_code ? magnitude : max_code) | (sign << sign_shift);
                    if (output == OUT_CODES8) ((uint8_t *)dst)[at + i] = (uint8_t)code;
                    else ((uint16_t *)dst)[at + i] = (uint16_t)code;
                }
            }
            continue;
        }
        for (Py_ssize_t j = 0; j < block; j += PIECE) { /* pieces of a long block */
            const Py_ssize_t m = block - j < PIECE ? block - j : PIECE;
            int32_t ex[PIECE];
            if (subnormals) for (Py_ssize_t i = 0; i < m; i++) ex[i] = exponent(xb[j + i], 1);
            else for (Py_ssize_t i = 0; i < m; i++) ex[i] = exponent(xb[j + i], 0);
            for (Py_ssize_t i = 0; i < m; i++) {
                int32_t q;
                const uint32_t r = round_element(k, xb[j + i], ex[i], s, mode, &q);
                if (output == OUT_F32) ((uint32_t *)dst)[at + j + i] = value_bits_32(r, q, s, top_32);
                else if (output == OUT_F64) {
                    ((uint32_t *)dst)[2 * (at + j + i) + (1 - HIGH_WORD)] = 0;
                    ((uint32_t *)dst)[2 * (at + j + i) + HIGH_WORD] = value_high_64(r, q, s, top_64);
                }
                else if (output == OUT_CODES8) ((uint8_t *)dst)[at + j + i] = (uint8_t)element_code(k, r, q);
                else ((uint16_t *)dst)[at + j + i] = (uint16_t)element_code(k, r, q);
            }
        }
    }
}

/* One function per (mode, output), blocks of 32 (MX) spelt out so that the loops have a fixed count. The value
   outputs get an AVX-512 clone too (about 10% faster on an AVX-512 CPU), the codes not (10% slower with it). */
typedef void (*run_fn)(const mx_t *, const uint32_t *, void *, uint8_t *, Py_ssize_t, Py_ssize_t);
#define CLONES_OUT_CODES8 MULTIVERSION
#define CLONES_OUT_CODES16 MULTIVERSION
#define CLONES_OUT_F32 MULTIVERSION_512
#define CLONES_OUT_F64 MULTIVERSION_512
#define DEFINE_RUN(MODE, OUTPUT)                                                                            \
    CLONES_##OUTPUT static void run_##MODE##_##OUTPUT(const mx_t *k, const uint32_t *x, void *dst, uint8_t *scales, \
                                                   Py_ssize_t blocks, Py_ssize_t block) {                 \
        if (block == 32) run_blocks(k, x, dst, scales, blocks, 32, MODE, OUTPUT);                          \
        else run_blocks(k, x, dst, scales, blocks, block, MODE, OUTPUT);                                   \
    }
#define DEFINE_RUNS(MODE) DEFINE_RUN(MODE, OUT_CODES8) DEFINE_RUN(MODE, OUT_CODES16) DEFINE_RUN(MODE, OUT_F32) \
    DEFINE_RUN(MODE, OUT_F64)
DEFINE_RUNS(NEAREST_EVEN)
DEFINE_RUNS(NEAREST_AWAY)
DEFINE_RUNS(TOWARD_ZERO)
DEFINE_RUNS(UP)
DEFINE_RUNS(DOWN)
DEFINE_RUNS(ODD)
#define ROW(MODE) {run_##MODE##_OUT_CODES8, run_##MODE##_OUT_CODES16, run_##MODE##_OUT_F32, run_##MODE##_OUT_F64},
static const run_fn runs[STOCHASTIC][OUT_COUNT] = {ROW(NEAREST_EVEN) ROW(NEAREST_AWAY) ROW(TOWARD_ZERO) ROW(UP)
                                                       ROW(DOWN) ROW(ODD)};

/* The end of an entry point: its three buffers released, then None, or a ValueError saying `problem`. */
static PyObject *finish(Py_buffer *src, Py_buffer *dst, Py_buffer *scales, const char *problem) {
    PyBuffer_Release(src);
    PyBuffer_Release(dst);
    PyBuffer_Release(scales);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *quantize_mx(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"src", "dst", "scales", "block", "mode", "output", "rule", "man_bits", "emin", "bias",
                            "emax", "top_exp", "max_significand", "sign_shift", "element_max", "nan_code", NULL};
    Py_buffer src, dst, scales;
    Py_ssize_t block;
    int mode, output;
    mx_t k;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*w*w*$niiiiiiiiIifI", names, &src, &dst, &scales, &block,
                                     &mode, &output, &k.rule, &k.man_bits, &k.emin, &k.bias, &k.emax, &k.top_exp,
                                     &k.max_significand, &k.sign_shift, &k.element_max, &k.nan_code))
        return NULL;
    static const Py_ssize_t out_bytes[OUT_COUNT] = {1, 2, 4, 8};
    const Py_ssize_t n = src.len / 4;
    const char *problem = NULL;
    if (mode < 0 || mode >= STOCHASTIC || output < 0 || output >= OUT_COUNT || k.rule < 0 || k.rule >= RULE_COUNT ||
        k.man_bits < 1 || k.man_bits > 19 || k.sign_shift < 1 || k.sign_shift > 15)
        problem = "quantize_mx: mode, output, rule or format out of range";
    else if (block < 1 || src.len % 4 || n % block || dst.len != n * out_bytes[output] || scales.len != n / block)
        problem = "quantize_mx: src must be whole blocks of float32, dst one output and scales one byte per block";
    if (!problem) {
        k.max_code = code_magnitude(&k, k.max_significand, k.top_exp);
        Py_BEGIN_ALLOW_THREADS
        runs[mode][output](&k, src.buf, dst.buf, scales.buf, n / block, block);
        Py_END_ALLOW_THREADS
    }
    return finish(&src, &dst, &scales, problem);
}

/* ------------------------------------------------ NVFP4: E2M1 elements, E4M3 block scales, an FP32 tensor scale */
/* For each block of 16 (or `block`) finite float32 elements and the tensor scale t (fpsim/blocks.py, computed
 * by the caller from the tensor's amax), in round-to-nearest-even:
 *
 *   scale     s = max(amax, amax_floor) / (6 t) rounded to E4M3, saturating at 448: the float64 quotient
 *             (6 t has at most 26 significant bits, amax 24) rounded to E4M3's grid to nearest even, which is the
 *             correct rounding of the exact quotient: that is either one of E4M3's decision points (then
 *             exact in float64) or further from one than float64's rounding moves it (fpsim/quotient.py);
 *   elements  x / (s t) rounded to E2M1 with saturation, without a quotient: E2M1's magnitudes are
 *             0, 0.5, 1, 1.5, 2, 3, 4, 6, its decision points the midpoints m between them, and the code
 *             of |x| is the count of midpoints it passes, |x| > m s t, or >= where a tie rounds up to an
 *             even code. m s t (at most 31 significant bits, exact in float64) becomes, once per block, the
 *             float32 threshold that |x|, a float32, passes exactly when it passes m s t, so that the
 *             element loop compares float32s. A block whose scale is 0 gives ±0 elements (the input's sign);
 *   output    the element code (sign bit 3) or the dequantised value E2M1(code) * s * t in float64
 *             (exact: at most 30 significant bits), and the scale's E4M3 code.
 *
 * fpsim/_native_blocks.py covers_nvfp4 says when this applies; tests/test_blocks.py checks it against
 * fpsim/exact_blocks.py like the rest. */
#define E2M1_MIDPOINTS 7
static const double e2m1_midpoints[E2M1_MIDPOINTS] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0};
static const int e2m1_tie_up[E2M1_MIDPOINTS] = {0, 1, 0, 1, 0, 1, 0}; /* ties go to the even code */

static ALWAYS_INLINE double power_of_two(int e) { /* 2^e for -1022 <= e <= 1023 */
    const uint64_t bits = (uint64_t)(e + 1023) << 52;
    double f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* E4M3 (bias 7, 3 mantissa bits, subnormals of 2^-9, max 448) of a normal float64 q > 0 or of 0, rounded to
   nearest even and saturating: its code, and its value in *value. */
static ALWAYS_INLINE uint32_t e4m3_nearest(double q, double *value) {
    uint64_t bits;
    memcpy(&bits, &q, sizeof bits);
    const int e = (int)(bits >> 52) - 1023;                 /* q = 1.f * 2^e (q = 0: e = -1023) */
    const int grid = e < -6 ? -9 : e - 3;                   /* the spacing 2^grid at q */
    const double magic = 4503599627370496.0;                /* 2^52: adding it rounds to an integer, to even */
    const double n = (q * power_of_two(-grid) + magic) - magic; /* the nearest count of 2^grid (exact scaling) */
    const double v = n * power_of_two(grid);
    if (v > 448.0) {
        *value = 448.0;
        return 0x7Eu;
    }
    *value = v;
    if (grid == -9) return (uint32_t)n;                     /* subnormal (n = 8: 2^-6, whose code is 8 too) */
    return n == 16.0 ? (uint32_t)(e + 8) << 3 : ((uint32_t)(e + 7) << 3) | ((uint32_t)n - 8u);
}

/* The float32 threshold tau with a >= tau exactly where a > t (strict) or a >= t, for every float32 a >= 0:
   the float32 just above t when t is one and the comparison is strict, else the smallest float32 >= t.
   Without branches: whether float32's nearest lies above t is as good as random, so a branch on it would
   mispredict about half the time, seven times a block. */
static ALWAYS_INLINE float float32_threshold(double t, int strict) {
    const float f = (float)t; /* nearest */
    const uint32_t above = ((double)f > t) | (((double)f == t) & !strict);
    return bits_float(float_bits(f) + (above ^ 1u)); /* (t >= 0 and below float32's max here) */
}

#define NVFP4_GROUP 64 /* blocks whose scales are found before their elements: independent divisions overlap */

static ALWAYS_INLINE void run_nvfp4(const uint32_t *restrict x, void *restrict dst, uint8_t *restrict scales,
                                    Py_ssize_t blocks, Py_ssize_t block, double tensor_scale, float amax_floor,
                                    int output) {
    const double divisor = 6.0 * tensor_scale; /* exact */
    double unit[NVFP4_GROUP];                  /* s t of each block of the group: exact, at most 28 significant bits */
    for (Py_ssize_t first = 0; first < blocks; first += NVFP4_GROUP) {
        const Py_ssize_t group = blocks - first < NVFP4_GROUP ? blocks - first : NVFP4_GROUP;
        for (Py_ssize_t k = 0; k < group; k++) { /* the scales: one chain each (amax, quotient, rounding) */
            const uint32_t *xb = x + (first + k) * block;
            for (Py_ssize_t i = 0; i < block; i += 16) __builtin_prefetch((const char *)(xb + i) + PREFETCH_AHEAD, 0, 3);
            const uint32_t amax = amax_bits(xb, block);
            const float floored = bits_float(amax) > amax_floor ? bits_float(amax) : amax_floor;
            double s;
            scales[first + k] = (uint8_t)e4m3_nearest((double)floored / divisor, &s);
            unit[k] = s * tensor_scale;
        }
        for (Py_ssize_t k = 0; k < group; k++) { /* the elements */
            const Py_ssize_t at = (first + k) * block;
            const uint32_t *xb = x + at;
            const double d = unit[k];
            float tau[E2M1_MIDPOINTS]; /* |x| >= tau[j]: |x| passes midpoint j (exactly, see above) */
            if (d == 0)
                for (int j = 0; j < E2M1_MIDPOINTS; j++) tau[j] = bits_float(0x7f800000u);
            else
                for (int j = 0; j < E2M1_MIDPOINTS; j++)
                    tau[j] = float32_threshold(e2m1_midpoints[j] * d, !e2m1_tie_up[j]);
            for (Py_ssize_t i = 0; i < block; i++) {
                const uint32_t u = xb[i], sign = u >> 31;
                const float a = bits_float(u & 0x7fffffffu);
                uint32_t mag = 0;
                for (int j = 0; j < E2M1_MIDPOINTS; j++) mag += a >= tau[j];
                if (output == OUT_F64) {
                    const float g = mag < 4 ? 0.5f * (float)mag : mag == 7 ? 6.0f : (float)mag - 2.0f; /* E2M1(mag) */
                    const double v = (double)g * d;
                    ((double *)dst)[at + i] = sign ? -v : v;
                } else {
                    ((uint8_t *)dst)[at + i] = (uint8_t)(mag | (sign << 3));
                }
            }
        }
    }
}

MULTIVERSION static void run_nvfp4_codes(const uint32_t *x, void *dst, uint8_t *scales, Py_ssize_t blocks,
                                         Py_ssize_t block, double tensor_scale, float amax_floor) {
    if (block == 16) run_nvfp4(x, dst, scales, blocks, 16, tensor_scale, amax_floor, OUT_CODES8);
    else run_nvfp4(x, dst, scales, blocks, block, tensor_scale, amax_floor, OUT_CODES8);
}

MULTIVERSION static void run_nvfp4_values(const uint32_t *x, void *dst, uint8_t *scales, Py_ssize_t blocks,
                                          Py_ssize_t block, double tensor_scale, float amax_floor) {
    if (block == 16) run_nvfp4(x, dst, scales, blocks, 16, tensor_scale, amax_floor, OUT_F64);
    else run_nvfp4(x, dst, scales, blocks, block, tensor_scale, amax_floor, OUT_F64);
}

static PyObject *quantize_nvfp4(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"src", "dst", "scales", "block", "values", "tensor_scale", "amax_floor", NULL};
    Py_buffer src, dst, scales;
    Py_ssize_t block;
    int values;
    double tensor_scale;
    float amax_floor;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*w*w*$npdf", names, &src, &dst, &scales, &block, &values,
                                     &tensor_scale, &amax_floor))
        return NULL;
    const Py_ssize_t n = src.len / 4;
    const char *problem = NULL;
    if (!(tensor_scale > 0) || !(tensor_scale < 3.5e38) || !(amax_floor >= 0) || !isfinite(amax_floor))
        problem = "quantize_nvfp4: the tensor scale must be a positive float32, amax_floor finite and >= 0";
    else if (block < 1 || src.len % 4 || n % block || dst.len != n * (values ? 8 : 1) || scales.len != n / block)
        problem = "quantize_nvfp4: src must be whole blocks of float32, dst one output and scales one byte per block";
    if (!problem) {
        Py_BEGIN_ALLOW_THREADS
        if (values) run_nvfp4_values(src.buf, dst.buf, scales.buf, n / block, block, tensor_scale, amax_floor);
        else run_nvfp4_codes(src.buf, dst.buf, scales.buf, n / block, block, tensor_scale, amax_floor);
        Py_END_ALLOW_THREADS
    }
    return finish(&src, &dst, &scales, problem);
}

static PyMethodDef methods[] = {
    {"quantize_mx", (PyCFunction)(void (*)(void))quantize_mx, METH_VARARGS | METH_KEYWORDS,
     "quantize_mx(src, dst, scales, *, block, mode, output, rule, <element format>): MX blocks of float32 src "
     "into element codes or dequantised values (dst) and E8M0 scale codes (scales)"},
    {"quantize_nvfp4", (PyCFunction)(void (*)(void))quantize_nvfp4, METH_VARARGS | METH_KEYWORDS,
     "quantize_nvfp4(src, dst, scales, *, block, values, tensor_scale, amax_floor): NVFP4 blocks of finite "
     "float32 src into E2M1 codes or dequantised float64 values (dst) and E4M3 scale codes (scales)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastblocks",
                                    "Compiled fast paths of MX and NVFP4 block quantisation.", -1, methods};

PyMODINIT_FUNC PyInit__fastblocks(void) { return PyModule_Create(&module); }
