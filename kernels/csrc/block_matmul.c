/* Products and row dequantization over weights held in block formats (block_decode.h; the
   table of formats is kernels/block_formats.py). Built twice by kernels/native_build.py: with
   AVX2 + FMA + F16C, and portable (plain C, whatever the compiler vectorizes).

   W is (rows, row_bytes) uint8, each row cols / block_size blocks of block_bytes. Weights decode
   32 at a time (a "group"), to exactly their dequantized float32 values, then multiply x as
   float32 weights would: a row's sum runs over the groups in order, one partial a group (in the
   AVX2 build: a multiply and three FMAs over the group's four 8-lane vectors, added to an 8-lane
   accumulator, summed horizontally at the end), so a row's result is the same for every m.
   Rows are split statically between the threads, each streaming its own contiguous share. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "block_decode.h"

#define GROUP 32
#define MAX_M 8
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 4
#endif

#ifdef __AVX2__
#include "simd.h"  /* hsum256 */

/* One weight row against m x rows (x_stride floats apart) -> out[i * out_stride]. Inlined with
   constant code and m (row_dispatch), so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void row_dot(const int code, const int m, const uint8_t* row,
                                                          int64_t num_blocks, int64_t block_bytes, int groups_per_block,
                                                          const float* x, int64_t x_stride, float* out, int64_t out_stride) {
  __m256 acc[MAX_M];
  for (int i = 0; i < m; i++) acc[i] = _mm256_setzero_ps();
  /* known from the (constant) code, so the group loop unrolls and each group's shifts and scale
     positions fold to constants */
  const int groups = code >= FORMAT_Q2_K && code <= FORMAT_Q6_K ? 8 : 1;
  (void)groups_per_block;
  for (int64_t blk = 0; blk < num_blocks; blk++) {
    const uint8_t* block = row + blk * block_bytes;
    #pragma GCC unroll 8
    for (int g = 0; g < groups; g++) {
      __m256 w[4];
      decode_group_avx2(code, block, g, w);
      const float* xg = x + (blk * groups + g) * GROUP;
      for (int i = 0; i < m; i++) {
        const float* xb = xg + i * x_stride;
        __m256 partial = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
        partial = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), partial);
        partial = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), partial);
        partial = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), partial);
        acc[i] = _mm256_add_ps(acc[i], partial);
      }
    }
  }
  for (int i = 0; i < m; i++) out[i * out_stride] = hsum256(acc[i]);
}

/* group g of `block` as four 8-lane vectors, for a code known only at run time */
static inline void decode_group_vectors(int code, const uint8_t* block, int g, __m256 v[4]) {
  switch (code) {
#define DECODE_CASE(C) case C: decode_group_avx2(C, block, g, v); break;
    DECODE_CASE(0) DECODE_CASE(1) DECODE_CASE(2) DECODE_CASE(3) DECODE_CASE(4) DECODE_CASE(5) DECODE_CASE(6)
    DECODE_CASE(7) DECODE_CASE(8) DECODE_CASE(9) DECODE_CASE(10) DECODE_CASE(11) DECODE_CASE(12)
#undef DECODE_CASE
  }
}

static inline void decode_group_any(int code, const uint8_t* block, int g, float* w) {
  __m256 v[4];
  decode_group_vectors(code, block, g, v);
  for (int k = 0; k < 4; k++) _mm256_storeu_ps(w + 8 * k, v[k]);
}

/* 8 floats -> 8 bfloat16, rounded to nearest even as torch rounds them; a NaN stays a NaN (0x7FC0). */
static inline __m128i to_bf16x8(__m256 v) {
  __m256i bits = _mm256_castps_si256(v);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
}

static inline void decode_group_any_bf16(int code, const uint8_t* block, int g, uint16_t* w) {
  __m256 v[4];
  decode_group_vectors(code, block, g, v);
  for (int k = 0; k < 4; k++) _mm_storeu_si128((__m128i*)(w + 8 * k), to_bf16x8(v[k]));
}

#else  /* portable */

static inline void row_dot(const int code, const int m, const uint8_t* row, int64_t num_blocks, int64_t block_bytes,
                           int groups_per_block, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
  float acc[MAX_M][8] = {{0}};
  for (int64_t blk = 0; blk < num_blocks; blk++) {
    const uint8_t* block = row + blk * block_bytes;
    for (int g = 0; g < groups_per_block; g++) {
      float w[GROUP];
      decode_group_scalar(code, block, g, w);
      const float* xg = x + (blk * groups_per_block + g) * GROUP;
      for (int i = 0; i < m; i++) {
        const float* xb = xg + i * x_stride;
        for (int lane = 0; lane < 8; lane++) {
          float partial = w[lane] * xb[lane] + w[lane + 8] * xb[lane + 8] + w[lane + 16] * xb[lane + 16]
                          + w[lane + 24] * xb[lane + 24];
          acc[i][lane] += partial;
        }
      }
    }
  }
  for (int i = 0; i < m; i++) {
    float sum = 0.0f;
    for (int lane = 0; lane < 8; lane++) sum += acc[i][lane];
    out[i * out_stride] = sum;
  }
}

static inline void decode_group_any(int code, const uint8_t* block, int g, float* w) {
  decode_group_scalar(code, block, g, w);
}

