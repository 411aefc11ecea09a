/* Matrix-vector products for decode on CPU (AVX2 + FMA, OpenMP).

   y (m, rows) = x (m, cols) @ W^T for a weight W (rows, cols) held row-major as
   - float32 (matvec_f32, m = 1), or
   - blocks of 32 weights along a row (kernels/block_formats.py, BlockWeight.from_gguf):
       Q4_1: {f32 d, f32 min, 16 bytes of nibbles} (fp16 scales widened at load), w = d * q + min,
             q in 0..15, element j < 16 in the low nibble of byte j, element j + 16 in its high nibble;
       Q8_0: GGUF's own block {fp16 d, 32 int8 q} (34 bytes: loads are unaligned), w = d * q.
     Each block is decoded to exactly the float32 weights of gguf's dequantization
     (see scale_shift_block), then multiplied with x like float32 weights.
   Rows of W are split statically between the threads, each streaming its own
   contiguous share; x rows go through in groups of up to 8 (8 accumulators, the
   decoded block and a partial fit AVX2's 16 registers), so each block of W is
   decoded once per group. A row's result is the same for every m (row_tile). cols is a multiple of 32 for the block formats, 8 for f32. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#define BLOCK 32
#define Q4_1_BYTES 24
#define Q8_0_BYTES 34
#define MAX_GROUP 8

static inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
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

/* The 32 quantized values of a block as four vectors of 8 floats, in element order.
   Q4_1 nibbles: bytes 0-7 widened to 32 bits hold elements 0-7 (low nibbles) and
   16-23 (high nibbles), bytes 8-15 elements 8-15 and 24-31; widening straight from
   memory needs two shuffles a block instead of six. */
static inline void decode_q4_1(const uint8_t* nibbles, __m256 q[4]) {
  const __m256i low_nibble = _mm256_set1_epi32(0x0F);
  __m256i bytes_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)nibbles));
  __m256i bytes_hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(nibbles + 8)));
  q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes_lo, low_nibble));
  q[1] = _mm256_cvtepi32_ps(_mm256_and_si256(bytes_hi, low_nibble));
  q[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes_lo, 4));
  q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes_hi, 4));
}

static inline void decode_q8_0(const uint8_t* values, __m256 q[4]) {
  for (int k = 0; k < 4; k++)
    q[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(values + 8 * k))));
}

/* The block's weights from its quantized values: w = d * q (+ min). d * q is exact in
   float32 (an fp16 d times an integer below 256), so the single rounding of the FMA
   gives exactly the float32 of gguf's dequantization, (d * q) + min. */
static inline void scale_block(__m256 w[4], const uint8_t* fp16_d) {
  __m256 dv = _mm256_set1_ps(_cvtsh_ss((uint16_t)(fp16_d[0] | fp16_d[1] << 8)));
  for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(w[k], dv);
}

static inline void scale_shift_block(__m256 w[4], const float* d_min) {
  __m256 dv = _mm256_broadcast_ss(d_min), mv = _mm256_broadcast_ss(d_min + 1);
  for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(w[k], dv, mv);
}

/* Blocks [0, nb) of one weight row against m x rows (x_stride floats apart). Always
   inlined with constant format and m (see row_dispatch), so the accumulators live in
   registers: with a runtime m they went through memory and each block waited on a
   store-to-load round trip (measured: 2x slower).

   One summation order for every m and every column tiling: a block's four products
   go into one partial vector (a multiply and three FMAs, in element order), added to
   the x row's 8-lane accumulator; a row cut into column tiles carries that
   accumulator from tile to tile (`carry`, m x 8 floats: loaded unless `is_first`,
   stored unless `is_last`), and only the last tile sums it horizontally into
   out[i * out_stride]. So a row's result does not depend on how many rows share the
   call (a decode of one row, or a speculative verify chunk of several): the same bits
   either way. The loop-carried chain is one add a block, so no row waits on FMA
   latency, and m accumulators + 4 weight vectors + a partial fit the 16 registers
   for m <= 8. */
static inline __attribute__((always_inline)) void row_tile(
    const int format, const int64_t m, const uint8_t* row, int64_t nb, const float* x, int64_t x_stride,
    float* out, int64_t out_stride, float* carry, int is_first, int is_last) {
  const int64_t block_bytes = format == 0 ? Q4_1_BYTES : Q8_0_BYTES;
  __m256 acc[MAX_GROUP];
  for (int64_t i = 0; i < m; i++) acc[i] = is_first ? _mm256_setzero_ps() : _mm256_loadu_ps(carry + 8 * i);
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* block = row + b * block_bytes;
    __m256 w[4];
    if (format == 0) {
      decode_q4_1(block + 8, w);
      scale_shift_block(w, (const float*)block);
    } else {
      decode_q8_0(block + 2, w);
      scale_block(w, block);
    }
    for (int64_t i = 0; i < m; i++) {
      const float* xb = x + i * x_stride + b * BLOCK;
      __m256 partial = _mm256_mul_ps(w[0], _mm256_loadu_ps(xb));
      partial = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), partial);
      partial = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), partial);
      partial = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), partial);
      acc[i] = _mm256_add_ps(acc[i], partial);
    }
  }
  for (int64_t i = 0; i < m; i++) {
    if (is_last) out[i * out_stride] = hsum8(acc[i]);
    else _mm256_storeu_ps(carry + 8 * i, acc[i]);
  }
}

