/* Compiled fast path of fpsim's rounding engine, and its random stream.
 *
 * fpsim/rounding.py holds the numerics; this file repeats them for speed on
 * float32, float64 and integer arrays and is tested to give the same bits
 * (tests/test_native.py). One algorithm, in four steps:
 *
 *   1. decompose  the sign and the magnitude's bits in the layout of a working
 *                 float: float32 (W = 32) for float32 input (and for block
 *                 formats' float64 quotients and float64 input's codes in
 *                 deterministic modes, rounded to odd at float32's
 *                 precision: the second rounding then gives the correctly
 *                 rounded result); float64 (W = 64) for float64 input's
 *                 values and stochastic rounding (read and written in place:
 *                 one pass, which measured faster than narrowing it to
 *                 float32 and widening the results), for integers (exact up to
 *                 2^53; larger ones go to the general path) and for float32
 *                 input of formats whose normal range reaches below float32's;
 *   2. grid       from the format's min normal up (the band) the format keeps
 *                 man_bits bits below the leading one, so rounding drops the
 *                 `drop` = P - man_bits low bits of the bit pattern, and a carry
 *                 into the exponent field renormalises; below min normal the
 *                 spacing is the fixed 2^quantum_exp and the significand is
 *                 rounded at a count of bits that depends on its exponent;
 *   3. round      round_at(), the one table of what each mode does, moves the
 *                 kept part up by one or not; stochastic rounding's decision,
 *                 sr_up(), compares the element's uniform U_i (Philox4x32-10,
 *                 fpsim/philox.py) with the exact dropped fraction; when U_i's
 *                 first word equals the fraction's first 32 bits (probability
 *                 2^-32) the general path reads U_i's further words;
 *   4. finish     overflow, zeros, Inf, NaN and negative inputs of unsigned
 *                 formats take the outputs the numpy engine gives them (data
 *                 from the caller: the kernel never re-derives a format's
 *                 special values); the rest is assembled as a value (the
 *                 working float's bits) or a code.
 *
 * The array goes through in chunks of CHUNK elements that stay in cache: the
 * band pass (vectorised, every element), the below-band pass (vectorised, only
 * in chunks that hold such inputs), the general path (scalar, only for the
 * elements that need it: stochastic ties, integers beyond 2^53, inputs below
 * the working float's min normal where the format is still normal there, as
 * float32 subnormals for E8M0), then one store into the caller's type.
 * Float64 input into float32's own format skips the passes: the hardware's
 * conversion rounds it (cast_chunk, one pass into float32 bits or float64
 * values), and the edge inputs take their answers.
 * Block formats (fpsim/block_codec.py) enter through round_blocks: step 1
 * then divides float32 input by one scale per block (divide_chunk) before the
 * same passes, and block_amax gives each block's largest magnitude. Steps 2 to 4 of the two passes are written
 * once, in _fastround_width.h, and included for each working width.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The rounding modes, in the order of their kernel ids in fpsim/modes.py (tests/test_modes.py reads this list). */
#define FOR_EACH_MODE(X) X(NEAREST_EVEN) X(NEAREST_AWAY) X(TOWARD_ZERO) X(UP) X(DOWN) X(ODD) X(STOCHASTIC)
#define MODE_ENUM(MODE) MODE,
enum { FOR_EACH_MODE(MODE_ENUM) MODE_COUNT };

enum { IN_WORKING = 0, IN_F32, IN_F64, IN_I8, IN_I16, IN_I32, IN_I64, IN_U8, IN_U16, IN_U32, IN_U64, IN_COUNT };
enum { OUT_F32 = 0, OUT_F64, OUT_CODES }; /* float32 values, float64 values, codes */
/* How stochastic rounding reads U: exactly (its first word, then further words on a tie), or against
   the fraction truncated to rand_bits <= 32 bits (its first word), or to more (its first two words). */
enum { EXACT_DRAW, TRUNCATED_DRAW, WIDE_DRAW };
#define CHUNK 2048

/* The kernel's parameters, built by fpsim/_native.py (kernel_params) from this list, which the module
   exports as KERNEL_FIELDS: (type, name, struct code). Values are bits of the working float or codes. */
#define KERNEL_FIELDS(X)                                                                                    \
    X(int64_t, mode, "q")            /* kernel id of the rounding mode */                                  \
    X(int64_t, band_mode, "q")       /* the same in the band, except for formats without mantissa bits */  \
    X(int64_t, width, "q")           /* 32 or 64: the working float */                                      \
    X(int64_t, input, "q")           /* IN_* */                                                             \
    X(int64_t, output, "q")          /* OUT_* */                                                            \
    X(int64_t, code_bytes, "q")      /* bytes of a code (OUT_CODES) */                                      \
    X(uint64_t, lo, "Q")             /* the band: magnitude bits of the format's min normal (or the working \
                                        float's, whichever is larger) ... */                                \
    X(uint64_t, hi, "Q")             /* ... and of its max */                                               \
    X(int64_t, drop, "q")            /* bits dropped in the band: P - man_bits (>= 1) */                     \
    X(uint64_t, rebias, "Q")         /* code = (rounded bits >> drop) - rebias */                            \
    X(int64_t, code_sign_shift, "q") /* the code's sign bit is 1 << code_sign_shift */                      \
    X(int64_t, is_signed, "q")                                                                              \
    X(int64_t, below_general, "q")   /* below the band: the general path (the format's normal range goes  \
                                        below the working float's); else the grid of spacing quantum: */  \
    X(int64_t, below_offset, "q")    /* bits dropped = below_offset - exponent field */                     \
    X(double, quantum, "d")          /* 2^quantum_exp, the spacing below the band */                         \
    X(uint64_t, code_unit, "Q")      /* the code of one quantum (min normal's without subnormals) */        \
    X(uint64_t, min_count, "Q")      /* fewest quanta a result has: 1 without a zero, else 0 */              \
    X(uint64_t, zero_below, "Q")     /* counts below this give the zero output (flush_subnormal_outputs) */ \
    X(uint64_t, flush_inputs, "Q")   /* inputs below min normal give the zero output */                     \
    X(uint64_t, key, "Q")            /* Philox key (stochastic) */                                          \
    X(uint64_t, rand_bits, "Q")      /* 0: exact stochastic rounding */                                     \
    X(uint64_t, over_pos, "Q")       /* the engine's outputs for edge inputs: overflow, ... */              \
    X(uint64_t, over_neg, "Q")                                                                              \
    X(uint64_t, inf_pos, "Q")        /* ... infinities, ... */                                              \
    X(uint64_t, inf_neg, "Q")                                                                               \
    X(uint64_t, nan_pos, "Q")        /* ... NaN, ... */                                                     \
    X(uint64_t, nan_neg, "Q")                                                                               \
    X(uint64_t, zero_pos, "Q")       /* ... zeros, ... */                                                   \
    X(uint64_t, zero_neg, "Q")                                                                              \
    X(uint64_t, negative, "Q")       /* ... a negative input of an unsigned format */                       \
    X(int64_t, man_bits, "q")        /* the format, for the general path */                                 \
    X(int64_t, emin, "q")                                                                                   \
    X(int64_t, bias, "q")                                                                                   \
    X(int64_t, quantum_exp, "q")                                                                            \
    X(int64_t, top_exp, "q")         /* max = max_significand * 2^top_exp */                                \
    X(uint64_t, max_significand, "Q")                                                                       \
    X(int64_t, subnormals, "q")                                                                             \
    X(int64_t, flush_outputs, "q")                                                                          \
    X(int64_t, cast, "q")            /* 1: float64 input into float32's own format, converted by the        \
                                        hardware (cast_chunk); the answers are float32 bits or codes */

