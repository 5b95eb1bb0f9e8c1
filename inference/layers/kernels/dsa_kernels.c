/* DeepSeek Sparse Attention (GLM-5) on the CPU, fp32: the lightning indexer's scores and top-k,
 * and the attention over each query's chosen latent rows, one OpenMP region a call.
 *
 * With torch ops a long prefill was slower sparse than dense (0.1-0.2x dense MLA at 16k-32k on a
 * 2-core AVX-512 EPYC, 4 Dec 2026): the indexer wrote a [queries x heads, positions] score tensor
 * and read it back, torch's topk sorted 2048 of up to 32k per query, and the attention gathered
 * every query's 2048 latent rows into a fresh tensor before two small matrix products. Here a
 * query's index scores stay in one buffer of its positions (four queries against a block of keys
 * in registers), the top-k keeps the scores over a floor a sample of them sets (one pass) and
 * radix-selects the boundary among those alone (no sort),
 * and the attention reads the chosen rows where the cache holds them, each row once for every
 * head (MLA's heads share the latent row).
 *
 * Built into the same library as cpu_kernels.c (cpu_kernels.py), whose vectorised exponentials
 * it uses. A few queries (decode) score the keys where the cache holds them and split each
 * query's chosen rows among the threads (merged as flash-decoding does); many queries (prefill)
 * score against the keys transposed once a call and take a query a thread.
 */
#include <math.h>
#include <stdint.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

float wecom_exp_shifted(float *s, long n, float top);

/* Keys a panel of the transposed keys, kT [panels, D, PANEL]: a block's D rows lie side by side.
 * (Transposed whole, [D, T], the rows a block reads were T floats apart: at a power-of-two T
 * such as 32k every one of them fell in the same L1 set, and the indexer ran at a fifth of the
 * FMA units' rate.) */
#define PANEL 128

/* Queries scored together against each block of keys (prefill): each key row loaded once for
 * all of them, so that the FMAs outnumber the loads four to one (one query at a time, a load a
 * multiply-add). QUERY_BLOCK x BLOCK_KEYS sums in registers, written with GCC's vector types (as
 * plain arrays GCC unrolled the loop over D and kept the sums on the stack): 4 x 64 (16 zmm) with
 * AVX-512, 4 x 16 (8 ymm) with AVX2. */
#define QUERY_BLOCK 4
#ifdef __AVX512F__
#define LANES_V 16
#define VECTORS 4
#else
#define LANES_V 8
#define VECTORS 2
#endif
#define BLOCK_KEYS (LANES_V * VECTORS)
typedef float vfloat __attribute__((vector_size(LANES_V * sizeof(float))));
typedef float vfloat_u __attribute__((vector_size(LANES_V * sizeof(float)), aligned(4))); /* unaligned loads */
_Static_assert(PANEL % BLOCK_KEYS == 0, "a block of keys lies within one panel");

/* s[a * lds + j] = sum_h w[a][h] * relu(scale * q[a][h] . k_j) for the QUERY_BLOCK queries
 * q [QUERY_BLOCK, H, D] (w [QUERY_BLOCK, H]) and keys j in [0, m); the keys transposed in panels,
 * kT [panels, D, PANEL] (zeros past the last key) */
