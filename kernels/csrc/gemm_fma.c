/* Prefill GEMM over GGUF blocks in float32 with 256-bit FMA (OpenMP): y (M x N) = x (M x K float32) @ W^T for W
   (N x K) held in a block format, its panels decoded to float32 by the kernel as it goes. For CPUs whose fastest
   GEMM is float32's (AVX2 + FMA without native bf16, where the int8 GEMM is not faster: docs/performance.md,
   "Prefill over blocks with FMA"): no float32 copy of W is kept and no dequantized tile is handed to a GEMM
   that reorders it on every call.

   blocks_fma_gemm: the threads split W's rows (in 16s); each takes its share a panel (PANEL_ROWS rows x up to
   CHUNK_K k of float32: 256 KiB, in L2) at a time: the panel's groups decoded (decode_group_avx2: the values
   dequantize gives) and transposed into slices of 16 rows, k-major (slice s, k: the 16 rows' weights at
   panel + (s * ck + k) * 16), then every MR rows of x through it, a slice at a time (micro_tile: MR x 16 sums in
   12 ymm, two FMAs of a broadcast x[m][k] with the slice's two vectors at k).
   blocks_fma_gemm_interleaved: the same panels from a copy of W in the int8 GEMM's 8 interleaved rows (the AVX2
   layout of kernels/csrc/gemm_q8.c: Q4_1, Q4_K, Q6_K, the decode copies), whose vectors hold 8 rows already: no
   transpose; the same weights, so the same bits.
   Sums: y[m][n] is one FMA chain over k in k order (a K chunk continues from the float32 stored by the one
   before), the same whatever M, the other rows and the thread count: a row's bits do not depend on the row
   count (tested). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_decode.h"
#define R 8 /* the interleaved copies' rows a group: the AVX2 build's (interleaved_rows.h) */
#include "interleaved_rows.h"

#define NR 16          /* weight rows a slice (two ymm) */
#define MR 6           /* rows of x a micro-tile: 12 accumulators, 2 slice vectors, 1 broadcast */
#define PANEL_ROWS 256 /* weight rows a panel: a multiple of NR */
#define CHUNK_K 256    /* k a panel: a multiple of 256 (a K-quant block) */

/* y's MR x 16 tile (rows `rows` <= MR) += x's rows over ck k times a slice. first: y starts at 0, not its
   stored value. Inlined with a constant `rows` (micro_rows). */
static inline __attribute__((always_inline)) void micro_tile(const int rows, const float* x, int64_t x_stride,
                                                              const float* slice, int64_t ck, float* y,
                                                              int64_t y_stride, int first) {
  __m256 acc[MR][2];
  for (int r = 0; r < rows; r++)
    for (int h = 0; h < 2; h++)
      acc[r][h] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(y + r * y_stride + 8 * h);
  #pragma GCC unroll 4
  for (int64_t k = 0; k < ck; k++) {
    const __m256 b0 = _mm256_load_ps(slice + k * NR), b1 = _mm256_load_ps(slice + k * NR + 8);
    for (int r = 0; r < rows; r++) {
      const __m256 a = _mm256_broadcast_ss(x + r * x_stride + k);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < rows; r++)
    for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + r * y_stride + 8 * h, acc[r][h]);
}

static void micro_rows(int rows, const float* x, int64_t x_stride, const float* slice, int64_t ck, float* y,
                       int64_t y_stride, int first) {
  switch (rows) {
#define ROWS_CASE(n) case n: micro_tile(n, x, x_stride, slice, ck, y, y_stride, first); break;
    ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6)
#undef ROWS_CASE
  }
}

