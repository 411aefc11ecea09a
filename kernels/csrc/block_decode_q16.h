/* Decoding one 32-weight group of a quantized block (codes FORMAT_Q4_1 .. FORMAT_Q6_K of
   block_decode.h) into INTEGER weights and their float scales, for products with activations
   quantized to int16 (block_matmul_q16.c):

     w_j = dl * q_j - ml[j / 16]        j = 0..31, q_j an integer with |q_j| <= 4096

   exactly the dequantized value's factors: the K-quants' small integer sub-block scales are
   multiplied into q (Q2_K, Q3_K, Q6_K: a scale per 16 weights) or into dl (Q4_K, Q5_K: one per
   32); ml is 0 for the symmetric formats, -m for Q4_1 / Q5_1. With |q_j| <= 4096 and int16
   activations (|x| <= 32767), a pair of products and the sum of a group's 16 pairs fit in int32.

   The 32-weight formats decode a block's scales with its group (decode_group_q16_*); a K-quant
   block's scales and mins are decoded once for its 8 groups (k_block_factors; k_block_scales_avx2
   as vectors), then each group's integers (decode_k_group_q16_*).

   Portable: q into int16_t[32]. AVX2: q as two __m256i of 16 int16 (j = 0..15, 16..31), made
   from 32 decoded bytes widened, the per-16 scales multiplied in after widening. */
#ifndef RADIXSERVE_BLOCK_DECODE_Q16_H
#define RADIXSERVE_BLOCK_DECODE_Q16_H

#include "block_decode.h"

/* formats whose groups carry a min (ml != 0) */
static inline int format_has_min(int code) {
  return code == FORMAT_Q4_1 || code == FORMAT_Q5_1 || code == FORMAT_Q2_K || code == FORMAT_Q4_K ||
         code == FORMAT_Q5_K;
}

/* The integer sub-scale of 16-group k (Q2_K, Q3_K, Q6_K; k_block_factors' scale16[k]). */
static inline __attribute__((always_inline)) int k_scale16(const int code, const uint8_t* b, int k) {
  switch (code) {
    case FORMAT_Q2_K: return b[k] & 0x0F;
    case FORMAT_Q3_K: return scale_q3_k(b + 96, k);
    case FORMAT_Q6_K: return (int8_t)b[192 + k];
    default: return 1;
  }
}

/* A K-quant block's (Q2_K .. Q6_K) per-group factors, decoded once for its 8 groups:
   dl[g] the float scale of 32-group g; ml[k] the min of 16-group k (Q2_K) or of 32-group k (Q4_K,
   Q5_K: k < 8), 0 for the symmetric formats; scale16[k] the integer sub-scale of 16-group k
   multiplied into q (Q2_K, Q3_K, Q6_K), 1 otherwise. */
typedef struct {
  float dl[8];
  float ml[16];
  int scale16[16];
} KBlockFactors;

#if defined(__F16C__)
#include <immintrin.h>
#define K_HALF(p) _cvtsh_ss(load_u16(p))  /* exact, as load_f16 */
#else
#define K_HALF(p) load_f16(p)
#endif

static inline __attribute__((always_inline)) void k_block_factors(const int code, const uint8_t* b,
                                                                   KBlockFactors* f) {
  for (int k = 0; k < 16; k++) f->ml[k] = 0.0f, f->scale16[k] = 1;
  switch (code) {
    case FORMAT_Q2_K: {
      float d = K_HALF(b + 80), dmin = K_HALF(b + 82);
      for (int g = 0; g < 8; g++) f->dl[g] = d;
      for (int k = 0; k < 16; k++) f->scale16[k] = k_scale16(code, b, k), f->ml[k] = dmin * (float)(b[k] >> 4);
      break;
    }
    case FORMAT_Q4_K:
    case FORMAT_Q5_K: {
      float d = K_HALF(b), dmin = K_HALF(b + 2);
      for (int g = 0; g < 8; g++) {
        int sc, mn;
        scale_min_k4(b + 4, g, &sc, &mn);
        f->dl[g] = d * (float)sc, f->ml[g] = dmin * (float)mn;
      }
      break;
    }
    case FORMAT_Q3_K:
    case FORMAT_Q6_K: {  /* one super-block scale (at byte 108 / 208), 16 sub-scales */
      float d = K_HALF(b + (code == FORMAT_Q3_K ? 108 : 208));
      for (int g = 0; g < 8; g++) f->dl[g] = d;
      for (int k = 0; k < 16; k++) f->scale16[k] = k_scale16(code, b, k);
      break;
    }
  }
}

