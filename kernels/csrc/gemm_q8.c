/* Prefill GEMM over GGUF blocks with int8 activations (OpenMP), llama.cpp's vec_dot scheme:
   y (m, rows) = x (m, cols) @ W^T with W kept as quantized blocks of 32 along a row and x
   quantized per block of 32 to int8 (Q8: d_x = max|x| / 127, q_x = round(x / d_x)), so each
   block's dot product is an integer one, scaled once by d_w * d_x.

   Weights are repacked once at load (gemm_q8_repack) from BlockWeight's bytes (the formats'
   table and layouts: kernels/block_formats.py; codes: block_decode.h) into groups of R rows
   interleaved by 4 bytes (ik_llama.cpp's "_R8" idea), R = 16 with AVX-512 (a zmm holds 4 bytes
   of each of 16 rows), 8 with AVX2, in one of three layouts, per group and 32 columns:
     d    R floats, the rows' scales of these 32 weights
     min  R floats (LAYOUT_SCALE_MIN only)
     q    LAYOUT_BYTES (Q8_0): 8 vectors k = 0..7 of R x 4 bytes: bytes 4k..4k+3 of each row's
               32; AVX-512: q + 128 as unsigned (vpdpbusd is u8 x s8), AVX2: q (sign trick)
          LAYOUT_SCALE_MIN (Q4_1), LAYOUT_K4 (Q4_K: its 6-bit scales and mins as bytes, d and -dmin a
          256-column header: interleaved_rows.h) and LAYOUT_NIBBLES (Q4_0, w = d * (q - 8)): 4 vectors
          j = 0..3 of R x 4 bytes: low
               nibbles elements 4j..4j+3, high nibbles elements 4(j+4)..4(j+4)+3 of each row's 32
   One vector of weights times x's 4 bytes broadcast gives, lane r, row r's partial dot
   product: no horizontal sums. Rows past the weight's last (a partial group) are zero.

   A micro-kernel multiplies one group (R rows) by up to TOKENS x rows, block by block,
   the block's weight vectors loaded once for all of them; OpenMP splits the groups. The sum
   over blocks runs in block order in float32 for every m, so a row's result does not depend
   on how many rows share the call.

   gemm_q16 multiplies the same layouts (LAYOUT_SCALE_MIN: Q4_1, LAYOUT_K4: Q4_K) by int16 activations instead
   (q16_activations.h: what the few-rows block kernels use, 15 bits of each group's largest value), for
   decode: each int16 x value split in a high byte (signed) and a low one (unsigned), x = 256 hi + lo,
   and a block's integer dot product of row r the exact int32 256 * sum w hi + sum w lo (two vpdpbusd
   a weight vector: nibbles x hi, lo x nibbles; AVX2: maddubs pairs); then per row and block, in block
   order, acc = fma(float(dot), d_w * s_x, acc) and mins = fma(m_w, sum x, mins), y = acc + mins: the
   same float operations in both builds, so the same bits, and none depends on m. The AVX2 build's gemm_q16 also
   reads Q6_K repacked (LAYOUT_K6: interleaved_rows.h), with its own integer products (group_tile_q16_k6). */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block_decode.h"
#include "q16_activations.h"

#define BLOCK 32
#define TOKENS 8

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define R 16
#define VARIANT "avx512_vnni"
#else
#define R 8
#define VARIANT "avx2"
#endif

#include "interleaved_rows.h" /* the layouts' codes and block records (needs R) */

const char* gemm_q8_variant(void) { return VARIANT; }
int gemm_q8_interleave(void) { return R; }

/* the layout a source format is repacked into; -1: none */
int gemm_q8_layout(int format) {
  switch (format) {
    case FORMAT_Q4_1: return LAYOUT_SCALE_MIN;
    case FORMAT_Q4_K: return LAYOUT_K4;
    case FORMAT_Q8_0: return LAYOUT_BYTES;
    case FORMAT_Q4_0: return LAYOUT_NIBBLES;
#if R == 8
    case FORMAT_Q6_K: return LAYOUT_K6;  /* gemm_q16 only */
#endif
    default: return -1;
  }
}

int64_t gemm_q8_packed_bytes(int layout, int64_t rows, int64_t cols) {
  return (rows + R - 1) / R * group_bytes(layout, cols / BLOCK);
}