#define DECLARE_FIELD(TYPE, NAME, CODE) TYPE NAME;
typedef struct {
    KERNEL_FIELDS(DECLARE_FIELD)
} kernel_t;
#define DESCRIBE_FIELD(TYPE, NAME, CODE) #NAME ":" CODE " "
static const char kernel_fields[] = KERNEL_FIELDS(DESCRIBE_FIELD);

#include "_fastcompile.h"

/* ------------------------------------------------ the random stream: Philox4x32-10 (Random123) */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static inline void philox4x32_10(uint32_t x[4], uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)PHILOX_M0 * x[0], p1 = (uint64_t)PHILOX_M1 * x[2];
        const uint32_t y0 = (uint32_t)(p1 >> 32) ^ x[1] ^ k0, y2 = (uint32_t)(p0 >> 32) ^ x[3] ^ k1;
        x[0] = y0;
        x[1] = (uint32_t)p1;
        x[2] = y2;
        x[3] = (uint32_t)p0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
}

/* word(i, depth) for i = first .. first + n - 1 (first a multiple of 4): one block per four elements. */
static void stream_words_plain(uint64_t key, uint64_t first, Py_ssize_t n, uint32_t depth, uint32_t *restrict out) {
    const uint64_t block0 = first >> 2;
    for (Py_ssize_t j = 0; j < (n + 3) / 4; j++) {
        const uint64_t block = block0 + (uint64_t)j;
        uint32_t x[4] = {(uint32_t)block, (uint32_t)(block >> 32), depth, 0};
        philox4x32_10(x, (uint32_t)key, (uint32_t)(key >> 32));
        memcpy(out + 4 * j, x, sizeof x);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
/* The AVX2 and AVX-512 loops below, in vectors of V bits. PHILOX_KEYS: the round keys k0[r], k1[r] in every
   lane (SET1 broadcasts a 64-bit value). PHILOX_ROUNDS: the ten rounds on two interleaved sets of blocks (a, b)
   whose counters are block_a, block_b, one block's word k in each 64-bit lane of ak / bk (the multiplies read
   the low halves). */
#define PHILOX_KEYS(V, SET1)                                                                               \
    __m##V##i k0[10], k1[10];                                                                              \
    {                                                                                                      \
        uint32_t key0 = (uint32_t)key, key1 = (uint32_t)(key >> 32);                                       \
        for (int round = 0; round < 10; round++, key0 += PHILOX_W0, key1 += PHILOX_W1) {                   \
            k0[round] = SET1(key0);                                                                        \
            k1[round] = SET1(key1);                                                                        \
        }                                                                                                  \
    }
#define PHILOX_ROUNDS(V)                                                                                   \
    __m##V##i a0 = block_a, a1 = _mm##V##_srli_epi64(block_a, 32), a2 = lane_depth, a3 = _mm##V##_setzero_si##V(); \
    __m##V##i b0 = block_b, b1 = _mm##V##_srli_epi64(block_b, 32), b2 = lane_depth, b3 = _mm##V##_setzero_si##V(); \
    for (int round = 0; round < 10; round++) {                                                             \
        const __m##V##i pa0 = _mm##V##_mul_epu32(a0, m0), pa1 = _mm##V##_mul_epu32(a2, m1);                \
        const __m##V##i pb0 = _mm##V##_mul_epu32(b0, m0), pb1 = _mm##V##_mul_epu32(b2, m1);                \
        a0 = _mm##V##_xor_si##V(_mm##V##_xor_si##V(_mm##V##_srli_epi64(pa1, 32), a1), k0[round]);          \
        a2 = _mm##V##_xor_si##V(_mm##V##_xor_si##V(_mm##V##_srli_epi64(pa0, 32), a3), k1[round]);          \
        b0 = _mm##V##_xor_si##V(_mm##V##_xor_si##V(_mm##V##_srli_epi64(pb1, 32), b1), k0[round]);          \
        b2 = _mm##V##_xor_si##V(_mm##V##_xor_si##V(_mm##V##_srli_epi64(pb0, 32), b3), k1[round]);          \
        a1 = pa1, a3 = pa0, b1 = pb1, b3 = pb0;                                                            \
    }

/* The same with AVX2, which compilers do not find by themselves: each 64-bit lane holds one block's
   32-bit word (the multiply reads the low halves), two sets of four blocks interleaved. */
__attribute__((target("avx2"))) static void stream_words_avx2(uint64_t key, uint64_t first, Py_ssize_t n,
                                                              uint32_t depth, uint32_t *restrict out) {
    const Py_ssize_t blocks = (n + 3) / 4;
    const __m256i m0 = _mm256_set1_epi64x(PHILOX_M0), m1 = _mm256_set1_epi64x(PHILOX_M1);
    const __m256i lane_depth = _mm256_set1_epi64x(depth), eight = _mm256_set1_epi64x(8);
    PHILOX_KEYS(256, _mm256_set1_epi64x)
    __m256i block_a = _mm256_add_epi64(_mm256_set1_epi64x((long long)(first >> 2)), _mm256_setr_epi64x(0, 1, 2, 3));
    __m256i block_b = _mm256_add_epi64(block_a, _mm256_set1_epi64x(4));
    Py_ssize_t j = 0;
    for (; j + 8 <= blocks; j += 8) {
        PHILOX_ROUNDS(256)
        /* words 0, 1 and 2, 3 of each block side by side, then blocks in order */
#define STORE_BLOCKS(x0, x1, x2, x3, dst)                                                                 \
    do {                                                                                                 \
        const __m256i w01 = _mm256_blend_epi32(x0, _mm256_slli_epi64(x1, 32), 0xAA);                        \
        const __m256i w23 = _mm256_blend_epi32(x2, _mm256_slli_epi64(x3, 32), 0xAA);                        \
        const __m256i even = _mm256_unpacklo_epi64(w01, w23), odd = _mm256_unpackhi_epi64(w01, w23);        \
        _mm256_storeu_si256((__m256i *)(dst), _mm256_permute2x128_si256(even, odd, 0x20));                  \
        _mm256_storeu_si256((__m256i *)(dst) + 1, _mm256_permute2x128_si256(even, odd, 0x31));              \
    } while (0)
        STORE_BLOCKS(a0, a1, a2, a3, out + 4 * j);
        STORE_BLOCKS(b0, b1, b2, b3, out + 4 * j + 16);
#undef STORE_BLOCKS
        block_a = _mm256_add_epi64(block_a, eight);
        block_b = _mm256_add_epi64(block_b, eight);
    }
    stream_words_plain(key, first + 4 * (uint64_t)j, n - 4 * j, depth, out + 4 * j);
}

/* The same with AVX-512 F: eight blocks per register, two registers interleaved. */
__attribute__((target("avx512f"))) static void stream_words_avx512(uint64_t key, uint64_t first, Py_ssize_t n,
                                                                  uint32_t depth, uint32_t *restrict out) {
    const Py_ssize_t blocks = (n + 3) / 4;
    const __m512i m0 = _mm512_set1_epi64(PHILOX_M0), m1 = _mm512_set1_epi64(PHILOX_M1);
    const __m512i lane_depth = _mm512_set1_epi64(depth), sixteen = _mm512_set1_epi64(16);
    /* 128-bit pieces (blocks) of `even` (blocks 0, 2, 4, 6) and `odd` (1, 3, 5, 7) back in block order */
    const __m512i low_order = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
    const __m512i high_order = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
    PHILOX_KEYS(512, _mm512_set1_epi64)
    __m512i block_a = _mm512_add_epi64(_mm512_set1_epi64((long long)(first >> 2)),
                                       _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    __m512i block_b = _mm512_add_epi64(block_a, _mm512_set1_epi64(8));
    Py_ssize_t j = 0;
    for (; j + 16 <= blocks; j += 16) {
        PHILOX_ROUNDS(512)
#define STORE_BLOCKS(x0, x1, x2, x3, dst)                                                                 \
    do {                                                                                                 \
        const __m512i w01 = _mm512_mask_blend_epi32(0xAAAA, x0, _mm512_slli_epi64(x1, 32));                 \
        const __m512i w23 = _mm512_mask_blend_epi32(0xAAAA, x2, _mm512_slli_epi64(x3, 32));                 \
        const __m512i even = _mm512_unpacklo_epi64(w01, w23), odd = _mm512_unpackhi_epi64(w01, w23);        \
        _mm512_storeu_si512((void *)(dst), _mm512_permutex2var_epi64(even, low_order, odd));               \
        _mm512_storeu_si512((void *)((dst) + 16), _mm512_permutex2var_epi64(even, high_order, odd));       \
    } while (0)
        STORE_BLOCKS(a0, a1, a2, a3, out + 4 * j);
        STORE_BLOCKS(b0, b1, b2, b3, out + 4 * j + 32);
#undef STORE_BLOCKS
        block_a = _mm512_add_epi64(block_a, sixteen);
        block_b = _mm512_add_epi64(block_b, sixteen);
    }
    stream_words_avx2(key, first + 4 * (uint64_t)j, n - 4 * j, depth, out + 4 * j);
}

static void stream_words(uint64_t key, uint64_t first, Py_ssize_t n, uint32_t depth, uint32_t *restrict out) {
    static int isa = -1; /* 2: AVX-512 F (unless built with FPSIM_NO_AVX512), 1: AVX2, 0: neither */
#if defined(FPSIM_NO_AVX512)
    if (isa < 0) isa = __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    if (isa < 0) isa = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
#endif
    if (isa == 2) stream_words_avx512(key, first, n, depth, out);
    else if (isa == 1) stream_words_avx2(key, first, n, depth, out);
    else stream_words_plain(key, first, n, depth, out);
}
#else
#define stream_words stream_words_plain
#endif

static uint32_t stream_word(uint64_t key, uint64_t index, uint32_t depth) {
    uint32_t x[4] = {(uint32_t)(index >> 2), (uint32_t)(index >> 34), depth, 0};
    philox4x32_10(x, (uint32_t)key, (uint32_t)(key >> 32));
    return x[index & 3];
}

/* ------------------------------------------------ steps 2 to 4, vectorised, per working width */
#define W 32
#define word_t uint32_t
#define sword_t int32_t
#define fword_t float
#define P 23
#define BIAS_IN 127
#define FN(name) name##_32
#include "_fastround_width.h"
#undef W
#undef word_t
#undef sword_t
#undef fword_t
#undef P
#undef BIAS_IN
#undef FN

#define W 64
#define word_t uint64_t
#define sword_t int64_t
#define fword_t double
#define P 52
#define BIAS_IN 1023
#define FN(name) name##_64
#include "_fastround_width.h"
#undef W
#undef word_t
#undef sword_t
#undef fword_t
#undef P
#undef BIAS_IN
#undef FN

/* ------------------------------------------------ the general path: one element, exactly */
/* digit j of f = rest / 2^D (its bits 32 j + 1 .. 32 (j + 1) after the binary point); *more: f has
   bits beyond them. */
static uint32_t fraction_digit(uint64_t rest, int64_t D, int64_t j, int *more) {
    const int64_t shift = 32 * (j + 1) - D; /* digit = floor(rest * 2^shift) mod 2^32 */
    if (shift >= 0) {
        *more = 0;
        return shift >= 32 ? 0u : (uint32_t)(rest << shift);
    }
    if (-shift >= 64) {
        *more = rest != 0;
        return 0u;
    }
    *more = (rest & ((UINT64_C(1) << -shift) - 1)) != 0;
    return (uint32_t)(rest >> -shift);
}

/* Stochastic rounding's decision for U_index < f = rest / 2^D, exactly or truncated to rand_bits. */
static int general_sr_up(const kernel_t *k, uint64_t rest, int64_t D, uint64_t index, uint32_t u0) {
    const int64_t r = (int64_t)k->rand_bits;
    if (r) {
        const uint64_t truncated = D <= r ? rest << (r - D) : (D - r < 64 ? rest >> (D - r) : 0);
        const uint64_t u = ((uint64_t)u0 << 32) | (r > 32 ? stream_word(k->key, index, 1) : 0u);
        return (u >> (64 - r)) < truncated;
    }
    uint32_t u = u0;
    for (int64_t j = 0;; j++) { /* the first word that differs from f's decides */
        int more;
        const uint32_t digit = fraction_digit(rest, D, j, &more);
        if (u != digit) return u < digit;
        if (!more) return 0; /* U >= f */
        u = stream_word(k->key, index, (uint32_t)(j + 1));
    }
}

static uint64_t float_bits(double v, int width) {
    if (width == 32) {
        const float f = (float)v;
        uint32_t b;
        memcpy(&b, &f, sizeof b);
        return b;
    }
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

/* Steps 2 to 4 for |x| = sig * 2^lsb (0 < sig < 2^64) with sign neg, from the format's facts: the
   output in the representation of `out` (values of the working float, or codes). */
static uint64_t round_general(const kernel_t *k, int neg, uint64_t sig, int64_t lsb, uint64_t index, uint32_t u0) {
    const int64_t M = k->man_bits;
    const uint64_t zero = neg ? k->zero_neg : k->zero_pos;
    /* 2. the grid's spacing 2^q at |x| */
    const int64_t e = lsb + 63 - __builtin_clzll(sig); /* floor(log2 |x|) */
    const int tiny = e < k->emin;
    if (tiny && k->flush_inputs) return zero;
    if (neg && !k->is_signed) return k->negative;
    int64_t q = tiny ? k->quantum_exp : e - M;
    const int64_t D = q - lsb;
    /* 3. round: n quanta */
    uint64_t n;
    if (D <= 0) {
        n = sig << -D; /* on the grid */
    } else {
        const uint64_t keep = D < 64 ? sig >> D : 0, rest = D < 64 ? sig & ((UINT64_C(1) << D) - 1) : sig;
        if (k->mode == STOCHASTIC) {
            n = keep + (uint64_t)general_sr_up(k, rest, D, index, u0);
        } else { /* the mode table on (last kept bit, round bit, sticky bit) */
            const uint64_t round_bit = D <= 64 ? (rest >> (D - 1)) & 1 : 0;
            const uint64_t sticky = D <= 64 ? (D == 1 ? 0 : (rest & ((UINT64_C(1) << (D - 1)) - 1)) != 0) : rest != 0;
            n = (keep & ~UINT64_C(1)) + round_at_64((int)k->mode, ((keep & 1) << 2) | (round_bit << 1) | sticky, 2, 3,
                                                    (uint64_t)neg, 0);
        }
    }
    /* 4. finish */
    if (n == 0) {
        if (k->min_count == 0) return zero;
        n = 1; /* no zero: the smallest value */
    }
    const uint64_t full = UINT64_C(1) << M;
    if (n == 2 * full) { /* carried into the next binade */
        n = full;
        q++;
    }
    if (n < full && !k->subnormals) { /* one quantum below the band is min normal */
        n <<= M;
        q -= M;
    }
    if (n >= full && (q > k->top_exp || (q == k->top_exp && n > k->max_significand)))
        return neg ? k->over_neg : k->over_pos;
    if (n < full && k->flush_outputs) return zero;
    if (k->output == OUT_CODES) {
        const uint64_t magnitude = n >= full ? ((uint64_t)(q + M + k->bias) << M) | (n - full) : n;
        return magnitude | (neg ? UINT64_C(1) << k->code_sign_shift : 0);
    }
    const int width = (int)k->width;
    return float_bits(ldexp((double)n, (int)q), width) | ((uint64_t)neg << (width - 1));
}

/* The exact sign, significand and lsb exponent of element i of the input (working bits w for floats). */
static int decompose_exact(const kernel_t *k, const void *src, Py_ssize_t i, uint64_t w, uint64_t *sig,
                           int64_t *lsb) {
    int64_t v = 0;
    uint64_t u = 0;
    switch (k->input) {
    case IN_I8: v = ((const int8_t *)src)[i]; break;
    case IN_I16: v = ((const int16_t *)src)[i]; break;
    case IN_I32: v = ((const int32_t *)src)[i]; break;
    case IN_I64: v = ((const int64_t *)src)[i]; break;
    case IN_U8: u = ((const uint8_t *)src)[i]; break;
    case IN_U16: u = ((const uint16_t *)src)[i]; break;
    case IN_U32: u = ((const uint32_t *)src)[i]; break;
    case IN_U64: u = ((const uint64_t *)src)[i]; break;
    default: { /* the working float's bits */
        const int P_ = k->width == 32 ? 23 : 52, bias_in = k->width == 32 ? 127 : 1023;
        const uint64_t magnitude = w & ((UINT64_C(1) << (k->width - 1)) - 1), field = magnitude >> P_;
        *sig = (magnitude & ((UINT64_C(1) << P_) - 1)) | (field ? UINT64_C(1) << P_ : 0);
        *lsb = (int64_t)(field ? field : 1) - bias_in - P_;
        return (int)(w >> (k->width - 1)) & 1;
    }
    }
    *lsb = 0;
    if (k->input <= IN_I64) {
        *sig = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
        return v < 0;
    }
    *sig = u;
    return 0;
}

/* ------------------------------------------------ step 1 for inputs of another type than the working float */
/* Working float64 bits of a chunk; integers beyond 2^53 are marked for the general path (general[i]: 1,
   else 0). */
static int widen(const kernel_t *k, const void *src, Py_ssize_t start, Py_ssize_t n, uint64_t *out,
                 uint64_t *general) {
    int any = 0;
#define WIDEN(TYPE, BIG)                                                                                 \
    for (Py_ssize_t i = 0; i < n; i++) {                                                               \
        const TYPE v = ((const TYPE *)src)[start + i];                                                    \
        const double d = (double)v;                                                                       \
        const int big = BIG;                                                                              \
        memcpy(&out[i], &d, sizeof d);                                                                    \
        general[i] = (uint64_t)big;                                                                        \
        any |= big;                                                                                       \
    }                                                                                                    \
    break;
    switch (k->input) {
    case IN_F32: WIDEN(float, 0)
    case IN_I8: WIDEN(int8_t, 0)
    case IN_I16: WIDEN(int16_t, 0)
    case IN_I32: WIDEN(int32_t, 0)
    case IN_U8: WIDEN(uint8_t, 0)
    case IN_U16: WIDEN(uint16_t, 0)
    case IN_U32: WIDEN(uint32_t, 0)
    case IN_I64: WIDEN(int64_t, v > (INT64_C(1) << 53) || v < -(INT64_C(1) << 53))
    default: WIDEN(uint64_t, v > (UINT64_C(1) << 53))
    }
#undef WIDEN
    return any;
}

/* Working float32 bits of a chunk of float64 values (block formats' quotients), rounded to odd (truncated, the last bit set when
   any dropped bit is): rounding that again to a format with at most 21 mantissa bits, whose values
   all have an even last bit in float32, gives the correctly rounded result in every deterministic
   mode (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using
   rounding to odd", IEEE TC 2008). Beyond float32's range: float32's max, which overflows (or, toward
   zero, saturates) exactly where the input does; below it, float32's subnormal grid, which the caller
   keeps two bits finer than the format's (quantum_exp >= -147). */
static void narrow_to_odd_plain(const uint64_t *restrict src, uint32_t *restrict out, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint64_t u = src[i], a = u & ~(UINT64_C(1) << 63), field = a >> 52, mant = a & ((UINT64_C(1) << 52) - 1);
        uint32_t bits;
        if (field == 2047) bits = mant ? 0x7fc00000u : 0x7f800000u; /* NaN, Inf */
        else if (field > 1150) bits = 0x7f7fffffu;                   /* finite beyond float32: its max */
        else if (field >= 897)                                       /* rebias, 23 bits, the sticky bit */
            bits = (uint32_t)((field - 896) << 23) | (uint32_t)(mant >> 29) | ((mant << 35) != 0);
        else { /* float32 subnormal k * 2^-149 and the sticky bit */
            const uint64_t sig = mant | ((uint64_t)(field != 0) << 52), shift = 926 - (field ? field : 1);
            const uint64_t kept = shift < 64 ? sig >> shift : 0;
            bits = (uint32_t)kept | (shift < 64 ? sig != kept << shift : sig != 0);
        }
        out[i] = bits | ((uint32_t)(u >> 32) & 0x80000000u);
    }
}

#if defined(__GNUC__) && defined(__x86_64__)
/* The same with the hardware: convert rounding toward zero (MXCSR, subnormals kept, exceptions masked),
   then set the last bit where converting back differs; exactly the cases above. */
__attribute__((target("avx2"))) static void narrow_to_odd_avx2(const uint64_t *restrict src, uint32_t *restrict out,
                                                               Py_ssize_t n) {
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(0x7F80u); /* round toward zero, all exceptions masked, no flush to zero */
    const __m256i even_lanes = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d x = _mm256_loadu_pd((const double *)src + i);
        const __m128 y = _mm256_cvtpd_ps(x);
        const __m256d inexact = _mm256_cmp_pd(_mm256_cvtps_pd(y), x, _CMP_NEQ_UQ);
        const __m128i sticky = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), even_lanes));
        _mm_storeu_si128((__m128i *)(out + i), _mm_or_si128(_mm_castps_si128(y), _mm_and_si128(sticky, _mm_set1_epi32(1))));
    }
    _mm_setcsr(saved);
    narrow_to_odd_plain(src + i, out + i, n - i);
}

