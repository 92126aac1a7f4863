/* Compiled fast path of the analyzer's log2 histograms (fpsim/analyze/histogram.py): one pass over a
 * float32, float16 or bfloat16 buffer, read as bits (no widening copy).
 *
 * A tensor's counts come back as "pairs": bytes holding int64 (class, count) for the classes it has
 * (a tensor fills a few dozen of the 1026), class = sign << 9 | float32 exponent field << 1 | mantissa
 * nonzero, of the value widened exactly to float32 (the raw layout of histogram.py).
 *
 * count(address, n, kind, mass=None) -> (amax, pairs): kind 0 float32, 1 float16, 2 bfloat16; amax is
 *   the largest magnitude (NaN when a NaN is present). With `mass` (float64[512]) it also adds |x| to
 *   mass[F] and x*x to mass[256 + F] for every finite value, F its float32 exponent field (0 for float32
 *   subnormals).
 * updates(before, parts, last, n_formats, lost) -> (amax, pairs): the float32 updates u = after - before
 *   (as float32 subtraction gives them) of parameters laid end to end in `before`, parts being their
 *   (address, n); adds to lost[f] (int64[n_formats]) the nonzero updates a weight stored in format f
 *   would lose: exponent field of u in 1..last[g * n_formats + f] (int32[256 * n_formats]), g the
 *   exponent field of the weight before, or u a float32 subnormal.
 * count_parts(parts, kind, mass=None) -> (amax, pairs): count over several buffers, parts being their
 *   (address, n); with `mass`, as count does.
 * accumulate(tables, row, pairs, amax_value, step, mass=None): tables = (raw, amax, first, masses, rows),
 *   the addresses of a store's tables (int64 [rows, 1026], float32 [rows], int64 [rows], float64
 *   [rows, 512]) and their row count; adds pairs to raw[row], raises amax[row] (NaN sticks), for a
 *   non-finite amax_value lowers first[row] to step, and adds `mass` (float64[512]) to masses[row].
 *
 * count_rows(tables, items, kind, step, with_mass) -> None: for each (row, parts) of `items`, counts
 *   the buffers of `parts` ((address, n), ...) together and adds them to that row as accumulate does
 *   (with their mass when with_mass): a module's weights or gradients, all modules in one call.
 * updates_rows(tables, lost, items, last, n_formats, step) -> None: for each (row, before, parts) of
 *   `items`, the updates of `parts` against the old values at address `before`, as updates counts them,
 *   added to that row, and their lost counts to the int64 [rows, n_formats] table at address `lost`.
 *
 * count_into(tables, row, address, n, kind, step, with_mass) -> (amax, record): count as count does and
 *   add the result to that row of the tables as accumulate does, in one call (the analyzer's hooks call
 *   it for every tensor); record: bytes holding the same counts and mass, for add_record.
 * add_record(tables, row, record, amax_value, step) -> None: add a record of count_into to a row (the
 *   same tensor seen again, by another hook or under another name).
 *
 * vector_path(on=None) -> bool: whether counting (with or without mass) and the updates take the AVX2 loops
 *   (the CPU is asked when the module loads); with on, switch them first (tests hold both to numpy).
 *
 * Addresses are those of contiguous CPU tensors (torch's data_ptr()), kept alive by the caller.
 * Sub-histograms indexed by i % 4 keep the increments of neighbouring values independent. The torch
 * code of histogram.py is the reference; tests hold the two, and an independent numpy count, equal
 * bit for bit.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_fastcompile.h"

enum { KIND_F32 = 0, KIND_F16 = 1, KIND_BF16 = 2 };
#define RAW_SIZE 1026
#define MASS_SIZE 512
#define LANES 4
#define CHUNK (1 << 28) /* values per pass of the uint32 sub-histograms: no lane can overflow */
#define NOGIL_FROM 65536
#define ONE_LANE_BELOW 4096 /* fewer values: one lane, less to clear and fold */

/* Class index of a float16 value (its exact float32 widening); the tables below are made from it. */
static uint32_t f16_class(uint32_t b) {
    uint32_t sign = (b >> 15) & 1u, e = (b >> 10) & 31u, m = b & 0x3ffu;
    if (e == 31u) return sign << 9 | 255u << 1 | (m != 0);
    if (e) return sign << 9 | (e + 112u) << 1 | (m != 0);
    if (!m) return sign << 9;
    uint32_t k = 0; /* subnormal: m * 2^-24 with 2^k <= m < 2^(k+1) */
    while (m >> (k + 1)) k++;
    return sign << 9 | (103u + k) << 1 | ((m & (m - 1)) != 0);
}

static double f16_scale[32]; /* the value of one unit of the significand, by float16 exponent field */

static inline double f16_magnitude(uint32_t b) {
    uint32_t e = (b >> 10) & 31u, m = b & 0x3ffu;
    if (e == 31u) return m ? NAN : INFINITY;
    return (double)(e ? 1024u + m : m) * f16_scale[e];
}

static inline float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    uint32_t h[LANES][1024];
} lanes_t;

#define MASS_CHUNK (1 << 16) /* values per fold of the significand sums: no lane's sum of squares can overflow */
static double unit1[256], unit2[256]; /* the value of one significand unit (and its square) by exponent field */

/* Class index of a float32 pattern (also of a bfloat16 pattern shifted up 16 bits). */
#define F32_CLASS(u) ((((u) >> 22) & 0x3feu) | (((u) & 0x7fffffu) != 0))

/* Class index of a float16 pattern, from two small tables (both looked up, one kept: no branch). */
static inline uint32_t f16_class_fast(uint32_t b);
#define F16_CLASS(b) f16_class_fast(b)

static uint32_t f16_base[64];       /* sign << 9 | float32 exponent field << 1, by float16 sign and exponent */
static uint32_t f16_subnormal[1024]; /* the class of a positive float16 of exponent field 0, by mantissa */

static inline uint32_t f16_class_fast(uint32_t b) {
    uint32_t normal = f16_base[b >> 10] | ((b & 0x3ffu) != 0);
    uint32_t subnormal = (b >> 15) << 9 | f16_subnormal[b & 0x3ffu];
    uint32_t keep_normal = 0u - (uint32_t)((b & 0x7c00u) != 0);
    return (normal & keep_normal) | (subnormal & ~keep_normal);
}

static void init_tables(void) {
    for (int e = 0; e < 31; e++) f16_scale[e] = ldexp(1.0, e ? e - 25 : -24);
    for (uint32_t s = 0; s < 2; s++)
        for (uint32_t e = 0; e < 32; e++) f16_base[s << 5 | e] = f16_class(s << 15 | e << 10) & ~1u;
    for (uint32_t m = 0; m < 1024; m++) f16_subnormal[m] = f16_class(m);
    for (int f = 0; f < 256; f++) {
        unit1[f] = ldexp(1.0, (f ? f : 1) - 150);
        unit2[f] = unit1[f] * unit1[f];
    }
}

/* Counts n values (n <= CHUNK) into `lanes` lanes (1 or LANES: value i into lane i % lanes); CLASS(i) is
   the class of value i. */
#define COUNT_LOOP(CLASS)                                                             \
    do {                                                                              \
        Py_ssize_t i = 0;                                                             \
        if (lanes == LANES) {                                                         \
            uint32_t *h0 = L->h[0], *h1 = L->h[1], *h2 = L->h[2], *h3 = L->h[3];      \
            for (; i + 4 <= n; i += 4) {                                              \
                uint32_t c0 = CLASS(i), c1 = CLASS(i + 1), c2 = CLASS(i + 2), c3 = CLASS(i + 3); \
                h0[c0]++;                                                             \
                h1[c1]++;                                                             \
                h2[c2]++;                                                             \
                h3[c3]++;                                                             \
            }                                                                         \
        }                                                                             \
        for (; i < n; i++) L->h[(int)(i & (lanes - 1))][CLASS(i)]++;                  \
    } while (0)