/* element e (0..31) of 16 nibble bytes: e < 16 low nibble of byte e, else high nibble of byte e - 16 */
static inline uint8_t nibble(const uint8_t* nibbles, int e) {
  return e < 16 ? nibbles[e] & 15 : nibbles[e - 16] >> 4;
}

/* The 32 weights b (a 32-column block index) of one source row: scale, min, and the 32 quantized
   values (as stored in the layout: unsigned nibble values, or Q8_0's signed bytes). */
static void source_group(int format, const uint8_t* row, int64_t b, float* d, float* m, uint8_t q[32]) {
  if (format == FORMAT_Q4_1) {
    const uint8_t* block = row + b * 24;
    *d = load_f32(block), *m = load_f32(block + 4);
    for (int e = 0; e < 32; e++) q[e] = nibble(block + 8, e);
  } else if (format == FORMAT_Q8_0) {
    const uint8_t* block = row + b * 34;
    *d = load_f16(block), *m = 0.0f;
    memcpy(q, block + 2, 32);
  } else if (format == FORMAT_Q4_0) {
    const uint8_t* block = row + b * 18;
    *d = load_f16(block), *m = 0.0f;
    for (int e = 0; e < 32; e++) q[e] = nibble(block + 2, e);
  } else {  /* FORMAT_Q4_K: group g of a 256-block; w = d * sc * q - dmin * mn */
    const uint8_t* block = row + (b / 8) * 144;
    int g = (int)(b % 8), sc, mn;
    scale_min_k4(block + 4, g, &sc, &mn);
    *d = load_f16(block) * (float)sc, *m = -(load_f16(block + 2) * (float)mn);
    const uint8_t* qs = block + 16 + 32 * (g / 2);
    for (int e = 0; e < 32; e++) q[e] = g % 2 ? qs[e] >> 4 : qs[e] & 15;
  }
}

/* Q6_K (210 bytes per 256 weights: ql[128] low 4 bits, qh[64] top 2 bits, int8 scales[16] per 16, fp16 d):
   the 6-bit values u of 32-column group g (0..7) of a 256-block (llama.cpp's order: element e of the block
   takes ql[64 n + 32 (q % 2) + l]'s low nibble for q < 2, else its high one, and bits 2q.. of qh[32 n + l],
   with n = e / 128, q = e % 128 / 32, l = e % 32) */
static void q6_k_values(const uint8_t* block, int g, uint8_t u[32]) {
  const uint8_t* ql = block;
  const uint8_t* qh = block + 128;
  for (int i = 0; i < 32; i++) {
    const int e = 32 * g + i, n = e / 128, q = e % 128 / 32, l = e % 32;
    const uint8_t low = ql[64 * n + 32 * (q % 2) + l];
    u[i] = (uint8_t)((q < 2 ? low & 15 : low >> 4) | ((qh[32 * n + l] >> (2 * q)) & 3) << 4);
  }
}

/* LAYOUT_K6's record of row r (of R) for 32-column block b from its Q6_K row (interleaved_rows.h) */
static void repack_k6(const uint8_t* row, int64_t b, int r, uint8_t* group, uint8_t* out) {
  const uint8_t* block = row + (b / 8) * 210;
  const int g = (int)(b % 8);
  uint8_t u[32];
  q6_k_values(block, g, u);
  out[r] = block[192 + 2 * g], out[R + r] = block[192 + 2 * g + 1];
  ((float*)(group + b / 8 * K6_SUPER))[r] = load_f16(block + 208);
  uint8_t* nibbles = out + 2 * R;
  uint8_t* plane = nibbles + 16 * R;
  for (int j = 0; j < 4; j++)
    for (int i = 0; i < 4; i++) nibbles[(j * R + r) * 4 + i] = (u[4 * j + i] & 15) | (u[4 * (j + 4) + i] & 15) << 4;
  for (int k = 0; k < 8; k++)
    for (int i = 0; i < 4; i++) plane[((k / 4) * R + r) * 4 + i] |= (uint8_t)((u[4 * k + i] >> 4) << (2 * (k % 4)));
}