/* 8 x 8 floats: rows[i] <- column i (rows[i][j] = rows_before[j][i]) */
static inline void transpose8(__m256 rows[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; i++) {
    rows[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    rows[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

/* panel = W's rows n0 .. n0 + width over k0 .. k0 + ck in slices (above). Inlined with a constant code
   (decode_panel), so a K-quant block's group loop unrolls and its shifts fold to constants. */
static inline __attribute__((always_inline)) void decode_panel_as(const int code, const uint8_t* W, int64_t row_bytes,
                                                                   int64_t bytes, int64_t n0, int64_t width,
                                                                   int64_t k0, int64_t ck, float* panel) {
  const int block_groups = code >= FORMAT_Q2_K && code <= FORMAT_Q6_K ? 8 : 1;
  for (int64_t c0 = 0; c0 < width; c0 += 8) { /* 8 rows: half of slice c0 / 16 */
    const uint8_t* rows = W + (n0 + c0) * row_bytes;
    float* half = panel + c0 / NR * ck * NR + c0 % NR;
    for (int64_t k = 0; k < ck; k += 32 * block_groups) {
      const uint8_t* block = rows + (k0 + k) / (32 * block_groups) * bytes;
      #pragma GCC unroll 8
      for (int g = 0; g < block_groups; g++) {
        __m256 v[8][4]; /* row r's 32 weights of this group, 8 at a time */
        for (int r = 0; r < 8; r++) decode_group_avx2(code, block + r * row_bytes, g, v[r]);
        for (int q = 0; q < 4; q++) {
          __m256 lanes[8];
          for (int r = 0; r < 8; r++) lanes[r] = v[r][q];
          transpose8(lanes); /* lanes[i]: weight k + 32 g + 8 q + i of the 8 rows */
          for (int i = 0; i < 8; i++) _mm256_store_ps(half + (k + 32 * g + 8 * q + i) * NR, lanes[i]);
        }
      }
    }
  }
}

static void decode_panel(int code, const uint8_t* W, int64_t row_bytes, int64_t bytes, int64_t n0, int64_t width,
                         int64_t k0, int64_t ck, float* panel) {
  switch (code) {
#define PANEL_CASE(C) case C: decode_panel_as(C, W, row_bytes, bytes, n0, width, k0, ck, panel); break;
    PANEL_CASE(0) PANEL_CASE(1) PANEL_CASE(2) PANEL_CASE(3) PANEL_CASE(4) PANEL_CASE(5) PANEL_CASE(6)
    PANEL_CASE(7) PANEL_CASE(8) PANEL_CASE(9) PANEL_CASE(10) PANEL_CASE(11) PANEL_CASE(12)
#undef PANEL_CASE
  }
}

/* The same panel from the interleaved copy (layout LAYOUT_SCALE_MIN, LAYOUT_K4 or LAYOUT_K6, 8 rows a group): per
   32 columns 4 vectors j of 8 rows x 4 bytes, lane r's byte i holding weight 4j + i (low nibble) and 4j + 16 + i
   (high nibble) of row r: w = d q + min, each k's 8 rows one vector. LAYOUT_K6 adds each value's top two bits
   from its plane (interleaved_rows.h) and scales per 16 columns: w = d sc (u - 32) = fma(u, d sc, -32 d sc), exact
   (|u - 32| <= 32 times an fp16 times an int8 fits float32), so the blocks' values. */
static void decode_interleaved_panel(int layout, const uint8_t* W, int64_t K, int64_t n0, int64_t width, int64_t k0,
                                     int64_t ck, float* panel) {
  const int64_t blocks = K / 32;
  const __m256i low4 = _mm256_set1_epi32(0x0F0F0F0F), top2 = _mm256_set1_epi32(0x03030303),
                byte = _mm256_set1_epi32(0xFF);
  for (int64_t c0 = 0; c0 < width; c0 += R) {
    const uint8_t* group = W + (n0 + c0) / R * group_bytes(layout, blocks);
    float* half = panel + c0 / NR * ck * NR + c0 % NR;
    for (int64_t k = 0; k < ck; k += 32) {
      const int64_t b = (k0 + k) / 32;
      const uint8_t* record = block_record(layout, group, b);
      __m256 d[2], min[2];  /* [high]: the scale and min of columns 0..15, 16..31 */
      if (layout == LAYOUT_K6) {
        const __m256 super_d = _mm256_loadu_ps((const float*)(group + b / 8 * K6_SUPER));
        for (int high = 0; high < 2; high++) {
          d[high] = _mm256_mul_ps(super_d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                               _mm_loadl_epi64((const __m128i*)(record + R * high)))));
          min[high] = _mm256_mul_ps(d[high], _mm256_set1_ps(-32.0f));
        }
      } else {
        block_scales(layout, group, b, record, &d[0], &min[0]);
        d[1] = d[0], min[1] = min[0];
      }
      const uint8_t* quants = record + scale_bytes(layout);
      for (int j = 0; j < 4; j++) {
        const __m256i v = _mm256_loadu_si256((const __m256i*)(quants + 32 * j));
        for (int high = 0; high < 2; high++) {
          __m256i q = high ? _mm256_and_si256(_mm256_srli_epi32(v, 4), low4) : _mm256_and_si256(v, low4);
          if (layout == LAYOUT_K6) {  /* bits 2j, 2j + 1 of plane `high`'s bytes, to bits 4, 5 */
            const __m256i plane = _mm256_loadu_si256((const __m256i*)(quants + 16 * R + 32 * high));
            q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(plane, 2 * j), top2), 4));
          }
          for (int i = 0; i < 4; i++) {
            const __m256 w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(q, 8 * i), byte)),
                                             d[high], min[high]);
            _mm256_store_ps(half + (k + 4 * j + i + 16 * high) * NR, w);
          }
        }
      }
    }
  }
}