static void narrow_to_odd(const uint64_t *restrict src, uint32_t *restrict out, Py_ssize_t n) {
    static int avx2 = -1;
    if (avx2 < 0) avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
    if (avx2) narrow_to_odd_avx2(src, out, n);
    else narrow_to_odd_plain(src, out, n);
}
#else
#define narrow_to_odd narrow_to_odd_plain
#endif

/* Float64 input into float32's own format (fpsim/_native.py _casts): one conversion by the hardware in the
   mode's rounding direction (MXCSR; odd: toward zero, then the last bit set where converting back differs, as
   narrow_to_odd; nearest-away: toward zero, then up where the rest reaches half the spacing, away_from), then
   the engine's answers where the kernel's passes would give them: a NaN, Inf or zero input; overflow (a
   finite input of 2^128 or more, or one the conversion took to Inf, which is exactly where the mode's
   rounding exceeds float32's max); a result below zero_below (rounded to zero, or subnormal with
   flush_subnormal_outputs); an input below min normal with flush_subnormal_inputs. */
#if defined(__GNUC__) && defined(__x86_64__)
#define NARROW_MASK(m64) _mm256_castsi256_si128(_mm256_permutevar8x32_epi32((m64), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)))
/* Nearest with ties away from zero, which the conversion lacks: res holds x converted toward zero (RZ), and
   its magnitude goes one float32 up (the next bit pattern: carries into the exponent, and past max to Inf,
   as rounding does) where |x| - |res|, exact in float64, is at least half the spacing above |res| (both
   exact too; above max, where the next pattern is Inf, half the spacing is 2^103, as if the exponent went on).
   NaN and Inf inputs compare false and stay as converted. */