static void index_scores(const float *q, const float *w, const float *kT, long m, long H, long D, float scale,
                         float *s, long lds) {
    for (long j0 = 0; j0 < m; j0 += BLOCK_KEYS) {
        const float *panel = kT + (j0 / PANEL) * D * PANEL + j0 % PANEL;
        float total[QUERY_BLOCK][BLOCK_KEYS] = {{0}};
        for (long h = 0; h < H; h++) {
            vfloat acc[QUERY_BLOCK][VECTORS];
#pragma GCC unroll 16
            for (int a = 0; a < QUERY_BLOCK; a++)
#pragma GCC unroll 4
                for (int v = 0; v < VECTORS; v++)
                    acc[a][v] = (vfloat){0};
            for (long d = 0; d < D; d++) {
                const float *k = panel + d * PANEL;
                vfloat kv[VECTORS];
#pragma GCC unroll 4
                for (int v = 0; v < VECTORS; v++)
                    kv[v] = *(const vfloat_u *)(k + v * LANES_V);
#pragma GCC unroll 4
                for (int a = 0; a < QUERY_BLOCK; a++) {
                    const float x = q[(a * H + h) * D + d];
#pragma GCC unroll 4
                    for (int v = 0; v < VECTORS; v++)
                        acc[a][v] += kv[v] * x;
                }
            }
            float sums[QUERY_BLOCK][BLOCK_KEYS];
            memcpy(sums, acc, sizeof sums);
            for (int a = 0; a < QUERY_BLOCK; a++) {
                const float wh = w[a * H + h];
#pragma omp simd
                for (long j = 0; j < BLOCK_KEYS; j++) {
                    const float x = sums[a][j] * scale;
                    total[a][j] += wh * (x > 0.0f ? x : 0.0f);
                }
            }
        }
        long nb = m - j0 < BLOCK_KEYS ? m - j0 : BLOCK_KEYS;
        for (int a = 0; a < QUERY_BLOCK; a++)
            memcpy(s + a * lds + j0, total[a], (size_t)nb * sizeof(float));
    }
}

/* a float's bits, mapped so that unsigned order is the floats' order; -0 counts as +0 (a head
 * weight below zero times a ReLU's 0 is -0, which torch's top-k holds equal to 0) */
static inline uint32_t ordered(float f) {
    f += 0.0f; /* -0 + 0 = +0 (not folded away: without -ffast-math the compiler keeps it) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The ordered bits of the count-th largest of v[0, n) (count <= n), and in *above how many of
 * them are larger. A radix select, 11 + 11 + 10 bits: each level counts the survivors' next
 * digit, takes the digits above the one where `count` is reached, and narrows v (in place) to
 * that digit's values, until FEW are left: those are sorted. */
#define FEW 48 /* survivors sorted outright */

static uint32_t kth_largest(uint32_t *v, long n, long count, long *above) {
    static const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
    uint32_t value = 0;
    long need = count, larger = 0;
    for (int level = 0; level < 3; level++) {
        if (n <= FEW) { /* few left (the usual case after a level): sorted, not counted in 2048 bins */
            for (long c = 1; c < n; c++) {
                const uint32_t x = v[c];
                long d = c;
                for (; d > 0 && v[d - 1] < x; d--)
                    v[d] = v[d - 1];
                v[d] = x;
            }
            const uint32_t kth = v[need - 1];
            for (long c = 0; c < n && v[c] > kth; c++)
                larger++;
            *above = larger;
            return kth;
        }
        const int shift = shifts[level];
        const uint32_t mask = (1u << widths[level]) - 1;
        uint32_t hist[2048]; /* counts below 2^32: a row has fewer positions */
        memset(hist, 0, (mask + 1) * sizeof *hist);
        for (long c = 0; c < n; c++)
            hist[(v[c] >> shift) & mask]++;
        long b = (long)mask, acc = 0;
        for (; b > 0 && acc + hist[b] < need; b--)
            acc += hist[b];
        larger += acc;
        need -= acc;
        long kept = 0;
        for (long c = 0; c < n; c++) { /* branch-free: a branch here mispredicted half the time */
            const uint32_t x = v[c];
            v[kept] = x;
            kept += ((x >> shift) & mask) == (uint32_t)b;
        }
        n = kept;
        value |= (uint32_t)b << shift;
    }
    *above = larger;
    return value;
}

/* The indices of the scores s[0, m) whose ordered bits are at least `floor`, in order, into cand
 * (m entries); how many. AVX-512: 16 scores a step, their indices packed by a compress into a
 * register (to memory, a compress is microcoded on AMD's Zen 4) and stored whole (cand has room:
 * a step's store ends by its scores' end). */
static long at_least(const float *s, long m, uint32_t floor, uint32_t *cand) {
    long nc = 0, i = 0;
#ifdef __AVX512F__
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u), ones = _mm512_set1_epi32(-1);
    const __m512i bound = _mm512_set1_epi32((int)floor), step = _mm512_set1_epi32(16);
    __m512i index = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 zero = _mm512_setzero_ps();
    for (; i + 16 <= m; i += 16) {
        /* + 0: -0 becomes +0, as in `ordered` */
        const __m512i u = _mm512_castps_si512(_mm512_add_ps(_mm512_loadu_ps(s + i), zero));
        const __mmask16 negative = _mm512_test_epi32_mask(u, sign);
        const __m512i bits = _mm512_mask_xor_epi32(_mm512_or_si512(u, sign), negative, u, ones);
        const __mmask16 keep = _mm512_cmpge_epu32_mask(bits, bound);
        _mm512_storeu_si512((void *)(cand + nc), _mm512_maskz_compress_epi32(keep, index));
        nc += __builtin_popcount(keep);
        index = _mm512_add_epi32(index, step);
    }
#endif
    for (; i < m; i++) { /* branch-free: the index is written, kept when it passes */
        cand[nc] = (uint32_t)i;
        nc += ordered(s[i]) >= floor;
    }
    return nc;
}

