/*
 * att_tile_impl.h - private to att_tile.h, which includes it once per
 * vector width with ATT_VT (the vector type), ATT_L (its floats), ATT_J
 * (vectors per row of a tile) and ATT_SFX (the names' suffix) defined; no
 * include guard. The functions are documented at their entry points in
 * att_tile.h.
 */
#define ATT_CAT2(a, b) a##b
#define ATT_CAT(a, b) ATT_CAT2(a, b)
#define ATT_FN(name) ATT_CAT(name, ATT_SFX)

/* RT x J accumulators, J vectors of keys at a time; each key row of Kt
 * loaded once for the four query rows. */
ATT_INLINE void ATT_FN(att_scores)(float *S, const float *const qr[RT], const float *Kt, size_t D)
{
    for (int j0 = 0; j0 < BK / ATT_L; j0 += ATT_J) {
        ATT_VT acc[RT][ATT_J];
#pragma GCC unroll 4
        for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
            for (int j = 0; j < ATT_J; j++) acc[r][j] = (ATT_VT){0};
        for (size_t d = 0; d < D; d++) {
            ATT_VT k[ATT_J];
#pragma GCC unroll 4
            for (int j = 0; j < ATT_J; j++) k[j] = vld(ATT_VT, Kt + d * BK + ATT_L * (j0 + j));
#pragma GCC unroll 4
            for (int r = 0; r < RT; r++) {
                float x = qr[r][d];
#pragma GCC unroll 4
                for (int j = 0; j < ATT_J; j++) acc[r][j] += x * k[j];
            }
        }
#pragma GCC unroll 4
        for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
            for (int j = 0; j < ATT_J; j++) vst(S + r * BK + ATT_L * (j0 + j), acc[r][j]);
    }
}