#define ROW_CASE(M)                                                                                  \
  case M:                                                                                            \
    if (format == 0) row_tile(0, M, row, nb, x, x_stride, out, out_stride, carry, is_first, is_last); \
    else row_tile(1, M, row, nb, x, x_stride, out, out_stride, carry, is_first, is_last);            \
    break;

static void row_dispatch(int format, int64_t m, const uint8_t* row, int64_t nb, const float* x, int64_t x_stride,
                         float* out, int64_t out_stride, float* carry, int is_first, int is_last) {
  switch (m) { ROW_CASE(1) ROW_CASE(2) ROW_CASE(3) ROW_CASE(4) ROW_CASE(5) ROW_CASE(6) ROW_CASE(7) ROW_CASE(8) }
}

/* The x rows of a group are read once per weight row; columns go in tiles whose
   slice of the group's x stays in L1 (8 rows of a 1536-wide x are 48 KB: read from
   L2 for every weight row, they made 8 rows cost 3x what 1 row does), but never
   under MIN_TILE_BLOCKS blocks (SmolLM2's 576-wide rows stay whole: 18 KB for 8 x
   rows). A tiled row carries its accumulators from tile to tile (row_tile), so the
   tiling, which depends on m, leaves the sums as they are. */
#define TILE_X_BYTES 16384
#define MIN_TILE_BLOCKS 24
/* While a weight row's tile is multiplied, the same tile of the row PREFETCH_ROWS ahead is prefetched:
   with several x rows the kernel is bound by its multiply-adds, and without it the weight stream from
   memory stalled them (see docs/performance.md). Only loads are added: the sums are untouched. */
#ifndef PREFETCH_ROWS
#define PREFETCH_ROWS 8
#endif

/* format: 0 = Q4_1, 1 = Q8_0. W (rows, cols / 32 blocks), x (m, cols), y (m, rows).
   Returns 0, or -1 when the carried accumulators of a tiled call cannot be allocated. */
int matmul_blocks(int format, const uint8_t* W, const float* x, float* y,
                  int64_t m, int64_t rows, int64_t cols, int num_threads) {
  int64_t num_blocks = cols / BLOCK;
  int64_t block_bytes = format == 0 ? Q4_1_BYTES : Q8_0_BYTES;
  int64_t row_bytes = num_blocks * block_bytes;
  float* carry = NULL;  /* (rows, group, 8): the accumulators between a row's tiles */
  for (int64_t first = 0; first < m; first += MAX_GROUP) {
    int64_t group = m - first < MAX_GROUP ? m - first : MAX_GROUP;
    const float* xg = x + first * cols;
    float* yg = y + first * rows;
    int64_t tile_blocks = TILE_X_BYTES / (group * BLOCK * (int64_t)sizeof(float));
    if (tile_blocks < MIN_TILE_BLOCKS) tile_blocks = MIN_TILE_BLOCKS;
    if (tile_blocks < num_blocks && !carry && !(carry = (float*)malloc((size_t)(rows * MAX_GROUP * 8) * sizeof(float))))
      return -1;
    #pragma omp parallel num_threads(num_threads)
    {
      int64_t thread = omp_get_thread_num(), num = omp_get_num_threads();
      int64_t r0 = rows * thread / num, r1 = rows * (thread + 1) / num;  /* a contiguous share of W */
      for (int64_t tile = 0; tile < num_blocks; tile += tile_blocks) {
        int64_t nb = num_blocks - tile < tile_blocks ? num_blocks - tile : tile_blocks;
        int is_first = tile == 0, is_last = tile + nb == num_blocks;
        for (int64_t r = r0; r < r1; r++) {
          if (r + PREFETCH_ROWS < r1) {
            const char* ahead = (const char*)(W + (r + PREFETCH_ROWS) * row_bytes + tile * block_bytes);
            for (int64_t byte = 0; byte < nb * block_bytes; byte += 64) _mm_prefetch(ahead + byte, _MM_HINT_T0);
          }
          row_dispatch(format, group, W + r * row_bytes + tile * block_bytes, nb, xg + tile * BLOCK, cols,
                       yg + r, rows, carry ? carry + r * MAX_GROUP * 8 : NULL, is_first, is_last);
        }
      }
    }
  }
  free(carry);
  return 0;
}