#define SAMPLE_STRIDE 8 /* one score in 8 estimates where the top `count` begins */

/* The indices of the `count` largest of s[0, m) (count < m), in increasing order, into out;
 * equal scores at the boundary: the first. Returns 1 where that was a choice (more scores equal
 * to the count-th largest than places left for them): torch's top-k, the reference, breaks such
 * a tie by where its selection algorithm happens to leave the equal entries, which no rule here
 * reproduces, so the caller must not use this row (it recomputes it with torch). Where m is large against count, a sample of the
 * scores sets a floor that about 1.2 x count of them pass (one pass keeps those, in order); the
 * exact boundary is then selected among them alone, and a last pass over them writes the chosen
 * in position order. A floor too high (fewer than count pass) falls back to every position.
 * bits and cand: m entries of scratch each (positions fit 32 bits, as the scores' bits do). */
static int top_count(const float *s, long m, long count, uint32_t *bits, uint32_t *cand, long *out) {
    long nc = 0;
    const long samples = m / SAMPLE_STRIDE, rank = count / SAMPLE_STRIDE + count / (5 * SAMPLE_STRIDE) + 8;
    if (rank < samples) {
        for (long j = 0; j < samples; j++)
            bits[j] = ordered(s[j * SAMPLE_STRIDE]);
        long ignored;
        nc = at_least(s, m, kth_largest(bits, samples, rank, &ignored), cand);
    }
    if (nc < count) {
        for (long i = 0; i < m; i++)
            cand[i] = (uint32_t)i;
        nc = m;
    }
    for (long c = 0; c < nc; c++)
        bits[c] = ordered(s[cand[c]]);
    long larger;
    const uint32_t boundary = kth_largest(bits, nc, count, &larger);
    long equal = count - larger, taken = 0, ties = 0;
    for (long c = 0; c < nc; c++) { /* branch-free, the chosen packed to the front of cand */
        const uint32_t b = ordered(s[cand[c]]);
        const long tie = b == boundary, take = (b > boundary) | (tie & (equal > 0));
        cand[taken] = cand[c];
        taken += take;
        equal -= take & tie;
        ties += tie;
    }
    for (long c = 0; c < count; c++)
        out[c] = cand[c];
    return ties > count - larger; /* every score >= the floor is a candidate: all the equal ones counted */
}

/* A query with no more than `count` positions (m) keeps them all: 0..count-1 into row (those
 * past its own are filler the caller masks); true when that was the case. */
static int all_earlier(long *row, long m, long count) {
    if (m > count)
        return 0;
    for (long c = 0; c < count; c++)
        row[c] = c;
    return 1;
}