#define F32_AT(i) (src32[i])
#define F32_CLASS_AT(i) F32_CLASS(src32[i])
#define BF16_AT(i) ((uint32_t)src16[i] << 16)
#define BF16_CLASS_AT(i) F32_CLASS((uint32_t)src16[i] << 16)
#define F16_AT(i) f16_bits32(src16[i])
#define F16_CLASS_AT(i) F16_CLASS((uint32_t)src16[i])

/* A float16 pattern as the float32 pattern of the same value. */
static inline uint32_t f16_bits32(uint32_t b) {
    float f = (float)f16_magnitude(b & 0x7fffu);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u | (b & 0x8000u) << 16;
}

/* Counts of n values (n <= CHUNK) into the lanes; the largest magnitude bits (in the input's encoding). */
static uint32_t count_chunk(const void *data, Py_ssize_t n, int kind, int lanes, lanes_t *L) {
    uint32_t top = 0;
    const uint32_t *src32 = (const uint32_t *)data;
    const uint16_t *src16 = (const uint16_t *)data;
    if (kind == KIND_F32) {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t a = src32[i] & 0x7fffffffu;
            top = a > top ? a : top;
        }
        COUNT_LOOP(F32_CLASS_AT);
        return top;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t a = src16[i] & 0x7fffu;
        top = a > top ? a : top;
    }
    if (kind == KIND_BF16) COUNT_LOOP(BF16_CLASS_AT);
    else COUNT_LOOP(F16_CLASS_AT);
    return top;
}

/* With the mass, two increments per value instead of three: a 64-bit counter per class holds the class
   count (bits 40 and up) and the sum of the significands (bits 0..39: at most MASS_CHUNK values of < 2^24,
   so < 2^40), and one per exponent field the sum of the squared significands (< 2^64). */
typedef struct {
    uint64_t count_sum[LANES][1024];
    uint64_t squares[LANES][256];
} mass_lanes_t;

#define SUM_BITS 40
#define MASS_STEP(LANE, U)                                                                        \
    do {                                                                                          \
        uint32_t u_ = (U), f_ = (u_ >> 23) & 0xffu;                                               \
        uint64_t s_ = (u_ & 0x7fffffu) | (uint32_t)(f_ != 0) << 23;                               \
        M->count_sum[LANE][F32_CLASS(u_)] += ((uint64_t)1 << SUM_BITS) + s_;                      \
        M->squares[LANE][f_] += s_ * s_;                                                          \
    } while (0)

#define MASS_LOOP(BITS)                                                                           \
    do {                                                                                          \
        Py_ssize_t i = 0;                                                                         \
        if (lanes == LANES)                                                                       \
            for (; i + 4 <= n; i += 4) {                                                          \
                MASS_STEP(0, BITS(i));                                                            \
                MASS_STEP(1, BITS(i + 1));                                                        \
                MASS_STEP(2, BITS(i + 2));                                                        \
                MASS_STEP(3, BITS(i + 3));                                                        \
            }                                                                                     \
        for (; i < n; i++) MASS_STEP((int)(i & (lanes - 1)), BITS(i));                           \
    } while (0)

/* Counts and mass of n values (n <= MASS_CHUNK) added to totals and mass; the largest magnitude bits. */
static uint32_t count_chunk_mass(const void *data, Py_ssize_t n, int kind, int lanes, mass_lanes_t *M,
                                 int64_t *totals, double *mass) {
    const uint32_t *src32 = (const uint32_t *)data;
    const uint16_t *src16 = (const uint16_t *)data;
    uint32_t top = 0;
    memset(M->count_sum, 0, sizeof(M->count_sum[0]) * lanes);
    memset(M->squares, 0, sizeof(M->squares[0]) * lanes);
    if (kind == KIND_F32) {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t a = src32[i] & 0x7fffffffu;
            top = a > top ? a : top;
        }
        MASS_LOOP(F32_AT);
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t a = src16[i] & 0x7fffu;
            top = a > top ? a : top;
        }
        if (kind == KIND_BF16) MASS_LOOP(BF16_AT);
        else MASS_LOOP(F16_AT);
    }
    uint64_t sums[256] = {0};
    for (int lane = 0; lane < lanes; lane++) {
        for (int c = 0; c < 1024; c++) {
            uint64_t v = M->count_sum[lane][c];
            if (v) {
                totals[c] += (int64_t)(v >> SUM_BITS);
                sums[(c >> 1) & 0xff] += v & (((uint64_t)1 << SUM_BITS) - 1);
            }
        }
        for (int f = 0; f < 255; f++) /* field 255: Inf and NaN, which carry no mass */
            if (M->squares[lane][f]) mass[256 + f] += (double)M->squares[lane][f] * unit2[f];
    }
    for (int f = 0; f < 255; f++)
        if (sums[f]) mass[f] += (double)sums[f] * unit1[f];
    return top;
}

static double magnitude_of(uint32_t top, int kind) {
    if (kind == KIND_F32) return (double)f32_of(top);
    if (kind == KIND_BF16) return (double)f32_of(top << 16);
    return f16_magnitude(top);
}

static int kind_size(int kind) { return kind == KIND_F32 ? 4 : 2; }

/* ------------------------------------------------------------------ the vector path of the mass count
   With AVX2 (checked when the module loads), counts with their mass take eight values per step: their
   class, significand and squared significand are computed in vector registers, and each value then adds
   one 128-bit pair (count << 40 | significand, squared significand) to its class's entry in its lane:
   one read-modify-write per value instead of two. The input is prefetched ahead (from L3 the hardware
   prefetcher alone left the loop waiting: about 2x slower). float16 is widened by the hardware conversion
   (exact: every float16 is a float32, subnormals included, whatever the FTZ/DAZ bits), bfloat16 by a
   shift. Only the classes of the exponent fields a chunk spans are cleared and folded. The same numbers
   as count_chunk_mass: the tests run both. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define VECTOR_MASS 1
#define VECTOR_TARGET __attribute__((target("avx2,f16c")))
#define WIDE_CHUNK (LANES << 16) /* values per fold: 2^16 per lane, so that no lane's sums overflow */
#define PREFETCH_AHEAD 1024      /* bytes ahead of the value being read */

static int vector_mass; /* AVX2 and F16C present (set when the module loads), and not switched off */

static int cpu_has_vector(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}

typedef struct {
    __m128i e[LANES][1024]; /* per lane and class: count << SUM_BITS | significand sum, squared significand sum */
} wide_lanes_t;

/* Values i .. i + 7 as float32 bit patterns of the same values. */
static ALWAYS_INLINE VECTOR_TARGET __m256i wide_bits(const void *data, Py_ssize_t i, int kind) {
    if (kind == KIND_F32) return _mm256_loadu_si256((const __m256i *)((const uint32_t *)data + i));
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)data + i));
    if (kind == KIND_BF16) return _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    return _mm256_castps_si256(_mm256_cvtph_ps(h));
}