/* The integer weights of 32-group g of a K-quant block, its sub-scales (f) multiplied in. */
static inline void decode_k_group_q16_scalar(int code, const uint8_t* b, int g, const KBlockFactors* f, int16_t* q) {
  for (int half = 0; half < 2; half++) {
    int scale = f->scale16[2 * g + half];
    for (int j = 16 * half; j < 16 * half + 16; j++) {
      int v = 0;
      switch (code) {
        case FORMAT_Q2_K: v = (b[16 + 32 * (g / 4) + j] >> (2 * (g % 4))) & 3; break;
        case FORMAT_Q3_K: v = ((b[32 + 32 * (g / 4) + j] >> (2 * (g % 4))) & 3) - (((b[j] >> g) & 1) ? 0 : 4); break;
        case FORMAT_Q4_K: v = (b[16 + 32 * (g / 2) + j] >> (4 * (g % 2))) & 0x0F; break;
        case FORMAT_Q5_K: v = ((b[48 + 32 * (g / 2) + j] >> (4 * (g % 2))) & 0x0F) | (((b[16 + j] >> g) & 1) << 4); break;
        case FORMAT_Q6_K: {
          int h = g / 4, r = g % 4;
          v = ((((b[64 * h + 32 * (r % 2) + j] >> (4 * (r / 2))) & 0x0F) | (((b[128 + 32 * h + j] >> (2 * r)) & 3) << 4))
              - 32);
          break;
        }
      }
      q[j] = (int16_t)(v * scale);
    }
  }
}

static inline void decode_group_q16_scalar(int code, const uint8_t* b, int g, int16_t* q, float* dl, float* ml) {
  ml[0] = ml[1] = 0.0f;
  switch (code) {
    case FORMAT_Q4_1:
      *dl = load_f32(b);
      ml[0] = ml[1] = -load_f32(b + 4);
      for (int j = 0; j < 16; j++) {
        q[j] = b[8 + j] & 0x0F;
        q[j + 16] = b[8 + j] >> 4;
      }
      break;
    case FORMAT_Q8_0:
      *dl = load_f16(b);
      for (int j = 0; j < 32; j++) q[j] = (int8_t)b[2 + j];
      break;
    case FORMAT_Q4_0:
      *dl = load_f16(b);
      for (int j = 0; j < 16; j++) {
        q[j] = (b[2 + j] & 0x0F) - 8;
        q[j + 16] = (b[2 + j] >> 4) - 8;
      }
      break;
    case FORMAT_Q5_0:
    case FORMAT_Q5_1: {
      int has_min = code == FORMAT_Q5_1, offset = has_min ? 0 : 16;
      *dl = load_f16(b);
      if (has_min) ml[0] = ml[1] = -load_f16(b + 2);
      uint32_t qh = load_u32(b + 2 + 2 * has_min);
      const uint8_t* qs = b + 6 + 2 * has_min;
      for (int j = 0; j < 16; j++) {
        q[j] = ((qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - offset;
        q[j + 16] = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset;
      }
      break;
    }
  }
}

#ifdef __AVX2__
#include <immintrin.h>

static inline float f16c(const uint8_t* p) { return _cvtsh_ss(load_u16(p)); }  /* exact, as load_f16 */

/* 16 bytes of nibbles -> 32 bytes: the low nibbles (elements 0..15), then the high ones */
static inline __m256i nibble_bytes(const uint8_t* p) {
  const __m128i low = _mm_set1_epi8(0x0F);
  __m128i v = _mm_loadu_si128((const __m128i*)p);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
}

/* byte j = 0xFF where bit j of x is set, else 0 (llama.cpp's bytes_from_bits_32) */
static inline __m256i bit_bytes(uint32_t x) {
  const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

static inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

static inline __attribute__((always_inline)) void decode_group_q16_avx2(const int code, const uint8_t* b, int g,
                                                                         __m256i q[2], float* dl, float* ml) {
  __m256i bytes = _mm256_setzero_si256();  /* the 32 weights as signed bytes, before the per-16 scales */
  ml[0] = ml[1] = 0.0f;
  switch (code) {
    case FORMAT_Q4_1:
      *dl = load_f32(b);
      ml[0] = ml[1] = -load_f32(b + 4);
      bytes = nibble_bytes(b + 8);
      break;
    case FORMAT_Q8_0:
      *dl = f16c(b);
      q[0] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 2)));
      q[1] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)(b + 18)));
      return;
    case FORMAT_Q4_0:
      *dl = f16c(b);
      bytes = _mm256_sub_epi8(nibble_bytes(b + 2), _mm256_set1_epi8(8));
      break;
    case FORMAT_Q5_0:
    case FORMAT_Q5_1: {
      const int has_min = code == FORMAT_Q5_1;
      *dl = f16c(b);
      if (has_min) ml[0] = ml[1] = -f16c(b + 2);
      __m256i fifth = _mm256_and_si256(bit_bytes(load_u32(b + 2 + 2 * has_min)), _mm256_set1_epi8(0x10));
      bytes = _mm256_or_si256(nibble_bytes(b + 6 + 2 * has_min), fifth);
      if (!has_min) bytes = _mm256_sub_epi8(bytes, _mm256_set1_epi8(16));
      break;
    }
  }
  q[0] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes));
  q[1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1));
}

