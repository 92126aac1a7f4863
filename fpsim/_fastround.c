/* Compiled fast path of fpsim's rounding engine: float32 input, every mode (stochastic
 * rounding takes its draws from the caller: the same draws the numpy engine would use).
 *
 * The numerics live in fpsim/rounding.py; this kernel repeats only the core
 * step, for speed, and takes every edge case as data computed by that engine:
 *   pass 0 (vectorised): the common case alone, finite inputs from the
 *     format's min normal up (overflow included) and signed zeros; when it
 *     meets anything else (Inf, NaN, ...), pass 1 runs:
 *   pass 1 (vectorised): finite normal float32 inputs are rounded by adding an
 *     increment to their bit pattern and clearing the dropped bits (exact for
 *     any binade where the format is normal); a result above the format's max
 *     becomes the caller's overflow value; zeros, Inf, NaN and negative
 *     inputs of unsigned formats become the caller's values for them;
 *   pass 2 (only when pass 1 met inputs below the format's min normal):
 *     those are rounded onto the format's subnormal grid, or counted and left
 *     for the caller when the format has no subnormal grid.
 * The caller (fpsim/_native.py) finishes what is left with the numpy engine.
 * Tests compare the kernel with that engine bit for bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { NEAREST_EVEN, NEAREST_AWAY, TOWARD_ZERO, UP, DOWN, ODD, STOCHASTIC };
enum { OUT_F32 = 0, OUT_U8 = 1, OUT_U16 = 2, OUT_U32 = 4 };

typedef struct {
    uint32_t lo, hi;           /* float32 bits of the format's min normal (>= 2^-126) and max */
    uint32_t drop;             /* bits dropped in the normal range: 23 - man_bits */
    uint32_t rebias;           /* float32 exponent field minus the format's, shifted by man_bits */
    uint32_t sign_shift;       /* float32 sign bit down to the code's sign bit */
    uint32_t is_signed;        /* the format has negative values */
    uint32_t subnormal_band;   /* pass 2 rounds onto the subnormal grid */
    int32_t emin, man_bits;
    uint32_t over[2], inf[2], nan[2], zero[2], negative; /* outputs for edge inputs, by sign */
    const uint32_t *draws;     /* stochastic: one uniform draw in [0, 2^rbits) per element */
    uint32_t rbits;
} params_t;

/* The magnitude bits `a` rounded at bit `drop`; s is the sign bit. Stochastic
   rounding carries when the dropped bits, read as an rbits-bit fraction
   (shifted by ls, then rs), plus the draw reach 2^rbits. */
static inline uint32_t round_magnitude(int mode, uint32_t a, uint32_t s, uint32_t drop, uint32_t draw,
                                       uint32_t rbits, uint32_t ls, uint32_t rs) {
    const uint32_t ulp = 1u << drop, low = ulp - 1u, keep = ~low;
    switch (mode) {
    case STOCHASTIC: return (a & keep) + (((((a & low) << ls) >> rs) + draw) >> rbits << drop);
    case NEAREST_EVEN: return (a + (low >> 1) + ((a >> drop) & 1u)) & keep;
    case NEAREST_AWAY: return (a + (ulp >> 1)) & keep;
    case TOWARD_ZERO: return a & keep;
    case UP: return (a + (((s >> 31) - 1u) & low)) & keep;   /* positive: add ulp - 1 */
    case DOWN: return (a + ((0u - (s >> 31)) & low)) & keep; /* negative: add ulp - 1 */
    default: {                                                 /* ODD: sticky into the lsb */
        uint32_t rest = a & low;
        return (a & keep) | (((rest | (0u - rest)) >> 31) << drop);
    }
    }
}

/* Branch-free select: x where cond (0 or 1) holds, else y. */
#define SEL(cond, x, y) ((((uint32_t)(cond)) * 0xffffffffu & (x)) | ((((uint32_t)(cond)) - 1u) & (y)))

/* One loop per (mode, output type), parameters in locals, so that it vectorises. */
#define PASS1(MODE, OUT_T, NORMAL_EXPR)                                                \
    do {                                                                               \
        OUT_T *restrict out_ = (OUT_T *)dst;                                           \
        for (Py_ssize_t i = 0; i < n; i++) {                                           \
            uint32_t u = src[i], a = u & 0x7fffffffu, s = u & 0x80000000u;               \
            uint32_t neg = s >> 31;                                                     \
            uint32_t r = round_magnitude(MODE, a, s, drop, MODE == STOCHASTIC ? draws[i] : 0u, \
                                         rbits, ls, rs);                               \
            uint32_t res = (NORMAL_EXPR);                                               \
            res = SEL(r > hi, SEL(neg, over1, over0), res);                             \
            uint32_t special = SEL(a == 0x7f800000u, SEL(neg, inf1, inf0), SEL(neg, nan1, nan0)); \
            res = SEL(a >= 0x7f800000u, special, res);                                  \
            res = SEL(a == 0, SEL(neg, zero1, zero0), res);                             \
            res = SEL(neg & unsigned_fmt & (a != 0), negative, res);                    \
            out_[i] = (OUT_T)res;                                                       \
            below |= (a < lo) & (a != 0);                                               \
        }                                                                              \
    } while (0)