/* Value i as a float32 bit pattern (the tail of a chunk). */
static ALWAYS_INLINE VECTOR_TARGET uint32_t wide_bits1(const void *data, Py_ssize_t i, int kind) {
    if (kind == KIND_F32) return ((const uint32_t *)data)[i];
    uint32_t h = ((const uint16_t *)data)[i];
    if (kind == KIND_BF16) return h << 16;
    uint32_t u;
    float f = _cvtsh_ss((unsigned short)h);
    memcpy(&u, &f, 4);
    return u;
}

static ALWAYS_INLINE void wide_add1(wide_lanes_t *W, int lane, uint32_t u) {
    uint32_t f = (u >> 23) & 0xffu;
    uint64_t s = (u & 0x7fffffu) | (uint32_t)(f != 0) << 23, *entry = (uint64_t *)&W->e[lane][F32_CLASS(u)];
    entry[0] += ((uint64_t)1 << SUM_BITS) + s;
    entry[1] += s * s;
}

/* Counts and mass of n <= WIDE_CHUNK values added to totals and mass; the largest magnitude bits in the
   input's encoding. */
static ALWAYS_INLINE VECTOR_TARGET uint32_t wide_chunk(const void *data, Py_ssize_t n, int kind, wide_lanes_t *W,
                                                       int64_t *totals, double *mass) {
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), field = _mm256_set1_epi32(0xff);
    const __m256i mantissa = _mm256_set1_epi32(0x7fffff), hidden = _mm256_set1_epi32(0x800000);
    const __m256i class_bits = _mm256_set1_epi32(0x3fe), one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
    const __m256i count_one = _mm256_set1_epi64x((int64_t)1 << SUM_BITS);
    Py_ssize_t body = n & ~(Py_ssize_t)7;
    /* First pass: the largest magnitude and the span of exponent fields (the classes to clear and fold). */
    __m256i top8 = zero, low8 = field, high8 = zero;
    for (Py_ssize_t i = 0; i < body; i += 8) {
        __m256i u = wide_bits(data, i, kind), f = _mm256_and_si256(_mm256_srli_epi32(u, 23), field);
        top8 = _mm256_max_epu32(top8, _mm256_and_si256(u, magnitude));
        low8 = _mm256_min_epu32(low8, f), high8 = _mm256_max_epu32(high8, f);
    }
    uint32_t tops[8], lows[8], highs[8], top = 0, low = 0xff, high = 0;
    _mm256_storeu_si256((__m256i *)tops, top8);
    _mm256_storeu_si256((__m256i *)lows, low8);
    _mm256_storeu_si256((__m256i *)highs, high8);
    for (int k = 0; k < 8; k++) {
        top = tops[k] > top ? tops[k] : top;
        low = lows[k] < low ? lows[k] : low, high = highs[k] > high ? highs[k] : high;
    }
    for (Py_ssize_t i = body; i < n; i++) {
        uint32_t u = wide_bits1(data, i, kind), f = (u >> 23) & 0xffu, a = u & 0x7fffffffu;
        top = a > top ? a : top;
        low = f < low ? f : low, high = f > high ? f : high;
    }
    Py_ssize_t first = 2 * low, span = 2 * (high - low + 1); /* classes 2f, 2f + 1 of each sign */
    for (int lane = 0; lane < LANES; lane++) {
        memset(&W->e[lane][first], 0, span * 16);
        memset(&W->e[lane][512 + first], 0, span * 16);
    }
    /* Second pass: each value's pair added to its class in lane i % 4 (pairs come out of the unpacks in the
       order 0, 2, 1, 3 of each half). */
    for (Py_ssize_t i = 0; i < body; i += 8) {
        _mm_prefetch((const char *)data + (i * kind_size(kind) + PREFETCH_AHEAD), _MM_HINT_T0);
        __m256i u = wide_bits(data, i, kind), m = _mm256_and_si256(u, mantissa);
        __m256i normal = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 23), field), zero);
        __m256i s = _mm256_or_si256(m, _mm256_and_si256(normal, hidden));
        __m256i c = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 22), class_bits),
                                    _mm256_andnot_si256(_mm256_cmpeq_epi32(m, zero), one));
        uint32_t cls[8];
        _mm256_storeu_si256((__m256i *)cls, c);
        __m256i s0 = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(s)), s1 = _mm256_cvtepu32_epi64(_mm256_extracti128_si256(s, 1));
        __m256i q0 = _mm256_mul_epu32(s0, s0), q1 = _mm256_mul_epu32(s1, s1);
        __m256i k0 = _mm256_add_epi64(s0, count_one), k1 = _mm256_add_epi64(s1, count_one);
        __m128i p[8];
        _mm256_storeu_si256((__m256i *)&p[0], _mm256_unpacklo_epi64(k0, q0)); /* values 0, 2 */
        _mm256_storeu_si256((__m256i *)&p[2], _mm256_unpackhi_epi64(k0, q0)); /* values 1, 3 */
        _mm256_storeu_si256((__m256i *)&p[4], _mm256_unpacklo_epi64(k1, q1)); /* values 4, 6 */
        _mm256_storeu_si256((__m256i *)&p[6], _mm256_unpackhi_epi64(k1, q1)); /* values 5, 7 */
        W->e[0][cls[0]] = _mm_add_epi64(W->e[0][cls[0]], p[0]);
        W->e[2][cls[2]] = _mm_add_epi64(W->e[2][cls[2]], p[1]);
        W->e[1][cls[1]] = _mm_add_epi64(W->e[1][cls[1]], p[2]);
        W->e[3][cls[3]] = _mm_add_epi64(W->e[3][cls[3]], p[3]);
        W->e[0][cls[4]] = _mm_add_epi64(W->e[0][cls[4]], p[4]);
        W->e[2][cls[6]] = _mm_add_epi64(W->e[2][cls[6]], p[5]);
        W->e[1][cls[5]] = _mm_add_epi64(W->e[1][cls[5]], p[6]);
        W->e[3][cls[7]] = _mm_add_epi64(W->e[3][cls[7]], p[7]);
    }
    for (Py_ssize_t i = body; i < n; i++) /* (in lane i % 4 too: no lane holds more than 2^16 values) */
        wide_add1(W, (int)(i & (LANES - 1)), wide_bits1(data, i, kind));
    /* Fold: counts into totals, sums by exponent field into mass (field 255, Inf and NaN, has none). An
       entry's sum of squares is below 2^64 (2^16 values below 2^48 each), but the 16 entries of a field
       together need not be: each is added as a double. */
    uint64_t sums[256] = {0};
    double squares[256] = {0};
    for (int lane = 0; lane < LANES; lane++)
        for (int sign = 0; sign < 2; sign++)
            for (Py_ssize_t c = 512 * sign + first; c < 512 * sign + first + span; c++) {
                uint64_t v[2];
                memcpy(v, &W->e[lane][c], 16);
                if (!v[0]) continue;
                totals[c] += (int64_t)(v[0] >> SUM_BITS);
                sums[(c >> 1) & 0xff] += v[0] & (((uint64_t)1 << SUM_BITS) - 1);   /* (16 x 2^40: no overflow) */
                squares[(c >> 1) & 0xff] += (double)v[1];
            }
    for (uint32_t f = low; f <= high && f < 255; f++) {
        if (sums[f]) mass[f] += (double)sums[f] * unit1[f];
        if (squares[f] != 0.0) mass[256 + f] += squares[f] * unit2[f];
    }
    if (kind == KIND_BF16) return top >> 16;
    if (kind == KIND_F16) {
        float f;
        memcpy(&f, &top, 4);
        return (uint32_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT) & 0x7fffu; /* exact: top is a float16 value */
    }
    return top;
}

