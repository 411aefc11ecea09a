/* Decode products over weights held in block formats, with the activations quantized to int16
   (built into the same libraries as block_matmul.c: AVX-512 VNNI, AVX2, portable).

   y (m, rows) = x (m, cols) @ W^T for a few rows. Each row of x is quantized once per call, per
   group of 32 values: scale s = max|x| / 32767, xq = round(x / s) (int16), and the float sum of
   each 16 values (for the formats with a min). A weight group decodes to integers and scales
   (block_decode_q16.h: w_j = dl * q_j - ml[j / 16]); its product with a row is

     dl * s * sum_j q_j xq_j  -  ml[0] * sum_{j<16} x_j  -  ml[1] * sum_{j>=16} x_j

   with sum_j q_j xq_j exact in int32 (vpmaddwd on AVX2, vpdpwssd on AVX-512 VNNI, plain C in
   the portable build), 8 int32 lanes a group, converted to float and accumulated with one FMA
   per group, summed horizontally at the end. The only approximation is x's rounding to int16,
   an error of at most s / 2 = max|x over the group| / 65534 per value (about 15 bits of each
   group's largest value; float32 keeps 24): the weights' values are exact.

   Q4_K, Q6_K, Q4_1 and Q4_0 (the last two in rows of an even number of blocks: byte_products) multiply
   bytes instead (byte products): each xq is split into a low byte (unsigned) and a high one (signed),
   xq = 256 xhi + xlo, and a group's 8 int32 lanes are

     D_k = sum_{j = 4k .. 4k+3} q_j xq_j = 256 sum q_j xhi_j + sum q_j xlo_j          k = 0..7

   over the weights' bytes as they are decoded (Q4_K's nibbles; Q6_K's u - 32, its per-16 sub-scale
   in the lane's float scale: (d * sc) * s), with vpdpbusd (u8 x s8, 4 bytes a lane) in the AVX-512
   build, vpmaddubsw + vpmaddwd in the AVX2 build (no pair sum saturates: |q| <= 63 against a byte),
   plain C over xq in the portable one. Q6_K's and Q4_0's high-byte products take u (unsigned) and add
   the x-only correction -32 (Q4_0: -8) sum xhi_j (bias16, bias32). At one row of x that is fewer instructions than
   widening the weights to int16 (AVX-512, per 64 weights by count: Q4_K 8 instead of 10, Q6_K 13
   instead of 20); at more rows (above BYTE_ROWS) the weights are widened once, in the same lanes
   (quad_words_*, x in the quad layout), since then a byte product's extra op per row costs more.

   Two Q4_1 or Q4_0 blocks are one pair of lanes, as two of Q4_K's groups; Q4_1's mins stay one float
   chain per accumulator (min_even, min_odd), so the byte products changed their int32 lanes and
   nothing else. The AVX2 build widens Q4_1's nibbles at every m (BYTE_ROWS_OF: its maddubs pairs
   measured slower).

   The AVX-512 build multiplies Q4_K, Q6_K, Q8_0, Q4_1 and Q4_0 rows two groups at a time (row_dot_512:
   one accumulator holding the even and the odd groups' 8 lanes side by side); for Q8_0 (32 lanes of
   int16) it reads a copy of xq in a pair layout (pair_layout); for Q8_0, Q4_1 and Q4_0 each two groups'
   x scales (and Q4_1's sums) spread over 16 lanes (pair_factors: one vector multiply for the scales,
   one FMA for both mins, lanes 0 and 8). Its int32 lanes and FMAs are the AVX2 build's, so are its bits (tested).

   Rows of x are quantized independently and rows of W split statically between threads, so a
   row's result does not depend on m or on the thread count. The quantized x lives in a buffer
   of the calling thread, grown when needed (no allocation per call once warm). */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "block_decode_q16.h"
#include "q16_activations.h"

#define GROUP 32
#define MAX_M 8
/* Each thread reads its rows of W once, as one forward stream (rows are contiguous). At one row of x the
   hardware prefetchers alone left a core waiting on memory: a 16384x2048 Q4_K weight read from memory at
   ~5-6 GB/s on one thread of an Intel Xeon where the same kernel runs at ~17 GB/s from cache and a plain
   read at ~15 GB/s. So every row loop asks for the bytes this far ahead of the block it decodes
   (docs/performance.md, "Prefetching the weights"); prefetches never fault and change no result. */
#define PREFETCH_DISTANCE 2048

/* the cache lines of bytes at + PREFETCH_DISTANCE .. + bytes, read soon */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t* at, int64_t bytes) {
  for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(at + PREFETCH_DISTANCE + offset, 0, 3);
}

int blocks_matmul(int code, int64_t block_size, int64_t block_bytes, const uint8_t* W, const float* x, float* y,
                  int64_t m, int64_t rows, int64_t cols, int64_t y_stride, int num_threads);

/* x (m, cols) quantized: xq (m, cols) int16, scale (m, cols / 32), sums of x per 16 values
   (m, cols / 16) and per 32 (m, cols / 32: the two 16-sums added) */
typedef struct {
  int16_t* xq;
  float* scale;
  float* sums;
  float* sums32;
  int16_t* xp;  /* AVX-512 build, Q8_0: xq in the pair layout (pair_layout), else NULL */
  int16_t* xquad;  /* Q4_K, Q6_K, more than BYTE_ROWS rows: xq in the quad layout (quad_layout) */
  uint8_t* xlo;  /* Q4_K, Q6_K (AVX2 and AVX-512 builds): xq's low bytes, (m, cols) */
  int8_t* xhi;  /* and its high bytes: xq = 256 xhi + xlo */
  int16_t* bias16;  /* Q6_K: -32 (xhi_2j + xhi_2j+1), (m, cols / 2); Q4_0: -8 (...) */
  int32_t* bias32;  /* Q6_K: -32 (xhi_4k + .. + xhi_4k+3), (m, cols / 4); Q4_0: -8 (...) */
  /* AVX-512 build, Q8_0, Q4_1 and Q4_0: each group's scale as 8 lanes, so that any two groups g, g + 1 read as
     [s_g x 8 | s_g+1 x 8], (m, cols / 4); Q4_1: their sums32 as [S_g, 0 x 7 | S_g+1, 0 x 7] */
  float* pair_scale;
  float* pair_sums;
} QuantizedRows;

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define PAIR_LAYOUT 1
#else
#define PAIR_LAYOUT 0
#endif