__attribute__((target("avx2"))) static ALWAYS_INLINE __m128i away_from(__m256d x, __m128i res) {
    const __m128i next = _mm_add_epi32(res, _mm_set1_epi32(1));
    const __m256d below = _mm256_cvtps_pd(_mm_castsi128_ps(res)), above = _mm256_cvtps_pd(_mm_castsi128_ps(next));
    const __m256d magnitude = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256d rest = _mm256_and_pd(_mm256_sub_pd(x, below), magnitude);
    const __m256d half = _mm256_min_pd(_mm256_and_pd(_mm256_mul_pd(_mm256_sub_pd(above, below), _mm256_set1_pd(0.5)),
                                                     magnitude), _mm256_set1_pd(0x1p103));
    const __m256i up = _mm256_castpd_si256(_mm256_cmp_pd(rest, half, _CMP_GE_OQ));
    return _mm_blendv_epi8(res, next, NARROW_MASK(up));
}

/* Four elements: x, their float64 bits, into float32 bits (MXCSR set by the caller). The common case takes
   no answer (one test for the four, on the results alone): a result strictly between float32's min normal
   and its max comes from a finite input in float32's normal range that neither overflows nor is flushed
   (the inputs that do give those two values, Inf, NaN, zero or a subnormal). */
__attribute__((target("avx2"))) static ALWAYS_INLINE __m128i cast_four(const kernel_t *k, const int odd, const int away,
                                                                     __m256d x) {
    const __m128 y = _mm256_cvtpd_ps(x);
    __m128i res = _mm_castps_si128(y);
    if (away) res = away_from(x, res);
    if (odd) res = _mm_or_si128(res, _mm_srli_epi32(NARROW_MASK(_mm256_castpd_si256(
                                                    _mm256_cmp_pd(_mm256_cvtps_pd(y), x, _CMP_NEQ_UQ))), 31));
    const __m128i magnitude = _mm_and_si128(res, _mm_set1_epi32(0x7fffffff));
    const __m128i ordinary = _mm_and_si128(_mm_cmpgt_epi32(magnitude, _mm_set1_epi32(0x00800000)),
                                           _mm_cmpgt_epi32(_mm_set1_epi32(0x7f7fffff), magnitude));
    if (_mm_movemask_epi8(ordinary) == 0xFFFF) return res;
    const __m256i a = _mm256_and_si256(_mm256_castpd_si256(x), _mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256i tiny64 = _mm256_set1_epi64x(0x3810000000000000LL), huge64 = _mm256_set1_epi64x(0x47efffffffffffffLL);
    const __m128i is_nan = NARROW_MASK(_mm256_cmpgt_epi64(a, _mm256_set1_epi64x(0x7ff0000000000000LL)));
    const __m128i is_inf = NARROW_MASK(_mm256_cmpeq_epi64(a, _mm256_set1_epi64x(0x7ff0000000000000LL)));
    const __m128i is_zero = NARROW_MASK(_mm256_cmpeq_epi64(a, _mm256_setzero_si256()));
    const __m128i tiny = _mm_and_si128(NARROW_MASK(_mm256_cmpgt_epi64(tiny64, a)), _mm_set1_epi32(-(int)!!k->flush_inputs));
    const __m128i negative = _mm_srai_epi32(res, 31);
    const __m128i over = _mm_or_si128(NARROW_MASK(_mm256_cmpgt_epi64(a, huge64)),
                                      _mm_cmpeq_epi32(magnitude, _mm_set1_epi32(0x7f800000)));
    const __m128i to_zero = _mm_or_si128(_mm_or_si128(is_zero, tiny), _mm_cmplt_epi32(magnitude, _mm_set1_epi32((int)k->zero_below)));
#define ANSWER(POS, NEG) _mm_blendv_epi8(_mm_set1_epi32((int)k->POS), _mm_set1_epi32((int)k->NEG), negative)
    res = _mm_blendv_epi8(res, ANSWER(zero_pos, zero_neg), to_zero);
    res = _mm_blendv_epi8(res, ANSWER(over_pos, over_neg), over);
    res = _mm_blendv_epi8(res, ANSWER(inf_pos, inf_neg), is_inf);
    return _mm_blendv_epi8(res, ANSWER(nan_pos, nan_neg), is_nan);
#undef ANSWER
}
#undef NARROW_MASK

/* wide: the results as float64 values (exactly), else as float32 bits. */
__attribute__((target("avx2"))) static ALWAYS_INLINE void cast_loop(const kernel_t *k, const int odd, const int away,
                                                                     const int wide,
                                                                     const uint64_t *restrict src,
                                                                     void *restrict out, Py_ssize_t n) {
    Py_ssize_t i = 0;
    if (!odd) { /* eight at a time, with one test of the results for the eight (as cast_four's) */
        for (; i + 8 <= n; i += 8) {
            const __m256d x0 = _mm256_loadu_pd((const double *)src + i), x1 = _mm256_loadu_pd((const double *)src + i + 4);
            __m128i r0 = _mm_castps_si128(_mm256_cvtpd_ps(x0)), r1 = _mm_castps_si128(_mm256_cvtpd_ps(x1));
            if (away) r0 = away_from(x0, r0), r1 = away_from(x1, r1);
            const __m256i magnitude = _mm256_and_si256(_mm256_set_m128i(r1, r0), _mm256_set1_epi32(0x7fffffff));
            const __m256i ordinary = _mm256_and_si256(_mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x00800000)),
                                                      _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f7fffff), magnitude));
            if (_mm256_movemask_epi8(ordinary) != -1) r0 = cast_four(k, 0, away, x0), r1 = cast_four(k, 0, away, x1);
            if (wide) {
                _mm256_storeu_pd((double *)out + i, _mm256_cvtps_pd(_mm_castsi128_ps(r0)));
                _mm256_storeu_pd((double *)out + i + 4, _mm256_cvtps_pd(_mm_castsi128_ps(r1)));
            } else {
                _mm256_storeu_si256((__m256i *)((uint32_t *)out + i), _mm256_set_m128i(r1, r0));
            }
        }
    }
    for (; i + 4 <= n; i += 4) {
        const __m128i res = cast_four(k, odd, away, _mm256_loadu_pd((const double *)src + i));
        if (wide) _mm256_storeu_pd((double *)out + i, _mm256_cvtps_pd(_mm_castsi128_ps(res)));
        else _mm_storeu_si128((__m128i *)((uint32_t *)out + i), res);
    }
    if (i < n) { /* the last one to three */
        double last[4] = {0.0, 0.0, 0.0, 0.0}, wide_res[4];
        uint32_t res[4];
        memcpy(last, src + i, (size_t)(n - i) * sizeof(double));
        const __m128i r = cast_four(k, odd, away, _mm256_loadu_pd(last));
        _mm_storeu_si128((__m128i *)res, r);
        _mm256_storeu_pd(wide_res, _mm256_cvtps_pd(_mm_castsi128_ps(r)));
        if (wide) memcpy((double *)out + i, wide_res, (size_t)(n - i) * sizeof(double));
        else memcpy((uint32_t *)out + i, res, (size_t)(n - i) * sizeof(uint32_t));
    }
}

