/* fp32 CPU kernels for decoding a few rows: a matrix product that reads each weight once for all
 * of them, a decoder layer's work around its attention in two calls, and a whole layer for one
 * decode row.
 *
 * The product, Y = X W^T (+ bias):
 * W is [N, K] row-major (output-major, as checkpoints store it). Each thread takes a contiguous
 * run of weight rows and reads them one after another, each row once for all the rows of X (up
 * to four at a time against it; the row stays in L1 for the next four), so a thread's loads are
 * one unbroken sequential stream. The work is bound by reading W. That one stream matters: on the
 * 2-core AVX-512 EPYC this was measured on (4 Dec 2026, all the weights of a 132M GLM-4, 2
 * threads), reading four weight rows side by side (four streams a few KB apart) took 0.92 of a
 * plain `sum`'s bandwidth at 50 GB/s and 0.87 at 80 GB/s, one row at a time 1.00 and 0.98.
 * Built by cpu_kernels.py with the compiler's -march=native, so the AVX-512 path below is taken
 * where the CPU has it and the portable loop (vectorised by the compiler) elsewhere (or with
 * -DWECOM_GEMV_PORTABLE).
 *
 * Summation order per output depends only on K and the build, never on N, the thread count or
 * the rows beside it: a row's result is the same bits in every call.
 */
#include <math.h>
#include <stddef.h>

#if defined(__AVX512F__) && !defined(WECOM_GEMV_PORTABLE)
#include <immintrin.h>
#define WECOM_AVX512 1

/* y[r * ldy] = w . x[r * ldx] for R (1-4) rows of x: per row four partial sums of 16 lanes over
 * 64-wide blocks, the 16-wide and masked tails into the first, then ((a0 + a1) + (a2 + a3)).
 * Four independent sums keep four loads of w in flight. Inlined with R a constant. */
static inline __attribute__((always_inline)) void dots(const float *w, const float *x, long ldx, float *y,
                                                       long ldy, long K, int R) {
    __m512 a[4][4];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++)
            a[r][j] = _mm512_setzero_ps();
    long k = 0;
    for (; k + 64 <= K; k += 64)
        for (int j = 0; j < 4; j++) {
            __m512 wv = _mm512_loadu_ps(w + k + 16 * j);
            for (int r = 0; r < R; r++)
                a[r][j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x + r * ldx + k + 16 * j), a[r][j]);
        }
    for (; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
        __m512 wv = _mm512_maskz_loadu_ps(m, w + k);
        for (int r = 0; r < R; r++)
            a[r][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + r * ldx + k), a[r][0]);
    }
    for (int r = 0; r < R; r++)
        y[r * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]),
                                                        _mm512_add_ps(a[r][2], a[r][3])));
}

static float row1(const float *w, const float *x, long K) {
    float y;
    dots(w, x, 0, &y, 0, K, 1);
    return y;
}

/* NAME(w, x, ldx, y, ldy, K, R): one weight row (of type T) against R rows of x, four at a time,
 * through DOTS (inlined with its row count a constant); for the fp32 and the int8 rows */
#define WEIGHT_ROW(NAME, T, DOTS)                                                                  \
    static void NAME(const T *w, const float *x, long ldx, float *y, long ldy, long K, long R) {  \
        long r = 0;                                                                                \
        for (; r + 4 <= R; r += 4)                                                                 \
            DOTS(w, x + r * ldx, ldx, y + r * ldy, ldy, K, 4);                                     \
        switch (R - r) {                                                                           \
        case 3: DOTS(w, x + r * ldx, ldx, y + r * ldy, ldy, K, 3); break;                          \
        case 2: DOTS(w, x + r * ldx, ldx, y + r * ldy, ldy, K, 2); break;                          \
        case 1: DOTS(w, x + r * ldx, ldx, y + r * ldy, ldy, K, 1); break;                          \
        }                                                                                          \
    }