/* The common case alone: normal-range inputs and signed zeros; flags anything else. */
#define PASS0(MODE, OUT_T, NORMAL_EXPR, OVER)                                          \
    do {                                                                               \
        OUT_T *restrict out_ = (OUT_T *)dst;                                           \
        for (Py_ssize_t i = 0; i < n; i++) {                                           \
            uint32_t u = src[i], a = u & 0x7fffffffu, s = u & 0x80000000u;               \
            uint32_t r = round_magnitude(MODE, a, s, drop, MODE == STOCHASTIC ? draws[i] : 0u, \
                                         rbits, ls, rs);                               \
            uint32_t ok = (((u & band_mask) - lo) <= (OVER ? finite_span : span))       \
                          | ((a == 0) & plain_zero);                                    \
            /* values: a zero rounds to itself, r | s is the signed zero already */      \
            uint32_t res = neg_zero_code ? SEL(a == 0, s >> sign_shift, (NORMAL_EXPR)) : (NORMAL_EXPR); \
            out_[i] = (OUT_T)(OVER ? SEL(r > hi, SEL(s >> 31, over1, over0), res) : res); \
            flags |= (ok ^ 1u) << (a >= lo); /* 1: below min normal, 2: anything else */ \
        }                                                                              \
    } while (0)

#define VALUE_EXPR (r | s)
#define CODE_EXPR ((s >> sign_shift) | ((r >> drop) - rebias))

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default"))) /* the loader picks one */
#else
#define MULTIVERSION
#endif

MULTIVERSION
static uint32_t pass0(int mode, int out, const uint32_t *restrict src, void *restrict dst, Py_ssize_t n,
                      const params_t *p) {
    const uint32_t lo = p->lo, hi = p->hi, drop = p->drop, rebias = p->rebias;
    /* formats whose max lies well inside float32's range take every finite input from min
       normal up here (the overflow value past max); the others (bf16, tf32) only [lo, hi] */
    const uint32_t span = p->hi - p->lo, finite_span = 0x7f7fffffu - p->lo;
    const uint32_t over0 = p->over[0], over1 = p->over[1], with_over = p->hi < 0x7f000000u;
    const uint32_t sign_shift = p->sign_shift;
    /* unsigned formats compare the sign bit too, which puts negatives out of band */
    const uint32_t band_mask = p->is_signed ? 0x7fffffffu : 0xffffffffu;
    /* zeros come out as signed zeros (code: the sign bit alone) when the format has -0 */
    const uint32_t plain_zero = p->zero[0] == 0 && p->zero[1] == (out == OUT_F32 ? 0x80000000u : 1u << (31 - sign_shift));
    const uint32_t neg_zero_code = out != OUT_F32; /* codes need the zero's own code */
    const uint32_t *restrict draws = p->draws, rbits = p->rbits;
    const uint32_t ls = rbits >= drop ? rbits - drop : 0u, rs = drop > rbits ? drop - rbits : 0u;
    uint32_t flags = 0; /* 1: inputs below min normal (pass 2); 2: anything else (pass 1) */
#define DISPATCH_OUT0_(MODE, OVER)                                                      \
    switch (out) {                                                                      \
    case OUT_F32: PASS0(MODE, uint32_t, VALUE_EXPR, OVER); break;                       \
    case OUT_U8: PASS0(MODE, uint8_t, CODE_EXPR, OVER); break;                          \
    case OUT_U16: PASS0(MODE, uint16_t, CODE_EXPR, OVER); break;                        \
    default: PASS0(MODE, uint32_t, CODE_EXPR, OVER); break;                             \
    }
#define DISPATCH_OUT0(MODE)                                                             \
    if (with_over) {                                                                    \
        DISPATCH_OUT0_(MODE, 1)                                                         \
    } else {                                                                            \
        DISPATCH_OUT0_(MODE, 0)                                                         \
    }
    switch (mode) {
    case NEAREST_EVEN: DISPATCH_OUT0(NEAREST_EVEN) break;
    case NEAREST_AWAY: DISPATCH_OUT0(NEAREST_AWAY) break;
    case TOWARD_ZERO: DISPATCH_OUT0(TOWARD_ZERO) break;
    case UP: DISPATCH_OUT0(UP) break;
    case DOWN: DISPATCH_OUT0(DOWN) break;
    case STOCHASTIC: DISPATCH_OUT0(STOCHASTIC) break;
    default: DISPATCH_OUT0(ODD) break;
    }
    return flags;
}