__attribute__((target("avx2"))) static void cast_chunk(const kernel_t *k, const uint64_t *restrict src,
                                                       void *restrict out, Py_ssize_t n, int wide) {
    static const unsigned rounding_control[MODE_COUNT] = {
        [NEAREST_EVEN] = 0x0000u, [DOWN] = 0x2000u, [UP] = 0x4000u, [TOWARD_ZERO] = 0x6000u, [ODD] = 0x6000u,
        [NEAREST_AWAY] = 0x6000u};
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(0x1F80u | rounding_control[k->mode]); /* all exceptions masked, no flush to zero */
    if (wide) {
        if (k->mode == ODD) cast_loop(k, 1, 0, 1, src, out, n);
        else if (k->mode == NEAREST_AWAY) cast_loop(k, 0, 1, 1, src, out, n);
        else cast_loop(k, 0, 0, 1, src, out, n);
    } else {
        if (k->mode == ODD) cast_loop(k, 1, 0, 0, src, out, n);
        else if (k->mode == NEAREST_AWAY) cast_loop(k, 0, 1, 0, src, out, n);
        else cast_loop(k, 0, 0, 0, src, out, n);
    }
    _mm_setcsr(saved);
}

static int has_cast(void) { return __builtin_cpu_supports("avx2") ? 1 : 0; }
#else
static void cast_chunk(const kernel_t *k, const uint64_t *src, void *out, Py_ssize_t n, int wide) {
    (void)k, (void)src, (void)out, (void)n, (void)wide; /* (never called: has_cast() is 0, and check() refuses the parameters) */
}
static int has_cast(void) { return 0; }
#endif