/* src: BlockWeight bytes (rows, bytes per row) of `format` -> dst (gemm_q8_packed_bytes of its layout) */
void gemm_q8_repack(int format, const uint8_t* src, int64_t src_row_bytes, uint8_t* dst, int64_t rows,
                    int64_t cols) {
  int layout = gemm_q8_layout(format);
  int64_t nb = cols / BLOCK, groups = (rows + R - 1) / R;
  #pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; g++) {
    uint8_t* group = dst + g * group_bytes(layout, nb);
    memset(group, 0, (size_t)group_bytes(layout, nb));
    for (int64_t b = 0; b < nb; b++) {
      uint8_t* out = (uint8_t*)block_record(layout, group, b);
      float* d = (float*)out;
      uint8_t* q = out + scale_bytes(layout);
      for (int r = 0; r < R && g * R + r < rows; r++) {
        const uint8_t* row = src + (g * R + r) * src_row_bytes;
        if (layout == LAYOUT_K6) {
          repack_k6(row, b, r, group, out);
          continue;
        }
        float scale, min;
        uint8_t values[32];
        source_group(format, row, b, &scale, &min, values);
        if (layout == LAYOUT_K4) {  /* Q4_K's own 6-bit scale and min, its block's d and -dmin in the header */
          const uint8_t* block = row + (b / 8) * 144;
          int sc, mn;
          scale_min_k4(block + 4, (int)(b % 8), &sc, &mn);
          out[r] = (uint8_t)sc, out[R + r] = (uint8_t)mn;
          float* header = (float*)(group + b / 8 * K4_SUPER);
          header[r] = load_f16(block), header[R + r] = -load_f16(block + 2);
        } else {
          d[r] = scale;
          if (layout == LAYOUT_SCALE_MIN) d[R + r] = min;
        }
        if (layout == LAYOUT_BYTES) {
          for (int k = 0; k < 8; k++)
            for (int i = 0; i < 4; i++) q[(k * R + r) * 4 + i] = values[4 * k + i] ^ (R == 16 ? 0x80 : 0);
        } else {
          for (int j = 0; j < 4; j++)
            for (int i = 0; i < 4; i++) q[(j * R + r) * 4 + i] = values[4 * j + i] | values[4 * (j + 4) + i] << 4;
        }
      }
    }
  }
}

/* x (m, cols) -> q (m, cols) int8, d (m, nb) float, and per block the term the layout's
   kernel adds (corr, m x nb): SCALE_MIN d_x * sum(q_x) as float (times min); as int32 added to
   the integer dot product, NIBBLES -8 * sum(q_x) (w = d * (q - 8)), BYTES with AVX-512
   -128 * sum(q_x) (the +128 of the unsigned weights taken back), with AVX2 0. */
static void quantize_rows(int layout, const float* x, int8_t* q, float* d, int32_t* corr, int64_t m, int64_t cols,
                          int num_threads) {
  int64_t nb = cols / BLOCK;
  #pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t index = 0; index < m * nb; index++) {
    const float* xb = x + index * BLOCK;
    int8_t* qb = q + index * BLOCK;
    __m256 amax = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int k = 0; k < 4; k++) amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(xb + 8 * k), abs_mask));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float scale = _mm_cvtss_f32(m4) / 127.0f;
    float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    __m256 iv = _mm256_set1_ps(inverse);
    int32_t sum = 0;
    for (int k = 0; k < 4; k++) {
      __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), iv));  /* nearest, ties to even */
      int32_t lanes[8];
      _mm256_storeu_si256((__m256i*)lanes, v);
      for (int i = 0; i < 8; i++) {
        qb[8 * k + i] = (int8_t)lanes[i];
        sum += lanes[i];
      }
    }
    d[index] = scale;
    if (has_min(layout)) {
      float term = scale * (float)sum;
      memcpy(corr + index, &term, 4);
    } else {
      corr[index] = layout == LAYOUT_NIBBLES ? -8 * sum : R == 16 ? -128 * sum : 0;
    }
  }
}

static inline int32_t x4(const int8_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return v;
}