/* A thread's panel, kept between calls (OpenMP's threads persist): a fresh one a call would be a fresh mapping
   whose pages fault in and are zeroed every time. */
static __thread float* thread_panel;

/* Where a panel's weights come from: W's blocks (code >= 0: block_decode.h's format, rows row_bytes apart), or a
   copy in 8 interleaved rows (code INTERLEAVED, `layout`). */
#define INTERLEAVED (-1)
typedef struct {
  int code, layout;
  const uint8_t* W;
  int64_t row_bytes, bytes; /* blocks: a row's, a block's */
} panel_source;

/* y (M x N, row m at y + m * y_stride) = x (M x K, row m at x + m * x_stride) @ W^T, W's panels from `src`.
   Returns 0, or -3 when a thread's panel could not be allocated. */
static int gemm_over(const panel_source* src, const float* x, int64_t x_stride, int64_t M, int64_t N, int64_t K,
                     float* y, int64_t y_stride, int num_threads) {
  const int64_t slices = N / NR;
  int failed = 0;
  #pragma omp parallel num_threads(num_threads)
  {
    const int64_t thread = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t n_begin = slices * thread / count * NR, n_end = slices * (thread + 1) / count * NR;
    if (!thread_panel) thread_panel = aligned_alloc(64, (size_t)PANEL_ROWS * CHUNK_K * sizeof(float));
    if (!thread_panel) {
      #pragma omp atomic write
      failed = 1;
    } else {
      for (int64_t n0 = n_begin; n0 < n_end; n0 += PANEL_ROWS) {
        const int64_t width = n_end - n0 < PANEL_ROWS ? n_end - n0 : PANEL_ROWS;
        for (int64_t k0 = 0; k0 < K; k0 += CHUNK_K) {
          const int64_t ck = K - k0 < CHUNK_K ? K - k0 : CHUNK_K;
          if (src->code == INTERLEAVED) decode_interleaved_panel(src->layout, src->W, K, n0, width, k0, ck, thread_panel);
          else decode_panel(src->code, src->W, src->row_bytes, src->bytes, n0, width, k0, ck, thread_panel);
          for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int rows = M - m0 < MR ? (int)(M - m0) : MR;
            for (int64_t s = 0; s < width; s += NR)
              micro_rows(rows, x + m0 * x_stride + k0, x_stride, thread_panel + s / NR * ck * NR, ck,
                         y + m0 * y_stride + n0 + s, y_stride, k0 == 0);
          }
        }
      }
    }
  }
  return failed ? -3 : 0;
}

/* The product over W (N, K) in block format `code`. Returns 0; -1 for a bad code, -2 when N is not a multiple of
   16 or K of 32, -3 when a buffer could not be allocated. */
int blocks_fma_gemm(int code, int64_t block_size, int64_t block_bytes, const uint8_t* W, const float* x,
                    int64_t x_stride, int64_t M, int64_t N, int64_t K, float* y, int64_t y_stride, int num_threads) {
  if (code < 0 || code >= NUM_FORMATS) return -1;
  if (K % 32 || N % NR) return -2;
  panel_source src = {.code = code, .W = W};
  int64_t num_blocks;
  int groups;
  row_shape(code, K, block_size, block_bytes, &num_blocks, &src.bytes, &groups);
  src.row_bytes = num_blocks * src.bytes;
  return gemm_over(&src, x, x_stride, M, N, K, y, y_stride, num_threads);
}

/* The product over a copy of W (N, K) in 8 interleaved rows (gemm_q8_repack's with AVX2), `layout`
   LAYOUT_SCALE_MIN (Q4_1), LAYOUT_K4 (Q4_K) or LAYOUT_K6 (Q6_K). Returns 0; -1 for another layout, -2 when N is
   not a multiple of 16 or K of 32 (of 256 for LAYOUT_K4, LAYOUT_K6), -3 when a buffer could not be allocated. */
int blocks_fma_gemm_interleaved(int layout, const uint8_t* W, const float* x, int64_t x_stride, int64_t M, int64_t N,
                                int64_t K, float* y, int64_t y_stride, int num_threads) {
  if (!has_min(layout) && layout != LAYOUT_K6) return -1;
  if (K % 32 || N % NR || (is_super(layout) && K % 256)) return -2;
  const panel_source src = {.code = INTERLEAVED, .layout = layout, .W = W};
  return gemm_over(&src, x, x_stride, M, N, K, y, y_stride, num_threads);
}