/* The lightning indexer's choice for n queries: q [n, H, D] (rotated), w [n, H] (the head
 * weights, already scaled), the keys transposed in panels kT [ldk / PANEL, D, PANEL]; query i sees positions
 * 0..positions[i] and keeps the `count` best. out [n, count]: the chosen positions in increasing
 * order; a query with fewer than `count` earlier positions lists them all, then filler after its
 * own (the caller masks positions after a query's). tied [n]: 1 where a query's boundary was a
 * tie (`top_count`), its row not to be used. */
void wecom_dsa_select(const float *q, const float *w, const float *kT, long ldk, const long *positions, long n,
                      long H, long D, long count, float scale, long *out, unsigned char *tied, int threads) {
#pragma omp parallel num_threads(threads)
    {
        float *s = malloc((size_t)QUERY_BLOCK * ldk * sizeof(float));
        float *qb = malloc((size_t)QUERY_BLOCK * H * D * sizeof(float)), *wb = malloc((size_t)QUERY_BLOCK * H * sizeof(float));
        uint32_t *bits = malloc((size_t)ldk * sizeof(uint32_t));
        uint32_t *cand = malloc((size_t)ldk * sizeof(uint32_t));
#pragma omp for schedule(dynamic, 1)
        for (long i0 = 0; i0 < n; i0 += QUERY_BLOCK) {
            /* the block's queries that keep a choice (more positions than count), scored together
             * up to the furthest one's positions (a query ignores the scores past its own) */
            long rows[QUERY_BLOCK], nr = 0, m = 0;
            for (long i = i0; i < i0 + QUERY_BLOCK && i < n; i++) {
                tied[i] = 0;
                if (all_earlier(out + i * count, positions[i] + 1, count))
                    continue;
                memcpy(qb + nr * H * D, q + i * H * D, (size_t)H * D * sizeof(float));
                memcpy(wb + nr * H, w + i * H, (size_t)H * sizeof(float));
                m = positions[i] + 1 > m ? positions[i] + 1 : m;
                rows[nr++] = i;
            }
            if (nr == 0)
                continue;
            for (long a = nr; a < QUERY_BLOCK; a++) { /* a short block: its empty places score a copy */
                memcpy(qb + a * H * D, qb, (size_t)H * D * sizeof(float));
                memcpy(wb + a * H, wb, (size_t)H * sizeof(float));
            }
            index_scores(qb, wb, kT, m, H, D, scale, s, ldk);
            for (long a = 0; a < nr; a++)
                tied[rows[a]] = (unsigned char)top_count(s + a * ldk, positions[rows[a]] + 1, count, bits, cand,
                                                         out + rows[a] * count);
        }
        free(s);
        free(qb);
        free(wb);
        free(bits);
        free(cand);
    }
}

#define LANES 16 /* heads scored together: the query is transposed, its heads padded to LANES */

/* s[j] = sum_h w[h] * relu(scale * q_h . k_j) for keys j in [lo, hi) of the row-major keys
 * [T, D] (key j in row slots[j], or j where slots is NULL): the heads along the vector
 * (qT [D, Hp], w [Hp], zeros past H), 4 keys side by side */
static void index_scores_rows(const float *qT, const float *w, const float *keys, const long *slots, long lo,
                              long hi, long Hp, long D, float scale, float *s) {
    for (long j = lo; j < hi; j += 4) {
        const float *k[4];
        for (int a = 0; a < 4; a++) {
            long key = j + a < hi ? j + a : j; /* past hi: key j again, not stored */
            k[a] = keys + (slots != NULL ? slots[key] : key) * D;
        }
        float total[4] = {0};
        for (long h0 = 0; h0 < Hp; h0 += LANES) {
            float acc[4][LANES] = {{0}};
            for (long d = 0; d < D; d++) {
                const float *q = qT + d * Hp + h0;
                for (int a = 0; a < 4; a++) {
                    const float x = k[a][d];
#pragma omp simd
                    for (int l = 0; l < LANES; l++)
                        acc[a][l] += x * q[l];
                }
            }
            for (int a = 0; a < 4; a++) {
                float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                for (int l = 0; l < LANES; l++) {
                    float x = acc[a][l] * scale;
                    sum += w[h0 + l] * (x > 0.0f ? x : 0.0f);
                }
                total[a] += sum;
            }
        }
        for (long a = 0; a < 4 && j + a < hi; a++)
            s[j + a] = total[a];
    }
}