#if R == 16
static inline void store_rows(float* out, __m512 v, int valid) {
  _mm512_mask_storeu_ps(out, (__mmask16)((1u << valid) - 1), v);
}
/* One group (16 rows) x nt tokens over all nb blocks -> acc[t] (16 rows' sums). */
static inline __attribute__((always_inline)) void group_tile(
    const int layout, const int nt, const uint8_t* group, int64_t nb, const int8_t* xq, const float* xd,
    const int32_t* xc, int64_t cols, float* out, int64_t out_stride, int valid) {
  __m512 acc[TOKENS];
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* p = block_record(layout, group, b);
    __m512 dw, mw;
    block_scales(layout, group, b, p, &dw, &mw);
    __m512i w[8];
    if (layout != LAYOUT_BYTES) {
      const uint8_t* q = p + scale_bytes(layout);
      for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512((const void*)(q + 64 * j));
        w[j] = _mm512_and_si512(v, low);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    } else {
      const uint8_t* q = p + R * 4;
      for (int k = 0; k < 8; k++) w[k] = _mm512_loadu_si512((const void*)(q + 64 * k));
    }
    if (has_min(layout)) {
      for (int t = 0; t < nt; t++) {
        const int8_t* xb = xq + t * cols + b * BLOCK;
        __m512i i = _mm512_setzero_si512();
        for (int k = 0; k < 8; k++) i = _mm512_dpbusd_epi32(i, w[k], _mm512_set1_epi32(x4(xb + 4 * k)));
        float dx, term;
        dx = xd[t * nb + b];
        memcpy(&term, xc + t * nb + b, 4);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[t]);
        acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(term), acc[t]);
      }
    } else {
      for (int t = 0; t < nt; t++) {
        const int8_t* xb = xq + t * cols + b * BLOCK;
        __m512i i = _mm512_set1_epi32(xc[t * nb + b]);
        for (int k = 0; k < 8; k++) i = _mm512_dpbusd_epi32(i, w[k], _mm512_set1_epi32(x4(xb + 4 * k)));
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(dw, _mm512_set1_ps(xd[t * nb + b])), acc[t]);
      }
    }
  }
  for (int t = 0; t < nt; t++) store_rows(out + t * out_stride, acc[t], valid);
}
#else
static inline void store_rows(float* out, __m256 v, int valid) {
  if (valid == R) {
    _mm256_storeu_ps(out, v);
  } else {
    float lanes[R];
    _mm256_storeu_ps(lanes, v);
    memcpy(out, lanes, (size_t)valid * sizeof(float));
  }
}
/* AVX2: maddubs (u8 x s8 -> saturating int16 pairs). Q8_0 takes |w| and x with w's sign
   (pairs <= 2 * 128 * 127, no saturation); Q4_1's nibbles are unsigned and small, so its 8
   int16 partials add up without saturating (8 * 2 * 15 * 127 < 32768) before one madd. */
static inline __attribute__((always_inline)) void group_tile(
    const int layout, const int nt, const uint8_t* group, int64_t nb, const int8_t* xq, const float* xd,
    const int32_t* xc, int64_t cols, float* out, int64_t out_stride, int valid) {
  __m256 acc[TOKENS];
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* p = block_record(layout, group, b);
    __m256 dw, mw;
    block_scales(layout, group, b, p, &dw, &mw);
    __m256i w[8];
    if (layout != LAYOUT_BYTES) {
      const uint8_t* q = p + scale_bytes(layout);
      for (int j = 0; j < 4; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i*)(q + 32 * j));
        w[j] = _mm256_and_si256(v, low);
        w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
      for (int t = 0; t < nt; t++) {
        const int8_t* xb = xq + t * cols + b * BLOCK;
        __m256i s = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x4(xb)));
        for (int k = 1; k < 8; k++) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[k], _mm256_set1_epi32(x4(xb + 4 * k))));
        __m256i i = _mm256_madd_epi16(s, ones);
        if (layout == LAYOUT_NIBBLES) i = _mm256_add_epi32(i, _mm256_set1_epi32(xc[t * nb + b]));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw, _mm256_set1_ps(xd[t * nb + b])), acc[t]);
        if (has_min(layout)) {
          float term;
          memcpy(&term, xc + t * nb + b, 4);
          acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(term), acc[t]);
        }
      }
    } else {
      const uint8_t* q = p + R * 4;
      __m256i u[8];
      for (int k = 0; k < 8; k++) {
        w[k] = _mm256_loadu_si256((const __m256i*)(q + 32 * k));
        u[k] = _mm256_abs_epi8(w[k]);
      }
      for (int t = 0; t < nt; t++) {
        const int8_t* xb = xq + t * cols + b * BLOCK;
        __m256i i = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) {
          __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(x4(xb + 4 * k)), w[k]);
          i = _mm256_add_epi32(i, _mm256_madd_epi16(_mm256_maddubs_epi16(u[k], signed_x), ones));
        }
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw, _mm256_set1_ps(xd[t * nb + b])), acc[t]);
      }
    }
  }
  for (int t = 0; t < nt; t++) store_rows(out + t * out_stride, acc[t], valid);
}
#endif