MULTIVERSION
static uint32_t pass1(int mode, int out, const uint32_t *restrict src, void *restrict dst, Py_ssize_t n,
                      const params_t *p) {
    const uint32_t lo = p->lo, hi = p->hi, drop = p->drop, rebias = p->rebias, sign_shift = p->sign_shift;
    const uint32_t unsigned_fmt = !p->is_signed, negative = p->negative;
    const uint32_t over0 = p->over[0], over1 = p->over[1], inf0 = p->inf[0], inf1 = p->inf[1];
    const uint32_t nan0 = p->nan[0], nan1 = p->nan[1], zero0 = p->zero[0], zero1 = p->zero[1];
    const uint32_t *restrict draws = p->draws, rbits = p->rbits;
    const uint32_t ls = rbits >= drop ? rbits - drop : 0u, rs = drop > rbits ? drop - rbits : 0u;
    uint32_t below = 0; /* whether pass 2 has work */
#define DISPATCH_OUT(MODE)                                                              \
    switch (out) {                                                                      \
    case OUT_F32: PASS1(MODE, uint32_t, VALUE_EXPR); break;                             \
    case OUT_U8: PASS1(MODE, uint8_t, CODE_EXPR); break;                                \
    case OUT_U16: PASS1(MODE, uint16_t, CODE_EXPR); break;                              \
    default: PASS1(MODE, uint32_t, CODE_EXPR); break;                                   \
    }
    switch (mode) {
    case NEAREST_EVEN: DISPATCH_OUT(NEAREST_EVEN) break;
    case NEAREST_AWAY: DISPATCH_OUT(NEAREST_AWAY) break;
    case TOWARD_ZERO: DISPATCH_OUT(TOWARD_ZERO) break;
    case UP: DISPATCH_OUT(UP) break;
    case DOWN: DISPATCH_OUT(DOWN) break;
    case STOCHASTIC: DISPATCH_OUT(STOCHASTIC) break;
    default: DISPATCH_OUT(ODD) break;
    }
    return below;
}

static float pow2f(int q) { /* exact 2^q for -149 <= q <= 127 */
    uint32_t bits = q >= -126 ? (uint32_t)(q + 127) << 23 : 1u << (q + 149);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void store(int out, void *dst, Py_ssize_t i, uint32_t value) {
    if (out == OUT_F32 || out == OUT_U32) ((uint32_t *)dst)[i] = value;
    else if (out == OUT_U16) ((uint16_t *)dst)[i] = (uint16_t)value;
    else ((uint8_t *)dst)[i] = (uint8_t)value;
}

/* Pass 2: inputs below the format's min normal (pass 0 flags them, zeros and unsigned
   negatives among them, which take the caller's values). Returns how many it left to the caller. */
static Py_ssize_t pass2(int mode, int out, const uint32_t *src, void *dst, Py_ssize_t n, const params_t *p) {
    Py_ssize_t left = 0;
    const int quantum_exp = p->emin - p->man_bits; /* >= -149 for the formats the caller sends */
    const float quantum = pow2f(quantum_exp);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t u = src[i], a = u & 0x7fffffffu, s = u & 0x80000000u;
        if (a >= p->lo) continue; /* passes 0 and 1 got it right */
        if (a == 0) {
            store(out, dst, i, s ? p->zero[1] : p->zero[0]);
            continue;
        }
        if (!p->subnormal_band) { /* flushing, or no subnormal grid: the numpy engine decides */
            left++;
            continue;
        }
        if (s && !p->is_signed) {
            store(out, dst, i, p->negative);
            continue;
        }
        uint32_t field = a >> 23;
        uint32_t sig = (a & 0x7fffffu) | (field ? 0x800000u : 0u);
        int lsb_exp = (field ? (int)field : 1) - 150;
        int all = quantum_exp - lsb_exp; /* >= 1: the input is below min normal */
        int d = all > 26 ? 26 : all;     /* sig < 2^24 < half: only "nonzero" matters */
        uint32_t keep = sig >> d, rest = sig & ((1u << d) - 1u), half = 1u << (d - 1);
        uint32_t inexact = rest != 0, up = 0;
        switch (mode) {
        case NEAREST_EVEN: up = rest > half || (rest == half && (keep & 1u)); break;
        case NEAREST_AWAY: up = rest >= half; break;
        case TOWARD_ZERO: break;
        case UP: up = inexact && !s; break;
        case DOWN: up = inexact && s; break;
        case STOCHASTIC: {
            /* the fraction of the spacing uses the true bit count: far below, it is tiny */
            uint32_t ls = p->rbits >= (uint32_t)all ? p->rbits - (uint32_t)all : 0u;
            uint32_t rs = (uint32_t)all > p->rbits ? (uint32_t)all - p->rbits : 0u;
            if (rs > 31u) rs = 31u;
            up = (((rest << ls) >> rs) + p->draws[i]) >> p->rbits;
            break;
        }
        default: keep |= inexact; break;
        }
        keep += up;
        if (keep == 0) {
            store(out, dst, i, s ? p->zero[1] : p->zero[0]);
        } else if (out == OUT_F32) {
            float v = (float)keep * quantum;
            uint32_t bits;
            memcpy(&bits, &v, sizeof bits);
            store(out, dst, i, bits | s);
        } else { /* subnormal code = keep; keep == 2^man_bits is min normal's code */
            store(out, dst, i, (s >> p->sign_shift) | keep);
        }
    }
    return left;
}