/* Counts and mass of n values, chunk by chunk, the kind's loop specialised. */
static VECTOR_TARGET uint32_t wide_count(const char *data, Py_ssize_t n, int kind, int64_t *totals, double *mass) {
    wide_lanes_t W;
    uint32_t top = 0;
    for (Py_ssize_t done = 0; done < n; done += WIDE_CHUNK) {
        Py_ssize_t part = n - done < WIDE_CHUNK ? n - done : WIDE_CHUNK;
        const char *chunk = data + done * kind_size(kind);
        uint32_t t = kind == KIND_F32    ? wide_chunk(chunk, part, KIND_F32, &W, totals, mass)
                     : kind == KIND_BF16 ? wide_chunk(chunk, part, KIND_BF16, &W, totals, mass)
                                         : wide_chunk(chunk, part, KIND_F16, &W, totals, mass);
        top = t > top ? t : top;
    }
    return top;
}
#endif

/* Adds the first `lanes` lanes into totals, and clears them. */
static void fold(lanes_t *L, int lanes, int64_t *totals) {
    for (int lane = 0; lane < lanes; lane++) {
        for (int c = 0; c < 1024; c++) totals[c] += L->h[lane][c];
        memset(L->h[lane], 0, sizeof(L->h[lane]));
    }
}

/* The nonzero totals as pairs bytes. */
static PyObject *pairs_of(const int64_t *totals) {
    int64_t packed[2 * 1024];
    Py_ssize_t k = 0;
    for (int c = 0; c < 1024; c++)
        if (totals[c]) {
            packed[2 * k] = c;
            packed[2 * k + 1] = totals[c];
            k++;
        }
    return PyBytes_FromStringAndSize((const char *)packed, k * 16);
}

static int writable(Py_buffer *view, PyObject *obj, Py_ssize_t bytes, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return 0;
    if (view->len < bytes) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be a writable buffer of at least %zd bytes", what, bytes);
        return 0;
    }
    return 1;
}

/* The common case of float32 data, in two passes. A pass that vectorises counts the zeros (by sign)
   and the values whose mantissa is zero. When those are all zeros (no exact powers of two, no Inf),
   every nonzero value's mantissa is nonzero, so its class follows from its top 10 bits (sign, exponent
   field, first mantissa bit: one shift), which the second pass counts, with the amax; the zeros are then
   moved out of the class of small values they share. Returns 0, having counted nothing, when there are
   exact powers of two or Infs: the general loop counts those. */
static int count_halves_f32(const uint32_t *src, Py_ssize_t n, int64_t *totals, uint32_t *top, lanes_t *L) {
    uint32_t zeros = 0, negative_zeros = 0, mantissa_zero = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t u = src[i];
        zeros += (u & 0x7fffffffu) == 0;
        negative_zeros += u == 0x80000000u;
        mantissa_zero += (u & 0x7fffffu) == 0;
    }
    if (mantissa_zero != zeros) return 0;
    uint32_t *h0 = L->h[0], *h1 = L->h[1], *h2 = L->h[2], *h3 = L->h[3];
    uint32_t t0 = 0, t1 = 0, t2 = 0, t3 = 0;
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t u0 = src[i], u1 = src[i + 1], u2 = src[i + 2], u3 = src[i + 3];
        h0[u0 >> 22]++;
        h1[u1 >> 22]++;
        h2[u2 >> 22]++;
        h3[u3 >> 22]++;
        u0 &= 0x7fffffffu, u1 &= 0x7fffffffu, u2 &= 0x7fffffffu, u3 &= 0x7fffffffu;
        t0 = u0 > t0 ? u0 : t0, t1 = u1 > t1 ? u1 : t1, t2 = u2 > t2 ? u2 : t2, t3 = u3 > t3 ? u3 : t3;
    }
    for (; i < n; i++) {
        h0[src[i] >> 22]++;
        uint32_t u = src[i] & 0x7fffffffu;
        t0 = u > t0 ? u : t0;
    }
    for (int c = 0; c < 1024; c += 2) /* the two half binades c, c + 1 make class c + 1 */
        for (int lane = 0; lane < LANES; lane++) totals[c + 1] += (int64_t)L->h[lane][c] + L->h[lane][c + 1];
    memset(L->h, 0, sizeof(L->h));
    totals[1] -= zeros - negative_zeros, totals[0] += zeros - negative_zeros;
    totals[513] -= negative_zeros, totals[512] += negative_zeros;
    t0 = t0 > t1 ? t0 : t1, t2 = t2 > t3 ? t2 : t3;
    *top = t0 > t2 ? t0 : t2;
    return 1;
}

/* Counts n values at `data` into totals (and mass); the largest magnitude bits. */
static uint32_t count_buffer(const char *data, Py_ssize_t n, int kind, int64_t *totals, double *mass) {
    lanes_t lanes_here, *L = &lanes_here; /* on the stack: the GIL is released, calls may overlap */
    mass_lanes_t mass_lanes_here, *M = &mass_lanes_here;
    int lanes = n < ONE_LANE_BELOW ? 1 : LANES;
    uint32_t top = 0;
    int release = n >= NOGIL_FROM;
    PyThreadState *state = release ? PyEval_SaveThread() : NULL;
#ifdef VECTOR_MASS
    if (vector_mass) {   /* (without mass too: the vector loop is faster than count_halves_f32 and COUNT_LOOP) */
        double unused[MASS_SIZE] = {0};
        top = wide_count(data, n, kind, totals, mass ? mass : unused);
        if (release) PyEval_RestoreThread(state);
        return top;
    }
#endif
    Py_ssize_t chunk_size = mass ? MASS_CHUNK : CHUNK;
    for (Py_ssize_t done = 0; done < n; done += chunk_size) {
        Py_ssize_t part = n - done < chunk_size ? n - done : chunk_size;
        const char *chunk = data + done * kind_size(kind);
        uint32_t t;
        if (lanes == LANES && !mass && kind == KIND_F32) {   /* (bfloat16 measured no faster this way) */
            memset(L->h, 0, sizeof(L->h));
            if (count_halves_f32((const uint32_t *)chunk, part, totals, &t, L)) {
                top = t > top ? t : top;
                continue;
            }
        }
        if (mass) {
            t = count_chunk_mass(chunk, part, kind, lanes, M, totals, mass);
            top = t > top ? t : top;
            continue;
        }
        memset(L->h, 0, sizeof(L->h[0]) * lanes);
        t = count_chunk(chunk, part, kind, lanes, L);
        top = t > top ? t : top;
        fold(L, lanes, totals);
    }
    if (release) PyEval_RestoreThread(state);
    return top;
}

static int check_kind(int kind) {
    if (kind >= KIND_F32 && kind <= KIND_BF16) return 1;
    PyErr_Format(PyExc_ValueError, "kind must be 0 (float32), 1 (float16) or 2 (bfloat16), got %d", kind);
    return 0;
}

static PyObject *count(PyObject *self, PyObject *args) {
    unsigned long long address;
    Py_ssize_t n;
    int kind;
    PyObject *mass_obj = Py_None;
    if (!PyArg_ParseTuple(args, "Kni|O", &address, &n, &kind, &mass_obj) || !check_kind(kind)) return NULL;
    if (n < 0 || (n && !address)) {
        PyErr_Format(PyExc_ValueError, "count: need n >= 0 and a nonzero address, got n %zd", n);
        return NULL;
    }
    Py_buffer mass;
    int with_mass = mass_obj != Py_None;
    if (with_mass && !writable(&mass, mass_obj, MASS_SIZE * 8, "mass")) return NULL;
    int64_t totals[1024] = {0};
    uint32_t top = count_buffer((const char *)(uintptr_t)address, n, kind, totals,
                                with_mass ? (double *)mass.buf : NULL);
    if (with_mass) PyBuffer_Release(&mass);
    PyObject *pairs = pairs_of(totals);
    if (!pairs) return NULL;
    return Py_BuildValue("(dN)", magnitude_of(top, kind), pairs);
}