#define TILE_CASE(NT)                                                                                         \
  case NT:                                                                                                    \
    if (layout == LAYOUT_SCALE_MIN) group_tile(LAYOUT_SCALE_MIN, NT, group, nb, xq, xd, xc, cols, out, out_stride, valid); \
    else if (layout == LAYOUT_K4) group_tile(LAYOUT_K4, NT, group, nb, xq, xd, xc, cols, out, out_stride, valid);           \
    else if (layout == LAYOUT_BYTES) group_tile(LAYOUT_BYTES, NT, group, nb, xq, xd, xc, cols, out, out_stride, valid);    \
    else group_tile(LAYOUT_NIBBLES, NT, group, nb, xq, xd, xc, cols, out, out_stride, valid);                             \
    break;

static void tile_dispatch(int layout, int nt, const uint8_t* group, int64_t nb, const int8_t* xq, const float* xd,
                          const int32_t* xc, int64_t cols, float* out, int64_t out_stride, int valid) {
  switch (nt) { TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8) }
}

/* packed: gemm_q8_repack's output in `layout`; x (m, cols) float32 -> y (m, rows). Returns 0,
   -1 when the quantized copy of x cannot be allocated, -2 for LAYOUT_K6 (gemm_q16's alone). */
int gemm_q8(int layout, const uint8_t* packed, const float* x, float* y, int64_t m, int64_t rows, int64_t cols,
            int num_threads) {
  if (layout == LAYOUT_K6) return -2;  /* decode's gemm_q16 reads it, not this GEMM */
  int64_t nb = cols / BLOCK, groups = (rows + R - 1) / R, gbytes = group_bytes(layout, nb);
  int8_t* xq = (int8_t*)malloc((size_t)(m * cols));
  float* xd = (float*)malloc((size_t)(m * nb) * sizeof(float));
  int32_t* xc = (int32_t*)malloc((size_t)(m * nb) * sizeof(int32_t));
  if (!xq || !xd || !xc) {
    free(xq), free(xd), free(xc);
    return -1;
  }
  quantize_rows(layout, x, xq, xd, xc, m, cols, num_threads);
  /* dynamic: on a shared machine a thread that loses its core leaves its groups to the others */
  #pragma omp parallel for schedule(dynamic, 2) num_threads(num_threads)
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* group = packed + g * gbytes;
    int valid = rows - g * R < R ? (int)(rows - g * R) : R;
    for (int64_t t0 = 0; t0 < m; t0 += TOKENS) {
      int nt = m - t0 < TOKENS ? (int)(m - t0) : TOKENS;
      tile_dispatch(layout, nt, group, nb, xq + t0 * cols, xd + t0 * nb, xc + t0 * nb, cols,
                    y + t0 * rows + g * R, rows, valid);
    }
  }
  free(xq), free(xd), free(xc);
  return 0;
}

/* ------------------------------------------------------------ int16 activations (gemm_q16) */

/* x (m, cols) quantized (q16_activations.h), split in bytes: lo, hi (m, cols); s (m, nb) the scales;
   sums (m, nb) the float sums of each 32; hi16 (m, 2 nb) -32 * 256 * the sum of each 16 high bytes (LAYOUT_K6:
   its products take u = w + 32 against the high bytes, this takes the 32 back) */
typedef struct {
  uint8_t* lo;
  int8_t* hi;
  float* s;
  float* sums;
  int32_t* hi16;
} SplitRows;

/* gemm_q16 asks for each group's weights this many bytes ahead of the block it multiplies (a group's
   blocks are one forward stream; at one row of x the hardware prefetchers alone left it waiting, as
   block_matmul_q16.c's PREFETCH_DISTANCE says of the blocks) */
#define Q16_PREFETCH 2048

static __thread void* q16_scratch = NULL;
static __thread size_t q16_scratch_bytes = 0;

