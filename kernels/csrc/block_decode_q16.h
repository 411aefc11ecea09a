/* Decoding one 32-weight group of a quantized block (codes FORMAT_Q4_1 .. FORMAT_Q6_K of
   block_decode.h) into INTEGER weights and their float scales, for products with activations
   quantized to int16 (block_matmul_q16.c):

     w_j = dl * q_j - ml[j / 16]        j = 0..31, q_j an integer with |q_j| <= 4096

   exactly the dequantized value's factors: the K-quants' small integer sub-block scales are
   multiplied into q (Q2_K, Q3_K: a scale per 16 weights) or into dl (Q4_K, Q5_K: one per
   32); ml is 0 for the symmetric formats, -m for Q4_1 / Q5_1. With |q_j| <= 4096 and int16
   activations (|x| <= 32767), a pair of products and the sum of a group's 16 pairs fit in int32.

   Q4_K, Q6_K and Q4_1 are decoded to BYTES instead (group_bytes_scalar, *_pair_bytes_*): Q4_K's and
   Q4_1's nibbles (0..15) and Q6_K's unsigned 6-bit values u (0..63, the weight is u - 32, its per-16
   sub-scale stays outside, in the float scale), for block_matmul_q16.c's byte products (x split into a
   low and a high byte).

   The 32-weight formats decode a block's scales with its group (decode_group_q16_*); a K-quant
   block's scales and mins are decoded once for its 8 groups (k_block_factors; k_block_scales_avx2
   as vectors), then each group's integers (decode_k_group_q16_*) or bytes (k_group_bytes_*).

   Portable: q into int16_t[32], bytes into uint8_t[32]. AVX2: q as two __m256i of 16 int16
   (j = 0..15, 16..31), made from 32 decoded bytes widened, the per-16 scales multiplied in after
   widening; bytes as one __m256i (j = 0..31). */
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
        case FORMAT_Q5_K: v = ((b[48 + 32 * (g / 2) + j] >> (4 * (g % 2))) & 0x0F) | (((b[16 + j] >> g) & 1) << 4); break;
      }
      q[j] = (int16_t)(v * scale);
    }
  }
}

/* The 32 bytes of group g of a Q4_K block (its nibbles, 0..15), of a Q4_1 or Q4_0 block (g = 0:
   its nibbles, the low ones then the high; Q4_0's weight is u - 8) or of a Q6_K block (its unsigned 6-bit values u, 0..63: the
   weight before the sub-scale is u - 32). */
static inline void group_bytes_scalar(int code, const uint8_t* b, int g, uint8_t* u) {
  for (int j = 0; j < 32; j++) {
    if (code == FORMAT_Q4_1 || code == FORMAT_Q4_0) {
      const uint8_t* qs = b + (code == FORMAT_Q4_1 ? 8 : 2);
      u[j] = j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
    } else if (code == FORMAT_Q4_K) {
      u[j] = (b[16 + 32 * (g / 2) + j] >> (4 * (g % 2))) & 0x0F;
    } else {
      int h = g / 4, r = g % 4;
      u[j] = ((b[64 * h + 32 * (r % 2) + j] >> (4 * (r / 2))) & 0x0F) | (((b[128 + 32 * h + j] >> (2 * r)) & 3) << 4);
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

/* decode_k_group_q16_scalar's integers (Q2_K, Q3_K, Q5_K) as two __m256i of 16 int16 (j = 0..15, 16..31) */
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
    case FORMAT_Q5_K: {
      bytes = _mm256_and_si256(_mm256_srl_epi16(load256(b + 48 + 32 * (g / 2)), _mm_cvtsi32_si128(4 * (g % 2))),
                               _mm256_set1_epi8(0x0F));
      __m256i bit = _mm256_set1_epi8((char)(1 << g));
      __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(load256(b + 16), bit), bit);
      bytes = _mm256_or_si256(bytes, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
      break;
    }
  }
  q[0] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(bytes));
  q[1] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(bytes, 1));
  if (code != FORMAT_Q5_K) {
    q[0] = _mm256_mullo_epi16(q[0], _mm256_set1_epi16((short)k_scale16(code, b, 2 * g)));
    q[1] = _mm256_mullo_epi16(q[1], _mm256_set1_epi16((short)k_scale16(code, b, 2 * g + 1)));
  }
}

