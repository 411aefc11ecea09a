/* Matrix-vector products for decode on CPU (AVX2 + FMA + F16C, OpenMP).

   y (m, rows) = x (m, cols) @ W^T for a weight W (rows, cols) held row-major as
   - float32 (matvec_f32, m = 1), or
   - GGUF blocks of 32 weights along a row, as the model file stores them:
       Q4_1: {fp16 d, fp16 min, 16 bytes of nibbles}, w = d * q + min, q in 0..15,
             element j < 16 in the low nibble of byte j, element j + 16 in its high nibble;
       Q8_0: {fp16 d, 32 int8 q}, w = d * q.
     A block's contribution is d * sum(x * q) + min * sum(x): each weight costs one
     FMA, and the per-block sums of x are computed once per call, not once per row.
   Rows of W are split statically between the threads, each streaming its own
   contiguous share; x rows go through in groups of up to 4, so each block of W is
   decoded once per group. cols is a multiple of 32 for the block formats, 8 for f32. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32
#define Q4_1_BYTES 20
#define Q8_0_BYTES 34
#define MAX_GROUP 4

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

void matvec_f32(const float* W, const float* x, float* y, int64_t rows, int64_t cols, int num_threads) {
  int64_t num_blocks = (rows + 3) / 4;
  #pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t block = 0; block < num_blocks; block++) {
    int64_t r = block * 4;
    const float* w = W + r * cols;
    if (rows - r >= 4) {
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
      __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
      for (int64_t c = 0; c < cols; c += 8) {
        __m256 xv = _mm256_loadu_ps(x + c);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + c), xv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + cols + c), xv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * cols + c), xv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * cols + c), xv, a3);
      }
      y[r] = hsum8(a0);
      y[r + 1] = hsum8(a1);
      y[r + 2] = hsum8(a2);
      y[r + 3] = hsum8(a3);
    } else {
      for (int64_t k = 0; r + k < rows; k++) {
        __m256 a = _mm256_setzero_ps();
        for (int64_t c = 0; c < cols; c += 8)
          a = _mm256_fmadd_ps(_mm256_loadu_ps(w + k * cols + c), _mm256_loadu_ps(x + c), a);
        y[r + k] = hsum8(a);
      }
    }
  }
}

/* The 32 quantized values of a block as four vectors of 8 floats, in element order. */
static inline void decode_q4_1(const uint8_t* block, __m256 q[4]) {
  const __m128i nibble = _mm_set1_epi8(0x0F);
  __m128i bytes = _mm_loadu_si128((const __m128i*)(block + 4));
  __m128i lo = _mm_and_si128(bytes, nibble);
  __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble);
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}

static inline void decode_q8_0(const uint8_t* block, __m256 q[4]) {
  for (int k = 0; k < 4; k++) {
    __m128i bytes = _mm_loadl_epi64((const __m128i*)(block + 2 + 8 * k));
    q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  }
}

/* One weight row against a group of m <= MAX_GROUP x rows. xsum (m, cols / 32).
   Always inlined with a constant m (see row_dispatch), so the accumulators live in
   registers: with a runtime m they went through memory, and each block waited on a
   store-to-load round trip (measured: 2x slower). */
static inline __attribute__((always_inline)) void row_q4_1(const uint8_t* row, const float* x, const float* xsum, float* out,
                            int64_t m, int64_t cols, int64_t rows_stride_out) {
  int64_t num_blocks = cols / BLOCK;
  __m256 acc[MAX_GROUP];
  float min_acc[MAX_GROUP];
  for (int64_t i = 0; i < m; i++) { acc[i] = _mm256_setzero_ps(); min_acc[i] = 0.0f; }
  for (int64_t b = 0; b < num_blocks; b++) {
    const uint8_t* block = row + b * Q4_1_BYTES;
    __m256 q[4];
    decode_q4_1(block, q);
    __m256 d = _mm256_set1_ps(half_to_float(block));
    float min = half_to_float(block + 2);
    for (int64_t i = 0; i < m; i++) {
      const float* xb = x + i * cols + b * BLOCK;
      __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
      t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), t);
      t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), t);
      t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), t);
      acc[i] = _mm256_fmadd_ps(d, t, acc[i]);
      min_acc[i] += min * xsum[i * num_blocks + b];
    }
  }
  for (int64_t i = 0; i < m; i++) out[i * rows_stride_out] = hsum8(acc[i]) + min_acc[i];
}

static inline __attribute__((always_inline)) void row_q8_0(const uint8_t* row, const float* x, float* out,
                            int64_t m, int64_t cols, int64_t rows_stride_out) {
  int64_t num_blocks = cols / BLOCK;
  __m256 acc[MAX_GROUP];
  for (int64_t i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < num_blocks; b++) {
    const uint8_t* block = row + b * Q8_0_BYTES;
    __m256 q[4];
    decode_q8_0(block, q);
    __m256 d = _mm256_set1_ps(half_to_float(block));
    for (int64_t i = 0; i < m; i++) {
      const float* xb = x + i * cols + b * BLOCK;
      __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xb));
      t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xb + 8), t);
      t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xb + 16), t);
      t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xb + 24), t);
      acc[i] = _mm256_fmadd_ps(d, t, acc[i]);
    }
  }
  for (int64_t i = 0; i < m; i++) out[i * rows_stride_out] = hsum8(acc[i]);
}

#define ROW_CASE(M)                                                        \
  case M:                                                                  \
    if (format == 0) row_q4_1(row, x, xsum, out, M, cols, rows_stride_out); \
    else row_q8_0(row, x, out, M, cols, rows_stride_out);                  \
    break;

static void row_dispatch(int format, int64_t m, const uint8_t* row, const float* x, const float* xsum,
                         float* out, int64_t cols, int64_t rows_stride_out) {
  switch (m) { ROW_CASE(1) ROW_CASE(2) ROW_CASE(3) ROW_CASE(4) }
}

/* format: 0 = Q4_1, 1 = Q8_0. W (rows, cols / 32 blocks), x (m, cols), y (m, rows). */
void matmul_blocks(int format, const uint8_t* W, const float* x, float* y,
                   int64_t m, int64_t rows, int64_t cols, int num_threads) {
  int64_t num_blocks = cols / BLOCK;
  int64_t row_bytes = num_blocks * (format == 0 ? Q4_1_BYTES : Q8_0_BYTES);
  float* xsum = NULL;
  if (format == 0) {
    xsum = (float*)malloc(sizeof(float) * m * num_blocks);
    for (int64_t i = 0; i < m * num_blocks; i++) {
      const float* xb = x + i * BLOCK;  /* rows of x are whole numbers of blocks */
      __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                               _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
      xsum[i] = hsum8(s);
    }
  }
  for (int64_t first = 0; first < m; first += MAX_GROUP) {
    int64_t group = m - first < MAX_GROUP ? m - first : MAX_GROUP;
    const float* xg = x + first * cols;
    float* yg = y + first * rows;
    const float* xsum_g = format == 0 ? xsum + first * num_blocks : NULL;
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++)
      row_dispatch(format, group, W + r * row_bytes, xg, xsum_g, yg + r, cols, rows);
  }
  free(xsum);
}