static inline uint16_t to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  if (value != value) return 0x7FC0;
  return (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

static inline void decode_group_any_bf16(int code, const uint8_t* block, int g, uint16_t* w) {
  float v[GROUP];
  decode_group_scalar(code, block, g, v);
  for (int j = 0; j < GROUP; j++) w[j] = to_bf16(v[j]);
}
#endif

#define ROW_CASE(C, M) \
  case M: row_dot(C, M, row, num_blocks, block_bytes, groups_per_block, x, x_stride, out, out_stride); break;
#define CODE_CASE(C)                                                                              \
  case C:                                                                                         \
    switch (m) { ROW_CASE(C, 1) ROW_CASE(C, 2) ROW_CASE(C, 3) ROW_CASE(C, 4) ROW_CASE(C, 5)       \
                 ROW_CASE(C, 6) ROW_CASE(C, 7) ROW_CASE(C, 8) }                                    \
    break;

static void row_dispatch(int code, int m, const uint8_t* row, int64_t num_blocks, int64_t block_bytes,
                         int groups_per_block, const float* x, int64_t x_stride, float* out, int64_t out_stride) {
  switch (code) {
    CODE_CASE(0) CODE_CASE(1) CODE_CASE(2) CODE_CASE(3) CODE_CASE(4) CODE_CASE(5) CODE_CASE(6)
    CODE_CASE(7) CODE_CASE(8) CODE_CASE(9) CODE_CASE(10) CODE_CASE(11) CODE_CASE(12)
  }
}

/* y (m, rows) = x (m, cols) @ W^T, row i of y at y + i * y_stride (y_stride >= rows: the columns of a wider
   output). Returns 0, or -1 for a bad format code. */
int blocks_matmul(int code, int64_t block_size, int64_t block_bytes, const uint8_t* W, const float* x, float* y,
                  int64_t m, int64_t rows, int64_t cols, int64_t y_stride, int num_threads) {
  if (code < 0 || code >= NUM_FORMATS) return -1;
  int64_t num_blocks, bytes;
  int groups;
  row_shape(code, cols, block_size, block_bytes, &num_blocks, &bytes, &groups);
  int64_t row_bytes = num_blocks * bytes;
  for (int64_t first = 0; first < m; first += MAX_M) {
    int group_m = (int)(m - first < MAX_M ? m - first : MAX_M);
    const float* xg = x + first * cols;
    float* yg = y + first * y_stride;
    #pragma omp parallel num_threads(num_threads)
    {
      int64_t thread = omp_get_thread_num(), num = omp_get_num_threads();
      int64_t r0 = rows * thread / num, r1 = rows * (thread + 1) / num;
      for (int64_t r = r0; r < r1; r++) {
#ifdef __AVX2__
        if (r + PREFETCH_ROWS < r1) {
          const char* ahead = (const char*)(W + (r + PREFETCH_ROWS) * row_bytes);
          for (int64_t byte = 0; byte < row_bytes; byte += 64) _mm_prefetch(ahead + byte, _MM_HINT_T0);
        }
#endif
        row_dispatch(code, group_m, W + r * row_bytes, num_blocks, bytes, groups, xg, cols, yg + r, y_stride);
      }
    }
  }
  return 0;
}

/* out (num_rows, cols) = the dequantized rows of W, rows row_ids[0..num_rows) when row_ids is given, else
   rows 0..num_rows: float32 values, or (out_bf16) those values rounded to bfloat16 (as uint16). */
static void dequantize_rows(int code, int64_t block_size, int64_t block_bytes, const uint8_t* W, const int64_t* row_ids,
                            int64_t num_rows, int64_t cols, void* out, int out_bf16, int num_threads) {
  int64_t num_blocks, bytes;
  int groups;
  row_shape(code, cols, block_size, block_bytes, &num_blocks, &bytes, &groups);
  int64_t row_bytes = num_blocks * bytes;
  #pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t i = 0; i < num_rows; i++) {
    const uint8_t* row = W + (row_ids ? row_ids[i] : i) * row_bytes;
    for (int64_t blk = 0; blk < num_blocks; blk++)
      for (int g = 0; g < groups; g++) {
        int64_t first = i * cols + (blk * groups + g) * GROUP;
        if (out_bf16) decode_group_any_bf16(code, row + blk * bytes, g, (uint16_t*)out + first);
        else decode_group_any(code, row + blk * bytes, g, (float*)out + first);
      }
  }
}

/* out (num_rows, cols) float32 = the dequantized rows of W: rows row_ids[0..num_rows) when row_ids
   is given, else rows 0..num_rows. Returns 0, or -1 for a bad format code. */
int blocks_dequantize_rows(int code, int64_t block_size, int64_t block_bytes, const uint8_t* W,
                           const int64_t* row_ids, int64_t num_rows, int64_t cols, float* out, int num_threads) {
  if (code < 0 || code >= NUM_FORMATS) return -1;
  dequantize_rows(code, block_size, block_bytes, W, row_ids, num_rows, cols, out, 0, num_threads);
  return 0;
}

/* out (num_rows, cols) bfloat16 (as uint16) = rows 0..num_rows of W dequantized, each value its float32
   value rounded to nearest even: what torch's .to(torch.bfloat16) of blocks_dequantize_rows' output holds,
   without the float32 pass (the tiles of a bfloat16 prefill GEMM). Returns 0, or -1 for a bad format code. */
int blocks_dequantize_rows_bf16(int code, int64_t block_size, int64_t block_bytes, const uint8_t* W, int64_t num_rows,
                                int64_t cols, uint16_t* out, int num_threads) {
  if (code < 0 || code >= NUM_FORMATS) return -1;
  dequantize_rows(code, block_size, block_bytes, W, NULL, num_rows, cols, out, 1, num_threads);
  return 0;
}