/* The top `count` of each query's scores row (scores [n, ld], query i's first positions[i] + 1
 * entries), in position order, into out [n, count]; a query with no more than `count` of them
 * lists them all, then filler after its own position; tied [n] as `wecom_dsa_select`'s. For scores a
 * library product made. */
void wecom_dsa_top_rows(const float *scores, long ld, const long *positions, long n, long count, long *out,
                        unsigned char *tied, int threads) {
#pragma omp parallel num_threads(threads)
    {
        uint32_t *bits = malloc((size_t)ld * sizeof(uint32_t));
        uint32_t *cand = malloc((size_t)ld * sizeof(uint32_t));
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < n; i++) {
            long m = positions[i] + 1, *row = out + i * count;
            tied[i] = 0;
            if (all_earlier(row, m, count))
                continue;
            tied[i] = (unsigned char)top_count(scores + i * ld, m, count, bits, cand, row);
        }
        free(bits);
        free(cand);
    }
}

#define SPLIT_KEYS 1024 /* keys a task scores when a few queries share the threads */

/* `wecom_dsa_select` for a few queries (decode, small verifies): the keys read where the cache
 * holds them, row-major [T, D] (position p's in row slots[p] of a paged pool; slots NULL: row p),
 * each query's keys shared out among the threads. */
void wecom_dsa_select_rows(const float *q, const float *w, const float *keys, const long *slots,
                           const long *positions, long n, long H, long D, long count, float scale, long *out,
                           unsigned char *tied, int threads) {
    const long Hp = (H + LANES - 1) / LANES * LANES;
    long most = 0;
    for (long i = 0; i < n; i++)
        most = positions[i] + 1 > most ? positions[i] + 1 : most;
    float *s = malloc((size_t)most * sizeof(float)), *qT = malloc((size_t)D * Hp * sizeof(float));
    float *wp = malloc((size_t)Hp * sizeof(float));
    uint32_t *bits = malloc((size_t)most * sizeof(uint32_t));
    uint32_t *cand = malloc((size_t)most * sizeof(uint32_t));
    for (long i = 0; i < n; i++) {
        long m = positions[i] + 1, *row = out + i * count;
        tied[i] = 0;
        if (all_earlier(row, m, count))
            continue;
        for (long d = 0; d < D; d++)
            for (long h = 0; h < Hp; h++)
                qT[d * Hp + h] = h < H ? q[(i * H + h) * D + d] : 0.0f;
        for (long h = 0; h < Hp; h++)
            wp[h] = h < H ? w[i * H + h] : 0.0f;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (long lo = 0; lo < m; lo += SPLIT_KEYS)
            index_scores_rows(qT, wp, keys, slots, lo, lo + SPLIT_KEYS < m ? lo + SPLIT_KEYS : m, Hp, D, scale, s);
        tied[i] = (unsigned char)top_count(s, m, count, bits, cand, row);
    }
    free(s);
    free(qT);
    free(wp);
    free(bits);
    free(cand);
}

#define ROWS 32  /* chosen rows a step of the online softmax (32, not 16: the step's max, exponentials and
                     * rescaling over twice the rows, 0.59 -> 0.50-0.55 s for 8k queries on a 2-core AVX-512 EPYC) */
#define CHAINS 8 /* rows scored side by side: 8 independent sums keep the FMA units busy */
#define VHEADS 4 /* heads a pass of the values: 4 x SPAN sums in registers */
#define SPAN 64  /* values of the rank a pass holds */

/* Per-thread scratch of the attention: the query transposed qT [W, Hp] (Hp: heads padded to
 * `attend_heads`, zeros), a step's scores s [ROWS, Hp], the running max m [Hp] and sum l [Hp] of each
 * head's softmax, its correction and the step's max [Hp], the chosen rows [k] (pointers into the
 * cache). */