/* Pass 2 for formats with a subnormal grid, branch-free so that it vectorises
 * (AVX2 shifts each lane by its own count): every input below min normal is
 * rounded onto the grid of spacing 2^(emin - man_bits); others keep pass 0/1's output. */
static inline uint32_t as_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

#define PASS2V(MODE, OUT_T, IS_CODES)                                                  \
    do {                                                                               \
        OUT_T *restrict out_ = (OUT_T *)dst;                                           \
        for (Py_ssize_t i = 0; i < n; i++) {                                           \
            uint32_t u = src[i], a = u & 0x7fffffffu, s = u & 0x80000000u;               \
            uint32_t field = a >> 23;                                                   \
            uint32_t sig = (a & 0x7fffffu) | SEL(field != 0, 0x800000u, 0u);              \
            int32_t all = quantum_exp - ((int32_t)SEL(field != 0, field, 1u) - 150);    \
            int32_t d = all < 1 ? 1 : (all > 26 ? 26 : all);                            \
            uint32_t dt = (uint32_t)(all < 1 ? 1 : (all > 60 ? 60 : all)); /* true count */ \
            uint32_t keep = sig >> d, rest = sig & ((1u << d) - 1u), half = 1u << (d - 1); \
            uint32_t inexact = rest != 0, neg = s >> 31;                                \
            uint32_t sls = SEL(rbits >= dt, rbits - dt, 0u);                            \
            uint32_t srs = SEL(dt > rbits, dt - rbits > 31u ? 31u : dt - rbits, 0u);     \
            uint32_t up = MODE == STOCHASTIC ? (((rest << sls) >> srs) + (MODE == STOCHASTIC ? draws[i] : 0u)) >> rbits \
                        : MODE == NEAREST_EVEN ? (rest > half) | ((rest == half) & keep) \
                        : MODE == NEAREST_AWAY ? rest >= half                           \
                        : MODE == UP ? inexact & (neg ^ 1u)                             \
                        : MODE == DOWN ? inexact & neg : 0u;                            \
            keep = (MODE == ODD ? keep | inexact : keep + (up & 1u));                   \
            uint32_t res = IS_CODES ? (s >> sign_shift) | keep                          \
                                    : as_bits((float)(int32_t)keep * quantum) | s;      \
            res = SEL(keep == 0, SEL(neg, zero1, zero0), res);                          \
            out_[i] = (OUT_T)SEL(a < lo, res, (uint32_t)out_[i]);                       \
        }                                                                              \
    } while (0)

MULTIVERSION
static void pass2_grid(int mode, int out, const uint32_t *restrict src, void *restrict dst, Py_ssize_t n,
                       const params_t *p) {
    const int32_t quantum_exp = p->emin - p->man_bits; /* >= -149 for the formats the caller sends */
    const float quantum = pow2f(quantum_exp);
    const uint32_t lo = p->lo, sign_shift = p->sign_shift, zero0 = p->zero[0], zero1 = p->zero[1];
    const uint32_t *restrict draws = p->draws, rbits = p->rbits;
#define DISPATCH_OUT2(MODE)                                                             \
    switch (out) {                                                                      \
    case OUT_F32: PASS2V(MODE, uint32_t, 0); break;                                     \
    case OUT_U8: PASS2V(MODE, uint8_t, 1); break;                                       \
    case OUT_U16: PASS2V(MODE, uint16_t, 1); break;                                     \
    default: PASS2V(MODE, uint32_t, 1); break;                                          \
    }
    switch (mode) {
    case NEAREST_EVEN: DISPATCH_OUT2(NEAREST_EVEN) break;
    case NEAREST_AWAY: DISPATCH_OUT2(NEAREST_AWAY) break;
    case TOWARD_ZERO: DISPATCH_OUT2(TOWARD_ZERO) break;
    case UP: DISPATCH_OUT2(UP) break;
    case DOWN: DISPATCH_OUT2(DOWN) break;
    case STOCHASTIC: DISPATCH_OUT2(STOCHASTIC) break;
    default: DISPATCH_OUT2(ODD) break;
    }
}