static size_t input_size(int64_t input, int64_t width) {
    static const size_t sizes[IN_COUNT] = {0, 4, 8, 1, 2, 4, 8, 1, 2, 4, 8};
    return input == IN_WORKING ? (size_t)width / 8 : sizes[input];
}

static size_t output_size(const kernel_t *k) {
    return k->output == OUT_CODES ? (size_t)k->code_bytes : k->output == OUT_F32 ? 4 : 8;
}

/* The last step: a chunk of results into the caller's type. */
static void store(const kernel_t *k, const void *results, void *dst, Py_ssize_t start, Py_ssize_t n) {
    if (k->width == 64 && k->output == OUT_F32) {
        const double *r = results;
        float *o = (float *)dst + start;
        for (Py_ssize_t i = 0; i < n; i++) o[i] = (float)r[i]; /* exact: the values are the format's */
        return;
    }
    if (k->width == 32 && k->output == OUT_F64) {
        const float *r = results;
        double *o = (double *)dst + start;
        for (Py_ssize_t i = 0; i < n; i++) o[i] = r[i];
        return;
    }
#define NARROW(FROM, TO)                                                                                 \
    do {                                                                                                 \
        const FROM *r = results;                                                                         \
        TO *o = (TO *)dst + start;                                                                       \
        for (Py_ssize_t i = 0; i < n; i++) o[i] = (TO)r[i];                                              \
    } while (0)
    if (k->width == 32) {
        if (k->code_bytes == 1) NARROW(uint32_t, uint8_t);
        else NARROW(uint32_t, uint16_t);
    } else {
        if (k->code_bytes == 1) NARROW(uint64_t, uint8_t);
        else if (k->code_bytes == 2) NARROW(uint64_t, uint16_t);
        else NARROW(uint64_t, uint32_t);
    }
#undef NARROW
}

/* Step 1 for block formats: x / s of a chunk of float32 input, one divisor s per `block` elements,
   as float32 working bits rounded exactly for the caller's formats (fpsim/_native.py covers_blocks: at
   most 21 mantissa bits, finest spacing 2^-125 or coarser).
   A power-of-two s: x * (1 / s) in float32, exact unless the quotient leaves float32's normal range;
   below it, where every quotient rounds as any nonzero one of its sign (2^-126, float32's min normal, is
   the formats' first rounding boundary at most), a quotient that underflowed to 0 becomes float32's
   smallest subnormal and one that rounded up onto 2^-126 the largest (a tie there would round away from
   zero); beyond it, one that overflowed becomes float32's max (which overflows, or saturates, exactly
   where the quotient does).
   Another s (at most 28 significant bits: an E4M3 block scale times an FP32 tensor scale): the float64
   quotient, correctly rounded, rounded to odd at float32's precision like float64 input. x / s is
   either a decision point of the format (then exact) or further from one than float64's rounding
   moves it (fpsim/quotient.py), so that the second rounding is the correct one. */
MULTIVERSION_512 static void scale_by_power_of_two(const uint32_t *restrict x, float r, Py_ssize_t n,
                                                   uint32_t *restrict out) {
    /* the magnitude whose quotient is 2^-126 exactly (none, where 2^-126 / r is not a float32) */
    const double exact_min_normal = ldexp(1.0, -126) / (double)r;
    const float exact_f = (float)exact_min_normal;
    uint32_t exact_bits = UINT32_MAX;
    if ((double)exact_f == exact_min_normal) memcpy(&exact_bits, &exact_f, sizeof exact_bits);
    for (Py_ssize_t i = 0; i < n; i++) {
        float xf, q;
        memcpy(&xf, &x[i], sizeof xf);
        q = xf * r;
        uint32_t qb;
        memcpy(&qb, &q, sizeof qb);
        const uint32_t qmag = qb & 0x7fffffffu, xmag = x[i] & 0x7fffffffu;
        const uint32_t underflow = (qmag == 0) & (xmag != 0), overflow = (qmag == 0x7f800000u) & (xmag < 0x7f800000u);
        const uint32_t onto_min_normal = (qmag == 0x00800000u) & (xmag != exact_bits);
        /* the smallest subnormal; the max (Inf's bits minus one); the largest subnormal (2^-126's minus one) */
        out[i] = (qb | underflow) - overflow - onto_min_normal;
    }
}

static void divide_chunk(const float *restrict src, const double *restrict divisors, Py_ssize_t block,
                         Py_ssize_t start, Py_ssize_t m, uint32_t *restrict work, uint64_t *restrict scratch) {
    const Py_ssize_t first = start / block, last = (start + m - 1) / block;
    int powers = 1;
    for (Py_ssize_t b = first; b <= last && powers; b++) {
        int e;
        powers = frexp(divisors[b], &e) == 0.5 && 1 - e >= -149 && 1 - e <= 127; /* 1 / s is a float32 */
    }
    Py_ssize_t i = 0, end = (first + 1) * block - start; /* block by block: [i, end) */
    for (Py_ssize_t b = first; b <= last; b++, i = end, end += block) {
        const Py_ssize_t stop = end < m ? end : m;
        if (powers) {
            scale_by_power_of_two((const uint32_t *)src + start + i, (float)(1.0 / divisors[b]), stop - i, work + i);
        } else {
            double *q = (double *)scratch;
            for (Py_ssize_t j = i; j < stop; j++) q[j] = (double)src[start + j] / divisors[b];
        }
    }
    if (!powers) narrow_to_odd(scratch, work, m); /* once per chunk: it sets the rounding mode */
}

/* The last step for block formats' values: each stored element times its block's divisor, the
   dequantised value (exact: the caller's output type holds element * scale). */
static void rescale_chunk(const kernel_t *k, void *dst, const double *restrict divisors, Py_ssize_t block,
                          Py_ssize_t start, Py_ssize_t m) {
    Py_ssize_t i = 0, end = (start / block + 1) * block - start;
    for (Py_ssize_t b = start / block; i < m; b++, i = end, end += block) {
        const Py_ssize_t stop = end < m ? end : m;
        const double s = divisors[b];
        if (k->output == OUT_F32) {
            float *o = (float *)dst + start;
            for (Py_ssize_t j = i; j < stop; j++) o[j] = (float)((double)o[j] * s);
        } else {
            double *o = (double *)dst + start;
            for (Py_ssize_t j = i; j < stop; j++) o[j] *= s;
        }
    }
}

/* Asks for the next chunk's input and output lines while this chunk is worked on, so that its passes,
   which read and write the caller's memory in separate loops, find them in cache. */