WEIGHT_ROW(weight_row, float, dots)

#else /* portable: 8 partial sums per row, in a fixed order the compiler can vectorise */
#define LANES 8

static float row1(const float *restrict w, const float *restrict x, long K) {
    float acc[LANES] = {0};
    long k = 0;
    for (; k + LANES <= K; k += LANES)
        for (int j = 0; j < LANES; j++)
            acc[j] += w[k + j] * x[k + j];
    float s = 0;
    for (int j = 0; j < LANES; j++)
        s += acc[j];
    for (; k < K; k++)
        s += w[k] * x[k];
    return s;
}

static void weight_row(const float *w, const float *x, long ldx, float *y, long ldy, long K, long R) {
    for (long r = 0; r < R; r++)
        y[r * ldy] = row1(w, x + r * ldx, K);
}
#endif

/* Y[R, N] = X[R, K] W[N, K]^T (+ bias[N] when bias is not NULL), on `threads` OpenMP threads;
 * row r of X at X + r * ldx, of Y at Y + r * ldy. Each weight row is read from memory once and
 * applied to every row of X from the L1 cache: a few rows (a speculative verify, a small batch)
 * cost about what one does. */
void wecom_gemm_f32(const float *W, const float *X, long ldx, const float *bias, float *Y, long ldy,
                    long R, long N, long K, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long n = 0; n < N; n++)
        weight_row(W + n * K, X, ldx, Y + n, ldy, K, R);
    if (bias != NULL)
        for (long r = 0; r < R; r++)
            for (long n = 0; n < N; n++)
                Y[r * ldy + n] += bias[n];
}

/* ---- int8 weights (W8A16) ---------------------------------------------------------------------
 * Y = (X W^T) * scale (+ bias) for an int8 W [N, K] with one fp32 scale per output row and fp32
 * activations: the same one-stream reading of the weight rows as above, a quarter of the bytes.
 * Each 16 int8 weights widen to 16 floats in registers (sign-extend, convert) and meet X by
 * fma, so the sums are fp32 throughout (torch's `_weight_int8pack_mm` on CPU takes bf16
 * activations and a bf16 scale); the scale is applied once per output. Summation order, as for
 * fp32, depends only on K and the build.
 */
#ifdef WECOM_AVX512
static inline __m512 widen16(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }

static inline __attribute__((always_inline)) void dots_i8(const signed char *w, const float *x, long ldx,
                                                          float *y, long ldy, long K, int R) {
    __m512 a[4][4];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < 4; j++)
            a[r][j] = _mm512_setzero_ps();
    long k = 0;
    for (; k + 64 <= K; k += 64) {
        __m512i raw = _mm512_loadu_si512((const void *)(w + k));
        __m512 wv[4] = {widen16(_mm512_extracti32x4_epi32(raw, 0)), widen16(_mm512_extracti32x4_epi32(raw, 1)),
                        widen16(_mm512_extracti32x4_epi32(raw, 2)), widen16(_mm512_extracti32x4_epi32(raw, 3))};
        for (int j = 0; j < 4; j++)
            for (int r = 0; r < R; r++)
                a[r][j] = _mm512_fmadd_ps(wv[j], _mm512_loadu_ps(x + r * ldx + k + 16 * j), a[r][j]);
    }
    for (; k < K; k += 16) {
        long left = K - k < 16 ? K - k : 16;
        __mmask16 m = left == 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
        signed char tail[16] = {0};
        for (long i = 0; i < left; i++)
            tail[i] = w[k + i];
        __m512 wv = widen16(_mm_loadu_si128((const __m128i *)tail));
        for (int r = 0; r < R; r++)
            a[r][0] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x + r * ldx + k), a[r][0]);
    }
    for (int r = 0; r < R; r++)
        y[r * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[r][0], a[r][1]),
                                                        _mm512_add_ps(a[r][2], a[r][3])));
}

