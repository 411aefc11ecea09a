/* Prefill GEMM over GGUF blocks with int8 activations (OpenMP), llama.cpp's vec_dot scheme:
   y (m, rows) = x (m, cols) @ W^T with W kept as quantized blocks of 32 along a row and x
   quantized per block of 32 to int8 (Q8: d_x = max|x| / 127, q_x = round(x / d_x)), so each
   block's dot product is an integer one, scaled once by d_w * d_x.

   Weights are repacked once at load (gemm_q8_repack) from the kernels' BlockWeight layout
   (kernels/cpu_matvec.py: Q4_1 {f32 d, f32 min, 16 B nibbles}, Q8_0 {f32 d, 32 int8}) into
   groups of R rows interleaved by 4 bytes (ik_llama.cpp's "_R8" idea), R = 16 with AVX-512
   (a zmm holds 4 bytes of each of 16 rows), 8 with AVX2. Per group and block of 32 columns:
     d    R floats, the rows' scales
     min  R floats, Q4_1 only
     q    Q8_0: 8 vectors k = 0..7 of R x 4 bytes: bytes 4k..4k+3 of each row's block;
               AVX-512: q + 128 as unsigned (vpdpbusd is u8 x s8), AVX2: q as is (sign trick)
          Q4_1: 4 vectors j = 0..3 of R x 4 bytes: low nibbles elements 4j..4j+3, high
               nibbles elements 4(j+4)..4(j+4)+3 of each row's block
   One vector of weights times x's 4 bytes broadcast gives, lane r, row r's partial dot
   product: no horizontal sums. Rows past the weight's last (a partial group) are zero.

   A micro-kernel multiplies one group (R rows) by up to TOKENS x rows, block by block,
   the block's weight vectors loaded once for all of them; OpenMP splits the groups. The sum
   over blocks runs in block order in float32 for every m, so a row's result does not depend
   on how many rows share the call. */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 32
#define TOKENS 8
enum { FORMAT_Q4_1 = 0, FORMAT_Q8_0 = 1 };

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define R 16
#define VARIANT "avx512_vnni"
#else
#define R 8
#define VARIANT "avx2"
#endif

const char* gemm_q8_variant(void) { return VARIANT; }
int gemm_q8_interleave(void) { return R; }

static int64_t scale_bytes(int format) { return (format == FORMAT_Q4_1 ? 2 : 1) * R * 4; }
static int64_t quant_bytes(int format) { return (format == FORMAT_Q4_1 ? 16 : 32) * R; }
static int64_t group_block_bytes(int format) { return scale_bytes(format) + quant_bytes(format); }
static int64_t source_block_bytes(int format) { return format == FORMAT_Q4_1 ? 24 : 36; }

int64_t gemm_q8_packed_bytes(int format, int64_t rows, int64_t cols) {
  return (rows + R - 1) / R * (cols / BLOCK) * group_block_bytes(format);
}

/* element e (0..31) of a Q4_1 block's 16 nibble bytes */
static inline uint8_t nibble(const uint8_t* nibbles, int e) {
  return e < 16 ? nibbles[e] & 15 : nibbles[e - 16] >> 4;
}

/* src (rows, cols / 32 * source_block_bytes) -> dst (gemm_q8_packed_bytes) */
void gemm_q8_repack(int format, const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  int64_t nb = cols / BLOCK, src_row = nb * source_block_bytes(format), gbb = group_block_bytes(format);
  int64_t groups = (rows + R - 1) / R;
  #pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; g++) {
    for (int64_t b = 0; b < nb; b++) {
      uint8_t* out = dst + (g * nb + b) * gbb;
      memset(out, 0, (size_t)gbb);
      float* d = (float*)out;
      uint8_t* q = out + scale_bytes(format);
      for (int r = 0; r < R && g * R + r < rows; r++) {
        const uint8_t* block = src + (g * R + r) * src_row + b * source_block_bytes(format);
        memcpy(d + r, block, 4);
        if (format == FORMAT_Q4_1) {
          memcpy(d + R + r, block + 4, 4);
          for (int j = 0; j < 4; j++)
            for (int i = 0; i < 4; i++)
              q[(j * R + r) * 4 + i] = nibble(block + 8, 4 * j + i) | nibble(block + 8, 4 * (j + 4) + i) << 4;
        } else {
          for (int k = 0; k < 8; k++)
            for (int i = 0; i < 4; i++)
#if R == 16
              q[(k * R + r) * 4 + i] = block[4 + 4 * k + i] ^ 0x80;
#else
              q[(k * R + r) * 4 + i] = block[4 + 4 * k + i];
#endif
        }
      }
    }
  }
}

/* x (m, cols) -> q (m, cols) int8, d (m, nb) float, and per block the term the format's
   kernel adds (corr, m x nb): Q4_1 d_x * sum(q_x) as float (times min), Q8_0 with AVX-512
   -128 * sum(q_x) as int32 (the +128 of the unsigned weights taken back). */