/* Q4_K, Q6_K: calls of at most this many rows (per group of MAX_M) run byte products; more rows
   widen each weight once to int16 for all of them (the same lanes, so the same bits). Measured
   (2048-row weights, 2 rows): vpdpbusd still wins at 2 rows, AVX2's maddubs pairs at 1 only. */
#define BYTE_ROWS (PAIR_LAYOUT ? 2 : 1)
static inline int is_nibble_pairs(int code) { return code == FORMAT_Q4_1 || code == FORMAT_Q4_0; }

/* Calls of at most this many rows run byte products. The AVX2 build, measured against its int16
   words at one row: Q4_1's maddubs pairs cost more than its widened words (so none), Q4_0's less
   (its sign-extended words cost two more ops a group). */
#define BYTE_ROWS_OF(code) \
  (PAIR_LAYOUT || !is_nibble_pairs(code) ? BYTE_ROWS : ((code) == FORMAT_Q4_0 ? 1 : 0))

/* Whether a weight of `code` and `cols` columns multiplies bytes (x split, or x in the quad layout):
   Q4_K, Q6_K, and Q4_1 / Q4_0 when their rows hold an even number of blocks (two blocks are one pair
   of lanes, as two of Q4_K's groups; an odd count keeps the int16 words of decode_group_q16_*). The
   choice depends on the weight alone, so a row's bits do not depend on m. */
static inline int byte_products(int code, int64_t cols) {
  return code == FORMAT_Q4_K || code == FORMAT_Q6_K || (is_nibble_pairs(code) && (cols / GROUP) % 2 == 0);
}

/* Formats whose byte products add a bias to the high bytes' lanes, w = u - offset: -offset * sum xhi */
static inline int byte_offset(int code) { return code == FORMAT_Q6_K ? 32 : (code == FORMAT_Q4_0 ? 8 : 0); }

static __thread void* scratch = NULL;
static __thread size_t scratch_bytes = 0;

static size_t aligned64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static int quantized_rows(int64_t m, int64_t cols, QuantizedRows* out) {
  const size_t n = (size_t)(m * cols), xq_bytes = aligned64(n * sizeof(int16_t));
  const size_t float_bytes = aligned64((2 * n / GROUP + n / 16) * sizeof(float));
  /* xq, the floats, xp, xlo, xhi, bias16, bias32, pair_scale, pair_sums */
  size_t need = xq_bytes + float_bytes + xq_bytes + 2 * aligned64(n) + aligned64(n / 2 * sizeof(int16_t)) +
                aligned64(n / 4 * sizeof(int32_t)) + 2 * aligned64(n / 4 * sizeof(float)) + 64;
  if (need > scratch_bytes) {
    void* grown = realloc(scratch, need);
    if (grown == NULL) return -1;
    scratch = grown, scratch_bytes = need;
  }
  char* at = (char*)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
  out->xq = (int16_t*)at, at += xq_bytes;
  out->scale = (float*)at, at += float_bytes;
  out->sums = out->scale + n / GROUP;
  out->sums32 = out->sums + n / 16;
  out->xp = PAIR_LAYOUT ? (int16_t*)at : NULL, out->xquad = (int16_t*)at, at += xq_bytes;  /* never both */
  out->xlo = (uint8_t*)at, at += aligned64(n);
  out->xhi = (int8_t*)at, at += aligned64(n);
  out->bias16 = (int16_t*)at, at += aligned64(n / 2 * sizeof(int16_t));
  out->bias32 = (int32_t*)at, at += aligned64(n / 4 * sizeof(int32_t));
  out->pair_scale = (float*)at, at += aligned64(n / 4 * sizeof(float));
  out->pair_sums = (float*)at;
  return 0;
}

/* xq's n values (a multiple of 64) -> xquad: each 64 (groups g, g + 1) as [g's x0 | (g + 1)'s x0 |
   g's x1 | (g + 1)'s x1], a group's x0 its elements 4k, 4k + 1 and x1 its 4k + 2, 4k + 3 (k = 0..7,
   in order): the words quad_words_avx2 / quad_words_512 meet. */
static void quad_layout(const int16_t* xq, int16_t* xquad, int64_t n) {
  for (int64_t base = 0; base < n; base += 2 * GROUP)
    for (int g = 0; g < 2; g++)
      for (int k = 0; k < 8; k++)
        for (int j = 0; j < 2; j++) {
          xquad[base + 16 * g + 2 * k + j] = xq[base + GROUP * g + 4 * k + j];
          xquad[base + 32 + 16 * g + 2 * k + j] = xq[base + GROUP * g + 4 * k + 2 + j];
        }
}

/* The per-group scale of `groups` groups -> pair_scale; with a min (Q4_1), their sums32 -> pair_sums */
static void pair_factors(const float* scale, const float* sums32, float* pair_scale, float* pair_sums, int64_t groups,
                         int with_min) {
  for (int64_t g = 0; g < groups; g++)
    for (int lane = 0; lane < 8; lane++) {
      pair_scale[8 * g + lane] = scale[g];
      if (with_min) pair_sums[8 * g + lane] = lane == 0 ? sums32[g] : 0.0f;
    }
}

/* xq's n values -> xlo, xhi; with an offset (byte_offset: Q6_K, Q4_0) bias16, bias32 */
static void split_bytes(const int16_t* xq, uint8_t* xlo, int8_t* xhi, int16_t* bias16, int32_t* bias32, int64_t n,
                        int offset) {
  split_int16(xq, xlo, xhi, n);
  if (!offset) return;
  for (int64_t j = 0; j < n / 2; j++) bias16[j] = (int16_t)(-offset * (xhi[2 * j] + xhi[2 * j + 1]));
  for (int64_t k = 0; k < n / 4; k++) bias32[k] = bias16[2 * k] + bias16[2 * k + 1];
}


/* xq (m, cols) -> xp: each row's 32-groups g, h = g + 1 (g even) as
   [x_g 0..15 | x_h 16..31 | x_g 16..31 | x_h 0..15] (block_decode_q16.h's pair layout); a row of
   an odd number of groups ends in one, copied as it is (its products read xq). */
static void pair_layout(const int16_t* xq, int16_t* xp, int64_t m, int64_t cols) {
  for (int64_t i = 0; i < m; i++) {
    const int16_t* in = xq + i * cols;
    int16_t* out = xp + i * cols;
    int64_t at = 0;
    for (; at + 2 * GROUP <= cols; at += 2 * GROUP) {
      memcpy(out + at, in + at, 16 * sizeof(int16_t));
      memcpy(out + at + 16, in + at + 48, 16 * sizeof(int16_t));
      memcpy(out + at + 32, in + at + 16, 16 * sizeof(int16_t));
      memcpy(out + at + 48, in + at + 32, 16 * sizeof(int16_t));
    }
    memcpy(out + at, in + at, (size_t)(cols - at) * sizeof(int16_t));
  }
}

