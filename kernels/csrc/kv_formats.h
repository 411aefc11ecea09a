/* The stored formats of KV pages (kernels/kv_format.py is the reference): per slot, num_kv_heads
   rows of head_dim values, in float32, bfloat16 (round to nearest even) or int8 with one float32
   scale per (slot, head): x ~= q * scale, scale = absmax / 127, q = round-half-even(x * 127 / absmax).
   Shared by row_ops.c (quantize on store), decode_attention.c and prefill_attention.c (dequantize on
   read). Builds without AVX2 (prefill_attention.c's portable one) get kv_load_head in plain C and no
   kv_store_slot. */
#ifndef RADIXSERVE_KV_FORMATS_H
#define RADIXSERVE_KV_FORMATS_H

#ifdef __AVX2__
#include "simd.h"
#else
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#endif

enum { KV_F32 = 0, KV_BF16 = 1, KV_I8 = 2 };

/* One of a layer's K or V caches: values (num_slots, KVH, D) in `format`; scales (num_slots, KVH)
   float32 for KV_I8, else NULL. */
typedef struct {
  void* values;
  float* scales;
  int64_t format;
} kv_pages;

static inline uint16_t f32_to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays a (quiet) NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

#ifdef __AVX2__
/* Writes x (KVH, D) floats as slot `slot` of the pages. */
static inline void kv_store_slot(const kv_pages* pages, int64_t slot, const float* x, int64_t num_kv_heads,
                                 int64_t head_dim) {
  const int64_t row = num_kv_heads * head_dim;
  if (pages->format == KV_F32) {
    memcpy((float*)pages->values + slot * row, x, (size_t)row * sizeof(float));
  } else if (pages->format == KV_BF16) {
    uint16_t* dst = (uint16_t*)pages->values + slot * row;
    for (int64_t i = 0; i < row; i++) dst[i] = f32_to_bf16(x[i]);
  } else {
    /* D % 8 == 0: eight values at a time; _mm256_cvtps_epi32 rounds half to even (MXCSR's default) */
    int8_t* dst = (int8_t*)pages->values + slot * row;
    const __m256 sign = _mm256_set1_ps(-0.0f), limit = _mm256_set1_ps(127.0f);
    for (int64_t h = 0; h < num_kv_heads; h++) {
      const float* xh = x + h * head_dim;
      __m256 vmax = _mm256_setzero_ps();
      for (int64_t d = 0; d < head_dim; d += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xh + d)));
      const float absmax = hmax256(vmax);
      const __m256 inverse = _mm256_set1_ps(absmax > 0.0f ? 127.0f / absmax : 0.0f);
      pages->scales[slot * num_kv_heads + h] = absmax / 127.0f;
      for (int64_t d = 0; d < head_dim; d += 8) {
        __m256 q = _mm256_mul_ps(_mm256_loadu_ps(xh + d), inverse);
        q = _mm256_max_ps(_mm256_min_ps(q, limit), _mm256_sub_ps(_mm256_setzero_ps(), limit));
        const __m256i q32 = _mm256_cvtps_epi32(q);
        const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q32), _mm256_extracti128_si256(q32, 1));
        _mm_storel_epi64((__m128i*)(dst + h * head_dim + d), _mm_packs_epi16(q16, q16));
      }
    }
  }
}

#endif

/* dst (D,) floats = head `head` of slot `slot`, dequantized. D % 8 == 0. The AVX2 build and the
   plain-C one give the same values. */
static inline void kv_load_head(const kv_pages* pages, int64_t slot, int64_t head, int64_t num_kv_heads,
                                int64_t head_dim, float* dst) {
  const int64_t at = (slot * num_kv_heads + head) * head_dim;
  if (pages->format == KV_F32) {
    memcpy(dst, (const float*)pages->values + at, (size_t)head_dim * sizeof(float));
  } else if (pages->format == KV_BF16) {
    const uint16_t* src = (const uint16_t*)pages->values + at;
#ifdef __AVX2__
    int64_t d = 0;
#ifdef __AVX512F__
    for (; d + 16 <= head_dim; d += 16) {
      const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(src + d)));
      _mm512_storeu_ps(dst + d, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
    }
#endif
    for (; d < head_dim; d += 8) {
      const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(src + d)));
      _mm256_storeu_ps(dst + d, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    }
#else
    for (int64_t d = 0; d < head_dim; d++) {
      const uint32_t bits = (uint32_t)src[d] << 16;
      memcpy(dst + d, &bits, sizeof bits);
    }
#endif
  } else {
    const int8_t* src = (const int8_t*)pages->values + at;
    const float scale = pages->scales[slot * num_kv_heads + head];
#ifdef __AVX2__
    const __m256 scales = _mm256_set1_ps(scale);
    for (int64_t d = 0; d < head_dim; d += 8) {
      const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(src + d)));
      _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_cvtepi32_ps(wide), scales));
    }
#else
    for (int64_t d = 0; d < head_dim; d++) dst[d] = (float)src[d] * scale;
#endif
  }
}


static inline int64_t kv_element_size(int64_t format) {
  return format == KV_F32 ? 4 : (format == KV_BF16 ? 2 : 1);
}

#endif
