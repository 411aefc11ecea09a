/* Decoding one 32-weight group of a weight row held in a block format (kernels/block_formats.py
   is the table of formats, codes, block sizes and bytes; the layouts are spelled out there).

   decode_group(code, block, g, w) writes the float32 weights of group g (0 .. block_size / 32 - 1;
   0 for the 32-wide formats) of `block`: exactly the values gguf's numpy dequantize computes, since
   every scale product is exact in float32 and the one rounding, of d * q +- m, is the same in an FMA
   and in a multiply then add whose product is exact.

   Two builds of the same source (kernels/native_build.py): with AVX2/FMA/F16C (__AVX2__ defined)
   groups decode into four __m256; without (the portable build) into a float[32] by plain C. */
#ifndef RADIXSERVE_BLOCK_DECODE_H
#define RADIXSERVE_BLOCK_DECODE_H

#include <stdint.h>
#include <string.h>

enum {
  FORMAT_Q4_1 = 0, FORMAT_Q8_0 = 1, FORMAT_Q4_0 = 2, FORMAT_Q5_0 = 3, FORMAT_Q5_1 = 4,
  FORMAT_Q2_K = 5, FORMAT_Q3_K = 6, FORMAT_Q4_K = 7, FORMAT_Q5_K = 8, FORMAT_Q6_K = 9,
  FORMAT_F16 = 10, FORMAT_BF16 = 11, FORMAT_F32 = 12, NUM_FORMATS = 13
};

static inline float load_f32(const uint8_t* p) { float v; memcpy(&v, p, 4); return v; }
static inline uint16_t load_u16(const uint8_t* p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t load_u32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }

static inline float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
  if (exponent == 0) {
    float magnitude = (float)mantissa * (1.0f / 16777216.0f);  /* subnormal: mantissa * 2^-24, exact */
    memcpy(&bits, &magnitude, 4);
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7F800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  memcpy(&out, &bits, 4);
  return out;
}

static inline float load_f16(const uint8_t* p) { return half_to_float(load_u16(p)); }

/* Q4_K / Q5_K: the 6-bit scale and min of group g (ggml's get_scale_min_k4). */
static inline void scale_min_k4(const uint8_t* s, int g, int* sc, int* m) {
  if (g < 4) {
    *sc = s[g] & 63;
    *m = s[g + 4] & 63;
  } else {
    *sc = (s[g + 4] & 0x0F) | ((s[g - 4] >> 6) << 4);
    *m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}

/* Q3_K: the signed 6-bit scale of 16-group s (0..15). */
static inline int scale_q3_k(const uint8_t* scales, int s) {
  int low = (scales[s % 8] >> (4 * (s / 8))) & 0x0F, high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | (high << 4)) - 32;
}

/* A row of `cols` weights as *num_blocks blocks of *bytes bytes, *groups 32-weight groups a block. The float
   formats (F16, BF16, F32) are one value a block in the table; here their "block" is a group of 32 values
   (block_bytes = 32 * value bytes), one group per block. */
static inline void row_shape(int code, int64_t cols, int64_t block_size, int64_t block_bytes, int64_t* num_blocks,
                             int64_t* bytes, int* groups) {
  if (code >= FORMAT_F16) {
    *num_blocks = cols / 32;
    *bytes = block_bytes * 32;
    *groups = 1;
  } else {
    *num_blocks = cols / block_size;
    *bytes = block_bytes;
    *groups = (int)(block_size / 32);
  }
}

/* ---------------------------------------------------------------- portable: 32 floats */