/* The k-th (address, n) of a parts tuple; 0 with an exception set when it is not one. */
static int part_at(PyObject *parts, Py_ssize_t k, unsigned long long *address, Py_ssize_t *n) {
    if (PyArg_ParseTuple(PyTuple_GET_ITEM(parts, k), "Kn", address, n) && *n >= 0 && (!*n || *address))
        return 1;
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "parts are (address, n >= 0) with nonzero addresses");
    return 0;
}

static PyObject *count_parts(PyObject *self, PyObject *args) {
    PyObject *parts, *mass_obj = Py_None;
    int kind;
    if (!PyArg_ParseTuple(args, "O!i|O", &PyTuple_Type, &parts, &kind, &mass_obj) || !check_kind(kind)) return NULL;
    Py_buffer mass;
    int with_mass = mass_obj != Py_None;
    if (with_mass && !writable(&mass, mass_obj, MASS_SIZE * 8, "mass")) return NULL;
    int64_t totals[1024] = {0};
    uint32_t top = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(parts); k++) {
        unsigned long long address;
        Py_ssize_t n;
        if (!part_at(parts, k, &address, &n)) {
            if (with_mass) PyBuffer_Release(&mass);
            return NULL;
        }
        uint32_t t = count_buffer((const char *)(uintptr_t)address, n, kind, totals,
                                  with_mass ? (double *)mass.buf : NULL);
        top = t > top ? t : top;
    }
    if (with_mass) PyBuffer_Release(&mass);
    PyObject *pairs = pairs_of(totals);
    if (!pairs) return NULL;
    return Py_BuildValue("(dN)", magnitude_of(top, kind), pairs);
}

/* The float32 updates of n values now - w into totals and lost_here; their largest magnitude raises *top. */
static void update_run(const uint32_t *w, const float *now, Py_ssize_t n, const int32_t *lim, int n_formats,
                       int64_t *totals, int64_t *lost_here, uint32_t *top) {
    uint32_t t_top = *top;
    for (Py_ssize_t i = 0; i < n; i++) {
        float u_f = now[i] - f32_of(w[i]);
        uint32_t u;
        memcpy(&u, &u_f, 4);
        uint32_t a = u & 0x7fffffffu, t = a >> 23, g = (w[i] >> 23) & 0xffu;
        t_top = a > t_top ? a : t_top;
        totals[F32_CLASS(u)]++;
        if (t == 0) {
            if (a) /* a float32 subnormal update: lost in every format */
                for (int f = 0; f < n_formats; f++) lost_here[f]++;
            continue;
        }
        const int32_t *row = lim + g * n_formats;
        for (int f = 0; f < n_formats; f++) lost_here[f] += (int32_t)t <= row[f];
    }
    *top = t_top;
}

#ifdef VECTOR_MASS
#define WIDE_UPDATES_FROM 256 /* values of a parameter from which the vector loop pays */

/* The lost-update table with the limits of four formats in the four bytes of one int32 per weight field
   (group k: formats 4k .. 4k + 3), so that one gather per eight values serves four formats; 0 when a limit
   is outside 0..255 (the scalar loop takes those). */
static int pack_limits(const int32_t *lim, int n_formats, uint32_t *packed) {
    int groups = (n_formats + 3) / 4;
    memset(packed, 0, sizeof(uint32_t) * 256 * groups);
    for (int g = 0; g < 256; g++)
        for (int f = 0; f < n_formats; f++) {
            int32_t v = lim[g * n_formats + f];
            if (v < 0 || v > 255) return 0;
            packed[(f / 4) * 256 + g] |= (uint32_t)v << (8 * (f % 4));
        }
    return 1;
}

/* update_run eight values at a time: the subtraction, fields and lost tests in vector registers (float32
   subtraction as the scalar loop does it, the same MXCSR), class counts in four lanes. */
static VECTOR_TARGET void wide_updates(const uint32_t *w, const float *now, Py_ssize_t n, const uint32_t *packed,
                                       const int32_t *lim, int n_formats, int64_t *totals, int64_t *lost_here,
                                       uint32_t *top) {
    lanes_t L;
    const __m256i magnitude = _mm256_set1_epi32(0x7fffffff), field = _mm256_set1_epi32(0xff);
    const __m256i mantissa = _mm256_set1_epi32(0x7fffff), class_bits = _mm256_set1_epi32(0x3fe);
    const __m256i one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
    int groups = (n_formats + 3) / 4;
    for (Py_ssize_t done = 0; done < n; done += CHUNK) {
        Py_ssize_t part = n - done < CHUNK ? n - done : CHUNK, body = part & ~(Py_ssize_t)7;
        const uint32_t *wc = w + done;
        const float *nc = now + done;
        __m256i lost[64], top8 = zero;
        for (int f = 0; f < n_formats; f++) lost[f] = zero;
        memset(L.h, 0, sizeof(L.h));
        for (Py_ssize_t i = 0; i < body; i += 8) {
            _mm_prefetch((const char *)(wc + i) + PREFETCH_AHEAD, _MM_HINT_T0);
            _mm_prefetch((const char *)(nc + i) + PREFETCH_AHEAD, _MM_HINT_T0);
            __m256i wb = _mm256_loadu_si256((const __m256i *)(wc + i));
            __m256i u = _mm256_castps_si256(_mm256_sub_ps(_mm256_loadu_ps(nc + i), _mm256_castsi256_ps(wb)));
            __m256i a = _mm256_and_si256(u, magnitude), t = _mm256_srli_epi32(a, 23);
            __m256i g = _mm256_and_si256(_mm256_srli_epi32(wb, 23), field);
            __m256i nonzero = _mm256_xor_si256(_mm256_cmpeq_epi32(a, zero), _mm256_set1_epi32(-1));
            top8 = _mm256_max_epu32(top8, a);
            __m256i c = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 22), class_bits),
                                        _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_and_si256(u, mantissa), zero), one));
            uint32_t cls[8];
            _mm256_storeu_si256((__m256i *)cls, c);
            L.h[0][cls[0]]++, L.h[1][cls[1]]++, L.h[2][cls[2]]++, L.h[3][cls[3]]++;
            L.h[0][cls[4]]++, L.h[1][cls[5]]++, L.h[2][cls[6]]++, L.h[3][cls[7]]++;
            for (int k = 0; k < groups; k++) {   /* lost: nonzero and t <= the format's limit (t = 0 always is) */
                __m256i limits = _mm256_i32gather_epi32((const int *)(packed + 256 * k), g, 4);
                for (int b = 0; b < 4 && 4 * k + b < n_formats; b++) {
                    __m256i limit = _mm256_and_si256(_mm256_srli_epi32(limits, 8 * b), field);
                    lost[4 * k + b] = _mm256_sub_epi32(lost[4 * k + b],
                                                       _mm256_andnot_si256(_mm256_cmpgt_epi32(t, limit), nonzero));
                }
            }
        }
        fold(&L, LANES, totals);
        for (int f = 0; f < n_formats; f++) {
            int32_t v[8];
            _mm256_storeu_si256((__m256i *)v, lost[f]);
            for (int k = 0; k < 8; k++) lost_here[f] += v[k];
        }
        uint32_t tops[8];
        _mm256_storeu_si256((__m256i *)tops, top8);
        for (int k = 0; k < 8; k++) *top = tops[k] > *top ? tops[k] : *top;
        update_run(wc + body, nc + body, part - body, lim, n_formats, totals, lost_here, top);
    }
}
#endif

