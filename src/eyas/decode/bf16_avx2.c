/* y = x @ w.T for bf16 weights w [N, K] (raw bits), fp32 rows x [M, K] and y [M, N]; K % 8 == 0.
 *
 * Every weight row is streamed once from memory, widened to fp32 in registers (bf16 is the top half
 * of an fp32) and multiplied with up to 6 input rows at a time, 16 lanes per step in two fp32 sums.
 * y[m, n] is the same sum in the same order whatever M is and wherever row m sits: a verify's
 * products give each token exactly what a step over that token alone gives.
 * Built by eyas.decode.bf16_kernel with -O3 -mavx2 -mfma -fopenmp; the loop over weight rows is
 * split over OpenMP threads (torch's runtime, so torch.set_num_threads applies). */
#include <immintrin.h>
#include <stdint.h>

#define INLINE static inline __attribute__((always_inline))
#define MAX_ROWS 6 /* input rows per pass: 12 accumulators + two weight vectors in 16 registers */
#define CHUNK 64   /* weight rows per OpenMP work item */

INLINE __m256 load_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[m0 .. m0+rows, n] for one weight row n; `rows` is a constant where inlined, so acc stays in registers.
 * Each row sums into two accumulators (lanes of k mod 16 < 8, and the rest), added at the end: two
 * independent FMA chains per row keep the FMA units busy where one chain would wait on its latency. */
INLINE void dot_rows(const float *x, int64_t K, const uint16_t *w, int64_t N, float *y, int64_t n, int64_t m0,
                     const int rows) {
    __m256 acc0[MAX_ROWS], acc1[MAX_ROWS];
    _Pragma("GCC unroll 8") for (int i = 0; i < rows; i++) acc0[i] = acc1[i] = _mm256_setzero_ps();
    const uint16_t *wn = w + n * K;
    const float *xm = x + m0 * K;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 w0 = load_bf16(wn + k), w1 = load_bf16(wn + k + 8);
        _Pragma("GCC unroll 8") for (int i = 0; i < rows; i++) {
            acc0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xm + i * K + k), acc0[i]);
            acc1[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xm + i * K + k + 8), acc1[i]);
        }
    }
    if (k < K) { /* K % 16 == 8: the last 8 lanes */
        __m256 w0 = load_bf16(wn + k);
        _Pragma("GCC unroll 8") for (int i = 0; i < rows; i++)
            acc0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xm + i * K + k), acc0[i]);
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < rows; i++) y[(m0 + i) * N + n] = hsum(_mm256_add_ps(acc0[i], acc1[i]));
}

#define ROWS_CASE(R) case R: for (int64_t n = lo; n < hi; n++) dot_rows(x, K, w, N, y, n, m0, R); break;

void bf16_weight_mm(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, float *y) {
    const int64_t passes = (M + MAX_ROWS - 1) / MAX_ROWS;
    #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < (N + CHUNK - 1) / CHUNK; c++) {
        const int64_t lo = c * CHUNK, hi = lo + CHUNK < N ? lo + CHUNK : N;
        for (int64_t p = 0, m0 = 0; p < passes; p++) { /* M split into near-equal passes of <= MAX_ROWS rows */
            const int64_t rows = (M - m0 + passes - p - 1) / (passes - p);
            switch (rows) { ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6) }
            m0 += rows;
        }
    }
}