/* hi16: LAYOUT_K6's sums, made only for it */
static int split_rows(const float* x, int64_t m, int64_t cols, int hi16, SplitRows* out) {
  const int64_t n = m * cols, nb = cols / BLOCK;
  const size_t need = (size_t)(2 * n + 16 * m * nb + 128);
  if (need > q16_scratch_bytes) {
    void* grown = realloc(q16_scratch, need);
    if (grown == NULL) return -1;
    q16_scratch = grown, q16_scratch_bytes = need;
  }
  out->lo = (uint8_t*)q16_scratch;
  out->hi = (int8_t*)(out->lo + n);
  out->s = (float*)(((uintptr_t)(out->hi + n) + 63) & ~(uintptr_t)63);
  out->sums = out->s + m * nb;
  out->hi16 = (int32_t*)(out->sums + m * nb);
  for (int64_t index = 0; index < m * nb; index++) {
    int16_t xq[BLOCK];
    float sums16[2];
    quantize_group(x + index * BLOCK, xq, out->s + index, sums16, out->sums + index);
    split_int16(xq, out->lo + index * BLOCK, out->hi + index * BLOCK, BLOCK);
    for (int half = 0; half < 2 * hi16; half++) {
      int32_t sum = 0;
      for (int e = 0; e < 16; e++) sum += out->hi[index * BLOCK + 16 * half + e];
      out->hi16[2 * index + half] = -8192 * sum;
    }
  }
  return 0;
}

#if R == 16
/* One group (16 rows) x nt rows of x over all nb blocks -> out (16 rows' results each). */
static inline __attribute__((always_inline)) void group_tile_q16(const int layout, const int nt, const uint8_t* group, int64_t nb,
                                                                 const SplitRows* x, int64_t cols, float* out,
                                                                 int64_t out_stride, int valid) {
  __m512 acc[TOKENS], mins[TOKENS];
  const int64_t gbb = group_block_bytes(layout);
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int t = 0; t < nt; t++) acc[t] = mins[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* p = block_record(layout, group, b);
    for (int64_t byte = 0; byte < gbb; byte += 64) _mm_prefetch((const char*)p + Q16_PREFETCH + byte, _MM_HINT_T0);
    __m512 dw, mw;
    block_scales(layout, group, b, p, &dw, &mw);
    const uint8_t* q = p + scale_bytes(layout);
    __m512i w[8];  /* w[k]: elements 4k..4k+3 of each row's 32 */
    for (int j = 0; j < 4; j++) {
      __m512i v = _mm512_loadu_si512((const void*)(q + 64 * j));
      w[j] = _mm512_and_si512(v, low);
      w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    for (int t = 0; t < nt; t++) {
      const int8_t* hb = x->hi + t * cols + b * BLOCK;
      const uint8_t* lb = x->lo + t * cols + b * BLOCK;
      __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
      for (int k = 0; k < 8; k++) {
        hi = _mm512_dpbusd_epi32(hi, w[k], _mm512_set1_epi32(x4(hb + 4 * k)));
        lo = _mm512_dpbusd_epi32(lo, _mm512_set1_epi32(x4((const int8_t*)lb + 4 * k)), w[k]);
      }
      const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(x->s[t * nb + b])), acc[t]);
      mins[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->sums[t * nb + b]), mins[t]);
    }
  }
  for (int t = 0; t < nt; t++) store_rows(out + t * out_stride, _mm512_add_ps(acc[t], mins[t]), valid);
}
#else
/* AVX2: the nibbles (<= 15) against the high bytes make maddubs pairs <= 3840, eight of them add up in
   int16 (30720); the low bytes (<= 255) against the nibbles make pairs <= 7650, four add up (30600). */