/* The float32 updates of the parts against the old values at w, into totals, lost_here and *top;
   0 with an exception set when a part is malformed. */
static int update_parts(const uint32_t *w, PyObject *parts, const int32_t *lim, int n_formats, int64_t *totals,
                        int64_t *lost_here, uint32_t *top) {
#ifdef VECTOR_MASS
    uint32_t packed[16 * 256];
    int packed_ok = -1; /* packed on first use */
#endif
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(parts); k++) {
        unsigned long long address;
        Py_ssize_t n;
        if (!part_at(parts, k, &address, &n)) return 0;
        const float *now = (const float *)(uintptr_t)address;
        int release = n >= NOGIL_FROM;
        PyThreadState *state = release ? PyEval_SaveThread() : NULL;
#ifdef VECTOR_MASS
        if (vector_mass && n >= WIDE_UPDATES_FROM && packed_ok < 0) packed_ok = pack_limits(lim, n_formats, packed);
        if (vector_mass && n >= WIDE_UPDATES_FROM && packed_ok > 0)
            wide_updates(w, now, n, packed, lim, n_formats, totals, lost_here, top);
        else
#endif
            update_run(w, now, n, lim, n_formats, totals, lost_here, top);
        if (release) PyEval_RestoreThread(state);
        w += n;
    }
    return 1;
}

static PyObject *updates(PyObject *self, PyObject *args) {
    unsigned long long before_address;
    int n_formats;
    PyObject *parts, *last_obj, *lost_obj;
    if (!PyArg_ParseTuple(args, "KO!OiO", &before_address, &PyTuple_Type, &parts, &last_obj, &n_formats,
                          &lost_obj))
        return NULL;
    if (n_formats < 1 || n_formats > 64 || !before_address) {
        PyErr_Format(PyExc_ValueError, "updates: need a nonzero address and 1 to 64 formats, got %d", n_formats);
        return NULL;
    }
    Py_buffer last, lost;
    if (PyObject_GetBuffer(last_obj, &last, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (last.len < 256 * n_formats * 4) {
        PyBuffer_Release(&last);
        PyErr_Format(PyExc_ValueError, "last must hold 256 x %d int32", n_formats);
        return NULL;
    }
    if (!writable(&lost, lost_obj, n_formats * 8, "lost")) {
        PyBuffer_Release(&last);
        return NULL;
    }
    const uint32_t *w = (const uint32_t *)(uintptr_t)before_address;
    const int32_t *lim = (const int32_t *)last.buf;
    int64_t *out = (int64_t *)lost.buf;
    int64_t lost_here[64] = {0}, totals[1024] = {0};
    uint32_t top = 0;
    if (!update_parts(w, parts, lim, n_formats, totals, lost_here, &top)) {
        PyBuffer_Release(&last);
        PyBuffer_Release(&lost);
        return NULL;
    }
    for (int f = 0; f < n_formats; f++) out[f] += lost_here[f];
    PyBuffer_Release(&last);
    PyBuffer_Release(&lost);
    PyObject *pairs = pairs_of(totals);
    if (!pairs) return NULL;
    return Py_BuildValue("(dN)", (double)f32_of(top), pairs);
}

typedef struct {
    int64_t *raw;
    float *amax;
    int64_t *first;
    double *mass;
    Py_ssize_t rows;
} tables_t;

/* A store's tables from their addresses (raw, amax, first, masses, rows); 0 with an exception set when not. */
static int tables_of(PyObject *obj, tables_t *t) {
    unsigned long long raw, amax, first, mass;
    if (!PyArg_ParseTuple(obj, "KKKKn", &raw, &amax, &first, &mass, &t->rows)) return 0;
    if (!raw || !amax || !first || !mass) {
        PyErr_SetString(PyExc_ValueError, "tables must be four nonzero addresses and a row count");
        return 0;
    }
    t->raw = (int64_t *)(uintptr_t)raw, t->amax = (float *)(uintptr_t)amax;
    t->first = (int64_t *)(uintptr_t)first, t->mass = (double *)(uintptr_t)mass;
    return 1;
}

static int row_in(const tables_t *t, Py_ssize_t row) {
    if (row >= 0 && row < t->rows) return 1;
    PyErr_Format(PyExc_ValueError, "row %zd out of range: the tables have %zd rows", row, t->rows);
    return 0;
}

/* Adds one observation's class totals, amax and (when given) mass to a row: amax rises (NaN sticks), a
   non-finite amax lowers first[row] to step. */
static void add_row(const tables_t *t, Py_ssize_t row, const int64_t *totals, double value, long long step,
                    const double *mass) {
    int64_t *dst = t->raw + row * RAW_SIZE;
    for (int c = 0; c < 1024; c++) dst[c] += totals[c];
    float *a = t->amax + row, v = (float)value;
    if (isnan(v) || v > *a) *a = isnan(*a) ? *a : v;
    if (!isfinite(value) && step < t->first[row]) t->first[row] = step;
    if (mass) {
        double *dst_mass = t->mass + row * MASS_SIZE;
        for (int k = 0; k < MASS_SIZE; k++) dst_mass[k] += mass[k];
    }
}

static PyObject *count_rows(PyObject *self, PyObject *args) {
    PyObject *tables_obj, *items;
    int kind, with_mass;
    long long step;
    tables_t t;
    if (!PyArg_ParseTuple(args, "OO!iLp", &tables_obj, &PyTuple_Type, &items, &kind, &step, &with_mass) ||
        !check_kind(kind) || !tables_of(tables_obj, &t))
        return NULL;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(items); j++) {
        Py_ssize_t row;
        PyObject *parts;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(items, j), "nO!", &row, &PyTuple_Type, &parts) || !row_in(&t, row))
            return NULL;
        int64_t totals[1024] = {0};
        double mass[MASS_SIZE] = {0};
        uint32_t top = 0;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(parts); k++) {
            unsigned long long address;
            Py_ssize_t n;
            if (!part_at(parts, k, &address, &n)) return NULL;
            uint32_t part_top = count_buffer((const char *)(uintptr_t)address, n, kind, totals,
                                             with_mass ? mass : NULL);
            top = part_top > top ? part_top : top;
        }
        add_row(&t, row, totals, magnitude_of(top, kind), step, with_mass ? mass : NULL);
    }
    Py_RETURN_NONE;
}