static int parse_pair(PyObject *seq, uint32_t pair[2]) {
    unsigned int x0, x1;
    if (!PyArg_ParseTuple(seq, "II", &x0, &x1)) return 0;
    pair[0] = x0;
    pair[1] = x1;
    return 1;
}

static PyObject *round_f32(PyObject *self, PyObject *args) {
    Py_buffer src, dst, draws;
    int mode, out;
    params_t p;
    unsigned int lo, hi, drop, rebias, sign_shift, is_signed, subnormal_band, negative, rbits;
    int emin, man_bits;
    PyObject *over, *inf, *nan, *zero;
    if (!PyArg_ParseTuple(args, "y*w*iiIIIIIIIiiO!O!O!O!Iy*I", &src, &dst, &mode, &out, &lo, &hi, &drop, &rebias,
                          &sign_shift, &is_signed, &subnormal_band, &emin, &man_bits, &PyTuple_Type, &over,
                          &PyTuple_Type, &inf, &PyTuple_Type, &nan, &PyTuple_Type, &zero, &negative, &draws,
                          &rbits))
        return NULL;
    Py_ssize_t n = src.len / 4;
    Py_ssize_t need = out == OUT_F32 ? n * 4 : n * out;
    int ok = parse_pair(over, p.over) && parse_pair(inf, p.inf) && parse_pair(nan, p.nan) &&
             parse_pair(zero, p.zero);
    int stochastic = mode == STOCHASTIC;
    if (!ok || src.len % 4 || dst.len < need || mode < NEAREST_EVEN || mode > STOCHASTIC || hi < lo || drop > 23 ||
        emin - man_bits < -149 || (stochastic && (draws.len < n * 4 || rbits < 1 || rbits > 26))) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyBuffer_Release(&draws);
        if (ok) PyErr_SetString(PyExc_ValueError, "round_f32: bad buffer sizes or parameters");
        return NULL;
    }
    p.lo = lo;
    p.hi = hi;
    p.drop = drop;
    p.rebias = rebias;
    p.sign_shift = sign_shift;
    p.is_signed = is_signed;
    p.subnormal_band = subnormal_band;
    p.emin = emin;
    p.man_bits = man_bits;
    p.negative = negative;
    p.draws = stochastic ? (const uint32_t *)draws.buf : NULL;
    p.rbits = stochastic ? rbits : 0u;
    Py_ssize_t left = 0;
    Py_BEGIN_ALLOW_THREADS
    /* With no mantissa bits the kept significand is the implicit 1, always odd,
       while the bit-pattern trick would read the exponent's lsb as its parity. */
    if (drop == 23) mode = mode == NEAREST_EVEN ? NEAREST_AWAY : mode == ODD ? TOWARD_ZERO : mode;
    uint32_t flags = pass0(mode, out, (const uint32_t *)src.buf, dst.buf, n, &p);
    if (flags & 2) flags |= pass1(mode, out, (const uint32_t *)src.buf, dst.buf, n, &p);
    if (flags & 1) {
        if (p.subnormal_band && p.is_signed)
            pass2_grid(mode, out, (const uint32_t *)src.buf, dst.buf, n, &p);
        else
            left = pass2(mode, out, (const uint32_t *)src.buf, dst.buf, n, &p);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&draws);
    return PyLong_FromSsize_t(left);
}

static PyMethodDef methods[] = {
    {"round_f32", round_f32, METH_VARARGS,
     "round_f32(src, dst, mode, out, lo, hi, drop, rebias, sign_shift, is_signed, subnormal_band, emin, "
     "man_bits, over, inf, nan, zero, negative, draws, rbits) -> number of elements left to the caller"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastround",
                                    "Compiled fast path of fpsim's rounding engine.", -1, methods};

PyMODINIT_FUNC PyInit__fastround(void) { return PyModule_Create(&module); }