#ifdef __AVX2__
#include "simd.h"  /* hsum256 */

/* the 8 int32 pair sums of q[0] . (16 int16 at x0) + q[1] . (16 int16 at x1) */
static inline __attribute__((always_inline)) __m256i two_vec_dot(const __m256i q[2], const int16_t* x0,
                                                                 const int16_t* x1) {
  __m256i a = _mm256_loadu_si256((const __m256i*)x0), b = _mm256_loadu_si256((const __m256i*)x1);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(_mm256_madd_epi16(q[0], a), q[1], b);
#else
  return _mm256_add_epi32(_mm256_madd_epi16(q[0], a), _mm256_madd_epi16(q[1], b));
#endif
}

/* the 8 int32 pair sums of a group: q . xq */
static inline __m256i group_dot(const __m256i q[2], const int16_t* xq) { return two_vec_dot(q, xq, xq + 16); }

/* A 32-weight block's term: the dot product scaled into acc; its min into min_acc (has_min formats). */
#define GROUP_STEP(acc, min_acc, blk, g)                                                                   \
  do {                                                                                                    \
    __m256i q[2];                                                                                         \
    float dl, ml[2];                                                                                      \
    decode_group_q16_avx2(code, row + (blk) * block_bytes, g, q, &dl, ml);                                \
    const int64_t group = (blk) * groups + (g);                                                           \
    for (int i = 0; i < m; i++) {                                                                         \
      __m256i dot = group_dot(q, x->xq + i * cols + group * GROUP);                                       \
      __m256 scale = _mm256_set1_ps(dl * x->scale[i * groups_per_row + group]);                           \
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[i]);                                   \
      if (has_min) {                                                                                      \
        min_acc[i] = fmaf(ml[0], x->sums32[i * groups_per_row + group], min_acc[i]);                      \
      }                                                                                                   \
    }                                                                                                     \
  } while (0)

/* A K-quant group's term (its block's factors decoded once, sdl = dl * the rows' x scales). */
#define K_GROUP_STEP(acc, g)                                                                              \
  do {                                                                                                    \
    __m256i q[2];                                                                                         \
    decode_k_group_q16_avx2(code, block, g, q);                                                           \
    for (int i = 0; i < m; i++) {                                                                         \
      __m256i dot = group_dot(q, x->xq + i * cols + (blk * 8 + (g)) * GROUP);                             \
      __m256 scale = _mm256_permutevar8x32_ps(sdl[i], _mm256_set1_epi32(g));                              \
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[i]);                                   \
    }                                                                                                     \
  } while (0)

/* A group's 8 int32 lanes of byte products (the D_k above): q (0..63) against xhi, w (|w| <= 32)
   against xlo; bias16 (Q6_K, q = u, w = u - 32) or NULL. No vpmaddubsw pair sum saturates:
   |2 * 63 * 128|, |2 * 255 * 32| < 32768. */
static inline __attribute__((always_inline)) __m256i bytes_dot(__m256i q, __m256i w, const int8_t* xhi,
                                                               const uint8_t* xlo, const int16_t* bias16) {
  __m256i high = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i*)xhi));
  if (bias16) high = _mm256_add_epi16(high, _mm256_loadu_si256((const __m256i*)bias16));
  __m256i low = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i*)xlo), w);
  return _mm256_add_epi32(_mm256_madd_epi16(high, _mm256_set1_epi16(256)), _mm256_madd_epi16(low, _mm256_set1_epi16(1)));
}

/* The same lanes from int16 weights in quad_words_avx2's order against x in the quad layout
   (x0 at xquad, x1 at xquad + 32) */
static inline __attribute__((always_inline)) __m256i quad_dot(const __m256i q[2], const int16_t* xquad) {
  return two_vec_dot(q, xquad, xquad + 32);
}

/* Q4_1 or Q4_0 blocks b0, b1, the row's groups `group` and group + 1 (group even), their weights
   (Q4_1 the nibbles, Q4_0 the nibbles - 8) by byte products (m <= BYTE_ROWS_OF) or widened to words
   in quad_words_avx2's order against x's quad layout into even and odd, Q4_1's mins into min_even and
   min_odd: the lanes of a pair of Q4_K groups, the AVX-512 build's row_dot_512's too, so the same bits
   there and for any m. */
static inline __attribute__((always_inline)) void nibble_pair_avx2(const int code, const int m, const uint8_t* b0,
                                                                   const uint8_t* b1, int64_t group,
                                                                   const QuantizedRows* x, int64_t cols, __m256* even,
                                                                   __m256* odd, float* min_even, float* min_odd) {
  const int64_t groups_per_row = cols / GROUP;
  const int is_q4_1 = code == FORMAT_Q4_1, nibbles = is_q4_1 ? 8 : 2;
  const float dl0 = is_q4_1 ? load_f32(b0) : f16c(b0), dl1 = is_q4_1 ? load_f32(b1) : f16c(b1);
  const __m256i u0 = nibble_bytes(b0 + nibbles), u1 = nibble_bytes(b1 + nibbles);  /* unsigned: 0..15 */
  const __m256i w0 = is_q4_1 ? u0 : _mm256_sub_epi8(u0, _mm256_set1_epi8(8));     /* the weights */
  const __m256i w1 = is_q4_1 ? u1 : _mm256_sub_epi8(u1, _mm256_set1_epi8(8));
  __m256i words0[2], words1[2];
  const int bytes = m <= BYTE_ROWS_OF(code);
  if (!bytes) {
    quad_words_avx2(w0, _mm256_cmpgt_epi8(_mm256_setzero_si256(), w0), words0);
    quad_words_avx2(w1, _mm256_cmpgt_epi8(_mm256_setzero_si256(), w1), words1);
  }
  for (int i = 0; i < m; i++) {
    const int64_t at = i * cols + group * GROUP, first = i * groups_per_row + group;
    __m256i dot0, dot1;
    if (bytes) {
      dot0 = bytes_dot(u0, w0, x->xhi + at, x->xlo + at, x->bias16 + at / 2);
      dot1 = bytes_dot(u1, w1, x->xhi + at + GROUP, x->xlo + at + GROUP, x->bias16 + (at + GROUP) / 2);
    } else {
      dot0 = quad_dot(words0, x->xquad + at), dot1 = quad_dot(words1, x->xquad + at + 16);
    }
    even[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot0), _mm256_set1_ps(dl0 * x->scale[first]), even[i]);
    odd[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot1), _mm256_set1_ps(dl1 * x->scale[first + 1]), odd[i]);
    if (is_q4_1) {
      min_even[i] = fmaf(-load_f32(b0 + 4), x->sums32[first], min_even[i]);
      min_odd[i] = fmaf(-load_f32(b1 + 4), x->sums32[first + 1], min_odd[i]);
    }
  }
}