static inline void decode_group_scalar(int code, const uint8_t* b, int g, float* w) {
  switch (code) {
    case FORMAT_Q4_1: {
      float d = load_f32(b), m = load_f32(b + 4);
      for (int j = 0; j < 16; j++) {
        w[j] = d * (float)(b[8 + j] & 0x0F) + m;
        w[j + 16] = d * (float)(b[8 + j] >> 4) + m;
      }
      break;
    }
    case FORMAT_Q8_0: {
      float d = load_f16(b);
      for (int j = 0; j < 32; j++) w[j] = (float)(int8_t)b[2 + j] * d;
      break;
    }
    case FORMAT_Q4_0: {
      float d = load_f16(b);
      for (int j = 0; j < 16; j++) {
        w[j] = d * (float)((b[2 + j] & 0x0F) - 8);
        w[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
      }
      break;
    }
    case FORMAT_Q5_0:
    case FORMAT_Q5_1: {
      int has_min = code == FORMAT_Q5_1;
      float d = load_f16(b), m = has_min ? load_f16(b + 2) : 0.0f;
      uint32_t qh = load_u32(b + 2 + 2 * has_min);
      const uint8_t* qs = b + 6 + 2 * has_min;
      int offset = has_min ? 0 : 16;
      for (int j = 0; j < 16; j++) {
        int lo = (qs[j] & 0x0F) | (((qh >> j) & 1) << 4), hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        w[j] = has_min ? d * (float)lo + m : d * (float)(lo - offset);
        w[j + 16] = has_min ? d * (float)hi + m : d * (float)(hi - offset);
      }
      break;
    }
    case FORMAT_Q2_K: {
      float d = load_f16(b + 80), dmin = load_f16(b + 82);
      const uint8_t* qs = b + 16 + 32 * (g / 4);
      int shift = 2 * (g % 4);
      for (int half = 0; half < 2; half++) {
        uint8_t sc = b[2 * g + half];
        float dl = d * (float)(sc & 0x0F), ml = dmin * (float)(sc >> 4);
        for (int j = 16 * half; j < 16 * half + 16; j++) w[j] = dl * (float)((qs[j] >> shift) & 3) - ml;
      }
      break;
    }
    case FORMAT_Q3_K: {
      float d = load_f16(b + 108);
      const uint8_t* qs = b + 32 + 32 * (g / 4);
      int shift = 2 * (g % 4);
      for (int half = 0; half < 2; half++) {
        float dl = d * (float)scale_q3_k(b + 96, 2 * g + half);
        for (int j = 16 * half; j < 16 * half + 16; j++) {
          int q = ((qs[j] >> shift) & 3) - (((b[j] >> g) & 1) ? 0 : 4);
          w[j] = dl * (float)q;
        }
      }
      break;
    }
    case FORMAT_Q4_K:
    case FORMAT_Q5_K: {
      int sc, mn, five = code == FORMAT_Q5_K;
      scale_min_k4(b + 4, g, &sc, &mn);
      float dl = load_f16(b) * (float)sc, ml = load_f16(b + 2) * (float)mn;
      const uint8_t* qs = b + (five ? 48 : 16) + 32 * (g / 2);
      int shift = 4 * (g % 2);
      for (int j = 0; j < 32; j++) {
        int q = (qs[j] >> shift) & 0x0F;
        if (five) q |= ((b[16 + j] >> g) & 1) << 4;
        w[j] = dl * (float)q - ml;
      }
      break;
    }
    case FORMAT_Q6_K: {
      float d = load_f16(b + 208);
      int h = g / 4, r = g % 4;
      const uint8_t* ql = b + 64 * h + 32 * (r % 2);
      const uint8_t* qh = b + 128 + 32 * h;
      for (int half = 0; half < 2; half++) {
        float dl = d * (float)(int8_t)b[192 + 2 * g + half];
        for (int j = 16 * half; j < 16 * half + 16; j++) {
          int q = (((ql[j] >> (4 * (r / 2))) & 0x0F) | (((qh[j] >> (2 * r)) & 3) << 4)) - 32;
          w[j] = dl * (float)q;
        }
      }
      break;
    }
    case FORMAT_F16:
      for (int j = 0; j < 32; j++) w[j] = load_f16(b + 2 * j);
      break;
    case FORMAT_BF16:
      for (int j = 0; j < 32; j++) {
        uint32_t bits = (uint32_t)load_u16(b + 2 * j) << 16;
        memcpy(&w[j], &bits, 4);
      }
      break;
    case FORMAT_F32:
      memcpy(w, b, 32 * sizeof(float));
      break;
  }
}

/* ---------------------------------------------------------------- AVX2: four __m256 */
#ifdef __AVX2__
#include <immintrin.h>

/* bytes p[8k .. 8k + 7] widened to 32-bit lanes, k = 0..3: the 32 bytes of a K-quant group's e */
static inline void widen32(const uint8_t* p, __m256i v[4]) {
  for (int k = 0; k < 4; k++) v[k] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8 * k)));
}

static inline __m256 f16x1(const uint8_t* p) { return _mm256_set1_ps(_cvtsh_ss(load_u16(p))); }

/* lanes j0 .. j0 + 7 of bit j of a 32-bit qh, moved to bit 4 */
static inline __m256i fifth_bits(uint32_t qh, int j0) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i bits = _mm256_srlv_epi32(_mm256_set1_epi32((int)qh), _mm256_add_epi32(lane, _mm256_set1_epi32(j0)));
  return _mm256_slli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(1)), 4);
}

/* 16 nibbles at p: lanes (elements 0-7, 8-15 low nibbles; 16-23, 24-31 high nibbles), as Q4_1's kernel */
static inline void nibbles32(const uint8_t* p, __m256i q[4]) {
  const __m256i low = _mm256_set1_epi32(0x0F);
  __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p));
  __m256i hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(p + 8)));
  q[0] = _mm256_and_si256(lo, low);
  q[1] = _mm256_and_si256(hi, low);
  q[2] = _mm256_srli_epi32(lo, 4);
  q[3] = _mm256_srli_epi32(hi, 4);
}