static void prefetch_next(const kernel_t *k, const void *src, void *dst, Py_ssize_t next, Py_ssize_t n) {
    const Py_ssize_t m = n - next < CHUNK ? n - next : CHUNK;
    if (m <= 0) return;
    const size_t in = input_size(k->input, k->width), out = output_size(k);
    const char *s = (const char *)src + (size_t)next * in, *d = (const char *)dst + (size_t)next * out;
    for (size_t b = 0; b < (size_t)m * in; b += 64) __builtin_prefetch(s + b, 0, 3);
    for (size_t b = 0; b < (size_t)m * out; b += 64) __builtin_prefetch(d + b, 1, 3);
}

/* ------------------------------------------------ the driver: chunk by chunk, pass by pass */
#define DEFINE_RUN(W_, word_t)                                                                              \
    static void run_##W_(const kernel_t *k, const void *src, void *dst, Py_ssize_t n,              \
                         const double *divisors, Py_ssize_t block, int rescale) {                      \
        word_t work[CHUNK], results[CHUNK];                                                                   \
        uint32_t u0[CHUNK], u1[CHUNK];                                                                        \
        word_t below[CHUNK], general[CHUNK];                                                                  \
        uint64_t scaled[divisors ? CHUNK : 1]; /* the quotients of block formats, as float64 bits */          \
        const int stochastic = k->mode == STOCHASTIC, codes = k->output == OUT_CODES;                         \
        const int direct = output_size(k) == sizeof(word_t); /* results straight into dst */                  \
        const pass_fn_##W_ band = passes_##W_[k->band_mode][0][codes], below_band = passes_##W_[k->mode][1][codes]; \
        const uint32_t *second = k->rand_bits > 32 ? u1 : u0; /* U's second word, where it is needed */      \
        for (Py_ssize_t start = 0; start < n; start += CHUNK) {                                               \
            const Py_ssize_t m = n - start < CHUNK ? n - start : CHUNK;                                       \
            prefetch_next(k, src, dst, start + m, n);                                                         \
            int general_ready = 0; /* general[] written for this chunk (cleared only where it is used) */     \
            /* 1. decompose: the working float's bits */                                                     \
            const word_t *w = (const word_t *)src + start;                                                    \
            int needs_general = 0;                                                                            \
            if (divisors && W_ == 32) {                                                                    \
                divide_chunk((const float *)src, divisors, block, start, m, (uint32_t *)work, scaled);        \
                w = work;                                                                                     \
            } else if (W_ == 32 && k->input == IN_F64) { /* deterministic modes only: check() */              \
                narrow_to_odd((const uint64_t *)src + start, (uint32_t *)work, m);                            \
                w = work;                                                                                     \
            } else if (k->input != IN_WORKING) {                                                              \
                needs_general = widen(k, src, start, m, (uint64_t *)work, (uint64_t *)general);                \
                general_ready = 1;                                                                            \
                w = work;                                                                                     \
            }                                                                                                \
            if (stochastic) {                                                                                 \
                stream_words(k->key, (uint64_t)start, m, 0, u0);                                              \
                if (k->rand_bits > 32) stream_words(k->key, (uint64_t)start, m, 1, u1);                       \
            }                                                                                                \
            word_t *out = direct ? (word_t *)dst + start : results;                                           \
            /* 2 to 4: the band, then below it, then what only the general path decides */                  \
            word_t ties = 0;                                                                                  \
            const Py_ssize_t n_below = band(k, w, u0, second, out, below, m, 0, &ties);                        \
            if (n_below && k->below_general) {                                                                \
                if (!general_ready) memset(general, 0, sizeof general);                                       \
                general_ready = 1;                                                                            \
                for (Py_ssize_t i = 0; i < m; i++) general[i] |= below[i];                                    \
                needs_general = 1;                                                                            \
            } else if (n_below) {                                                                             \
                below_band(k, w, u0, second, out, below, m, n_below, &ties);                                  \
            }                                                                                                \
            if (ties) {                                                                                       \
                if (!general_ready) memset(general, 0, sizeof general);                                       \
                ties_of_##W_(k, w, u0, second, below, general, m);                                            \
            }                                                                                                \
            if (needs_general || ties) {                                                                      \
                for (Py_ssize_t i = 0; i < m; i++) {                                                          \
                    if (!general[i]) continue;                                                                \
                    uint64_t sig;                                                                             \
                    int64_t lsb;                                                                              \
                    const int neg = decompose_exact(k, src, start + i, w[i], &sig, &lsb);                     \
                    out[i] = (word_t)round_general(k, neg, sig, lsb, (uint64_t)(start + i), stochastic ? u0[i] : 0); \
                }                                                                                            \
            }                                                                                                \
            if (!direct) store(k, out, dst, start, m);                                                        \
            if (rescale) rescale_chunk(k, dst, divisors, block, start, m);                                    \
        }                                                                                                    \
    }
DEFINE_RUN(32, uint32_t)
DEFINE_RUN(64, uint64_t)

/* ------------------------------------------------ the module */
/* Why the parameters (and the buffers' sizes in bytes) do not fit each other, or NULL. `blocks`: the
   parameters of round_blocks (float32 input divided into float64, rounded to odd: deterministic modes). */
static const char *check(const kernel_t *k, Py_ssize_t params_len, Py_ssize_t src_len, Py_ssize_t dst_len,
                         int blocks) {
    if (params_len != (Py_ssize_t)sizeof *k)
        return "parameters of the wrong size (build them with fpsim._native.kernel_params)";
    const int P_ = k->width == 32 ? 23 : 52;
    /* float32 working bits rounded to odd: block formats' quotients of float32 input, or float64 input */
    const int narrowed = k->mode != STOCHASTIC && k->input == (blocks ? IN_F32 : IN_F64);
    if (k->cast) { /* the hardware's conversion: its rounding directions, odd and nearest-away */
        if (blocks || !has_cast() || k->cast != 1 || k->width != 32 || k->input != IN_F64 ||
            k->mode < 0 || k->mode >= MODE_COUNT || k->mode == STOCHASTIC ||
            k->output < OUT_F32 || k->output > OUT_CODES || (k->output == OUT_CODES && k->code_bytes != 4))
            return "parameters out of range";
    } else if ((k->width != 32 && k->width != 64) || k->mode < 0 || k->mode >= MODE_COUNT || k->band_mode < 0 ||
               k->band_mode >= MODE_COUNT || k->input < 0 || k->input >= IN_COUNT ||
               (k->width == 32 && k->input != IN_WORKING && !narrowed) || (blocks && (k->width != 32 || !narrowed)) ||
               k->output < OUT_F32 || k->output > OUT_CODES ||
               (k->output == OUT_CODES && k->code_bytes != 1 && k->code_bytes != 2 && k->code_bytes != 4 &&
                !(k->code_bytes == 8 && k->width == 64)) ||
               k->drop < 1 || k->drop > P_ || k->rand_bits > (uint64_t)(k->width == 32 ? 32 : 52) ||
               k->man_bits < 0 || k->man_bits > P_ - 1 || k->code_sign_shift < 0 || k->code_sign_shift > 63) {
        return "parameters out of range";
    }
    const Py_ssize_t item = (Py_ssize_t)input_size(k->input, k->width);
    if (src_len % item || dst_len != src_len / item * (Py_ssize_t)output_size(k)) return "buffer sizes do not match";
    return NULL;
}