/* One Q4_K or Q6_K block of a row (its first group is `group0` of the row) by byte products (m <=
   BYTE_ROWS) or quad_dot into even and odd (the groups alternate, as in row_dot); Q4_K's mins into
   min_lanes. */
static inline __attribute__((always_inline)) void bytes_block_avx2(const int code, const int m, const uint8_t* block,
                                                                   int64_t group0, const QuantizedRows* x,
                                                                   int64_t cols, __m256* even, __m256* odd,
                                                                   __m256* min_lanes) {
  const int64_t groups_per_row = cols / GROUP;
  if (code == FORMAT_Q4_K) {
    __m256 dl, ml, ml_hi, sdl[MAX_M];
    k_block_scales_avx2(code, block, &dl, &ml, &ml_hi);
    for (int i = 0; i < m; i++) {
      const int64_t first = i * groups_per_row + group0;
      sdl[i] = _mm256_mul_ps(dl, _mm256_loadu_ps(x->scale + first));
      min_lanes[i] = _mm256_fmadd_ps(ml, _mm256_loadu_ps(x->sums32 + first), min_lanes[i]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
      __m256i q[2], words0[2], words1[2];
      q4_k_pair_bytes_avx2(block, t, q);
      if (m > BYTE_ROWS) quad_words_avx2(q[0], _mm256_setzero_si256(), words0), quad_words_avx2(q[1], _mm256_setzero_si256(), words1);
      for (int i = 0; i < m; i++) {
        const int64_t at = i * cols + (group0 + 2 * t) * GROUP;
        __m256i dot0, dot1;
        if (m > BYTE_ROWS) {
          dot0 = quad_dot(words0, x->xquad + at), dot1 = quad_dot(words1, x->xquad + at + 16);
        } else {
          dot0 = bytes_dot(q[0], q[0], x->xhi + at, x->xlo + at, NULL);
          dot1 = bytes_dot(q[1], q[1], x->xhi + at + GROUP, x->xlo + at + GROUP, NULL);
        }
        even[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot0), _mm256_permutevar8x32_ps(sdl[i], _mm256_set1_epi32(2 * t)), even[i]);
        odd[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot1), _mm256_permutevar8x32_ps(sdl[i], _mm256_set1_epi32(2 * t + 1)), odd[i]);
      }
    }
  } else {  /* Q6_K: lane k of group g is scaled by (d * sc[2g + k / 4]) * s_g */
    const __m256 d = _mm256_set1_ps(f16c(block + 208));
    const __m128i sc = _mm_loadu_si128((const __m128i*)(block + 192));
    const __m256 dsc_lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)));
    const __m256 dsc_hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))));
    __m256 scale_lo[MAX_M], scale_hi[MAX_M];  /* lane l: 16-group l (8 + l) times its 32-group's s */
    for (int i = 0; i < m; i++) {
      __m256 s = _mm256_loadu_ps(x->scale + i * groups_per_row + group0);
      scale_lo[i] = _mm256_mul_ps(dsc_lo, _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
      scale_hi[i] = _mm256_mul_ps(dsc_hi, _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
    }
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
      const __m256i u = q6_k_group_bytes_avx2(block, g), w = _mm256_sub_epi8(u, _mm256_set1_epi8(32));
      __m256i words[2];
      if (m > BYTE_ROWS) quad_words_avx2(w, _mm256_cmpgt_epi8(_mm256_setzero_si256(), w), words);
      const __m256i lanes = _mm256_setr_epi32(2 * (g % 4), 2 * (g % 4), 2 * (g % 4), 2 * (g % 4),
                                              2 * (g % 4) + 1, 2 * (g % 4) + 1, 2 * (g % 4) + 1, 2 * (g % 4) + 1);
      for (int i = 0; i < m; i++) {
        const int64_t at = i * cols + (group0 + g) * GROUP;
        __m256i dot = m > BYTE_ROWS ? quad_dot(words, x->xquad + i * cols + (group0 + g - g % 2) * GROUP + 16 * (g % 2))
                                    : bytes_dot(u, w, x->xhi + at, x->xlo + at, x->bias16 + at / 2);
        __m256 scale = _mm256_permutevar8x32_ps(g < 4 ? scale_lo[i] : scale_hi[i], lanes);
        if (g % 2) odd[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, odd[i]);
        else even[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, even[i]);
      }
    }
  }
}

/* One weight row against m quantized rows -> out[i * out_stride]. Inlined with constant code
   and m (row_dispatch), so the accumulators stay in registers. Groups alternate between two
   accumulators (even, odd) so that consecutive groups' FMAs do not wait on each other. A K-quant
   block's scales and mins are decoded once for its 8 groups, and its mins' term is one FMA of 8
   lanes (group g's min times the sum of x over it) per row. */