/* group_bytes_scalar's bytes of Q4_K groups 2t (q[0]) and 2t + 1 (q[1]): the low and the high
   nibbles of qs[32t .. 32t + 31] */
static inline __attribute__((always_inline)) void q4_k_pair_bytes_avx2(const uint8_t* b, int t, __m256i q[2]) {
  __m256i raw = load256(b + 16 + 32 * t);
  q[0] = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
  q[1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0F));
}

/* group_bytes_scalar's bytes u of Q6_K group g (h = g / 4, r = g % 4): low 4 bits from
   ql[64 h + 32 (r % 2) + j] (nibble r / 2), high 2 bits from qh[32 h + j] >> 2r */
static inline __attribute__((always_inline)) __m256i q6_k_group_bytes_avx2(const uint8_t* b, int g) {
  const int h = g / 4, r = g % 4;
  __m256i low = _mm256_and_si256(_mm256_srl_epi16(load256(b + 64 * h + 32 * (r % 2)), _mm_cvtsi32_si128(4 * (r / 2))),
                                 _mm256_set1_epi8(0x0F));
  __m256i high = _mm256_and_si256(_mm256_srl_epi16(load256(b + 128 + 32 * h), _mm_cvtsi32_si128(2 * r)),
                                  _mm256_set1_epi8(3));
  return _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
}

/* Q4_K / Q6_K bytes (w: 32 of a group, signed or not) widened to int16 in the byte products'
   lane order: q[0] = elements 4k, 4k + 1 (k = 0..7), q[1] = 4k + 2, 4k + 3, so that
   vpmaddwd(q[0], x0) + vpmaddwd(q[1], x1) sums lane k over 4k .. 4k + 3 (x in the quad layout of
   block_matmul_q16.c). `sign`: the bytes' sign bytes (0 or -1), or zero for unsigned ones. */
static inline __attribute__((always_inline)) void quad_words_avx2(__m256i w, __m256i sign, __m256i q[2]) {
  const __m256i order = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                         0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  w = _mm256_shuffle_epi8(w, order), sign = _mm256_shuffle_epi8(sign, order);
  q[0] = _mm256_unpacklo_epi8(w, sign);
  q[1] = _mm256_unpackhi_epi8(w, sign);
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

#if defined(__AVX512BW__) && defined(__AVX512VNNI__)
/* Two consecutive 32-groups of a row in one __m512i: for Q4_K and Q6_K their bytes (group 2t in
   bytes 0..31, 2t + 1 in 32..63, group_bytes_scalar's values), for Q8_0 as 64 int16 in two
   __m512i laid out so that one zmm accumulator holds the AVX2 build's even accumulator (group g,
   lanes 0..7) and its odd one (group h = g + 1, lanes 8..15) with the same int32 lanes:

     w[0] = [g 0..15 | h 16..31],  w[1] = [g 16..31 | h 0..15]

   against x in the pair layout [x_g 0..15 | x_h 16..31 | x_g 16..31 | x_h 0..15]
   (block_matmul_q16.c). vpdpwssd's lane k < 8 then sums g's elements 2k, 2k+1, 16 + 2k, 17 + 2k
   and lane 8 + k the same of h: the integers (and so the bits) of decode_group_q16_avx2. */

/* A Q4_K block's 8 group scales dl = d * sc and mins ml = dmin * m (k_block_scales_avx2's values)
   as [dl 0..7 | ml 0..7], unpacked with byte shuffles instead of scalar bit operations. */
static inline __attribute__((always_inline)) __m512 q4_k_scales_512(const uint8_t* b) {
  /* ggml's 12 bytes s: sc[g] = s[g] & 63 (g < 4), (s[g + 4] & 15) | (s[g - 4] >> 6) << 4 (g >= 4);
     m[g] = s[g + 4] & 63 (g < 4), (s[g + 4] >> 4) | (s[g] >> 6) << 4 (g >= 4); out byte j < 8 is
     sc[j], 8 + g is m[g] */
  const __m128i s = _mm_loadu_si128((const __m128i*)(b + 4));  /* s[0..11] and 4 bytes of qs */
  const __m128i low_from = _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11);
  const __m128i high_from = _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7);
  const __m128i low_mask = _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15);
  __m128i low = _mm_shuffle_epi8(s, low_from);
  low = _mm_mask_blend_epi8(0xF000, low, _mm_srli_epi16(low, 4));  /* m[4..7]: the high nibble */
  __m128i high = _mm_and_si128(_mm_srli_epi16(_mm_shuffle_epi8(s, high_from), 2), _mm_set1_epi8(0x30));
  __m128i bytes = _mm_ternarylogic_epi32(low, high, low_mask, 0xEC);  /* (low & mask) | high */
  /* [d, dmin, d, dmin] -> [d x 8 | dmin x 8] */
  __m128 d_dmin = _mm_cvtph_ps(_mm_set1_epi32((int)load_u32(b)));
  __m512 factor = _mm512_permutexvar_ps(_mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(1), 1),
                                        _mm512_castps128_ps512(d_dmin));
  return _mm512_mul_ps(factor, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(bytes)));
}

