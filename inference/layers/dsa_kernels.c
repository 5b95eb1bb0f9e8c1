/* DeepSeek Sparse Attention (GLM-5) on the CPU, fp32: the lightning indexer's scores and top-k,
 * and the attention over each query's chosen latent rows, one OpenMP region a call.
 *
 * With torch ops a long prefill was slower sparse than dense (0.1-0.2x dense MLA at 16k-32k on a
 * 2-core AVX-512 EPYC, 4 Dec 2026): the indexer wrote a [queries x heads, positions] score tensor
 * and read it back, torch's topk sorted 2048 of up to 32k per query, and the attention gathered
 * every query's 2048 latent rows into a fresh tensor before two small matrix products. Here a
 * query's index scores stay in one buffer of its positions (a block of 64 or 128 keys against every
 * head in registers), the top-k keeps the scores over a floor a sample of them sets (one pass) and
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
#include <stdlib.h>
#include <string.h>

float wecom_exp_shifted(float *s, long n, float top);

/* keys scored together: 8 vectors of sums in registers per head, so that the FMAs do not wait
 * on each other (AVX-512: 128 keys, 1.5x the indexer of 64 on a 2-core AVX-512 EPYC; AVX2's 16
 * registers hold 64) */
#ifdef __AVX512F__
#define KEY_BLOCK 128
#else
#define KEY_BLOCK 64
#endif

/* Keys a panel of the transposed keys, kT [panels, D, PANEL]: a block's D rows lie side by side.
 * (Transposed whole, [D, T], the rows a block reads were T floats apart: at a power-of-two T
 * such as 32k every one of them fell in the same L1 set, and the indexer ran at a fifth of the
 * FMA units' rate.) */
#define PANEL 128
_Static_assert(PANEL % KEY_BLOCK == 0, "a block of keys lies within one panel");

/* s[j] = sum_h w[h] * relu(scale * q[h] . k_j) for keys j in [0, m); the keys transposed in
 * panels, kT [panels, D, PANEL] (zeros past the last key) */
static void index_scores(const float *q, const float *w, const float *kT, long m, long H, long D, float scale,
                         float *s) {
    for (long j0 = 0; j0 < m; j0 += KEY_BLOCK) {
        const float *panel = kT + (j0 / PANEL) * D * PANEL + j0 % PANEL;
        float total[KEY_BLOCK] = {0};
        for (long h = 0; h < H; h++) {
            float acc[KEY_BLOCK] = {0};
            const float *qh = q + h * D;
            for (long d = 0; d < D; d++) {
                const float qd = qh[d];
                const float *k = panel + d * PANEL;
#pragma omp simd
                for (long j = 0; j < KEY_BLOCK; j++)
                    acc[j] += qd * k[j];
            }
            const float wh = w[h];
#pragma omp simd
            for (long j = 0; j < KEY_BLOCK; j++) {
                float a = acc[j] * scale;
                total[j] += wh * (a > 0.0f ? a : 0.0f);
            }
        }
        long nb = m - j0 < KEY_BLOCK ? m - j0 : KEY_BLOCK;
        memcpy(s + j0, total, (size_t)nb * sizeof(float));
    }
}

/* a float's bits, mapped so that unsigned order is the floats' order */
static inline uint32_t ordered(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* The ordered bits of the count-th largest of v[0, n) (count <= n), and in *above how many of
 * them are larger. A radix select, 11 + 11 + 10 bits: each level counts the survivors' next
 * digit, takes the digits above the one where `count` is reached, and narrows v (in place) to
 * that digit's values. */
static uint32_t kth_largest(uint32_t *v, long n, long count, long *above) {
    static const int shifts[3] = {21, 10, 0}, widths[3] = {11, 11, 10};
    uint32_t value = 0;
    long need = count, larger = 0;
    for (int level = 0; level < 3; level++) {
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
        for (long c = 0; c < n; c++)
            if (((v[c] >> shift) & mask) == (uint32_t)b)
                v[kept++] = v[c];
        n = kept;
        value |= (uint32_t)b << shift;
    }
    *above = larger;
    return value;
}

#define SAMPLE_STRIDE 8 /* one score in 8 estimates where the top `count` begins */

/* The indices of the `count` largest of s[0, m) (count < m), in increasing order, into out;
 * equal scores at the boundary: the first. Where m is large against count, a sample of the
 * scores sets a floor that about 1.2 x count of them pass (one pass keeps those, in order); the
 * exact boundary is then selected among them alone, and a last pass over them writes the chosen
 * in position order. A floor too high (fewer than count pass) falls back to every position.
 * bits and cand: m entries of scratch each (positions fit 32 bits, as the scores' bits do). */
static void top_count(const float *s, long m, long count, uint32_t *bits, uint32_t *cand, long *out) {
    long nc = 0;
    const long samples = m / SAMPLE_STRIDE, rank = count / SAMPLE_STRIDE + count / (5 * SAMPLE_STRIDE) + 8;
    if (rank < samples) {
        for (long j = 0; j < samples; j++)
            bits[j] = ordered(s[j * SAMPLE_STRIDE]);
        long ignored;
        const uint32_t floor = kth_largest(bits, samples, rank, &ignored);
        for (long i = 0; i < m; i++) { /* branch-free: the index is written, kept when it passes */
            cand[nc] = (uint32_t)i;
            nc += ordered(s[i]) >= floor;
        }
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
    long equal = count - larger, taken = 0;
    for (long c = 0; c < nc; c++) {
        const uint32_t b = ordered(s[cand[c]]);
        if (b > boundary || (b == boundary && equal > 0)) {
            equal -= b == boundary;
            out[taken++] = cand[c];
        }
    }
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
 * own (the caller masks positions after a query's). */
void wecom_dsa_select(const float *q, const float *w, const float *kT, long ldk, const long *positions, long n,
                      long H, long D, long count, float scale, long *out, int threads) {
#pragma omp parallel num_threads(threads)
    {
        float *s = malloc((size_t)ldk * sizeof(float));
        uint32_t *bits = malloc((size_t)ldk * sizeof(uint32_t));
        uint32_t *cand = malloc((size_t)ldk * sizeof(uint32_t));
#pragma omp for schedule(dynamic, 4)
        for (long i = 0; i < n; i++) {
            long m = positions[i] + 1, *row = out + i * count;
            if (all_earlier(row, m, count))
                continue;
            index_scores(q + i * H * D, w + i * H, kT, m, H, D, scale, s);
            top_count(s, m, count, bits, cand, row);
        }
        free(s);
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
 * lists them all, then filler after its own position. For scores a library product made. */
void wecom_dsa_top_rows(const float *scores, long ld, const long *positions, long n, long count, long *out,
                        int threads) {
#pragma omp parallel num_threads(threads)
    {
        uint32_t *bits = malloc((size_t)ld * sizeof(uint32_t));
        uint32_t *cand = malloc((size_t)ld * sizeof(uint32_t));
#pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < n; i++) {
            long m = positions[i] + 1, *row = out + i * count;
            if (all_earlier(row, m, count))
                continue;
            top_count(scores + i * ld, m, count, bits, cand, row);
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
                           int threads) {
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
        top_count(s, m, count, bits, cand, row);
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