static inline __attribute__((always_inline)) void row_dot(const int code, const int m, const uint8_t* row,
                                                          int64_t num_blocks, int64_t block_bytes,
                                                          const QuantizedRows* x, int64_t cols, float* out,
                                                          int64_t out_stride) {
  __m256 even[MAX_M], odd[MAX_M], min_lanes[MAX_M];
  float min_even[MAX_M], min_odd[MAX_M];
  for (int i = 0; i < m; i++) {
    even[i] = odd[i] = min_lanes[i] = _mm256_setzero_ps();
    min_even[i] = min_odd[i] = 0.0f;
  }
  const int groups = code >= FORMAT_Q2_K ? 8 : 1, has_min = format_has_min(code);
  const int64_t groups_per_row = cols / GROUP;
  if (is_nibble_pairs(code) && byte_products(code, cols)) {
    for (int64_t blk = 0; blk < num_blocks; blk += 2) {
      const uint8_t* b0 = row + blk * block_bytes;
      prefetch_ahead(b0, 2 * block_bytes);
      nibble_pair_avx2(code, m, b0, b0 + block_bytes, blk, x, cols, even, odd, min_even, min_odd);
    }
  } else if (groups == 1) {
    int64_t blk = 0;
    for (; blk + 2 <= num_blocks; blk += 2) {
      prefetch_ahead(row + blk * block_bytes, 2 * block_bytes);
      GROUP_STEP(even, min_even, blk, 0);
      GROUP_STEP(odd, min_odd, blk + 1, 0);
    }
    if (blk < num_blocks) GROUP_STEP(even, min_even, blk, 0);
  } else if (code == FORMAT_Q4_K || code == FORMAT_Q6_K) {
    for (int64_t blk = 0; blk < num_blocks; blk++) {
      prefetch_ahead(row + blk * block_bytes, block_bytes);
      bytes_block_avx2(code, m, row + blk * block_bytes, blk * 8, x, cols, even, odd, min_lanes);
    }
  } else {
    for (int64_t blk = 0; blk < num_blocks; blk++) {
      const uint8_t* block = row + blk * block_bytes;
      prefetch_ahead(block, block_bytes);
      __m256 dl, ml, ml_hi, sdl[MAX_M];
      k_block_scales_avx2(code, block, &dl, &ml, &ml_hi);
      for (int i = 0; i < m; i++) {
        const int64_t first = i * groups_per_row + blk * 8;  /* the block's first group in row i */
        sdl[i] = _mm256_mul_ps(dl, _mm256_loadu_ps(x->scale + first));
        if (code == FORMAT_Q2_K) {
          min_lanes[i] = _mm256_fmadd_ps(ml, _mm256_loadu_ps(x->sums + 2 * first), min_lanes[i]);
          min_lanes[i] = _mm256_fmadd_ps(ml_hi, _mm256_loadu_ps(x->sums + 2 * first + 8), min_lanes[i]);
        } else if (has_min) {
          min_lanes[i] = _mm256_fmadd_ps(ml, _mm256_loadu_ps(x->sums32 + first), min_lanes[i]);
        }
      }
      K_GROUP_STEP(even, 0); K_GROUP_STEP(odd, 1); K_GROUP_STEP(even, 2); K_GROUP_STEP(odd, 3);
      K_GROUP_STEP(even, 4); K_GROUP_STEP(odd, 5); K_GROUP_STEP(even, 6); K_GROUP_STEP(odd, 7);
    }
  }
  for (int i = 0; i < m; i++)
    out[i * out_stride] = hsum256(_mm256_add_ps(even[i], odd[i])) - ((min_even[i] + min_odd[i]) + hsum256(min_lanes[i]));
}


#if PAIR_LAYOUT
/* The fp16 scales at p0 and p1 as [d0 x 8 | d1 x 8] (exact, as f16c) */
static inline __attribute__((always_inline)) __m512 f16_pair_512(const uint8_t* p0, const uint8_t* p1) {
  return _mm512_cvtph_ps(_mm256_mask_blend_epi16(0xFF00, _mm256_set1_epi16((short)load_u16(p0)),
                                                 _mm256_set1_epi16((short)load_u16(p1))));
}

/* row_dot for Q4_K, Q6_K, Q8_0, Q4_1 and Q4_0 (byte_products) with 512-bit vectors: two groups at a time
   (g even in lanes 0..7, g + 1 in 8..15 of one accumulator: the AVX2 row_dot's even and odd
   accumulators side by side), the same int32 lanes (Q8_0: block_decode_q16.h's pair layout; Q4_K,
   Q6_K, Q4_1, Q4_0: byte products, 4 bytes a lane in vpdpbusd) and the same FMAs in the same order per
   lane, so the same bits as row_dot. */
static inline __attribute__((always_inline)) __m512i pair_dot(const __m512i w[2], const int16_t* xp) {
  __m512i dot = _mm512_madd_epi16(w[0], _mm512_loadu_si512((const void*)xp));
  return _mm512_dpwssd_epi32(dot, w[1], _mm512_loadu_si512((const void*)(xp + 32)));
}

/* The 16 int32 lanes D_k of two groups (the row's values at `at` on): byte products of q (unsigned)
   against x's high bytes (from `start`: Q6_K's bias) and of x's low bytes against w (signed: q, or
   Q6_K's q - 32), or (words) the weights widened by quad_words_512 against x's quad layout. */
static inline __attribute__((always_inline)) __m512i pair_lanes_512(const int bytes, __m512i q, __m512i w,
                                                                    const __m512i words[2], const QuantizedRows* x,
                                                                    int64_t at, __m512i start) {
  if (!bytes) {
    __m512i dot = _mm512_madd_epi16(words[0], _mm512_loadu_si512((const void*)(x->xquad + at)));
    return _mm512_dpwssd_epi32(dot, words[1], _mm512_loadu_si512((const void*)(x->xquad + at + 32)));
  }
  __m512i dot = _mm512_dpbusd_epi32(start, q, _mm512_loadu_si512((const void*)(x->xhi + at)));
  return _mm512_dpbusd_epi32(_mm512_slli_epi32(dot, 8), _mm512_loadu_si512((const void*)(x->xlo + at)), w);
}