typedef struct {
    float *qT, *s, *m, *l, *corr, *top;
    const float **valid;
} attend_scratch;

/* The attention's heads padded for its vectors: to 8 for up to 8 heads (on AVX-512 machines
 * whose FMA units are 256 bits wide, e.g. AMD's Zen 4, an 8-lane FMA costs half a 16-lane one:
 * 16 lanes for 8 heads would waste half the work), else to a multiple of LANES */
static long attend_heads(long H) {
    return H <= 8 ? 8 : (H + LANES - 1) / LANES * LANES;
}

/* s[b, h] = scale * row_b . query_h for the n (<= ROWS) rows, every head; rows read where the cache
 * holds them, CHAINS at a time against a run of L heads (L: 16, or 8 where Hp is 8) */
#define SCORE_ROWS(NAME, L)                                                                              \
    static void NAME(const attend_scratch *S, const float *const *rows, long n, long Hp, long W,         \
                     float scale) {                                                                      \
        for (long b0 = 0; b0 < n; b0 += CHAINS) {                                                        \
            const float *r[CHAINS];                                                                      \
            for (int a = 0; a < CHAINS; a++)                                                             \
                r[a] = rows[b0 + a < n ? b0 + a : b0]; /* past n: the first row again, not stored */     \
            for (long h0 = 0; h0 < Hp; h0 += L) {                                                        \
                float acc[CHAINS][L] = {{0}};                                                            \
                for (long w = 0; w < W; w++) {                                                           \
                    const float *q = S->qT + w * Hp + h0;                                                \
                    for (int a = 0; a < CHAINS; a++) {                                                   \
                        const float x = r[a][w];                                                         \
                        _Pragma("omp simd") for (int j = 0; j < L; j++) acc[a][j] += x * q[j];           \
                    }                                                                                    \
                }                                                                                        \
                for (long a = 0; a < CHAINS && b0 + a < n; a++)                                          \
                    for (int j = 0; j < L; j++)                                                          \
                        S->s[(b0 + a) * Hp + h0 + j] = acc[a][j] * scale;                                \
            }                                                                                            \
        }                                                                                                \
    }
SCORE_ROWS(score_rows16, LANES)
SCORE_ROWS(score_rows8, 8)

static void score_rows(const attend_scratch *S, const float *const *rows, long n, long Hp, long W, float scale) {
    if (Hp == 8)
        score_rows8(S, rows, n, Hp, W, scale);
    else
        score_rows16(S, rows, n, Hp, W, scale);
}

/* The step's scores become its softmax weights against the running max (raised where the step
 * holds a larger score: `corr` = exp(old max - new max) rescales what came before); every loop
 * runs along the heads, the contiguous axis */
static void softmax_step(const attend_scratch *S, long n, long Hp) {
    float *top = S->top;
    memcpy(top, S->m, (size_t)Hp * sizeof(float));
    for (long b = 0; b < n; b++)
#pragma omp simd
        for (long h = 0; h < Hp; h++)
            top[h] = S->s[b * Hp + h] > top[h] ? S->s[b * Hp + h] : top[h];
#pragma omp simd
    for (long h = 0; h < Hp; h++) {
        S->corr[h] = S->m[h] - top[h];
        S->m[h] = top[h];
    }
    for (long b = 0; b < n; b++)
#pragma omp simd
        for (long h = 0; h < Hp; h++)
            S->s[b * Hp + h] -= top[h];
    wecom_exp_shifted(S->corr, Hp, 0.0f);
    wecom_exp_shifted(S->s, n * Hp, 0.0f);
#pragma omp simd
    for (long h = 0; h < Hp; h++)
        S->l[h] *= S->corr[h];
    for (long b = 0; b < n; b++)
#pragma omp simd
        for (long h = 0; h < Hp; h++)
            S->l[h] += S->s[b * Hp + h];
}