static PyObject *updates_rows(PyObject *self, PyObject *args) {
    PyObject *tables_obj, *items, *last_obj;
    unsigned long long lost_address;
    int n_formats;
    long long step;
    tables_t t;
    if (!PyArg_ParseTuple(args, "OKO!OiL", &tables_obj, &lost_address, &PyTuple_Type, &items, &last_obj, &n_formats,
                          &step) || !tables_of(tables_obj, &t))
        return NULL;
    if (n_formats < 1 || n_formats > 64 || !lost_address) {
        PyErr_Format(PyExc_ValueError, "updates_rows: need nonzero addresses and 1 to 64 formats, got %d", n_formats);
        return NULL;
    }
    Py_buffer last;
    if (PyObject_GetBuffer(last_obj, &last, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (last.len < 256 * n_formats * 4) {
        PyBuffer_Release(&last);
        PyErr_Format(PyExc_ValueError, "last must hold 256 x %d int32", n_formats);
        return NULL;
    }
    int64_t *lost = (int64_t *)(uintptr_t)lost_address;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(items); j++) {
        Py_ssize_t row;
        unsigned long long before;
        PyObject *parts;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(items, j), "nKO!", &row, &before, &PyTuple_Type, &parts) ||
            !row_in(&t, row) || (!before && (PyErr_SetString(PyExc_ValueError, "updates_rows: a zero address"), 1))) {
            PyBuffer_Release(&last);
            return NULL;
        }
        int64_t lost_here[64] = {0}, totals[1024] = {0};
        uint32_t top = 0;
        if (!update_parts((const uint32_t *)(uintptr_t)before, parts, (const int32_t *)last.buf,
                          n_formats, totals, lost_here, &top)) {
            PyBuffer_Release(&last);
            return NULL;
        }
        add_row(&t, row, totals, (double)f32_of(top), step, NULL);
        for (int f = 0; f < n_formats; f++) lost[row * n_formats + f] += lost_here[f];
    }
    PyBuffer_Release(&last);
    Py_RETURN_NONE;
}

/* A record of one observation: int64 k, then k (class, count) pairs, then (field, |x| sum, x^2 sum) triples
   (the sums' float64 bits) for the fields with mass. */
static PyObject *record_of(const int64_t *totals, const double *mass) {
    int64_t packed[1 + 2 * 1024 + 3 * 256];
    Py_ssize_t k = 0, at = 1;
    for (int c = 0; c < 1024; c++)
        if (totals[c]) {
            packed[at++] = c;
            packed[at++] = totals[c];
            k++;
        }
    packed[0] = k;
    if (mass)
        for (int f = 0; f < 256; f++)
            if (mass[f] != 0.0 || mass[256 + f] != 0.0) {
                packed[at++] = f;
                memcpy(&packed[at++], &mass[f], 8);
                memcpy(&packed[at++], &mass[256 + f], 8);
            }
    return PyBytes_FromStringAndSize((const char *)packed, at * 8);
}

/* Small buffers with their mass (n < ONE_LANE_BELOW: the GIL is held, so one static set of counters serves,
   kept zero between calls): the classes and fields a buffer touches are listed as they are first seen, so
   that nothing of size 1024 is cleared, folded or scanned (the analyzer's hooks count thousands of small
   tensors a step). */
static uint64_t small_count_sum[1024];
static uint64_t small_squares[256];

typedef struct {
    int classes, fields;
    uint16_t class_of[1024], field_of[256];
    int64_t count[1024];
    double l1[256], l2[256];
} sparse_t;

#define SMALL_STEP(U)                                                                             \
    do {                                                                                          \
        uint32_t u_ = (U), f_ = (u_ >> 23) & 0xffu, c_ = F32_CLASS(u_);                           \
        uint64_t s_ = (u_ & 0x7fffffu) | (uint32_t)(f_ != 0) << 23;                               \
        if (!small_count_sum[c_]) out->class_of[out->classes++] = (uint16_t)c_;                   \
        small_count_sum[c_] += ((uint64_t)1 << SUM_BITS) + s_;                                    \
        small_squares[f_] += s_ * s_;                                                             \
    } while (0)

/* Counts and mass of n < ONE_LANE_BELOW values as sparse lists (the same numbers count_chunk_mass gives);
   the largest magnitude bits. */
static uint32_t count_small(const void *data, Py_ssize_t n, int kind, sparse_t *out) {
    const uint32_t *src32 = (const uint32_t *)data;
    const uint16_t *src16 = (const uint16_t *)data;
    uint32_t top = 0;
    out->classes = out->fields = 0;
    if (kind == KIND_F32) {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t a = src32[i] & 0x7fffffffu;
            top = a > top ? a : top;
            SMALL_STEP(src32[i]);
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t a = src16[i] & 0x7fffu;
            top = a > top ? a : top;
        }
        if (kind == KIND_BF16)
            for (Py_ssize_t i = 0; i < n; i++) SMALL_STEP(BF16_AT(i));
        else
            for (Py_ssize_t i = 0; i < n; i++) SMALL_STEP(F16_AT(i));
    }
    int16_t slot[256];
    memset(slot, -1, sizeof(slot));
    uint64_t sums[256];
    for (int j = 0; j < out->classes; j++) {
        uint32_t c = out->class_of[j], f = (c >> 1) & 0xffu;
        uint64_t v = small_count_sum[c];
        small_count_sum[c] = 0;
        out->count[j] = (int64_t)(v >> SUM_BITS);
        if (f == 255u) continue; /* Inf and NaN carry no mass */
        if (slot[f] < 0) {
            slot[f] = (int16_t)out->fields;
            out->field_of[out->fields] = (uint16_t)f;
            sums[out->fields++] = 0;
        }
        sums[slot[f]] += v & (((uint64_t)1 << SUM_BITS) - 1);
    }
    small_squares[255] = 0;
    for (int k = 0; k < out->fields; k++) {
        uint32_t f = out->field_of[k];
        out->l1[k] = (double)sums[k] * unit1[f];
        out->l2[k] = (double)small_squares[f] * unit2[f];
        small_squares[f] = 0;
    }
    return top;
}

/* count_into for a small buffer with its mass: added to the row and written as a record from the lists. */
static PyObject *count_small_into(const tables_t *t, Py_ssize_t row, const void *data, Py_ssize_t n, int kind,
                                  long long step) {
    sparse_t out;
    double amax = magnitude_of(count_small(data, n, kind, &out), kind);
    int64_t *dst = t->raw + row * RAW_SIZE;
    double *dst_mass = t->mass + row * MASS_SIZE;
    int64_t packed[1 + 2 * 1024 + 3 * 256];
    Py_ssize_t at = 1;
    packed[0] = out.classes;
    for (int j = 0; j < out.classes; j++) {
        dst[out.class_of[j]] += out.count[j];
        packed[at++] = out.class_of[j];
        packed[at++] = out.count[j];
    }
    for (int k = 0; k < out.fields; k++) {
        uint32_t f = out.field_of[k];
        dst_mass[f] += out.l1[k];
        dst_mass[256 + f] += out.l2[k];
        packed[at++] = f;
        memcpy(&packed[at++], &out.l1[k], 8);
        memcpy(&packed[at++], &out.l2[k], 8);
    }
    float *a = t->amax + row, v = (float)amax;
    if (isnan(v) || v > *a) *a = isnan(*a) ? *a : v;
    if (!isfinite(amax) && step < t->first[row]) t->first[row] = step;
    PyObject *record = PyBytes_FromStringAndSize((const char *)packed, at * 8);
    if (!record) return NULL;
    return Py_BuildValue("(dN)", amax, record);
}

static PyObject *count_into(PyObject *self, PyObject *args) {
    PyObject *tables_obj;
    Py_ssize_t row, n;
    unsigned long long address;
    int kind, with_mass;
    long long step;
    tables_t t;
    if (!PyArg_ParseTuple(args, "OnKniLp", &tables_obj, &row, &address, &n, &kind, &step, &with_mass) ||
        !check_kind(kind) || !tables_of(tables_obj, &t) || !row_in(&t, row))
        return NULL;
    if (n < 0 || (n && !address)) {
        PyErr_Format(PyExc_ValueError, "count_into: need n >= 0 and a nonzero address, got n %zd", n);
        return NULL;
    }
    if (with_mass && n < ONE_LANE_BELOW)
        return count_small_into(&t, row, (const void *)(uintptr_t)address, n, kind, step);
    int64_t totals[1024] = {0};
    double mass[MASS_SIZE] = {0};
    uint32_t top = count_buffer((const char *)(uintptr_t)address, n, kind, totals, with_mass ? mass : NULL);
    double amax = magnitude_of(top, kind);
    add_row(&t, row, totals, amax, step, with_mass ? mass : NULL);
    PyObject *record = record_of(totals, with_mass ? mass : NULL);
    if (!record) return NULL;
    return Py_BuildValue("(dN)", amax, record);
}