static void quantize_rows(int format, const float* x, int8_t* q, float* d, int32_t* corr, int64_t m, int64_t cols,
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
    if (format == FORMAT_Q4_1) {
      float term = scale * (float)sum;
      memcpy(corr + index, &term, 4);
    } else {
      corr[index] = R == 16 ? -128 * sum : 0;
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
    const int format, const int nt, const uint8_t* group, int64_t nb, const int8_t* xq, const float* xd,
    const int32_t* xc, int64_t cols, float* out, int64_t out_stride, int valid) {
  __m512 acc[TOKENS];
  const int64_t gbb = group_block_bytes(format);
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* p = group + b * gbb;
    __m512 dw = _mm512_loadu_ps((const float*)p);
    __m512i w[8];
    if (format == FORMAT_Q4_1) {
      const uint8_t* q = p + 2 * R * 4;
      for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512((const void*)(q + 64 * j));
        w[j] = _mm512_and_si512(v, low);
        w[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      __m512 mw = _mm512_loadu_ps((const float*)p + R);
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
      const uint8_t* q = p + R * 4;
      for (int k = 0; k < 8; k++) w[k] = _mm512_loadu_si512((const void*)(q + 64 * k));
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
    const int format, const int nt, const uint8_t* group, int64_t nb, const int8_t* xq, const float* xd,
    const int32_t* xc, int64_t cols, float* out, int64_t out_stride, int valid) {
  __m256 acc[TOKENS];
  const int64_t gbb = group_block_bytes(format);
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; b++) {
    const uint8_t* p = group + b * gbb;
    __m256 dw = _mm256_loadu_ps((const float*)p);
    __m256i w[8];
    if (format == FORMAT_Q4_1) {
      const uint8_t* q = p + 2 * R * 4;
      for (int j = 0; j < 4; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i*)(q + 32 * j));
        w[j] = _mm256_and_si256(v, low);
        w[j + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
      __m256 mw = _mm256_loadu_ps((const float*)p + R);
      for (int t = 0; t < nt; t++) {
        const int8_t* xb = xq + t * cols + b * BLOCK;
        __m256i s = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(x4(xb)));
        for (int k = 1; k < 8; k++) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[k], _mm256_set1_epi32(x4(xb + 4 * k))));
        __m256i i = _mm256_madd_epi16(s, ones);
        float term;
        memcpy(&term, xc + t * nb + b, 4);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(dw, _mm256_set1_ps(xd[t * nb + b])), acc[t]);
        acc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(term), acc[t]);
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

#define TILE_CASE(NT)                                                                     \
  case NT:                                                                                \
    if (format == FORMAT_Q4_1) group_tile(FORMAT_Q4_1, NT, group, nb, xq, xd, xc, cols, out, out_stride, valid); \
    else group_tile(FORMAT_Q8_0, NT, group, nb, xq, xd, xc, cols, out, out_stride, valid);                    \
    break;

static void tile_dispatch(int format, int nt, const uint8_t* group, int64_t nb, const int8_t* xq, const float* xd,
                          const int32_t* xc, int64_t cols, float* out, int64_t out_stride, int valid) {
  switch (nt) { TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8) }
}

/* packed: gemm_q8_repack's layout; x (m, cols) float32 -> y (m, rows). Returns 0, or -1
   when the quantized copy of x cannot be allocated. */
int gemm_q8(int format, const uint8_t* packed, const float* x, float* y, int64_t m, int64_t rows, int64_t cols,
            int num_threads) {
  int64_t nb = cols / BLOCK, groups = (rows + R - 1) / R, gbb = group_block_bytes(format);
  int8_t* xq = (int8_t*)malloc((size_t)(m * cols));
  float* xd = (float*)malloc((size_t)(m * nb) * sizeof(float));
  int32_t* xc = (int32_t*)malloc((size_t)(m * nb) * sizeof(int32_t));
  if (!xq || !xd || !xc) {
    free(xq), free(xd), free(xc);
    return -1;
  }
  quantize_rows(format, x, xq, xd, xc, m, cols, num_threads);
  #pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t g = 0; g < groups; g++) {
    const uint8_t* group = packed + g * nb * gbb;
    int valid = rows - g * R < R ? (int)(rows - g * R) : R;
    for (int64_t t0 = 0; t0 < m; t0 += TOKENS) {
      int nt = m - t0 < TOKENS ? (int)(m - t0) : TOKENS;
      tile_dispatch(format, nt, group, nb, xq + t0 * cols, xd + t0 * nb, xc + t0 * nb, cols,
                    y + t0 * rows + g * R, rows, valid);
    }
  }
  free(xq), free(xd), free(xc);
  return 0;
}