/* out[h, :] = out[h, :] * corr[h] + sum_b p[b, h] row_b[:R] for the step's n rows, every head:
 * VHEADS heads x SPAN values in registers where they fill them, a plain loop for the rest */
static void values_step(const attend_scratch *S, const float *const *rows, long n, long Hp, long H, long R,
                        float *out) {
    long h0 = 0;
    for (; h0 + VHEADS <= H; h0 += VHEADS) {
        long r0 = 0;
        for (; r0 + SPAN <= R; r0 += SPAN) {
            float acc[VHEADS][SPAN];
            for (int j = 0; j < VHEADS; j++) {
                const float c = S->corr[h0 + j], *o = out + (h0 + j) * R + r0;
#pragma omp simd
                for (int r = 0; r < SPAN; r++)
                    acc[j][r] = o[r] * c;
            }
            for (long b = 0; b < n; b++) {
                const float *row = rows[b] + r0;
                for (int j = 0; j < VHEADS; j++) {
                    const float p = S->s[b * Hp + h0 + j];
#pragma omp simd
                    for (int r = 0; r < SPAN; r++)
                        acc[j][r] += p * row[r];
                }
            }
            for (int j = 0; j < VHEADS; j++)
                memcpy(out + (h0 + j) * R + r0, acc[j], SPAN * sizeof(float));
        }
        for (long h = h0; h < h0 + VHEADS && r0 < R; h++) /* the rank's last part */
            for (long r = r0; r < R; r++) {
                float o = out[h * R + r] * S->corr[h];
                for (long b = 0; b < n; b++)
                    o += S->s[b * Hp + h] * rows[b][r];
                out[h * R + r] = o;
            }
    }
    for (long h = h0; h < H; h++) /* the last heads */
        for (long r = 0; r < R; r++) {
            float o = out[h * R + r] * S->corr[h];
            for (long b = 0; b < n; b++)
                o += S->s[b * Hp + h] * rows[b][r];
            out[h * R + r] = o;
        }
}

/* One query's attention over a part of its chosen rows, unnormalised: query [H, W] (absorbed:
 * the latent's width W = rank R + rope), rows latents[rows[c]] (where position picked[c] is held)
 * for the k entries with picked[c] <= position; out [H, R] gets sum_c exp(score_c - m) row_c[:R] per head, m [Hp] the
 * scores' max and l [Hp] the sum of those weights. One pass over the rows, ROWS at a time, with
 * an online softmax: each row is read once, for every head. */
static void attend_part(const attend_scratch *S, const float *query, long head_stride, const float *latents,
                        const long *picked, const long *rows, long position, long k, long H, long W, long R,
                        float scale, float *out) {
    const long Hp = attend_heads(H);
    for (long w = 0; w < W; w++)
        for (long h = 0; h < Hp; h++)
            S->qT[w * Hp + h] = h < H ? query[h * head_stride + w] : 0.0f;
    long v = 0;
    for (long c = 0; c < k; c++)
        if (picked[c] <= position)
            S->valid[v++] = latents + rows[c] * W;
    for (long h = 0; h < Hp; h++)
        S->m[h] = -INFINITY, S->l[h] = 0.0f;
    memset(out, 0, (size_t)H * R * sizeof(float));
    for (long c0 = 0; c0 < v; c0 += ROWS) {
        long n = v - c0 < ROWS ? v - c0 : ROWS;
        for (long b = c0 + ROWS; b < c0 + 2 * ROWS && b < v; b++) /* the next step's rows */
            for (long w = 0; w < W; w += 16)
                __builtin_prefetch(S->valid[b] + w);
        score_rows(S, S->valid + c0, n, Hp, W, scale);
        softmax_step(S, n, Hp);
        values_step(S, S->valid + c0, n, Hp, H, R, out);
    }
}

/* out [H, R] = the softmax-weighted sum of `parts` partial results (out_p [H, R], m_p and l_p
 * [Hp] each, `attend_part`'s), each rescaled to the largest max */