/* quad_words_avx2 for two groups at once (bytes 0..31 group g, 32..63 group g + 1): q[0] =
   [g's x0 words | (g + 1)'s], q[1] the same of x1 */
static inline __attribute__((always_inline)) void quad_words_512(__m512i w, __m512i sign, __m512i q[2]) {
  const __m512i order = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  w = _mm512_shuffle_epi8(w, order), sign = _mm512_shuffle_epi8(sign, order);
  q[0] = _mm512_unpacklo_epi8(w, sign);
  q[1] = _mm512_unpackhi_epi8(w, sign);
}

/* Q4_K groups 2t, 2t + 1: the low and the high nibbles of qs[32t .. 32t + 31] */
static inline __attribute__((always_inline)) __m512i q4_k_pair_bytes_512(const uint8_t* b, int t) {
  __m512i raw = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(b + 16 + 32 * t)));
  return _mm512_and_si512(_mm512_mask_srli_epi16(raw, 0xFFFF0000u, raw, 4), _mm512_set1_epi8(0x0F));
}

/* The nibbles of two blocks whose 16 bytes of them are at b0 and b1 (Q4_1: 8 bytes in, after float d
   and m; Q4_0: 2, after fp16 d): b0's 32 (the low ones, then the high: group_bytes_scalar's order) in
   bytes 0..31, b1's in 32..63 */
static inline __attribute__((always_inline)) __m512i nibble_pair_bytes_512(const uint8_t* b0, const uint8_t* b1) {
  __m512i raw = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)b0)), 0xFF00,
                                            _mm_loadu_si128((const __m128i*)b1));
  return _mm512_and_si512(_mm512_mask_srli_epi16(raw, 0xFF00FF00u, raw, 4), _mm512_set1_epi8(0x0F));
}

/* Q6_K groups 2t, 2t + 1 (half h = t / 2, r = 2 (t % 2)): u, low 4 bits from ql[64 h + e] and
   ql[64 h + 32 + e] (nibble r / 2), high 2 bits from qh[32 h + e] >> 2r and >> 2r + 2 */
static inline __attribute__((always_inline)) __m512i q6_k_pair_bytes_512(const uint8_t* b, int t) {
  const int h = t / 2, r = 2 * (t % 2);
  __m512i low = _mm512_loadu_si512((const void*)(b + 64 * h));  /* bytes 0..31: group 2t, 32..63: 2t + 1 */
  if (r) low = _mm512_srli_epi16(low, 4);
  __m512i high = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)(b + 128 + 32 * h)));
  high = _mm512_srlv_epi16(high, _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * r)), _mm256_set1_epi16((short)(2 * r + 2)), 1));
  high = _mm512_slli_epi16(_mm512_and_si512(high, _mm512_set1_epi8(3)), 4);
  return _mm512_ternarylogic_epi32(low, high, _mm512_set1_epi8(0x0F), 0xEC);  /* (low & 0x0F) | high */
}

/* Q8_0 blocks b0 and b1 (34 bytes each: fp16 d, 32 int8) */
static inline __attribute__((always_inline)) void decode_q8_0_pair_512(const uint8_t* b0, const uint8_t* b1, __m512i w[2]) {
  __m256i first = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(b0 + 2))),
                                          _mm_loadu_si128((const __m128i*)(b1 + 18)), 1);
  __m256i second = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i*)(b0 + 18))),
                                           _mm_loadu_si128((const __m128i*)(b1 + 2)), 1);
  w[0] = _mm512_cvtepi8_epi16(first);
  w[1] = _mm512_cvtepi8_epi16(second);
}
#endif

#endif