static inline __attribute__((always_inline)) void row_dot_512(const int code, const int m, const uint8_t* row,
                                                              int64_t num_blocks, int64_t block_bytes,
                                                              const QuantizedRows* x, int64_t cols, float* out,
                                                              int64_t out_stride) {
  __m512 acc[MAX_M];
  __m256 min_lanes[MAX_M];
  __m512 min_pairs[MAX_M];
  float min_even[MAX_M], min_odd[MAX_M];
  for (int i = 0; i < m; i++) {
    acc[i] = min_pairs[i] = _mm512_setzero_ps(), min_lanes[i] = _mm256_setzero_ps();
    min_even[i] = min_odd[i] = 0.0f;
  }
  const int64_t groups_per_row = cols / GROUP;
  if (is_nibble_pairs(code)) {  /* Q4_1, Q4_0: an even number of blocks a row (byte_products) */
    const int is_q4_1 = code == FORMAT_Q4_1, nibbles = is_q4_1 ? 8 : 2;
    for (int64_t blk = 0; blk < num_blocks; blk += 2) {
      const uint8_t* b0 = row + blk * block_bytes;
      const uint8_t* b1 = b0 + block_bytes;
      prefetch_ahead(b0, 2 * block_bytes);
      const __m512i q = nibble_pair_bytes_512(b0 + nibbles, b1 + nibbles);
      const __m512i w = is_q4_1 ? q : _mm512_sub_epi8(q, _mm512_set1_epi8(8));  /* the signed weights */
      __m512i words[2];
      if (m > BYTE_ROWS) quad_words_512(w, _mm512_movm_epi8(_mm512_movepi8_mask(w)), words);
      /* [d0 x 8 | d1 x 8], and Q4_1's mins the same way */
      const __m512 dl = is_q4_1 ? _mm512_mask_broadcastss_ps(_mm512_set1_ps(load_f32(b0)), 0xFF00, _mm_load_ss((const float*)b1))
                                : f16_pair_512(b0, b1);
      const __m512 ml = is_q4_1 ? _mm512_mask_broadcastss_ps(_mm512_set1_ps(load_f32(b0 + 4)), 0xFF00,
                                                             _mm_load_ss((const float*)(b1 + 4)))
                                : _mm512_setzero_ps();
      for (int i = 0; i < m; i++) {
        const int64_t pair = (i * groups_per_row + blk) * 8, at = i * cols + blk * GROUP;
        const __m512 scale = _mm512_mul_ps(dl, _mm512_loadu_ps(x->pair_scale + pair));
        const __m512i start = is_q4_1 || m > BYTE_ROWS ? _mm512_setzero_si512()
                                                       : _mm512_loadu_si512((const void*)(x->bias32 + at / 4));
        const __m512i dot = pair_lanes_512(m <= BYTE_ROWS, q, w, words, x, at, start);
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[i]);
        /* lanes 0 and 8: the AVX2 build's min_even and min_odd, fmaf(-m, S, .) */
        if (is_q4_1) min_pairs[i] = _mm512_fnmadd_ps(ml, _mm512_loadu_ps(x->pair_sums + pair), min_pairs[i]);
      }
    }
    for (int i = 0; i < m; i++) {
      min_even[i] = _mm512_cvtss_f32(min_pairs[i]);
      min_odd[i] = _mm_cvtss_f32(_mm512_extractf32x4_ps(min_pairs[i], 2));
    }
  } else if (code == FORMAT_Q8_0) {
    int64_t blk = 0;
    for (; blk + 2 <= num_blocks; blk += 2) {
      const uint8_t* b0 = row + blk * block_bytes;
      prefetch_ahead(b0, 2 * block_bytes);
      __m512i w[2];
      decode_q8_0_pair_512(b0, b0 + block_bytes, w);
      const __m512 dl = f16_pair_512(b0, b0 + block_bytes);
      for (int i = 0; i < m; i++) {
        const __m512 scale = _mm512_mul_ps(dl, _mm512_loadu_ps(x->pair_scale + (i * groups_per_row + blk) * 8));
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pair_dot(w, x->xp + i * cols + blk * GROUP)), scale, acc[i]);
      }
    }
    if (blk < num_blocks) {  /* the last, even block: the low half */
      __m256i q[2];
      float dl, ml[2];
      decode_group_q16_avx2(code, row + blk * block_bytes, 0, q, &dl, ml);
      for (int i = 0; i < m; i++) {
        __m256i dot = group_dot(q, x->xq + i * cols + blk * GROUP);
        __m256 scale = _mm256_set1_ps(dl * x->scale[i * groups_per_row + blk]);
        __m256 even = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, _mm512_castps512_ps256(acc[i]));
        acc[i] = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(acc[i]), _mm256_castps_pd(even), 0));
      }
    }
  } else {
    const __m512i index[4] = {  /* the pair scale: lane g of sdl in lanes 0..7, g + 1 in 8..15 */
      _mm512_inserti64x4(_mm512_set1_epi32(0), _mm256_set1_epi32(1), 1),
      _mm512_inserti64x4(_mm512_set1_epi32(2), _mm256_set1_epi32(3), 1),
      _mm512_inserti64x4(_mm512_set1_epi32(4), _mm256_set1_epi32(5), 1),
      _mm512_inserti64x4(_mm512_set1_epi32(6), _mm256_set1_epi32(7), 1),
    };
    for (int64_t blk = 0; blk < num_blocks; blk++) {
      const uint8_t* block = row + blk * block_bytes;
      prefetch_ahead(block, block_bytes);
      __m512 sdl[MAX_M];  /* Q4_K: lane g < 8 the group's d sc s; Q6_K: lane l the 16-group's (d sc) s */
      if (code == FORMAT_Q4_K) {
        __m512 dl_ml = q4_k_scales_512(block);
        __m256 dl = _mm512_castps512_ps256(dl_ml), ml = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(dl_ml), 1));
        for (int i = 0; i < m; i++) {
          const int64_t first = i * groups_per_row + blk * 8;
          sdl[i] = _mm512_castps256_ps512(_mm256_mul_ps(dl, _mm256_loadu_ps(x->scale + first)));
          min_lanes[i] = _mm256_fmadd_ps(ml, _mm256_loadu_ps(x->sums32 + first), min_lanes[i]);
        }
      } else {
        const __m512 dsc = _mm512_mul_ps(_mm512_set1_ps(f16c(block + 208)),
                                         _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(block + 192)))));
        const __m512i halves = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        for (int i = 0; i < m; i++) {
          const __m256 s = _mm256_loadu_ps(x->scale + i * groups_per_row + blk * 8);
          sdl[i] = _mm512_mul_ps(dsc, _mm512_permutexvar_ps(halves, _mm512_castps256_ps512(s)));
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < 4; t++) {
        /* Q6_K's lane scales: 16-groups 4t, 4t + 1 (group 2t), 4t + 2, 4t + 3 (group 2t + 1), 4 lanes each */
        const __m512i quarters = _mm512_setr_epi32(4 * t, 4 * t, 4 * t, 4 * t, 4 * t + 1, 4 * t + 1, 4 * t + 1, 4 * t + 1,
                                                   4 * t + 2, 4 * t + 2, 4 * t + 2, 4 * t + 2, 4 * t + 3, 4 * t + 3, 4 * t + 3, 4 * t + 3);
        const __m512i q = code == FORMAT_Q4_K ? q4_k_pair_bytes_512(block, t) : q6_k_pair_bytes_512(block, t);
        const __m512i w = code == FORMAT_Q4_K ? q : _mm512_sub_epi8(q, _mm512_set1_epi8(32));
        __m512i words[2];
        if (m > BYTE_ROWS)
          quad_words_512(w, code == FORMAT_Q4_K ? _mm512_setzero_si512() : _mm512_movm_epi8(_mm512_movepi8_mask(w)), words);
        for (int i = 0; i < m; i++) {
          const int64_t at = i * cols + (blk * 8 + 2 * t) * GROUP;
          const __m512i start = code == FORMAT_Q4_K || m > BYTE_ROWS ? _mm512_setzero_si512()
                                                                     : _mm512_loadu_si512((const void*)(x->bias32 + at / 4));
          const __m512i dot = pair_lanes_512(m <= BYTE_ROWS, q, w, words, x, at, start);
          __m512 scale = _mm512_permutexvar_ps(code == FORMAT_Q4_K ? index[t] : quarters, sdl[i]);
          acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[i]);
        }
      }
    }
  }
  for (int i = 0; i < m; i++) {
    __m256 sum = _mm256_add_ps(_mm512_castps512_ps256(acc[i]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i]), 1)));
    out[i * out_stride] = hsum256(sum) - ((min_even[i] + min_odd[i]) + hsum256(min_lanes[i]));
  }
}
#endif

