/* Steps 1 to 4 of fpsim's kernel for one working float, per element, and the passes that run them.
 *
 * Included twice by _fastround.c: with W = 32 (float32 bits in uint32_t) and
 * W = 64 (float64 bits in uint64_t). The includer defines W, word_t, sword_t
 * (its signed twin), fword_t (the float), P (mantissa bits), BIAS_IN and
 * FN(name), which appends the width to a name. The element functions are
 * branch-free so that the loops calling them vectorise. */

#define ONE ((word_t)1)
#define SIGN_BIT (ONE << (W - 1))
#define ABS_MASK (SIGN_BIT - 1)
#define INF_BITS (((ONE << (W - 1 - P)) - 1) << P)
#define MANT_MASK ((ONE << P) - 1)
#define MAGIC_BITS ((word_t)(BIAS_IN + P) << P) /* the bits of 2^P */

/* x where cond (0 or 1), else y. */
static ALWAYS_INLINE word_t FN(sel)(word_t cond, word_t x, word_t y) { return ((0 - cond) & x) | ((cond - 1) & y); }

static ALWAYS_INLINE word_t FN(min)(word_t x, word_t y) { return FN(sel)(x < y, x, y); }

/* x < y for magnitudes (below 2^(W-1)): a signed compare, which AVX2 has (unsigned it has not). */
static ALWAYS_INLINE word_t FN(less)(word_t x, word_t y) { return (sword_t)x < (sword_t)y; }

