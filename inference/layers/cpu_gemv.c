/* fp32 matrix-vector product for batch-1 decode on CPU: y = W x (+ bias).
 *
 * W is [N, K] row-major (output-major, as checkpoints store it). Each thread takes a contiguous
 * run of rows, so it streams one unbroken stretch of memory, four rows at a time against the
 * same x (which stays in L1). The work is bound by reading W; nothing here is clever beyond
 * keeping the loads sequential and the thread split even. Built by cpu_gemv.py with the
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

/* y[N] = W[N, K] x[K] (+ bias[N] when bias is not NULL), on `threads` OpenMP threads. */
void wecom_gemv_f32(const float *W, const float *x, const float *bias, float *y, long N, long K,
                    int threads) {
    long groups = N / 4;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long g = 0; g < groups; g++)
        rows4(W + 4 * g * K, x, y + 4 * g, K);
    for (long n = 4 * groups; n < N; n++)
        y[n] = row1(W + n * K, x, K);
    if (bias != NULL)
        for (long n = 0; n < N; n++)
            y[n] += bias[n];
}