ATT_INLINE void ATT_FN(att_scores1)(float *S, const float *q, const float *Kt, size_t D)
{
    for (int j0 = 0; j0 < BK / ATT_L; j0 += 4) {
        ATT_VT acc[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[j] = (ATT_VT){0};
        for (size_t d = 0; d < D; d++) {
            float x = q[d];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[j] += x * vld(ATT_VT, Kt + d * BK + ATT_L * (j0 + j));
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) vst(S + ATT_L * (j0 + j), acc[j]);
    }
}

/* Transposition of a key block into Kt (att_kt): L rows of L floats in
 * registers, transposed by swapping the off-diagonal blocks of b x b at
 * every scale b = L/2 .. 1 with two-vector shuffles of constant masks. */
typedef int ATT_FN(att_mt) __attribute__((vector_size(sizeof(ATT_VT))));
#define ATT_LO(j, b) (((j) & (b)) ? ATT_L + (j) - (b) : (j))
#define ATT_HI(j, b) (((j) & (b)) ? ATT_L + (j) : (j) + (b))
#if ATT_L == 16
#define ATT_MASK(F, b)                                                                          \
    (ATT_FN(att_mt))                                                                            \
    {                                                                                           \
        F(0, b), F(1, b), F(2, b), F(3, b), F(4, b), F(5, b), F(6, b), F(7, b), F(8, b),        \
            F(9, b), F(10, b), F(11, b), F(12, b), F(13, b), F(14, b), F(15, b)                 \
    }
#elif ATT_L == 8
#define ATT_MASK(F, b) \
    (ATT_FN(att_mt)) { F(0, b), F(1, b), F(2, b), F(3, b), F(4, b), F(5, b), F(6, b), F(7, b) }
#else
#define ATT_MASK(F, b) \
    (ATT_FN(att_mt)) { F(0, b), F(1, b), F(2, b), F(3, b) }
#endif
#define ATT_STAGE(v, b)                                                        \
    for (int i_ = 0; i_ < ATT_L; i_++)                                         \
        if (!(i_ & (b))) {                                                     \
            ATT_VT a_ = (v)[i_], c_ = (v)[i_ + (b)];                           \
            (v)[i_] = __builtin_shuffle(a_, c_, ATT_MASK(ATT_LO, b));          \
            (v)[i_ + (b)] = __builtin_shuffle(a_, c_, ATT_MASK(ATT_HI, b));    \
        }

ATT_INLINE void ATT_FN(att_kt)(float *Kt, const float *const *kr, size_t nk, size_t D)
{
    size_t d0 = 0;
    for (; d0 + ATT_L <= D; d0 += ATT_L)
        for (size_t c0 = 0; c0 < BK; c0 += ATT_L) {
            ATT_VT v[ATT_L];
#pragma GCC unroll 16
            for (int i = 0; i < ATT_L; i++)
                v[i] = c0 + (size_t)i < nk ? vld(ATT_VT, kr[c0 + (size_t)i] + d0) : (ATT_VT){0};
#if ATT_L == 16
            ATT_STAGE(v, 8)
#endif
#if ATT_L >= 8
            ATT_STAGE(v, 4)
#endif
            ATT_STAGE(v, 2)
            ATT_STAGE(v, 1)
#pragma GCC unroll 16
            for (int i = 0; i < ATT_L; i++) vst(Kt + (d0 + (size_t)i) * BK + c0, v[i]);
        }
    for (; d0 < D; d0++)
        for (size_t c = 0; c < BK; c++) Kt[d0 * BK + c] = c < nk ? kr[c][d0] : 0.0f;
}
#undef ATT_STAGE
#undef ATT_MASK
#undef ATT_HI
#undef ATT_LO

/* The columns of o in tiles of J vectors (nr = RT), then each row in four
 * vectors, one vector and one element at a time. */
ATT_INLINE void ATT_FN(att_rows)(float *o, size_t ostride, size_t D, const float *P,
                                 const float *corr, const float *v, size_t vstride, size_t c0,
                                 size_t c1, int nr)
{
    size_t d = 0;
    if (nr == RT) {
        for (; d + ATT_L * ATT_J <= D; d += ATT_L * ATT_J) {
            ATT_VT acc[RT][ATT_J];
#pragma GCC unroll 4
            for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
                for (int j = 0; j < ATT_J; j++)
                    acc[r][j] = vld(ATT_VT, o + r * ostride + d + ATT_L * j) * corr[r];
            for (size_t c = c0; c < c1; c++) {
                ATT_VT vv[ATT_J];
#pragma GCC unroll 4
                for (int j = 0; j < ATT_J; j++)
                    vv[j] = vld(ATT_VT, v + c * vstride + d + ATT_L * j);
#pragma GCC unroll 4
                for (int r = 0; r < RT; r++) {
                    float p = P[r * BK + c];
#pragma GCC unroll 4
                    for (int j = 0; j < ATT_J; j++) acc[r][j] += p * vv[j];
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
                for (int j = 0; j < ATT_J; j++) vst(o + r * ostride + d + ATT_L * j, acc[r][j]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float *orow = o + r * ostride;
        const float *pr = P + r * BK;
        size_t e = d;
        for (; e + 4 * ATT_L <= D; e += 4 * ATT_L) { /* four independent sums at a time */
            ATT_VT acc[4];
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[j] = vld(ATT_VT, orow + e + ATT_L * j) * corr[r];
            for (size_t c = c0; c < c1; c++) {
                float p = pr[c];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++)
                    acc[j] += p * vld(ATT_VT, v + c * vstride + e + ATT_L * j);
            }
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) vst(orow + e + ATT_L * j, acc[j]);
        }
        for (; e + ATT_L <= D; e += ATT_L) {
            ATT_VT acc = vld(ATT_VT, orow + e) * corr[r];
            for (size_t c = c0; c < c1; c++) acc += pr[c] * vld(ATT_VT, v + c * vstride + e);
            vst(orow + e, acc);
        }
        for (; e < D; e++) {
            float acc = orow[e] * corr[r];
            for (size_t c = c0; c < c1; c++) acc += pr[c] * v[c * vstride + e];
            orow[e] = acc;
        }
    }
}

/* The columns in tiles of J vectors with the y rows' columns loaded once for
 * all the keys (nr = RT), then one vector and one element at a time. */
ATT_INLINE void ATT_FN(att_cols)(float *X, size_t D, const float *P, const float *const y[RT],
                                 size_t c0, size_t c1, int nr)
{
    size_t d = 0;
    if (nr == RT) {
        for (; d + ATT_L * ATT_J <= D; d += ATT_L * ATT_J) {
            ATT_VT yy[RT][ATT_J];
#pragma GCC unroll 4
            for (int r = 0; r < RT; r++)
#pragma GCC unroll 4
                for (int j = 0; j < ATT_J; j++) yy[r][j] = vld(ATT_VT, y[r] + d + ATT_L * j);
            for (size_t c = c0; c < c1; c++) {
                ATT_VT acc[ATT_J];
#pragma GCC unroll 4
                for (int j = 0; j < ATT_J; j++) acc[j] = vld(ATT_VT, X + c * D + d + ATT_L * j);
#pragma GCC unroll 4
                for (int r = 0; r < RT; r++) {
                    float p = P[r * BK + c];
#pragma GCC unroll 4
                    for (int j = 0; j < ATT_J; j++) acc[j] += p * yy[r][j];
                }
#pragma GCC unroll 4
                for (int j = 0; j < ATT_J; j++) vst(X + c * D + d + ATT_L * j, acc[j]);
            }
        }
    }
    for (; d + ATT_L <= D; d += ATT_L)
        for (size_t c = c0; c < c1; c++) {
            ATT_VT acc = vld(ATT_VT, X + c * D + d);
            for (int r = 0; r < nr; r++) acc += P[r * BK + c] * vld(ATT_VT, y[r] + d);
            vst(X + c * D + d, acc);
        }
    for (; d < D; d++)
        for (size_t c = c0; c < c1; c++) {
            float acc = X[c * D + d];
            for (int r = 0; r < nr; r++) acc += P[r * BK + c] * y[r][d];
            X[c * D + d] = acc;
        }
}

#undef ATT_FN
#undef ATT_CAT
#undef ATT_CAT2
#undef ATT_VT
#undef ATT_L
#undef ATT_J
#undef ATT_SFX