static PyObject *round_array(PyObject *self, PyObject *args) {
    Py_buffer src, dst, params;
    if (!PyArg_ParseTuple(args, "y*w*y*", &src, &dst, &params)) return NULL;
    kernel_t k;
    memcpy(&k, params.buf, params.len < (Py_ssize_t)sizeof k ? (size_t)params.len : sizeof k);
    const char *problem = check(&k, params.len, src.len, dst.len, 0);
    if (!problem) {
        const Py_ssize_t n = src.len / (Py_ssize_t)input_size(k.input, k.width);
        Py_BEGIN_ALLOW_THREADS
        if (k.cast) cast_chunk(&k, src.buf, dst.buf, n, k.output == OUT_F64); /* one pass, in the output's type */
        else if (k.width == 32) run_32(&k, src.buf, dst.buf, n, NULL, 1, 0);
        else run_64(&k, src.buf, dst.buf, n, NULL, 1, 0);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&params);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *round_blocks(PyObject *self, PyObject *args) {
    Py_buffer src, dst, params, divisors;
    Py_ssize_t block;
    int rescale;
    if (!PyArg_ParseTuple(args, "y*w*y*y*np", &src, &dst, &params, &divisors, &block, &rescale)) return NULL;
    kernel_t k;
    memcpy(&k, params.buf, params.len < (Py_ssize_t)sizeof k ? (size_t)params.len : sizeof k);
    const char *problem = check(&k, params.len, src.len, dst.len, 1);
    const Py_ssize_t n = src.len / 4;
    if (!problem && (block < 1 || n % block || divisors.len != n / block * (Py_ssize_t)sizeof(double)))
        problem = "round_blocks: the elements are not whole blocks of `block`, one float64 divisor each";
    if (!problem && rescale && k.output == OUT_CODES) problem = "round_blocks: rescale applies to values, not codes";
    if (!problem) {
        Py_BEGIN_ALLOW_THREADS
        run_32(&k, src.buf, dst.buf, n, divisors.buf, block, rescale);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&params);
    PyBuffer_Release(&divisors);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The largest magnitude of each block of `block` consecutive elements of a float32 (or float64) buffer,
   as its magnitude's bits: integers order NaN above Inf above the finite values, as a block's amax needs. */
MULTIVERSION_512 static void amax_32(const uint32_t *restrict x, Py_ssize_t blocks, Py_ssize_t block,
                                     uint32_t *restrict out) {
    for (Py_ssize_t b = 0; b < blocks; b++) {
        uint32_t top = 0;
        for (Py_ssize_t i = 0; i < block; i++) {
            const uint32_t a = x[b * block + i] & 0x7fffffffu;
            top = a > top ? a : top;
        }
        out[b] = top;
    }
}

MULTIVERSION_512 static void amax_64(const uint64_t *restrict x, Py_ssize_t blocks, Py_ssize_t block,
                                     uint64_t *restrict out) {
    for (Py_ssize_t b = 0; b < blocks; b++) {
        uint64_t top = 0;
        for (Py_ssize_t i = 0; i < block; i++) {
            const uint64_t a = x[b * block + i] & ~(UINT64_C(1) << 63);
            top = a > top ? a : top;
        }
        out[b] = top;
    }
}

static PyObject *block_amax(PyObject *self, PyObject *args) {
    Py_buffer src, dst;
    Py_ssize_t block;
    int width;
    if (!PyArg_ParseTuple(args, "y*w*ni", &src, &dst, &block, &width)) return NULL;
    const Py_ssize_t item = width == 64 ? 8 : 4, n = src.len / item;
    const char *problem = NULL;
    if ((width != 32 && width != 64) || block < 1 || src.len % item || n % block || dst.len != n / block * item)
        problem = "block_amax: width 32 or 64, whole blocks, one output per block";
    else if (width == 32)
        amax_32(src.buf, n / block, block, dst.buf);
    else
        amax_64(src.buf, n / block, block, dst.buf);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *philox_words(PyObject *self, PyObject *args) {
    unsigned long long key, first;
    unsigned int depth;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "KKIw*", &key, &first, &depth, &out)) return NULL;
    if (first % 4 || out.len % 16) {
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "philox_words: first must be a multiple of 4, out a multiple of 4 words");
        return NULL;
    }
    stream_words(key, first, out.len / 4, depth, out.buf);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* The clone of the MULTIVERSION_512 loops that the loader picks on this CPU, as its resolver decides. */
static PyObject *isa(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
    __builtin_cpu_init();
#if __GNUC__ >= 12 && !defined(FPSIM_NO_AVX512)
    if (__builtin_cpu_supports("x86-64-v4")) return PyUnicode_FromString("x86-64-v4");
#endif
    if (__builtin_cpu_supports("avx2")) return PyUnicode_FromString("avx2");
#endif
    return PyUnicode_FromString("default");
}

/* The calling thread's flush-to-zero controls, which torch.set_flush_denormal(True) and -ffast-math code set
   (x86-64: MXCSR's FTZ and DAZ bits; AArch64: FPCR's FZ and FZ16 bits; elsewhere none): with them on, numpy's
   and torch's arithmetic and casts read and write subnormals as zeros. fpsim/_fpmode.py clears them around
   its public calls and puts them back. */
#if defined(__GNUC__) && defined(__x86_64__)
#define FLUSH_BITS 0x8040u
static unsigned long long read_flush_bits(void) { return _mm_getcsr() & FLUSH_BITS; }
static void write_flush_bits(unsigned long long bits) {
    _mm_setcsr((_mm_getcsr() & ~FLUSH_BITS) | ((unsigned)bits & FLUSH_BITS));
}
#elif defined(__GNUC__) && defined(__aarch64__)
#define FLUSH_BITS ((1ull << 24) | (1ull << 19))
static unsigned long long read_flush_bits(void) {
    unsigned long long fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    return fpcr & FLUSH_BITS;
}
static void write_flush_bits(unsigned long long bits) {
    unsigned long long fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    fpcr = (fpcr & ~FLUSH_BITS) | (bits & FLUSH_BITS);
    __asm__ volatile("msr fpcr, %0" : : "r"(fpcr));
}
#else
static unsigned long long read_flush_bits(void) { return 0; }
static void write_flush_bits(unsigned long long bits) { (void)bits; }
#endif

static PyObject *flush_bits(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyLong_FromUnsignedLongLong(read_flush_bits());
}

static PyObject *set_flush_bits(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long bits = PyLong_AsUnsignedLongLong(arg);
    if (bits == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    write_flush_bits(bits);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"flush_bits", flush_bits, METH_NOARGS,
     "flush_bits(): the calling thread's flush-to-zero control bits (MXCSR FTZ|DAZ, FPCR FZ|FZ16; 0: none set)"},
    {"set_flush_bits", set_flush_bits, METH_O, "set_flush_bits(bits): set those bits as flush_bits gave them"},
    {"isa", isa, METH_NOARGS, "isa(): the instruction set of the rounding loops this CPU runs (x86-64-v4, avx2, default)"},
    {"round_array", round_array, METH_VARARGS,
     "round_array(src, dst, params): round the buffer src into dst with the packed parameters params"},
    {"philox_words", philox_words, METH_VARARGS,
     "philox_words(key, first, depth, out): word(i, depth) of the stochastic-rounding stream for "
     "i = first .. first + len(out) - 1 (uint32 buffer)"},
    {"round_blocks", round_blocks, METH_VARARGS,
     "round_blocks(src, dst, params, divisors, block, rescale): round float32 src / divisors[i // block] "
     "into dst (times the divisor again when rescale: the dequantised values)"},
    {"block_amax", block_amax, METH_VARARGS,
     "block_amax(src, dst, block, width): the largest magnitude's bits of each block of src"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastround",
                                    "Compiled fast path of fpsim's rounding engine.", -1, methods};

PyMODINIT_FUNC PyInit__fastround(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddStringConstant(m, "KERNEL_FIELDS", kernel_fields) < 0 ||
              PyModule_AddIntConstant(m, "HARDWARE_CAST", has_cast()) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