static PyObject *add_record(PyObject *self, PyObject *args) {
    PyObject *tables_obj;
    Py_ssize_t row, length;
    const char *bytes;
    double value;
    long long step;
    tables_t t;
    if (!PyArg_ParseTuple(args, "Ony#dL", &tables_obj, &row, &bytes, &length, &value, &step) ||
        !tables_of(tables_obj, &t) || !row_in(&t, row))
        return NULL;
    const int64_t *p = (const int64_t *)bytes;
    Py_ssize_t words = length / 8, k = words ? p[0] : -1;
    int ok = length % 8 == 0 && k >= 0 && k <= (words - 1) / 2 && (words - 1 - 2 * k) % 3 == 0;
    for (Py_ssize_t j = 0; ok && j < k; j++) ok = p[1 + 2 * j] >= 0 && p[1 + 2 * j] < RAW_SIZE;
    for (Py_ssize_t at = 1 + 2 * k; ok && at < words; at += 3) ok = p[at] >= 0 && p[at] < 256;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "add_record: not a record of count_into");
        return NULL;
    }
    int64_t *dst = t.raw + row * RAW_SIZE;
    for (Py_ssize_t j = 0; j < k; j++) dst[p[1 + 2 * j]] += p[2 + 2 * j];
    float *a = t.amax + row, v = (float)value;
    if (isnan(v) || v > *a) *a = isnan(*a) ? *a : v;
    if (!isfinite(value) && step < t.first[row]) t.first[row] = step;
    double *dst_mass = t.mass + row * MASS_SIZE;
    for (Py_ssize_t at = 1 + 2 * k; at < words; at += 3) {
        double l1, l2;
        memcpy(&l1, &p[at + 1], 8);
        memcpy(&l2, &p[at + 2], 8);
        dst_mass[p[at]] += l1;
        dst_mass[256 + p[at]] += l2;
    }
    Py_RETURN_NONE;
}

static PyObject *accumulate(PyObject *self, PyObject *args) {
    unsigned long long raw_address, amax_address, first_address, mass_address;
    Py_ssize_t rows, row, length;
    const char *bytes;
    double value;
    long long step;
    PyObject *mass_obj = Py_None;
    if (!PyArg_ParseTuple(args, "(KKKKn)ny#dL|O", &raw_address, &amax_address, &first_address, &mass_address, &rows,
                          &row, &bytes, &length, &value, &step, &mass_obj))
        return NULL;
    const int64_t *p = (const int64_t *)bytes;
    int ok = raw_address && amax_address && first_address && mass_address && row >= 0 && row < rows &&
             length % 16 == 0;
    for (Py_ssize_t k = 0; ok && k < length / 16; k++) ok = p[2 * k] >= 0 && p[2 * k] < RAW_SIZE;
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "accumulate: row %zd of %zd, or pairs of %zd bytes, out of range", row, rows,
                     length);
        return NULL;
    }
    int64_t *dst = (int64_t *)(uintptr_t)raw_address + row * RAW_SIZE;
    for (Py_ssize_t k = 0; k < length / 16; k++) dst[p[2 * k]] += p[2 * k + 1];
    float *a = (float *)(uintptr_t)amax_address + row;
    float v = (float)value;
    if (isnan(v) || v > *a) *a = isnan(*a) ? *a : v;
    int64_t *f = (int64_t *)(uintptr_t)first_address + row;
    if (!isfinite(value) && step < *f) *f = step;
    if (mass_obj != Py_None) {
        Py_buffer mass;
        if (PyObject_GetBuffer(mass_obj, &mass, PyBUF_C_CONTIGUOUS) < 0) return NULL;
        if (mass.len < MASS_SIZE * 8) {
            PyBuffer_Release(&mass);
            PyErr_SetString(PyExc_ValueError, "accumulate: mass must hold 512 float64");
            return NULL;
        }
        double *dst_mass = (double *)(uintptr_t)mass_address + row * MASS_SIZE;
        const double *src = (const double *)mass.buf;
        for (int k = 0; k < MASS_SIZE; k++) dst_mass[k] += src[k];
        PyBuffer_Release(&mass);
    }
    Py_RETURN_NONE;
}

static PyObject *vector_path(PyObject *self, PyObject *args) {
    PyObject *on = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &on)) return NULL;
#ifdef VECTOR_MASS
    if (on != Py_None) {
        int want = PyObject_IsTrue(on);
        if (want < 0) return NULL;
        vector_mass = want && cpu_has_vector();
    }
    return PyBool_FromLong(vector_mass);
#else
    Py_RETURN_FALSE;
#endif
}

static PyMethodDef methods[] = {
    {"vector_path", vector_path, METH_VARARGS,
     "vector_path(on=None) -> bool: whether counts with their mass take the AVX2 path (where the CPU has it); "
     "with on, switch it on or off first (the tests hold both paths to the same numbers)"},
    {"count", count, METH_VARARGS,
     "count(address, n, kind, mass=None) -> (amax, pairs): the classes of n values (kind 0 float32, 1 float16, "
     "2 bfloat16) as int64 (class, count) pairs; their mass per exponent field added to mass (float64[512])"},
    {"updates", updates, METH_VARARGS,
     "updates(before, parts, last, n_formats, lost) -> (amax, pairs) of the float32 updates (address, n) - "
     "before, with the updates lost per format added to lost"},
    {"count_parts", count_parts, METH_VARARGS,
     "count_parts(parts, kind, mass=None) -> (amax, pairs): count over several buffers, parts being their "
     "(address, n); their mass added to mass as count does"},
    {"count_rows", count_rows, METH_VARARGS,
     "count_rows(tables, ((row, ((address, n), ...)), ...), kind, step, with_mass): count each row's buffers "
     "together and add them to that row of the tables"},
    {"updates_rows", updates_rows, METH_VARARGS,
     "updates_rows(tables, lost, ((row, before, ((address, n), ...)), ...), last, n_formats, step): the "
     "updates of each row's parameters against their old values at before, added to that row; lost counts to lost"},
    {"count_into", count_into, METH_VARARGS,
     "count_into(tables, row, address, n, kind, step, with_mass) -> (amax, record): count n values and add them "
     "to a row of the tables; record: the same observation for add_record"},
    {"add_record", add_record, METH_VARARGS,
     "add_record(tables, row, record, amax_value, step): add a record of count_into to a row of the tables"},
    {"accumulate", accumulate, METH_VARARGS,
     "accumulate((raw, amax, first, masses, rows), row, pairs, amax_value, step, mass=None): add a tensor's "
     "pairs, amax and mass to a table row, the tables given by address"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fasthist",
                                    "Compiled fast path of the analyzer's log2 histograms.", -1, methods};

PyMODINIT_FUNC PyInit__fasthist(void) {
    init_tables();
#ifdef VECTOR_MASS
    vector_mass = cpu_has_vector();
#endif
    return PyModule_Create(&module);
}