WEIGHT_ROW(weight_row_i8, signed char, dots_i8)
#else
static void weight_row_i8(const signed char *w, const float *x, long ldx, float *y, long ldy, long K, long R) {
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * ldx;
        float acc[LANES] = {0};
        long k = 0;
        for (; k + LANES <= K; k += LANES)
            for (int j = 0; j < LANES; j++)
                acc[j] += (float)w[k + j] * xr[k + j];
        float s = 0;
        for (int j = 0; j < LANES; j++)
            s += acc[j];
        for (; k < K; k++)
            s += (float)w[k] * xr[k];
        y[r * ldy] = s;
    }
}
#endif

/* Y[R, N] = (X[R, K] W[N, K]^T) * scales[N] (+ bias[N] when not NULL); rows of X and Y at
 * strides ldx and ldy, on `threads` OpenMP threads. */
void wecom_gemm_i8(const signed char *W, const float *scales, const float *X, long ldx, const float *bias,
                   float *Y, long ldy, long R, long N, long K, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long n = 0; n < N; n++) {
        weight_row_i8(W + n * K, X, ldx, Y + n, ldy, K, R);
        for (long r = 0; r < R; r++)
            Y[r * ldy + n] = Y[r * ldy + n] * scales[n] + (bias != NULL ? bias[n] : 0.0f);
    }
}

/* ---- exp over arrays ---------------------------------------------------------------------------
 * A layer's SiLU (2 * intermediate values) and its attention's softmax call exp thousands of times
 * a step; libm's expf one value at a time took ~12 us a layer of the 132M GLM-4, serial, while
 * the other thread waited. The AVX-512 path evaluates 16 at a time: exp(x) = 2^n exp(r) with
 * x = n ln2 + r, |r| <= ln2 / 2, exp(r) = 1 + r + r^2 P(r) with P Cephes' degree-5 minimax
 * polynomial for expf (about 1 ulp), 2^n applied by scalef (which also gives 0 and inf past the
 * range). Elsewhere expf.
 */
#ifdef WECOM_AVX512
static inline __m512 exp16(__m512 x) {
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    /* past these exp is inf or 0 in fp32 (and +-inf would make r NaN); min/max return their second
     * operand when one is NaN, so a NaN passes through */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_lo, _mm512_fnmadd_ps(n, ln2_hi, x));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
#endif

/* s[i] = exp(s[i] - top) for n values; returns their sum */
static float exp_shifted(float *s, long n, float top) {
    long i = 0;
    float total = 0;
#ifdef WECOM_AVX512
    __m512 acc = _mm512_setzero_ps(), t = _mm512_set1_ps(top);
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), t)));
        _mm512_mask_storeu_ps(s + i, m, e);
        acc = _mm512_add_ps(acc, e);
    }
    total = _mm512_reduce_add_ps(acc);
#endif
    for (; i < n; i++)
        total += s[i] = expf(s[i] - top);
    return total;
}

/* the exponentials above, for dsa_kernels.c (built into the same library) */
float wecom_exp_shifted(float *s, long n, float top) { return exp_shifted(s, n, top); }

/* out[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i] (exported for the tests) */
void wecom_silu_mul(const float *g, const float *u, float *out, long n) {
    long i = 0;
#ifdef WECOM_AVX512
    for (; i + 16 <= n; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e)),
                                                _mm512_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++)
        out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* ---- a decoder layer around its attention ---------------------------------------------------
 * At one row a layer is ~45 small torch ops besides its four matmuls, each a few microseconds of
 * dispatch and Python, on caches the weight streams just emptied. These two calls do everything
 * but the attention itself (which needs the cache, and stays in Python for several rows):
 *   pre:  x = rmsnorm(h) ; p = W_qkv x (+ b) ; rotary on the q and k heads of p ; |h|
 *   post: o = W_o a ; [o = rmsnorm(o)] ; h2 = h + o ; x = rmsnorm(h2) ; g = W_gu x ;
 *         m = W_down (silu(g[:I]) * g[I:]) ; [m = rmsnorm(m)] ; out = h2 + m
 * the bracketed norms being GLM-4's sandwich norms. Same formulas as the torch layers
 * (inference/layers/norm.py, rotary.py, activation.py), in fp32; each of the four matrices is
 * fp32 or int8 with per-row scales (W8A16: `wecom_gemm_i8`).
 */
