/* fp32 CPU kernels for decoding a few rows: a matrix product that reads each weight once for all
 * of them, and a decoder layer's work around its attention in two calls.
 *
 * The product, Y = X W^T (+ bias):
 * W is [N, K] row-major (output-major, as checkpoints store it). Each thread takes a contiguous
 * run of rows, so it streams one unbroken stretch of memory, four rows at a time against the
 * same x (which stays in L1). The work is bound by reading W; nothing here is clever beyond
 * keeping the loads sequential and the thread split even. Built by cpu_kernels.py with the
 * compiler's -march=native, so the AVX-512 path below is taken where the CPU has it and the
 * portable loop (vectorised by the compiler) elsewhere (or with -DWECOM_GEMV_PORTABLE).
 *
 * Summation order per row depends only on K and the build, never on N, the thread count or the
 * rows beside it: a row's result is the same bits in every call.
 */
#include <stddef.h>

#if defined(__AVX512F__) && !defined(WECOM_GEMV_PORTABLE)
#include <immintrin.h>

static void rows4(const float *w, const float *x, float *y, long K) {
    const float *w0 = w, *w1 = w + K, *w2 = w + 2 * K, *w3 = w + 3 * K;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    long k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 xv = _mm512_loadu_ps(x + k);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + k), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + k), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + k), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + k), xv, a3);
    }
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
        a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w0 + k), xv, a0);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w1 + k), xv, a1);
        a2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w2 + k), xv, a2);
        a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w3 + k), xv, a3);
    }
    y[0] = _mm512_reduce_add_ps(a0);
    y[1] = _mm512_reduce_add_ps(a1);
    y[2] = _mm512_reduce_add_ps(a2);
    y[3] = _mm512_reduce_add_ps(a3);
}

static float row1(const float *w, const float *x, long K) {
    __m512 a = _mm512_setzero_ps();
    long k = 0;
    for (; k + 16 <= K; k += 16)
        a = _mm512_fmadd_ps(_mm512_loadu_ps(w + k), _mm512_loadu_ps(x + k), a);
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1);
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + k), _mm512_maskz_loadu_ps(m, x + k), a);
    }
    return _mm512_reduce_add_ps(a);
}

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

static void rows4(const float *w, const float *x, float *y, long K) {
    for (int r = 0; r < 4; r++)
        y[r] = row1(w + r * K, x, K);
}
#endif

/* Y[R, N] = X[R, K] W[N, K]^T (+ bias[N] when bias is not NULL), on `threads` OpenMP threads;
 * row r of X at X + r * ldx, of Y at Y + r * ldy. Each group of four weight rows is read from
 * memory once and applied to every row of X from the L1 cache: a few rows (a speculative
 * verify, a small batch) cost about what one does. */
void wecom_gemm_f32(const float *W, const float *X, long ldx, const float *bias, float *Y, long ldy,
                    long R, long N, long K, int threads) {
    long groups = N / 4;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long g = 0; g < groups; g++)
        for (long r = 0; r < R; r++)
            rows4(W + 4 * g * K, X + r * ldx, Y + r * ldy + 4 * g, K);
    for (long n = 4 * groups; n < N; n++)
        for (long r = 0; r < R; r++)
            Y[r * ldy + n] = row1(W + n * K, X + r * ldx, K);
    if (bias != NULL)
        for (long r = 0; r < R; r++)
            for (long n = 0; n < N; n++)
                Y[r * ldy + n] += bias[n];
}

/* ---- a decoder layer around its attention ---------------------------------------------------
 * At one row a layer is ~45 small torch ops besides its four matmuls, each a few microseconds of
 * dispatch and Python, on caches the weight streams just emptied. These two calls do everything
 * but the attention itself (which needs the cache, and stays in Python):
 *   pre:  x = rmsnorm(h) ; p = W_qkv x (+ b) ; rotary on the q and k heads of p ; |h|
 *   post: o = W_o a ; [o = rmsnorm(o)] ; h2 = h + o ; x = rmsnorm(h2) ; g = W_gu x ;
 *         m = W_down (silu(g[:I]) * g[I:]) ; [m = rmsnorm(m)] ; out = h2 + m
 * the bracketed norms being GLM-4's sandwich norms. Same formulas as the torch layers
 * (inference/layers/norm.py, rotary.py, activation.py), in fp32.
 */
#include <math.h>

typedef struct {
    long hidden, heads, kv_heads, head_dim, rotary_dim, intermediate, proj_rows;
    float eps;
    int threads;
    const float *input_norm;     /* [hidden] */
    const float *proj, *proj_bias; /* [proj_rows, hidden]: q, k, v heads (then router rows); bias or NULL */
    const float *o_proj;         /* [hidden, heads * head_dim] */
    const float *post_attn_norm; /* [hidden] or NULL */
    const float *pre_mlp_norm;   /* [hidden] */
    const float *gate_up;        /* [2 * intermediate, hidden] */
    const float *down;           /* [hidden, intermediate] */
    const float *post_mlp_norm;  /* [hidden] or NULL */
} wecom_layer;

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
    wecom_gemm_f32(L->proj, x_scratch, H, L->proj_bias, proj_out, P, R, P, H, L->threads);
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
    wecom_gemm_f32(L->o_proj, attn, A, NULL, o, H, R, H, A, L->threads);
    for (long r = 0; r < R; r++) {
        float *orow = o + r * H, *outrow = out + r * H;
        const float *hrow = h + r * H;
        if (L->post_attn_norm != NULL)
            rmsnorm(orow, L->post_attn_norm, L->eps, H, orow);
        for (long i = 0; i < H; i++)
            outrow[i] = hrow[i] + orow[i];
        rmsnorm(outrow, L->pre_mlp_norm, L->eps, H, x + r * H);
    }
    wecom_gemm_f32(L->gate_up, x, H, NULL, g, 2 * I, R, 2 * I, H, L->threads);
    for (long r = 0; r < R; r++) {
        const float *grow = g + r * 2 * I;
        float *arow = act + r * I;
        for (long i = 0; i < I; i++)
            arow[i] = grow[i] / (1.0f + expf(-grow[i])) * grow[I + i];
    }
    wecom_gemm_f32(L->down, act, I, NULL, o, H, R, H, I, L->threads);
    for (long r = 0; r < R; r++) {
        float *orow = o + r * H, *outrow = out + r * H;
        if (L->post_mlp_norm != NULL)
            rmsnorm(orow, L->post_mlp_norm, L->eps, H, orow);
        for (long i = 0; i < H; i++)
            outrow[i] += orow[i];
    }
}