static inline __attribute__((always_inline)) void group_tile_q16(const int layout, const int nt, const uint8_t* group, int64_t nb,
                                                                 const SplitRows* x, int64_t cols, float* out,
                                                                 int64_t out_stride, int valid) {
  __m256 acc[TOKENS], mins[TOKENS];
  const int64_t gbb = group_block_bytes(layout);
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int t = 0; t < nt; t++) acc[t] = mins[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* p = block_record(layout, group, b);
    for (int64_t byte = 0; byte < gbb; byte += 64) _mm_prefetch((const char*)p + Q16_PREFETCH + byte, _MM_HINT_T0);
    __m256 dw, mw;
    block_scales(layout, group, b, p, &dw, &mw);
    const uint8_t* q = p + scale_bytes(layout);
    __m256i w[8];
    for (int j = 0; j < 4; j++) {
      __m256i v = _mm256_loadu_si256((const __m256i*)(q + 32 * j));
      w[j] = _mm256_and_si256(v, low);
      w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
    for (int t = 0; t < nt; t++) {
      const int8_t* hb = x->hi + t * cols + b * BLOCK;
      const uint8_t* lb = x->lo + t * cols + b * BLOCK;
      __m256i hi16 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x4(hb)));
      for (int k = 1; k < 8; k++) hi16 = _mm256_add_epi16(hi16, _mm256_maddubs_epi16(w[k], _mm256_set1_epi32(x4(hb + 4 * k))));
      __m256i lo = _mm256_setzero_si256();
      for (int half = 0; half < 2; half++) {
        __m256i lo16 = _mm256_maddubs_epi16(_mm256_set1_epi32(x4((const int8_t*)lb + 16 * half)), w[4 * half]);
        for (int k = 4 * half + 1; k < 4 * half + 4; k++)
          lo16 = _mm256_add_epi16(lo16, _mm256_maddubs_epi16(_mm256_set1_epi32(x4((const int8_t*)lb + 4 * k)), w[k]));
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(lo16, ones));
      }
      const __m256i dot = _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(hi16, ones), 8), lo);
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw, _mm256_set1_ps(x->s[t * nb + b])), acc[t]);
      mins[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->sums[t * nb + b]), mins[t]);
    }
  }
  for (int t = 0; t < nt; t++) store_rows(out + t * out_stride, _mm256_add_ps(acc[t], mins[t]), valid);
}

/* LAYOUT_K6 (Q6_K, w = d sc (u - 32)): per block and half (16 columns, one sc), the exact integer
   D = sum (u - 32) xq = 256 (sum u hi - 32 sum hi) + sum (u - 32) lo, from maddubs pairs that do not saturate
   (u <= 63 against hi: pairs <= 16128, two add up; lo <= 255 against u - 32 in [-32, 31]: pairs in
   [-16320, 15810], two add up); then acc = fma(float(D), d sc s_x, acc), half 0 then half 1. |D| < 2^24: exact
   in float32. */
static inline __attribute__((always_inline)) void group_tile_q16_k6(const int nt, const uint8_t* group, int64_t nb,
                                                                    const SplitRows* x, int64_t cols, float* out,
                                                                    int64_t out_stride, int valid) {
  __m256 acc[TOKENS];
  const int64_t gbb = group_block_bytes(LAYOUT_K6);
  const __m256i low = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30), offset = _mm256_set1_epi8(32),
                ones = _mm256_set1_epi16(1);
  for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* p = block_record(LAYOUT_K6, group, b);
    for (int64_t byte = 0; byte < gbb; byte += 64) _mm_prefetch((const char*)p + Q16_PREFETCH + byte, _MM_HINT_T0);
    const __m256 d = _mm256_loadu_ps((const float*)(group + b / 8 * K6_SUPER));
    __m256 dsc[2];
    for (int half = 0; half < 2; half++)
      dsc[half] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(p + R * half)))));
    const uint8_t* q = p + 2 * R;
    const __m256i planes[2] = {_mm256_loadu_si256((const __m256i*)(q + 16 * R)),
                               _mm256_loadu_si256((const __m256i*)(q + 16 * R + 32))};
    __m256i u[8], w[8];  /* weight vector k: elements 4k..4k+3 of each row's 32; u unsigned, w = u - 32 */
    for (int j = 0; j < 4; j++) {
      const __m256i v = _mm256_loadu_si256((const __m256i*)(q + 32 * j));
      const __m256i nibbles[2] = {_mm256_and_si256(v, low), _mm256_and_si256(_mm256_srli_epi16(v, 4), low)};
      for (int half = 0; half < 2; half++) {  /* top bits of vector 4 half + j: bits 2j, 2j + 1 of its plane, to 4, 5 */
        const __m256i plane = planes[half];
        const __m256i bits = j == 0 ? _mm256_slli_epi16(plane, 4) : j == 1 ? _mm256_slli_epi16(plane, 2)
                             : j == 2 ? plane : _mm256_srli_epi16(plane, 2);
        u[4 * half + j] = _mm256_or_si256(nibbles[half], _mm256_and_si256(bits, top));
        w[4 * half + j] = _mm256_sub_epi8(u[4 * half + j], offset);
      }
    }
    for (int t = 0; t < nt; t++) {
      const int8_t* hb = x->hi + t * cols + b * BLOCK;
      const uint8_t* lb = x->lo + t * cols + b * BLOCK;
      const float s = x->s[t * nb + b];
      for (int half = 0; half < 2; half++) {
        const int k = 4 * half;
        const __m256i hi = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[k], _mm256_set1_epi32(x4(hb + 4 * k))),
                                               _mm256_maddubs_epi16(u[k + 1], _mm256_set1_epi32(x4(hb + 4 * k + 4)))), ones),
            _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u[k + 2], _mm256_set1_epi32(x4(hb + 4 * k + 8))),
                                               _mm256_maddubs_epi16(u[k + 3], _mm256_set1_epi32(x4(hb + 4 * k + 12)))), ones));
        const __m256i lo = _mm256_add_epi32(
            _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(x4((const int8_t*)lb + 4 * k)), w[k]),
                                               _mm256_maddubs_epi16(_mm256_set1_epi32(x4((const int8_t*)lb + 4 * k + 4)), w[k + 1])), ones),
            _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(_mm256_set1_epi32(x4((const int8_t*)lb + 4 * k + 8)), w[k + 2]),
                                               _mm256_maddubs_epi16(_mm256_set1_epi32(x4((const int8_t*)lb + 4 * k + 12)), w[k + 3])), ones));
        const __m256i dot = _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo),
                                             _mm256_set1_epi32(x->hi16[t * 2 * nb + 2 * b + half]));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dsc[half], _mm256_set1_ps(s)), acc[t]);
      }
    }
  }
  for (int t = 0; t < nt; t++) store_rows(out + t * out_stride, acc[t], valid);
}
#endif

