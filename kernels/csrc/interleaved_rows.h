/* The int8 GEMM's interleaved rows (kernels/csrc/gemm_q8.c, where the layouts are spelled out; repacked by
   gemm_q8_repack): the layout codes, where a group's 32-column block record lies, and its scale and min
   vectors. R, the rows a group, is defined by the includer (16 with AVX-512, 8 with AVX2); kernels/csrc/
   gemm_amx.c reads the 16-row layouts.

   LAYOUT_K4 (Q4_K) keeps Q4_K's own scales: per group of R rows and 256 columns (a Q4_K block), a header of R
   float d and R float -dmin, then eight 32-column records of R 6-bit scales sc, R 6-bit mins m (one byte each)
   and the nibbles as LAYOUT_SCALE_MIN's. A record's scale d sc and min -dmin m are those LAYOUT_SCALE_MIN held as
   floats (exact in float32: an fp16 times a 6-bit integer), made with one multiply: the same values, 18 + 1.5
   bytes a row's 32 weights instead of 24.

   LAYOUT_K6 (Q6_K, the 8-row AVX2 groups only; decode's gemm_q16 reads it) keeps Q6_K's 6-bit values u (w =
   d sc (u - 32)) in its own bits: per group of R rows and 256 columns, a header of R float d, then eight
   32-column records of R int8 scales sc of the first 16 columns, R of the second 16, the low 4 bits of u as
   LAYOUT_SCALE_MIN's nibbles (16 R bytes), and a plane of u's top 2 bits (8 R bytes: two vectors p = 0, 1 of R
   x 4 bytes, whose byte of row r and position i holds at bits 2j, 2j + 1 the top bits of element
   4 (4p + j) + i): 26.5 bytes a row's 32 weights, Q6_K's 26.25. */
#ifndef RADIXSERVE_INTERLEAVED_ROWS_H
#define RADIXSERVE_INTERLEAVED_ROWS_H

#include <immintrin.h>
#include <stdint.h>

enum { LAYOUT_SCALE_MIN = 0, LAYOUT_BYTES = 1, LAYOUT_NIBBLES = 2, LAYOUT_K4 = 3, LAYOUT_K6 = 4 };

#define K4_HEADER (8 * R)               /* d and -dmin, R floats each */
#define K4_RECORD (2 * R + 16 * R)      /* sc and m bytes, then the nibbles */
#define K4_SUPER (K4_HEADER + 8 * K4_RECORD)
#define K6_HEADER (4 * R)               /* d, R floats */
#define K6_RECORD (2 * R + 24 * R)      /* the two sc bytes a row, the nibbles, the plane of top bits */
#define K6_SUPER (K6_HEADER + 8 * K6_RECORD)

static inline int has_min(int layout) { return layout == LAYOUT_SCALE_MIN || layout == LAYOUT_K4; }
static inline int is_super(int layout) { return layout == LAYOUT_K4 || layout == LAYOUT_K6; }
static inline int64_t scale_bytes(int layout) {
  return is_super(layout) ? 2 * R : (layout == LAYOUT_SCALE_MIN ? 2 : 1) * R * 4;
}
static inline int64_t quant_bytes(int layout) {
  return (layout == LAYOUT_BYTES ? 32 : layout == LAYOUT_K6 ? 24 : 16) * R;
}
static inline int64_t group_block_bytes(int layout) { return scale_bytes(layout) + quant_bytes(layout); }
static inline int64_t super_bytes(int layout) { return layout == LAYOUT_K6 ? K6_SUPER : K4_SUPER; }
static inline int64_t header_bytes(int layout) { return layout == LAYOUT_K6 ? K6_HEADER : K4_HEADER; }

/* bytes of one group of R rows over nb 32-column blocks (LAYOUT_K4, LAYOUT_K6: nb a multiple of 8) */
static inline int64_t group_bytes(int layout, int64_t nb) {
  return is_super(layout) ? nb / 8 * super_bytes(layout) : nb * group_block_bytes(layout);
}

/* block b's record in a group: its scales (scale_bytes) then its quants */
static inline const uint8_t* block_record(int layout, const uint8_t* group, int64_t b) {
  return is_super(layout) ? group + b / 8 * super_bytes(layout) + header_bytes(layout) + b % 8 * group_block_bytes(layout)
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