/* decode_k_group_q16_scalar's integers as two __m256i of 16 int16 (j = 0..15, 16..31) */
static inline __attribute__((always_inline)) void decode_k_group_q16_avx2(const int code, const uint8_t* b, const int g,
                                                                           __m256i q[2]) {
  __m256i bytes = _mm256_setzero_si256();  /* the 32 weights as signed bytes, before the per-16 scales */
  switch (code) {
    case FORMAT_Q2_K:
      bytes = _mm256_and_si256(_mm256_srl_epi16(load256(b + 16 + 32 * (g / 4)), _mm_cvtsi32_si128(2 * (g % 4))),
                               _mm256_set1_epi8(3));
      break;
    case FORMAT_Q3_K: {
      __m256i low = _mm256_and_si256(_mm256_srl_epi16(load256(b + 32 + 32 * (g / 4)), _mm_cvtsi32_si128(2 * (g % 4))),
                                     _mm256_set1_epi8(3));
      __m256i bit = _mm256_set1_epi8((char)(1 << g));
      __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(load256(b), bit), _mm256_setzero_si256());
      bytes = _mm256_sub_epi8(low, _mm256_and_si256(clear, _mm256_set1_epi8(4)));
      break;
    }
    case FORMAT_Q4_K:
    case FORMAT_Q5_K: {
      const int five = code == FORMAT_Q5_K;
      bytes = _mm256_and_si256(_mm256_srl_epi16(load256(b + (five ? 48 : 16) + 32 * (g / 2)),
                                                _mm_cvtsi32_si128(4 * (g % 2))), _mm256_set1_epi8(0x0F));
      if (five) {
        __m256i bit = _mm256_set1_epi8((char)(1 << g));
        __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(load256(b + 16), bit), bit);
        bytes = _mm256_or_si256(bytes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
      }
      break;
    }
    case FORMAT_Q6_K: {
      int h = g / 4, r = g % 4;
      __m256i low = _mm256_and_si256(_mm256_srl_epi16(load256(b + 64 * h + 32 * (r % 2)), _mm_cvtsi32_si128(4 * (r / 2))),
                                     _mm256_set1_epi8(0x0F));
      __m256i high = _mm256_and_si256(_mm256_srl_epi16(load256(b + 128 + 32 * h), _mm_cvtsi32_si128(2 * r)),
                                      _mm256_set1_epi8(3));
      bytes = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
      break;
    }
  }
  q[0] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes));
  q[1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1));
  if (code != FORMAT_Q4_K && code != FORMAT_Q5_K) {
    q[0] = _mm256_mullo_epi16(q[0], _mm256_set1_epi16((short)k_scale16(code, b, 2 * g)));
    q[1] = _mm256_mullo_epi16(q[1], _mm256_set1_epi16((short)k_scale16(code, b, 2 * g + 1)));
  }
}

/* A K-quant block's factors as vectors (lane g = 32-group g), without a trip through memory
   (a vector load of scalars just stored stalls on store forwarding): dl, and ml (Q4_K, Q5_K: the
   mins of the 8 groups; Q2_K: of 16-groups 0..7, and ml_hi of 8..15; 0 otherwise). The values
   are k_block_factors'. */
static inline __attribute__((always_inline)) void k_block_scales_avx2(const int code, const uint8_t* b, __m256* dl,
                                                                       __m256* ml, __m256* ml_hi) {
  *ml = *ml_hi = _mm256_setzero_ps();
  switch (code) {
    case FORMAT_Q2_K: {
      const __m256 dmin = _mm256_set1_ps(f16c(b + 82));
      __m128i mins = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i*)b), 4), _mm_set1_epi8(0x0F));
      *dl = _mm256_set1_ps(f16c(b + 80));
      *ml = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mins)));
      *ml_hi = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mins, 8))));
      break;
    }
    case FORMAT_Q3_K: *dl = _mm256_set1_ps(f16c(b + 108)); break;
    case FORMAT_Q4_K:
    case FORMAT_Q5_K: {  /* ggml's unpacking of the 12 scale bytes: 8 scales, then 8 mins, a byte each */
      uint32_t u[3];
      memcpy(u, b + 4, 12);
      uint64_t scales = (uint64_t)(u[0] & 0x3f3f3f3fu) | (uint64_t)((u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4)) << 32;
      uint64_t mins = (uint64_t)(u[1] & 0x3f3f3f3fu) | (uint64_t)(((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4)) << 32;
      *dl = _mm256_mul_ps(_mm256_set1_ps(f16c(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)scales))));
      *ml = _mm256_mul_ps(_mm256_set1_ps(f16c(b + 2)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)mins))));
      break;
    }
    case FORMAT_Q6_K: *dl = _mm256_set1_ps(f16c(b + 208)); break;
  }
}
#endif

#endif
