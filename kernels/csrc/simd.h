/* Shared by the decode-step kernels (row_ops.c, decode_attention.c) and the block products (block_matmul*.c): horizontal
   reductions, a vectorized exp, and the unpacking of packed arguments. */
#ifndef RADIXSERVE_SIMD_H
#define RADIXSERVE_SIMD_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline float hmax256(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/* [sum(a0), ..., sum(a7)] */
static inline __m256 hsum8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3,
                             __m256 a4, __m256 a5, __m256 a6, __m256 a7) {
  __m256 t0 = _mm256_hadd_ps(a0, a1), t1 = _mm256_hadd_ps(a2, a3);
  __m256 t2 = _mm256_hadd_ps(a4, a5), t3 = _mm256_hadd_ps(a6, a7);
  __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* exp(x), Cephes' expf: Cody-Waite reduction by ln 2 and a degree-6 polynomial,
   within ~1-2 ulp of expf. Arguments are clamped to [-87.3, 88]: below, the
   result is FLT_MIN-ish instead of a subnormal or 0 (harmless next to the
   1 it is added to in silu, or the sum of a softmax); NaN stays NaN. */
static inline __m256 exp256(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-87.3f);
  __m256 nan_mask = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  x = _mm256_max_ps(_mm256_min_ps(x, hi), lo);
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  __m256i n = _mm256_cvtps_epi32(fx);
  __m256 pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  return _mm256_blendv_ps(_mm256_mul_ps(y, pow2n), x, nan_mask);
}

/* ------------------------------------------------- packed-argument entry points

   Each exported op also has a `<name>_packed` form taking one pointer to its
   arguments, packed by the caller as consecutive 8-byte fields in parameter
   order (pointers and integers as int64, float parameters as double,
   num_threads as int64). A
   ctypes call converting ~18 arguments costs ~2-4 us on these machines; one
   bytes argument costs ~0.4 us. Each returns what its function returns (0 for
   the void ones). */

#define P(type, i) ((type)(intptr_t)a[i])
#define F(i) ((float)unpack_double(a + (i)))

static inline double unpack_double(const int64_t* field) {
  double value;
  memcpy(&value, field, sizeof value);
  return value;
}

#endif