typedef struct {
    long hidden, heads, kv_heads, head_dim, rotary_dim, intermediate, proj_rows;
    float eps;
    int threads;
    const float *input_norm;     /* [hidden] */
    const void *proj;            /* [proj_rows, hidden]: q, k, v heads (then router rows) */
    const float *proj_bias;      /* [proj_rows] or NULL */
    const void *o_proj;          /* [hidden, heads * head_dim] */
    const float *post_attn_norm; /* [hidden] or NULL */
    const float *pre_mlp_norm;   /* [hidden] */
    const void *gate_up;         /* [2 * intermediate, hidden] */
    const void *down;            /* [hidden, intermediate] */
    const float *post_mlp_norm;  /* [hidden] or NULL */
    int routed;                  /* the projection's rows after q/k/v start with the router's 3 logits */
    float route_threshold;       /* routed: a path whose weight is below it is dropped */
    /* per matrix: NULL for fp32 weights, or the fp32 scales [rows] of int8 (W8A16) weights */
    const float *proj_scale, *o_proj_scale, *gate_up_scale, *down_scale;
} wecom_layer;

/* Y = X W^T (+ bias) for fp32 W (scale NULL) or int8 W with one scale per row */
static void product(const void *W, const float *scale, const float *X, long ldx, const float *bias, float *Y,
                    long ldy, long R, long N, long K, int threads) {
    if (scale != NULL)
        wecom_gemm_i8((const signed char *)W, scale, X, ldx, bias, Y, ldy, R, N, K, threads);
    else
        wecom_gemm_f32((const float *)W, X, ldx, bias, Y, ldy, R, N, K, threads);
}

static float sum_squares(const float *x, long n) {
    float acc[8] = {0};
    long i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += x[i + j] * x[i + j];
    float s = 0;
    for (int j = 0; j < 8; j++)
        s += acc[j];
    for (; i < n; i++)
        s += x[i] * x[i];
    return s;
}