static inline __attribute__((always_inline)) void decode_group_avx2(const int code, const uint8_t* b, int g,
                                                                     __m256 w[4]) {
  __m256i q[4];
  switch (code) {
    case FORMAT_Q4_1: {
      __m256 d = _mm256_broadcast_ss((const float*)b), m = _mm256_broadcast_ss((const float*)(b + 4));
      nibbles32(b + 8, q);
      for (int k = 0; k < 4; k++) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[k]), d, m);
      break;
    }
    case FORMAT_Q8_0: {
      __m256 d = f16x1(b);
      for (int k = 0; k < 4; k++)
        w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(b + 2 + 8 * k)))), d);
      break;
    }
    case FORMAT_Q4_0: {
      __m256 d = f16x1(b);
      nibbles32(b + 2, q);
      for (int k = 0; k < 4; k++) w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q[k], _mm256_set1_epi32(8))), d);
      break;
    }
    case FORMAT_Q5_0:
    case FORMAT_Q5_1: {
      const int has_min = code == FORMAT_Q5_1;
      __m256 d = f16x1(b);
      uint32_t qh = load_u32(b + 2 + 2 * has_min);
      nibbles32(b + 6 + 2 * has_min, q);
      static const int first[4] = {0, 8, 16, 24};
      for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_or_si256(q[k], fifth_bits(qh, first[k]));
        if (has_min) w[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), d, f16x1(b + 2));
        else w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(v, _mm256_set1_epi32(16))), d);
      }
      break;
    }
    case FORMAT_Q2_K: {
      float d = _cvtsh_ss(load_u16(b + 80)), dmin = _cvtsh_ss(load_u16(b + 82));
      widen32(b + 16 + 32 * (g / 4), q);
      __m128i shift = _mm_cvtsi32_si128(2 * (g % 4));
      for (int k = 0; k < 4; k++) {
        uint8_t sc = b[2 * g + k / 2];
        __m256 dl = _mm256_set1_ps(d * (float)(sc & 0x0F)), ml = _mm256_set1_ps(dmin * (float)(sc >> 4));
        __m256i v = _mm256_and_si256(_mm256_srl_epi32(q[k], shift), _mm256_set1_epi32(3));
        w[k] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(v), dl, ml);
      }
      break;
    }
    case FORMAT_Q3_K: {
      float d = _cvtsh_ss(load_u16(b + 108));
      __m256i hm[4];
      widen32(b + 32 + 32 * (g / 4), q);
      widen32(b, hm);
      __m128i shift = _mm_cvtsi32_si128(2 * (g % 4)), hshift = _mm_cvtsi32_si128(g);
      for (int k = 0; k < 4; k++) {
        __m256 dl = _mm256_set1_ps(d * (float)scale_q3_k(b + 96, 2 * g + k / 2));
        __m256i low = _mm256_and_si256(_mm256_srl_epi32(q[k], shift), _mm256_set1_epi32(3));
        __m256i high = _mm256_and_si256(_mm256_srl_epi32(hm[k], hshift), _mm256_set1_epi32(1));
        /* q = low - 4 + 4 * high */
        __m256i v = _mm256_add_epi32(_mm256_sub_epi32(low, _mm256_set1_epi32(4)), _mm256_slli_epi32(high, 2));
        w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(v), dl);
      }
      break;
    }
    case FORMAT_Q4_K:
    case FORMAT_Q5_K: {
      const int five = code == FORMAT_Q5_K;
      int sc, mn;
      scale_min_k4(b + 4, g, &sc, &mn);
      __m256 dl = _mm256_set1_ps(_cvtsh_ss(load_u16(b)) * (float)sc);
      __m256 ml = _mm256_set1_ps(_cvtsh_ss(load_u16(b + 2)) * (float)mn);
      widen32(b + (five ? 48 : 16) + 32 * (g / 2), q);
      __m128i shift = _mm_cvtsi32_si128(4 * (g % 2));
      __m256i qh[4];
      if (five) widen32(b + 16, qh);
      for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_and_si256(_mm256_srl_epi32(q[k], shift), _mm256_set1_epi32(0x0F));
        if (five)
          v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(_mm256_srl_epi32(qh[k], _mm_cvtsi32_si128(g)),
                                                                    _mm256_set1_epi32(1)), 4));
        w[k] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(v), dl, ml);
      }
      break;
    }
    case FORMAT_Q6_K: {
      float d = _cvtsh_ss(load_u16(b + 208));
      int h = g / 4, r = g % 4;
      __m256i qh[4];
      widen32(b + 64 * h + 32 * (r % 2), q);
      widen32(b + 128 + 32 * h, qh);
      __m128i shift = _mm_cvtsi32_si128(4 * (r / 2)), hshift = _mm_cvtsi32_si128(2 * r);
      for (int k = 0; k < 4; k++) {
        __m256 dl = _mm256_set1_ps(d * (float)(int8_t)b[192 + 2 * g + k / 2]);
        __m256i low = _mm256_and_si256(_mm256_srl_epi32(q[k], shift), _mm256_set1_epi32(0x0F));
        __m256i high = _mm256_and_si256(_mm256_srl_epi32(qh[k], hshift), _mm256_set1_epi32(3));
        __m256i v = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
        w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(v), dl);
      }
      break;
    }
    case FORMAT_F16:
      for (int k = 0; k < 4; k++) w[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(b + 16 * k)));
      break;
    case FORMAT_BF16:
      for (int k = 0; k < 4; k++)
        w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(b + 16 * k))), 16));
      break;
    case FORMAT_F32:
    default:
      for (int k = 0; k < 4; k++) w[k] = _mm256_loadu_ps((const float*)(b + 32 * k));
      break;
  }
}
#endif

#endif