static void merge_parts(const float *outs, const float *ms, const float *ls, long parts, long H, long Hp, long R,
                        float *out) {
    for (long h = 0; h < H; h++) {
        float top = -INFINITY, total = 0.0f;
        for (long p = 0; p < parts; p++)
            top = ms[p * Hp + h] > top ? ms[p * Hp + h] : top;
        float *o = out + h * R;
        memset(o, 0, (size_t)R * sizeof(float));
        for (long p = 0; p < parts; p++) {
            if (ls[p * Hp + h] == 0.0f)
                continue; /* a part with no row at or before the query */
            const float f = expf(ms[p * Hp + h] - top), *op = outs + (p * H + h) * R;
            total += f * ls[p * Hp + h];
#pragma omp simd
            for (long r = 0; r < R; r++)
                o[r] += f * op[r];
        }
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (long r = 0; r < R; r++)
            o[r] *= inv;
    }
}

/* out [H, R] /= each head's sum of weights l [Hp] (a head that saw no row: zeros) */
static void normalise(float *out, const float *l, long H, long R) {
    for (long h = 0; h < H; h++) {
        const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
#pragma omp simd
        for (long r = 0; r < R; r++)
            out[h * R + r] *= inv;
    }
}

/* out [n, H, R] = softmax over the chosen rows of (query . row * scale) . row[:R], per head:
 * query i's head h at query[i * token_stride + h * head_stride], W values (the absorbed query
 * as the layer makes it, [H, n, W], is read in place), latents [T, W], picked [n, k] the chosen
 * positions (entries after a query's position are skipped), rows [n, k] the latents' rows
 * holding them (a paged cache's slots). Each query's chosen entries are split in `parts`
 * (enough tasks for every thread where queries are few: decode), done side by side and merged;
 * with one part (a prefill) a query's sums go straight into out. */
void wecom_dsa_attend(const float *query, long token_stride, long head_stride, const float *latents,
                      const long *picked, const long *rows, const long *positions, long n, long H, long W, long R,
                      long k, float scale, float *out, int threads) {
    const long Hp = attend_heads(H);
    long parts = n >= threads ? 1 : (threads + n - 1) / n;
    parts = parts > k / (4 * ROWS) ? (k / (4 * ROWS) > 1 ? k / (4 * ROWS) : 1) : parts;
    float *outs = parts > 1 ? malloc((size_t)n * parts * H * R * sizeof(float)) : out;
    float *ms = malloc((size_t)n * parts * Hp * sizeof(float)), *ls = malloc((size_t)n * parts * Hp * sizeof(float));
#pragma omp parallel num_threads(threads)
    {
        attend_scratch S = {
            malloc((size_t)W * Hp * sizeof(float)), malloc((size_t)ROWS * Hp * sizeof(float)),
            ms, ls, malloc((size_t)Hp * sizeof(float)), malloc((size_t)Hp * sizeof(float)),
            malloc((size_t)k * sizeof(float *)),
        };
#pragma omp for schedule(dynamic, 4)
        for (long task = 0; task < n * parts; task++) {
            long i = task / parts, p = task % parts, a = k * p / parts, b = k * (p + 1) / parts;
            S.m = ms + task * Hp, S.l = ls + task * Hp;
            attend_part(&S, query + i * token_stride, head_stride, latents, picked + i * k + a, rows + i * k + a,
                        positions[i], b - a, H, W, R, scale, outs + task * H * R);
            if (parts == 1)
                normalise(outs + task * H * R, S.l, H, R);
        }
        if (parts > 1) {
#pragma omp for schedule(static)
            for (long i = 0; i < n; i++)
                merge_parts(outs + i * parts * H * R, ms + i * parts * Hp, ls + i * parts * Hp, parts, H, Hp, R,
                            out + i * H * R);
        }
        free(S.qT);
        free(S.s);
        free(S.corr);
        free(S.top);
        free(S.valid);
    }
    if (parts > 1)
        free(outs);
    free(ms);
    free(ls);
}