/* out = x / sqrt(mean(x^2) + eps) * w; returns sum(x^2) */
static float rmsnorm(const float *x, const float *w, float eps, long n, float *out) {
    float ss = sum_squares(x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (long i = 0; i < n; i++)
        out[i] = x[i] * r * w[i];
    return ss;
}

/* R rows. h: [R, hidden]; rotations: [R, rotary_dim / 2] (cos, sin) pairs; proj_out:
 * [R, proj_rows]; x_scratch: [R, hidden]; norm_out: [R] |h| (the key-node election's norm), or NULL */
void wecom_layer_pre(const wecom_layer *L, long R, const float *h, const float *rotations, float *proj_out,
                     float *x_scratch, float *norm_out) {
    long H = L->hidden, P = L->proj_rows, pairs = L->rotary_dim / 2;
    for (long r = 0; r < R; r++) {
        float ss = rmsnorm(h + r * H, L->input_norm, L->eps, H, x_scratch + r * H);
        if (norm_out != NULL)
            norm_out[r] = sqrtf(ss);
    }
    product(L->proj, L->proj_scale, x_scratch, H, L->proj_bias, proj_out, P, R, P, H, L->threads);
    for (long r = 0; r < R; r++) {
        const float *rot = rotations + r * 2 * pairs;
        for (long head = 0; head < L->heads + L->kv_heads; head++) {
            float *v = proj_out + r * P + head * L->head_dim;
            for (long i = 0; i < pairs; i++) {
                float re = v[2 * i], im = v[2 * i + 1];
                float c = rot[2 * i], s = rot[2 * i + 1];
                v[2 * i] = re * c - im * s;
                v[2 * i + 1] = re * s + im * c;
            }
        }
    }
}

/* R rows. h: [R, hidden] the layer input; attn: [R, heads * head_dim]; out: [R, hidden];
 * scratch: [R, 2 * hidden + 3 * intermediate] */
void wecom_layer_post(const wecom_layer *L, long R, const float *h, const float *attn, float *out,
                      float *scratch) {
    long H = L->hidden, I = L->intermediate, A = L->heads * L->head_dim;
    float *o = scratch, *x = o + R * H, *g = x + R * H, *act = g + R * 2 * I;
    product(L->o_proj, L->o_proj_scale, attn, A, NULL, o, H, R, H, A, L->threads);
    for (long r = 0; r < R; r++) {
        float *orow = o + r * H, *outrow = out + r * H;
        const float *hrow = h + r * H;
        if (L->post_attn_norm != NULL)
            rmsnorm(orow, L->post_attn_norm, L->eps, H, orow);
        for (long i = 0; i < H; i++)
            outrow[i] = hrow[i] + orow[i];
        rmsnorm(outrow, L->pre_mlp_norm, L->eps, H, x + r * H);
    }
    product(L->gate_up, L->gate_up_scale, x, H, NULL, g, 2 * I, R, 2 * I, H, L->threads);
    for (long r = 0; r < R; r++)
        wecom_silu_mul(g + r * 2 * I, g + r * 2 * I + I, act + r * I, I);
    product(L->down, L->down_scale, act, I, NULL, o, H, R, H, I, L->threads);
    for (long r = 0; r < R; r++) {
        float *orow = o + r * H, *outrow = out + r * H;
        if (L->post_mlp_norm != NULL)
            rmsnorm(orow, L->post_mlp_norm, L->eps, H, orow);
        for (long i = 0; i < H; i++)
            outrow[i] += orow[i];
    }
}

/* ---- the routed experts of a MoE layer, a few rows each --------------------------------------
 * GLM's MoE (inference/layers/moe.py) runs each chosen expert on its tokens' rows, sorted by
 * expert. Through torch that was two products, a SiLU and a scaling per expert, each a few
 * microseconds of dispatch: ~300 calls a layer at a batch of 16 tokens (top-8 of 64 experts).
 * `wecom_moe_experts` does every expert of a layer in one call and one OpenMP region: for each
 * expert its rows' gate/up product, then SiLU(gate) * up for every row, then each expert's down
 * product times each row's routing weight. Each expert's weights (fp32, or int8 with a scale per
 * row) are read once for all its rows; an expert's output rows are shared out among the threads
 * and the threads go on to the next expert without waiting (nowait), with one barrier between the
 * two products. Summation order per output depends only on K, as for `wecom_gemm_f32`.
 */
typedef struct {
    long experts, hidden, intermediate;
    int threads;
    const void *const *gate_up;        /* [experts] -> [2 * intermediate, hidden] */
    const float *const *gate_up_scale; /* [experts] -> [2 * intermediate] for int8 weights; NULL: fp32 */
    const void *const *down;           /* [experts] -> [hidden, intermediate] */
    const float *const *down_scale;    /* [experts] -> [hidden] for int8 weights; NULL: fp32 */
} wecom_moe;

/* y[r * ldy] = W[n] . x[r * ldx] (times scale[n] for int8) for R rows */
static inline void expert_row(const void *W, const float *scale, long n, const float *X, long ldx, float *y,
                              long ldy, long R, long K) {
    if (scale != NULL) {
        weight_row_i8((const signed char *)W + n * K, X, ldx, y, ldy, K, R);
        for (long r = 0; r < R; r++)
            y[r * ldy] *= scale[n];
    } else {
        weight_row((const float *)W + n * K, X, ldx, y, ldy, K, R);
    }
}

/* counts: [experts] rows per expert; X: [P, hidden] the rows sorted by expert (P = sum of counts);
 * weights: [P] each row's routing weight; out: [P, hidden]; scratch: [P, 3 * intermediate] */
void wecom_moe_experts(const wecom_moe *M, const long *counts, const float *X, const float *weights, float *out,
                       float *scratch) {
    long H = M->hidden, I = M->intermediate, P = 0;
    for (long e = 0; e < M->experts; e++)
        P += counts[e];
    float *g = scratch, *act = scratch + P * 2 * I;
#pragma omp parallel num_threads(M->threads)
    {
        long start = 0;
        for (long e = 0; e < M->experts; e++) {
            long c = counts[e];
            if (c == 0)
                continue;
            const float *scale = M->gate_up_scale != NULL ? M->gate_up_scale[e] : NULL;
#pragma omp for schedule(static) nowait
            for (long n = 0; n < 2 * I; n++)
                expert_row(M->gate_up[e], scale, n, X + start * H, H, g + start * 2 * I + n, 2 * I, c, H);
            start += c;
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (long r = 0; r < P; r++)
            wecom_silu_mul(g + r * 2 * I, g + r * 2 * I + I, act + r * I, I);
        start = 0;
        for (long e = 0; e < M->experts; e++) {
            long c = counts[e];
            if (c == 0)
                continue;
            const float *scale = M->down_scale != NULL ? M->down_scale[e] : NULL;
#pragma omp for schedule(static) nowait
            for (long n = 0; n < H; n++) {
                expert_row(M->down[e], scale, n, act + start * I, I, out + start * H + n, H, c, I);
                for (long r = 0; r < c; r++)
                    out[(start + r) * H + n] *= weights[start + r];
            }
            start += c;
        }
    }
}

/* ---- one decode row through a whole layer, its cache and attention included -----------------
 * Between the two calls above a single sequence's decode row spent ~25 us a layer (0.3 ms a step
 * of the 132M GLM-4) in Python and ATen: cache writes, the undo log, views, SDPA's dispatch, on
 * caches the weight streams had just emptied. `wecom_layer_decode` does the pre call, writes the row's key, value
 * and node norm into the cache (`inference/layers/caches/gqa_sequence.py`'s `LayerCache`, whose bookkeeping stays
 * in Python: it says where they go), attends, and does the post call. The attention is
 * `inference/layers/attention.py`'s for one query: one softmax over the window and the valid key
 * nodes (dense and union), or in routed mode p_local * Attn(window) + p_global * Attn(nodes) with
 * the router's softmax thresholded; a path whose weight is 0, or nodes when there are none, is
 * not computed.
 */
typedef struct {
    float *k, *v;           /* [kv_heads, slots, head_dim]: the layer's cached keys and values */
    long slots;             /* slots per kv head */
    long slot;              /* where the row's key and value go */
    float *undo_k, *undo_v; /* [kv_heads, undo_slots, head_dim]: what `slot` held is copied to
                             * undo slot `undo_slot` first; NULL: nothing is kept */
    long undo_slots, undo_slot;
    float *norm_log, *block_norm; /* where the row's node norm (|h|) is noted; NULL: nowhere */
    long local, nodes;      /* the row attends to slots [0, local) (its window, the row's own
                             * included) and [local, local + nodes) (the key nodes it sees) */
} wecom_kv_row;

/* softmax(q . K[j] * scale) . V over `keys` rows of K and V (row stride head_dim), into out */
static void attend_one(const float *q, const float *K, const float *V, long keys, long d, float *scores,
                       float *out) {
    float scale = 1.0f / sqrtf((float)d), top = -INFINITY;
    for (long j = 0; j < keys; j++) {
        scores[j] = row1(K + j * d, q, d) * scale;
        top = scores[j] > top ? scores[j] : top;
    }
    float total = exp_shifted(scores, keys, top);
    for (long i = 0; i < d; i++)
        out[i] = 0;
    for (long j = 0; j < keys; j++) {
        const float *vrow = V + j * d;
        for (long i = 0; i < d; i++)
            out[i] += scores[j] * vrow[i];
    }
    for (long i = 0; i < d; i++)
        out[i] /= total;
}

/* (p_local, p_global) of softmax(logits[0..2]), each zeroed below the threshold */
static void route(const float *logits, float threshold, float *p) {
    float top = logits[0];
    for (int i = 1; i < 3; i++)
        top = logits[i] > top ? logits[i] : top;
    float e[3], total = 0;
    for (int i = 0; i < 3; i++)
        total += e[i] = expf(logits[i] - top);
    for (int i = 0; i < 2; i++) {
        p[i] = e[i] / total;
        if (threshold > 0 && !(p[i] >= threshold))
            p[i] = 0;
    }
}

/* The row of the projection `proj` (its q, k, v heads rotated; the router's logits after them
 * when routed) with node norm `norm`: its norm noted, its key and value written into the cache
 * where `C` says (what the slot held saved in the undo log first), its query attended to the
 * window and nodes `C` names, into attn [heads * head_dim]. scores: heads * (local + nodes). */
static void append_attend(const wecom_layer *L, const wecom_kv_row *C, const float *proj, float norm,
                          float *attn, float *scores) {
    long d = L->head_dim, heads = L->heads, kv = L->kv_heads, rep = heads / kv;
    long keys = C->local + C->nodes;
    if (C->norm_log != NULL)
        *C->norm_log = norm;
    if (C->block_norm != NULL)
        *C->block_norm = norm;
    for (long g = 0; g < kv; g++) {
        float *kslot = C->k + (g * C->slots + C->slot) * d, *vslot = C->v + (g * C->slots + C->slot) * d;
        if (C->undo_k != NULL) {
            long u = (g * C->undo_slots + C->undo_slot) * d;
            for (long i = 0; i < d; i++) {
                C->undo_k[u + i] = kslot[i];
                C->undo_v[u + i] = vslot[i];
            }
        }
        const float *knew = proj + (heads + g) * d, *vnew = proj + (heads + kv + g) * d;
        for (long i = 0; i < d; i++) {
            kslot[i] = knew[i];
            vslot[i] = vnew[i];
        }
    }
    float gate[2] = {1, 0};
    if (L->routed)
        route(proj + (heads + 2 * kv) * d, L->route_threshold, gate);
#pragma omp parallel for schedule(static) num_threads(L->threads)
    for (long head = 0; head < heads; head++) {
        const float *q = proj + head * d;
        const float *K = C->k + (head / rep) * C->slots * d, *V = C->v + (head / rep) * C->slots * d;
        float *o = attn + head * d, *s = scores + head * keys;
        if (!L->routed) {
            attend_one(q, K, V, keys, d, s, o);
            continue;
        }
        float part[d];
        for (long i = 0; i < d; i++)
            o[i] = 0;
        if (gate[0] > 0) {
            attend_one(q, K, V, C->local, d, s, part);
            for (long i = 0; i < d; i++)
                o[i] += gate[0] * part[i];
        }
        if (gate[1] > 0 && C->nodes > 0) {
            attend_one(q, K + C->local * d, V + C->local * d, C->nodes, d, s, part);
            for (long i = 0; i < d; i++)
                o[i] += gate[1] * part[i];
        }
    }
}

/* One row: h [hidden] in, out [hidden]; rotation: rotary_dim / 2 (cos, sin) pairs. scratch:
 * proj_rows + hidden + heads * (head_dim + local + nodes) + 2 * hidden + 3 * intermediate floats */
void wecom_layer_decode(const wecom_layer *L, const wecom_kv_row *C, const float *h, const float *rotation,
                        float *out, float *scratch) {
    long H = L->hidden, keys = C->local + C->nodes;
    float *proj = scratch, *x = proj + L->proj_rows, *attn = x + H, *scores = attn + L->heads * L->head_dim,
          *post = scores + L->heads * keys;
    float norm;
    wecom_layer_pre(L, 1, h, rotation, proj, x, &norm);
    append_attend(L, C, proj, norm, attn, scores);
    wecom_layer_post(L, 1, h, attn, out, post);
}

/* R consecutive rows of one sequence (a speculative verify, an MTP depth catching up): the pre
 * and post calls take all R rows (each weight read once for them), and between them each row in
 * turn is appended and attends, as R one-row calls would do it; C[r] is row r's cache row.
 * h, out: [R, hidden]; rotations: [R, rotary_dim / 2] pairs. scratch: R * (proj_rows + 1 +
 * 3 * hidden + heads * head_dim + 3 * intermediate) + heads * (most keys of a row) floats */
void wecom_layer_decode_rows(const wecom_layer *L, long R, const wecom_kv_row *C, const float *h,
                             const float *rotations, float *out, float *scratch) {
    long H = L->hidden, P = L->proj_rows, A = L->heads * L->head_dim;
    float *proj = scratch, *x = proj + R * P, *norms = x + R * H, *attn = norms + R, *post = attn + R * A,
          *scores = post + R * (2 * H + 3 * L->intermediate);
    wecom_layer_pre(L, R, h, rotations, proj, x, norms);
    for (long r = 0; r < R; r++)
        append_attend(L, &C[r], proj + r * P, norms[r], attn + r * A, scores);
    wecom_layer_post(L, R, h, attn, out, post);
}

/* ---- one decode token through a whole model ---------------------------------------------------
 * The embedding row, the rotation of its position, every decoder layer (`wecom_layer_decode`,
 * each with its cache row) and the final norm in one call: nothing of Python or ATen runs between
 * the layers' weight streams (`inference/models/cpu_step.py` says why that matters). The rotation
 * is the torch model's: angle_i = (float)position * inv_freq[i], (cos, sin) of it in fp32.
 */
typedef struct {
    long layers;
    const wecom_layer *const *layer; /* [layers] */
    const float *embedding;          /* [vocab, hidden] */
    long vocab;
    const float *inv_freq;           /* [rotary_pairs] */
    long rotary_pairs;
    const float *norm;               /* [hidden]: the final norm */
    float eps;
} wecom_model;

/* out [hidden]: the final-normed hidden state of `token` at `position`; rows[i]: layer i's cache
 * row. scratch: 2 * hidden + 2 * rotary_pairs plus the most any layer's `wecom_layer_decode` takes.
 * Returns 0, or -1 (having written nothing) when the token is not in the vocabulary. */
int wecom_decode_step(const wecom_model *M, const wecom_kv_row *rows, const long long *token,
                      const long long *position, float *out, float *scratch) {
    if (*token < 0 || *token >= M->vocab)
        return -1;
    long H = M->layer[0]->hidden;
    float *bufs[2] = {scratch, scratch + H}, *rotation = scratch + 2 * H, *rest = rotation + 2 * M->rotary_pairs;
    float pos = (float)*position;
    for (long i = 0; i < M->rotary_pairs; i++) {
        float angle = pos * M->inv_freq[i];
        rotation[2 * i] = cosf(angle);
        rotation[2 * i + 1] = sinf(angle);
    }
    const float *in = M->embedding + *token * H;
    for (long i = 0; i < M->layers; i++) {
        float *dst = bufs[i % 2]; /* never the layer's own input */
        wecom_layer_decode(M->layer[i], &rows[i], in, rotation, dst, rest);
        in = dst;
    }
    rmsnorm(in, M->norm, M->eps, H, out);
    return 0;
}
