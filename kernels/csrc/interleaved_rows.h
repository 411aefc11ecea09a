/* The int8 GEMM's interleaved rows (kernels/csrc/gemm_q8.c, where the layouts are spelled out; repacked by
   gemm_q8_repack): the layout codes, where a group's 32-column block record lies, and its scale and min
   vectors. R, the rows a group, is defined by the includer (16 with AVX-512, 8 with AVX2); kernels/csrc/
   gemm_amx.c reads the 16-row layouts.

   LAYOUT_K4 (Q4_K) keeps Q4_K's own scales: per group of R rows and 256 columns (a Q4_K block), a header of R
   float d and R float -dmin, then eight 32-column records of R 6-bit scales sc, R 6-bit mins m (one byte each)
   and the nibbles as LAYOUT_SCALE_MIN's. A record's scale d sc and min -dmin m are those LAYOUT_SCALE_MIN held as
   floats (exact in float32: an fp16 times a 6-bit integer), made with one multiply: the same values, 18 + 1.5
   bytes a row's 32 weights instead of 24. */
#ifndef RADIXSERVE_INTERLEAVED_ROWS_H
#define RADIXSERVE_INTERLEAVED_ROWS_H

#include <immintrin.h>
#include <stdint.h>

enum { LAYOUT_SCALE_MIN = 0, LAYOUT_BYTES = 1, LAYOUT_NIBBLES = 2, LAYOUT_K4 = 3 };

#define K4_HEADER (8 * R)               /* d and -dmin, R floats each */
#define K4_RECORD (2 * R + 16 * R)      /* sc and m bytes, then the nibbles */
#define K4_SUPER (K4_HEADER + 8 * K4_RECORD)

static inline int has_min(int layout) { return layout == LAYOUT_SCALE_MIN || layout == LAYOUT_K4; }
static inline int64_t scale_bytes(int layout) {
  return layout == LAYOUT_K4 ? 2 * R : (layout == LAYOUT_SCALE_MIN ? 2 : 1) * R * 4;
}
static inline int64_t quant_bytes(int layout) { return (layout == LAYOUT_BYTES ? 32 : 16) * R; }
static inline int64_t group_block_bytes(int layout) { return scale_bytes(layout) + quant_bytes(layout); }

/* bytes of one group of R rows over nb 32-column blocks (LAYOUT_K4: nb a multiple of 8) */
static inline int64_t group_bytes(int layout, int64_t nb) {
  return layout == LAYOUT_K4 ? nb / 8 * K4_SUPER : nb * group_block_bytes(layout);
}

/* block b's record in a group: its scales (scale_bytes) then its quants */
static inline const uint8_t* block_record(int layout, const uint8_t* group, int64_t b) {
  return layout == LAYOUT_K4 ? group + b / 8 * K4_SUPER + K4_HEADER + b % 8 * K4_RECORD
                             : group + b * group_block_bytes(layout);
}

#if R == 16
/* block b's R scales and mins (0 without a min) as floats */
static inline void block_scales(int layout, const uint8_t* group, int64_t b, const uint8_t* record, __m512* d,
                                __m512* min) {
  if (layout == LAYOUT_K4) {
    const float* header = (const float*)(group + b / 8 * K4_SUPER);
    *d = _mm512_mul_ps(_mm512_loadu_ps(header),
                       _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)record))));
    *min = _mm512_mul_ps(_mm512_loadu_ps(header + R),
                         _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(record + R)))));
  } else {
    *d = _mm512_loadu_ps(record);
    *min = layout == LAYOUT_SCALE_MIN ? _mm512_loadu_ps(record + 4 * R) : _mm512_setzero_ps();
  }
}
#else
static inline void block_scales(int layout, const uint8_t* group, int64_t b, const uint8_t* record, __m256* d,
                                __m256* min) {
  if (layout == LAYOUT_K4) {
    const float* header = (const float*)(group + b / 8 * K4_SUPER);
    *d = _mm256_mul_ps(_mm256_loadu_ps(header),
                       _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)record))));
    *min = _mm256_mul_ps(_mm256_loadu_ps(header + R),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(record + R)))));
  } else {
    *d = _mm256_loadu_ps((const float*)record);
    *min = layout == LAYOUT_SCALE_MIN ? _mm256_loadu_ps((const float*)record + R) : _mm256_setzero_ps();
  }
}
#endif

#endif