static ALWAYS_INLINE fword_t FN(as_float)(word_t bits) {
    fword_t f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static ALWAYS_INLINE word_t FN(as_bits)(fword_t f) {
    word_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* Step 3, the one table of what each mode does: x rounded at bit d (1 <= d <= P + 2, low = 2^d - 1),
   that is x >> d plus the mode's carry. s: the sign (0 or 1); increment: stochastic rounding's random
   increment (below 2^d: it carries exactly when the element rounds away from zero). */
static ALWAYS_INLINE word_t FN(round_at)(int mode, word_t x, word_t d, word_t low, word_t s, word_t increment) {
    const word_t keep = x >> d;
    switch (mode) {
    case NEAREST_EVEN: return (x + (low >> 1) + (keep & 1)) >> d; /* a tie carries when the kept part is odd */
    case NEAREST_AWAY: return (x + (low >> 1) + 1) >> d;          /* carries from half the spacing up */
    case TOWARD_ZERO: return keep;
    case UP: return (x + ((s - 1) & low)) >> d;                     /* positive: any dropped bit carries */
    case DOWN: return (x + ((0 - s) & low)) >> d;                   /* negative: any dropped bit carries */
    case ODD: return keep | ((x & low) != 0);                       /* the sticky bit into the last place */
    default: return (x + increment) >> d;                           /* STOCHASTIC */
    }
}

/* Step 3, stochastic rounding's decision: whether U < f = rest / 2^D (0 <= rest < 2^D, D >= 1), U's
   first words being u0, u1 (fpsim/philox.py). EXACT_DRAW: *tie is set when u0 equals f's first 32
   bits and f has more bits, which the general path compares with U's further words. Otherwise f is
   truncated to rbits bits and U's top rbits bits decide (no tie). */
static ALWAYS_INLINE word_t FN(sr_up)(const int draw, word_t rest, word_t D, word_t u0, word_t u1, word_t rbits,
                                      word_t *tie) {
    *tie = 0;
    if (draw == EXACT_DRAW) {
        const word_t left = FN(sel)(D <= 32, 32 - D, 0), right = FN(sel)(D > 32, FN(min)(D - 32, W - 1), 0);
        const word_t digit = (rest << left) >> right; /* f's first 32 bits */
        *tie = (u0 == digit) & (rest != (rest >> right) << right);
        return W == 64 ? FN(less)(u0, digit) : u0 < digit; /* (below 2^32: signed is right for W = 64) */
    }
    const word_t truncated = FN(sel)(D <= rbits, rest << (rbits - D), rest >> FN(min)(D - rbits, W - 1));
#if W == 64
    const word_t top = draw == WIDE_DRAW ? (u0 << (rbits - 32)) | (u1 >> (64 - rbits)) : u0 >> (32 - rbits);
    return FN(less)(top, truncated); /* both below 2^52 */
#else
    (void)u1; /* (rand_bits > 32 takes the 64-bit path) */
    return (u0 >> (32 - rbits)) < truncated;
#endif
}

/* The kernel's parameters in this width, loaded once per pass. */
typedef struct {
    word_t lo, hi, drop, low, rebias, sign_shift, unsigned_format, over0, over1, inf0, inf1, nan0, nan1, zero0, zero1,
        negative, code_unit, min_count, zero_below, flush_inputs, rbits;
    word_t band_shift, band_scale; /* stochastic in the band: see band_one */
    word_t cap, ones; /* P + 2 and ~0 as data, not constants: compilers turn a constant shifted by a
                         variable count, or a count they can bound, into shifts that AVX2 lacks */
    sword_t offset;
    fword_t quantum;
} FN(facts_t);

static ALWAYS_INLINE FN(facts_t) FN(facts)(const kernel_t *k) {
    FN(facts_t) f;
    f.lo = (word_t)k->lo, f.hi = (word_t)k->hi, f.drop = (word_t)k->drop, f.rebias = (word_t)k->rebias;
    f.low = (ONE << f.drop) - 1;
    f.sign_shift = (word_t)k->code_sign_shift, f.unsigned_format = !k->is_signed;
    f.over0 = (word_t)k->over_pos, f.over1 = (word_t)k->over_neg, f.inf0 = (word_t)k->inf_pos;
    f.inf1 = (word_t)k->inf_neg, f.nan0 = (word_t)k->nan_pos, f.nan1 = (word_t)k->nan_neg;
    f.zero0 = (word_t)k->zero_pos, f.zero1 = (word_t)k->zero_neg, f.negative = (word_t)k->negative;
    f.code_unit = (word_t)k->code_unit, f.min_count = (word_t)k->min_count, f.zero_below = (word_t)k->zero_below;
    f.flush_inputs = (word_t)k->flush_inputs, f.rbits = (word_t)k->rand_bits;
    f.offset = (sword_t)k->below_offset, f.quantum = (fword_t)k->quantum;
    /* U's top `bits` bits decide: those of f (exact: the band's f has `drop` bits, of which the
       first word holds 32), or f truncated to rand_bits */
    const word_t window = f.rbits == 0 ? 32 : f.rbits, bits = FN(min)(f.drop, window);
    f.band_shift = (f.rbits > 32 ? 64 : 32) - bits, f.band_scale = f.drop - bits;
    f.cap = (word_t)k->width == W ? P + 2 : 0;
    f.ones = (word_t)0 - ((word_t)k->width == W);
    return f;
}

/* Steps 1 to 4 from the format's min normal up (the band): the bit pattern is rounded at `drop`,
   a carry into the exponent field renormalises; overflow, zeros, Inf, NaN and negative inputs of
   unsigned formats take the engine's outputs. *below: the input is below min normal (below_one
   gives its result); *tie: stochastic rounding needs U's further words (the general path). */
static ALWAYS_INLINE word_t FN(band_one)(const int mode, const int codes, const int draw, const FN(facts_t) *f,
                                         word_t u, uint32_t u0, uint32_t u1, word_t *below, word_t *tie) {
    /* 1. decompose */
    const word_t a = u & ABS_MASK, s = u >> (W - 1);
    /* 2, 3. round the magnitude's bit pattern at `drop`. Stochastic: U < f written as a carry:
       adding the complement of U's top bits (scaled to f's last bit) carries exactly when U < f */
    word_t increment = 0;
    *tie = 0;
    if (mode == STOCHASTIC) {
#if W == 64
        const word_t not_u = draw == WIDE_DRAW ? ~(((word_t)u0 << 32) | u1) : (word_t)(uint32_t)~u0;
        if (draw == EXACT_DRAW) { /* where f is longer than U's first word, equal leading bits need more */
            const word_t rest = a & f->low;
            *tie = ((rest >> f->band_scale) == u0) & (rest != (rest >> f->band_scale) << f->band_scale);
        }
#else
        const word_t not_u = (word_t)~u0;
        (void)u1;
#endif
        increment = (not_u >> f->band_shift) << f->band_scale;
    }
    const word_t kept = FN(round_at)(mode, a, f->drop, f->low, s, increment), rounded = kept << f->drop;
    /* 4. finish: assemble, then the edge inputs' outputs */
    word_t res = codes ? (kept - f->rebias) | (s << f->sign_shift) : rounded | (u & SIGN_BIT);
    res = FN(sel)(FN(less)(f->hi, rounded), FN(sel)(s, f->over1, f->over0), res);
    res = FN(sel)(a == 0, FN(sel)(s, f->zero1, f->zero0), res);
    res = FN(sel)(!FN(less)(a, INF_BITS), FN(sel)(a == INF_BITS, FN(sel)(s, f->inf1, f->inf0), FN(sel)(s, f->nan1, f->nan0)),
                  res);
    const word_t is_below = FN(less)(a, f->lo);
    res = FN(sel)(s & f->unsigned_format & !is_below, f->negative, res);
    *below = is_below & (a != 0);
    return res;
}

/* Steps 1 to 4 below the format's min normal (for inputs there other than zeros), where the grid's
   spacing is 2^quantum_exp: the significand (implicit bit included) is rounded at a bit count that
   grows as the input gets smaller; the count of quanta gives the value count * 2^quantum_exp or the
   code: the count itself with subnormals, else (counts 0 or 1) code_unit, min normal's code. *tie as in
   band_one. */
static ALWAYS_INLINE word_t FN(below_one)(const int mode, const int codes, const int draw, const FN(facts_t) *f,
                                          word_t u, uint32_t u0, uint32_t u1, word_t *tie) {
    /* 1. decompose: |x| = sig * 2^(field - BIAS_IN - P) (field 0: the input's own subnormals) */
    const word_t a = u & ABS_MASK, s = u >> (W - 1), field = a >> P;
    const word_t sig = (a & MANT_MASK) | FN(sel)(field != 0, ONE << P, 0);
    /* 2. D bits fall below the spacing (D >= 1 here); past P + 2 only "nonzero" matters */
    const sword_t dropped = f->offset - (sword_t)FN(sel)(field != 0, field, 1);
    const word_t D = FN(sel)(dropped >= 1, (word_t)dropped, 1), d = FN(min)(D, f->cap), low = f->ones >> (W - d);
    /* 3. round: the count of quanta */
    word_t increment = 0;
    *tie = 0;
    if (mode == STOCHASTIC) increment = FN(sr_up)(draw, sig & low, D, u0, u1, f->rbits, tie) << d;
    word_t count = FN(round_at)(mode, sig, d, low, s, increment);
    count = FN(sel)(FN(less)(count, f->min_count), f->min_count, count); /* no zero: the smallest value */
    /* 4. finish (count < 2^P: the conversion to float through 2^P's bits is exact) */
    word_t res = codes ? (s << f->sign_shift) | FN(sel)(f->code_unit == 1, count, (0 - count) & f->code_unit)
                       : FN(as_bits)((FN(as_float)(MAGIC_BITS | count) - FN(as_float)(MAGIC_BITS)) * f->quantum)
                             | (u & SIGN_BIT);
    res = FN(sel)(FN(less)(count, f->zero_below) | f->flush_inputs, FN(sel)(s, f->zero1, f->zero0), res);
    return FN(sel)(s & f->unsigned_format & !f->flush_inputs, f->negative, res);
}

/* The passes over a chunk (n <= CHUNK). band: every element; returns how many are below min normal
   (marked in `below`). below: those n_below elements, in a vectorised loop over the chunk when they
   are more than one in 32, else one by one (at one in 20, one by one took 1.2 to 1.3 times as long for
   the whole call: E3M2 of N(0, 16) values, benchmarks/bench_rounding.py). Both set *ties when some element of the chunk needs the general path (ties_of
   then finds which: they are rare, 2^-32 per element). */
#define PASS_ARGS                                                                                        \
    const kernel_t *k, const word_t *restrict src, const uint32_t *restrict u0, const uint32_t *restrict u1, \
        word_t *restrict out, word_t *restrict below, Py_ssize_t n, Py_ssize_t n_below, word_t *ties
typedef Py_ssize_t (*FN(pass_fn))(PASS_ARGS);

static ALWAYS_INLINE Py_ssize_t FN(band_loop)(const int mode, const int codes, const int draw, const FN(facts_t) *f,
                                              PASS_ARGS) {
    word_t count = 0, any_tie = 0;
    (void)k, (void)n_below;
    for (Py_ssize_t i = 0; i < n; i++) {
        word_t is_below, tie;
        out[i] = FN(band_one)(mode, codes, draw, f, src[i], u0[i], u1[i], &is_below, &tie);
        below[i] = is_below;
        count += is_below;
        any_tie |= tie;
    }
    *ties |= any_tie;
    return (Py_ssize_t)count;
}

static ALWAYS_INLINE Py_ssize_t FN(below_loop)(const int mode, const int codes, const int draw, const FN(facts_t) *f,
                                               PASS_ARGS) {
    word_t any_tie = 0;
    (void)k;
    if (n_below * 32 > n) {
        for (Py_ssize_t i = 0; i < n; i++) {
            word_t tie;
            const word_t res = FN(below_one)(mode, codes, draw, f, src[i], u0[i], u1[i], &tie), take = below[i];
            out[i] = FN(sel)(take, res, out[i]);
            any_tie |= take & tie;
        }
    } else { /* groups of 16 that hold one: testing below[i] alone, the compiler vectorises the test away */
        for (Py_ssize_t g = 0; g < n; g += 16) {
            const Py_ssize_t end = g + 16 < n ? g + 16 : n;
            word_t any = 0;
            for (Py_ssize_t i = g; i < end; i++) any |= below[i];
            if (!any) continue;
            for (Py_ssize_t i = g; i < end; i++) {
                if (!below[i]) continue;
                word_t tie;
                out[i] = FN(below_one)(mode, codes, draw, f, src[i], u0[i], u1[i], &tie);
                any_tie |= tie;
            }
        }
    }
    *ties |= any_tie;
    return 0;
}

/* The way stochastic rounding reads U, from rand_bits (one loop each, so that each vectorises alone). */
static ALWAYS_INLINE int FN(draw_of)(const int mode, const FN(facts_t) *f) {
    if (mode != STOCHASTIC || f->rbits == 0) return EXACT_DRAW;
    return W == 64 && f->rbits > 32 ? WIDE_DRAW : TRUNCATED_DRAW;
}

#define DISPATCH_DRAW(LOOP)                                                                              \
    const FN(facts_t) f = FN(facts)(k);                                                                 \
    switch (FN(draw_of)(mode, &f)) {                                                                     \
    case WIDE_DRAW: return LOOP(mode, codes, WIDE_DRAW, &f, k, src, u0, u1, out, below, n, n_below, ties);   \
    case TRUNCATED_DRAW:                                                                                 \
        return LOOP(mode, codes, TRUNCATED_DRAW, &f, k, src, u0, u1, out, below, n, n_below, ties);         \
    default: return LOOP(mode, codes, EXACT_DRAW, &f, k, src, u0, u1, out, below, n, n_below, ties);        \
    }

static ALWAYS_INLINE Py_ssize_t FN(band_pass)(const int mode, const int codes, PASS_ARGS) { DISPATCH_DRAW(FN(band_loop)) }

static ALWAYS_INLINE Py_ssize_t FN(below_pass)(const int mode, const int codes, PASS_ARGS) { DISPATCH_DRAW(FN(below_loop)) }

/* Marks in `general` the elements of a chunk whose stochastic decision is a tie (exact rounding only). */
static void FN(ties_of)(const kernel_t *k, const word_t *src, const uint32_t *u0, const uint32_t *u1,
                        const word_t *below, word_t *general, Py_ssize_t n) {
    const FN(facts_t) f = FN(facts)(k);
    for (Py_ssize_t i = 0; i < n; i++) {
        word_t is_below, tie;
        if (below[i]) FN(below_one)(STOCHASTIC, 0, EXACT_DRAW, &f, src[i], u0[i], u1[i], &tie);
        else FN(band_one)(STOCHASTIC, 0, EXACT_DRAW, &f, src[i], u0[i], u1[i], &is_below, &tie);
        general[i] |= tie;
    }
}

/* One function per (mode, values or codes), from the mode list: the compiler specialises each. */
#define DEFINE_PASSES(MODE)                                                                              \
    MULTIVERSION_512 static Py_ssize_t FN(band_values_##MODE)(PASS_ARGS) {                                    \
        return FN(band_pass)(MODE, 0, k, src, u0, u1, out, below, n, n_below, ties);                      \
    }                                                                                                    \
    MULTIVERSION_512 static Py_ssize_t FN(band_codes_##MODE)(PASS_ARGS) {                                     \
        return FN(band_pass)(MODE, 1, k, src, u0, u1, out, below, n, n_below, ties);                      \
    }                                                                                                    \
    MULTIVERSION_512 static Py_ssize_t FN(below_values_##MODE)(PASS_ARGS) {                                   \
        return FN(below_pass)(MODE, 0, k, src, u0, u1, out, below, n, n_below, ties);                     \
    }                                                                                                    \
    MULTIVERSION_512 static Py_ssize_t FN(below_codes_##MODE)(PASS_ARGS) {                                    \
        return FN(below_pass)(MODE, 1, k, src, u0, u1, out, below, n, n_below, ties);                     \
    }
FOR_EACH_MODE(DEFINE_PASSES)
#define PASS_ROW(MODE) {{FN(band_values_##MODE), FN(band_codes_##MODE)}, {FN(below_values_##MODE), FN(below_codes_##MODE)}},
static const FN(pass_fn) FN(passes)[][2][2] = {FOR_EACH_MODE(PASS_ROW)}; /* [mode][band, below][values, codes] */

#undef ONE
#undef SIGN_BIT
#undef ABS_MASK
#undef INF_BITS
#undef MANT_MASK
#undef MAGIC_BITS
#undef PASS_ARGS
#undef DEFINE_PASSES
#undef PASS_ROW
#undef DISPATCH_DRAW
