/* Activations quantized to int16 per group of 32 values, for the integer products over weights held
   as blocks (block_matmul_q16.c) and over their interleaved repacking (gemm_q8.c's gemm_q16): scale
   s = max|x| / 32767, xq = round(x / s) to nearest even, and the float sums of each 16 values (in
   hsum256's order) and of the 32. Both libraries quantize a row the same way, so their products
   differ only in how they sum the exact integer dot products. */
#ifndef RADIXSERVE_Q16_ACTIVATIONS_H
#define RADIXSERVE_Q16_ACTIVATIONS_H

#include <math.h>
#include <stdint.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define Q16_MAX 32767.0f

/* x[0..32) -> xq[0..32), *scale, sums[0..2) (the two 16-sums), *sum32 */
static inline void quantize_group(const float* x, int16_t* xq, float* scale, float* sums, float* sum32) {
#ifdef __AVX2__
  __m256 v[4], amax = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int k = 0; k < 4; k++) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    amax = _mm256_max_ps(amax, _mm256_and_ps(v[k], abs_mask));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float max_abs = _mm_cvtss_f32(m4);
  float inverse = max_abs > 0.0f ? Q16_MAX / max_abs : 0.0f;
  __m256 inv = _mm256_set1_ps(inverse);
  __m256i lo = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[0], inv)), _mm256_cvtps_epi32(_mm256_mul_ps(v[1], inv)));
  __m256i hi = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[2], inv)), _mm256_cvtps_epi32(_mm256_mul_ps(v[3], inv)));
  /* packs interleaves 128-bit lanes: put the 16-bit values back in order */
  _mm256_storeu_si256((__m256i*)xq, _mm256_permute4x64_epi64(lo, 0xD8));
  _mm256_storeu_si256((__m256i*)(xq + 16), _mm256_permute4x64_epi64(hi, 0xD8));
  for (int half = 0; half < 2; half++) {
    __m256 s = _mm256_add_ps(v[2 * half], v[2 * half + 1]);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    sums[half] = _mm_cvtss_f32(s4);
  }
#else
  float max_abs = 0.0f;
  for (int j = 0; j < 32; j++) max_abs = fmaxf(max_abs, fabsf(x[j]));
  float inverse = max_abs > 0.0f ? Q16_MAX / max_abs : 0.0f;
  for (int j = 0; j < 32; j++) xq[j] = (int16_t)nearbyintf(x[j] * inverse);  /* ties to even, as cvtps */
  for (int half = 0; half < 2; half++) {
    float lane[8];
    for (int k = 0; k < 8; k++) lane[k] = x[16 * half + k] + x[16 * half + 8 + k];
    sums[half] = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  }
#endif
  *scale = max_abs / Q16_MAX;
  *sum32 = sums[0] + sums[1];
}

/* xq's n values split in bytes, xq = 256 hi + lo: lo unsigned, hi signed (the byte products' operands) */
static inline void split_int16(const int16_t* xq, uint8_t* lo, int8_t* hi, int64_t n) {
  for (int64_t e = 0; e < n; e++) lo[e] = (uint8_t)(xq[e] & 0xFF), hi[e] = (int8_t)(xq[e] >> 8);
}

#endif