#if R == 8
#define K6_TILE(NT) group_tile_q16_k6(NT, group, nb, &part, cols, out, y_stride, valid)
#else
#define K6_TILE(NT) (void)0 /* no LAYOUT_K6 in 16-row groups (gemm_q8_layout) */
#endif
#define Q16_CASE(NT)                                                                                 \
  case NT:                                                                                           \
    if (layout == LAYOUT_K4) group_tile_q16(LAYOUT_K4, NT, group, nb, &part, cols, out, y_stride, valid); \
    else if (layout == LAYOUT_K6) K6_TILE(NT);                                                        \
    else group_tile_q16(LAYOUT_SCALE_MIN, NT, group, nb, &part, cols, out, y_stride, valid);          \
    break;

/* packed: gemm_q8_repack's output in LAYOUT_SCALE_MIN, LAYOUT_K4 or (8-row groups) LAYOUT_K6; y (m, rows) = x (m, cols) @ W^T with x quantized to
   int16, row i of y at y + i * y_stride (y_stride >= rows). Returns 0, -1 for another layout, -2 when the
   quantized x cannot be allocated. Groups split statically between threads. */
int gemm_q16(int layout, const uint8_t* packed, const float* x, float* y, int64_t m, int64_t rows, int64_t cols,
             int64_t y_stride, int num_threads) {
  if (!has_min(layout) && !(layout == LAYOUT_K6 && R == 8)) return -1;
  SplitRows split;
  if (split_rows(x, m, cols, layout == LAYOUT_K6, &split)) return -2;
  const int64_t nb = cols / BLOCK, groups = (rows + R - 1) / R, gbytes = group_bytes(layout, nb);
  #pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* group = packed + g * gbytes;
    const int valid = rows - g * R < R ? (int)(rows - g * R) : R;
    for (int64_t t0 = 0; t0 < m; t0 += TOKENS) {
      const int nt = m - t0 < TOKENS ? (int)(m - t0) : TOKENS;
      const SplitRows part = {split.lo + t0 * cols, split.hi + t0 * cols, split.s + t0 * nb, split.sums + t0 * nb,
                              split.hi16 + t0 * 2 * nb};
      float* out = y + t0 * y_stride + g * R;
      switch (nt) { Q16_CASE(1) Q16_CASE(2) Q16_CASE(3) Q16_CASE(4) Q16_CASE(5) Q16_CASE(6) Q16_CASE(7) Q16_CASE(8) }
    }
  }
  return 0;
}

/* The packed-argument entry point (kernels/kernel_program.py records it): gemm_q16's parameters in
   order, 8 bytes each. */
int64_t gemm_q16_packed(const int64_t* a) {
  return gemm_q16((int)a[0], (const uint8_t*)(intptr_t)a[1], (const float*)(intptr_t)a[2], (float*)(intptr_t)a[3],
                  a[4], a[5], a[6], a[7], (int)a[8]);
}