#else  /* portable: the same sums, lane by lane */

static inline float hsum_lanes(const float a[8]) {  /* hsum256's order */
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

/* the dot products of an already decoded group of integers q, scaled by sdl[i] into acc[i] */
static inline void integer_group_step(int m, const int16_t* q, int64_t group, const float* sdl, int64_t sdl_stride,
                                      const QuantizedRows* x, int64_t cols, float acc[][8]) {
  for (int i = 0; i < m; i++) {
    const int16_t* xq = x->xq + i * cols + group * GROUP;
    for (int lane = 0; lane < 8; lane++) {  /* vpmaddwd's pairs: lane k sums 2k, 2k + 1 of each half */
      int32_t dot = q[2 * lane] * xq[2 * lane] + q[2 * lane + 1] * xq[2 * lane + 1]
                    + q[16 + 2 * lane] * xq[16 + 2 * lane] + q[17 + 2 * lane] * xq[17 + 2 * lane];
      acc[i][lane] = fmaf((float)dot, sdl[i * sdl_stride], acc[i][lane]);
    }
  }
}

/* Q4_K, Q6_K: the byte products' lanes, D_k = sum_{j = 4k..4k+3} (u_j - offset) xq_j (xq = 256 xhi +
   xlo exactly, so the sums of the split bytes), each scaled by scale[k / 4] (Q4_K: the group's
   d sc s twice; Q6_K: its 16-groups' (d sc) s) into acc[i]. */
static inline void byte_group_step(int m, const uint8_t* u, int offset, int64_t group, const float scale[][2],
                                   const QuantizedRows* x, int64_t cols, float acc[][8]) {
  for (int i = 0; i < m; i++) {
    const int16_t* xq = x->xq + i * cols + group * GROUP;
    for (int lane = 0; lane < 8; lane++) {
      int32_t dot = 0;
      for (int j = 4 * lane; j < 4 * lane + 4; j++) dot += (u[j] - offset) * xq[j];
      acc[i][lane] = fmaf((float)dot, scale[i][lane / 4], acc[i][lane]);
    }
  }
}

static inline void row_dot(const int code, const int m, const uint8_t* row, int64_t num_blocks, int64_t block_bytes,
                           const QuantizedRows* x, int64_t cols, float* out, int64_t out_stride) {
  float even[MAX_M][8] = {{0}}, odd[MAX_M][8] = {{0}}, min_lanes[MAX_M][8] = {{0}};
  float min_even[MAX_M] = {0}, min_odd[MAX_M] = {0};
  const int64_t groups_per_row = cols / GROUP;
  if (code < FORMAT_Q2_K) {
    for (int64_t blk = 0; blk < num_blocks; blk++) {  /* the AVX2 build's order */
      prefetch_ahead(row + blk * block_bytes, block_bytes);
      int16_t q[GROUP];
      float dl, ml[2], sdl[MAX_M], *min_acc = blk % 2 ? min_odd : min_even;
      decode_group_q16_scalar(code, row + blk * block_bytes, 0, q, &dl, ml);
      for (int i = 0; i < m; i++) {
        sdl[i] = dl * x->scale[i * groups_per_row + blk];
        if (format_has_min(code)) min_acc[i] = fmaf(ml[0], x->sums32[i * groups_per_row + blk], min_acc[i]);
      }
      if (byte_products(code, cols)) {  /* Q4_1, Q4_0: the byte products' lanes */
        uint8_t u[GROUP];
        float scale[MAX_M][2];
        group_bytes_scalar(code, row + blk * block_bytes, 0, u);
        for (int i = 0; i < m; i++) scale[i][0] = scale[i][1] = sdl[i];
        byte_group_step(m, u, byte_offset(code), blk, scale, x, cols, blk % 2 ? odd : even);
      } else {
        integer_group_step(m, q, blk, sdl, 1, x, cols, blk % 2 ? odd : even);
      }
    }
  } else {
    for (int64_t blk = 0; blk < num_blocks; blk++) {
      const uint8_t* block = row + blk * block_bytes;
      prefetch_ahead(block, block_bytes);
      KBlockFactors factors;
      k_block_factors(code, block, &factors);
      float sdl[MAX_M][8];
      for (int i = 0; i < m; i++) {
        const int64_t first = i * groups_per_row + blk * 8;
        for (int g = 0; g < 8; g++) {
          sdl[i][g] = factors.dl[g] * x->scale[first + g];
          if (code == FORMAT_Q2_K) {
            min_lanes[i][g] = fmaf(factors.ml[g], x->sums[2 * first + g], min_lanes[i][g]);
          } else if (format_has_min(code)) {
            min_lanes[i][g] = fmaf(factors.ml[g], x->sums32[first + g], min_lanes[i][g]);
          }
        }
        if (code == FORMAT_Q2_K)
          for (int g = 0; g < 8; g++) min_lanes[i][g] = fmaf(factors.ml[8 + g], x->sums[2 * first + 8 + g], min_lanes[i][g]);
      }
      for (int g = 0; g < 8; g++) {
        if (code == FORMAT_Q4_K || code == FORMAT_Q6_K) {
          uint8_t u[GROUP];
          float scale[MAX_M][2];
          group_bytes_scalar(code, block, g, u);
          for (int i = 0; i < m; i++)
            for (int half = 0; half < 2; half++)
              scale[i][half] = code == FORMAT_Q4_K ? sdl[i][g]
                               : (factors.dl[g] * (float)factors.scale16[2 * g + half]) * x->scale[i * groups_per_row + blk * 8 + g];
          byte_group_step(m, u, code == FORMAT_Q6_K ? 32 : 0, blk * 8 + g, scale, x, cols, g % 2 ? odd : even);
        } else {
          int16_t q[GROUP];
          decode_k_group_q16_scalar(code, block, g, &factors, q);
          integer_group_step(m, q, blk * 8 + g, &sdl[0][g], 8, x, cols, g % 2 ? odd : even);
        }
      }
    }
  }
  for (int i = 0; i < m; i++) {
    float a[8];
    for (int lane = 0; lane < 8; lane++) a[lane] = even[i][lane] + odd[i][lane];
    out[i * out_stride] = hsum_lanes(a) - ((min_even[i] + min_odd[i]) + hsum_lanes(min_lanes[i]));
  }
}
#endif

#if PAIR_LAYOUT
#define USES_512(C) ((C) == FORMAT_Q4_K || (C) == FORMAT_Q6_K || (C) == FORMAT_Q8_0 || (is_nibble_pairs(C) && byte_products(C, cols)))
#define ROW_CASE(C, M)                                                                             \
  case M:                                                                                         \
    if (USES_512(C)) row_dot_512(C, M, row, num_blocks, block_bytes, x, cols, out, out_stride);   \
    else row_dot(C, M, row, num_blocks, block_bytes, x, cols, out, out_stride);                    \
    break;
#else
#define ROW_CASE(C, M) case M: row_dot(C, M, row, num_blocks, block_bytes, x, cols, out, out_stride); break;
#endif
#define CODE_CASE(C)                                                                              \
  case C:                                                                                         \
    switch (m) { ROW_CASE(C, 1) ROW_CASE(C, 2) ROW_CASE(C, 3) ROW_CASE(C, 4) ROW_CASE(C, 5)       \
                 ROW_CASE(C, 6) ROW_CASE(C, 7) ROW_CASE(C, 8) }                                    \
    break;

static void row_dispatch(int code, int m, const uint8_t* row, int64_t num_blocks, int64_t block_bytes,
                         const QuantizedRows* x, int64_t cols, float* out, int64_t out_stride) {
  switch (code) {
    CODE_CASE(0) CODE_CASE(1) CODE_CASE(2) CODE_CASE(3) CODE_CASE(4) CODE_CASE(5) CODE_CASE(6)
    CODE_CASE(7) CODE_CASE(8) CODE_CASE(9)
  }
}

/* y (m, rows) = x (m, cols) @ W^T, activations quantized to int16, row i of y at y + i * y_stride. The float formats (F16, BF16,
   F32) have no integer weights: they run blocks_matmul's float product. Returns 0, -1 for a bad
   format code, -2 when the activation buffer cannot be had. */
int blocks_matmul_q16(int code, int64_t block_size, int64_t block_bytes, const uint8_t* W, const float* x, float* y,
                      int64_t m, int64_t rows, int64_t cols, int64_t y_stride, int num_threads) {
  if (code < 0 || code >= NUM_FORMATS) return -1;
  if (code >= FORMAT_F16)
    return blocks_matmul(code, block_size, block_bytes, W, x, y, m, rows, cols, y_stride, num_threads);
  QuantizedRows quantized;
  if (quantized_rows(m, cols, &quantized)) return -2;
  const int64_t groups_per_row = cols / GROUP;
  for (int64_t i = 0; i < m; i++)
    for (int64_t group = 0; group < groups_per_row; group++)
      quantize_group(x + i * cols + group * GROUP, quantized.xq + i * cols + group * GROUP,
                     quantized.scale + i * groups_per_row + group, quantized.sums + 2 * (i * groups_per_row + group),
                     quantized.sums32 + i * groups_per_row + group);
  if (PAIR_LAYOUT && code == FORMAT_Q8_0) pair_layout(quantized.xq, quantized.xp, m, cols);
  if (PAIR_LAYOUT && (code == FORMAT_Q8_0 || (is_nibble_pairs(code) && byte_products(code, cols))))
    pair_factors(quantized.scale, quantized.sums32, quantized.pair_scale, quantized.pair_sums, m * groups_per_row,
                 code == FORMAT_Q4_1);
#ifdef __AVX2__
  if (byte_products(code, cols)) {  /* byte products for calls of <= BYTE_ROWS rows */
    const int64_t last = m - MAX_M * ((m - 1) / MAX_M);  /* the rows of the last group of MAX_M */
    if (last <= BYTE_ROWS_OF(code))
      split_bytes(quantized.xq, quantized.xlo, quantized.xhi, quantized.bias16, quantized.bias32, m * cols,
                  byte_offset(code));
    if (m > BYTE_ROWS_OF(code)) quad_layout(quantized.xq, quantized.xquad, m * cols);
  }
#endif
  const int64_t num_blocks = cols / block_size, row_bytes = num_blocks * block_bytes;
  for (int64_t first = 0; first < m; first += MAX_M) {
    int group_m = (int)(m - first < MAX_M ? m - first : MAX_M);
    QuantizedRows part = {quantized.xq + first * cols, quantized.scale + first * groups_per_row,
                          quantized.sums + 2 * first * groups_per_row, quantized.sums32 + first * groups_per_row,
                          PAIR_LAYOUT ? quantized.xp + first * cols : NULL, quantized.xquad + first * cols,
                          quantized.xlo + first * cols,
                          quantized.xhi + first * cols, quantized.bias16 + first * cols / 2,
                          quantized.bias32 + first * cols / 4, quantized.pair_scale + first * cols / 4,
                          quantized.pair_sums + first * cols / 4};
    float* yg = y + first * y_stride;
    #pragma omp parallel num_threads(num_threads)
    {
      int64_t thread = omp_get_thread_num(), num = omp_get_num_threads();
      int64_t r0 = rows * thread / num, r1 = rows * (thread + 1) / num;
      for (int64_t r = r0; r < r1; r++)
        row_dispatch(code, group_m, W + r * row_bytes, num_blocks, block_bytes, &part, cols, yg + r, y_stride);
    }
  }
  return 0;
}

/* Packed-argument entry points (kernels/kernel_program.py records them): the fields of blocks_matmul(_q16)'s
   parameters in order, 8 bytes each. */

int64_t blocks_matmul_packed(const int64_t* a) {
  return blocks_matmul((int)a[0], a[1], a[2], (const uint8_t*)(intptr_t)a[3], (const float*)(intptr_t)a[4],
                       (float*)(intptr_t)a[5], a[6], a[7], a[8], a[9], (int)a[10]);
}

int64_t blocks_matmul_q16_packed(const int64_t* a) {
  return blocks_matmul_q16((int)a[0], a[1], a[2], (const uint8_t*)(intptr_t)a[3], (const float*)(intptr_t)a[4],
                           (float*)(intptr_t)a[5], a[6], a[7], a[8], a[9], (int)a[10]);
}
