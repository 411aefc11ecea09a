/* Prefill GEMMs over weights held in block formats, on AMX tiles (library "blocks_amx", kernels/amx_gemm.py):
   y (M, N) = x (M, K) @ W^T, x and the weights rounded to bf16 (to nearest even), the products summed in
   float32 by the tiles, float32 out. W (N, K) stays in its block format (block_decode.h: every format of
   kernels/block_formats.py); no other form of it is ever whole.

   blocks_amx_pack_rows: x (M, K) float32 -> xb (Mp, K) bf16, Mp = M rounded up to 32, zero rows past M: the
   A operand, made once for every part of a projection.
   blocks_amx_gemm: the threads split W's rows (in 32s); each takes its share a panel (PANEL_ROWS rows x up
   to CHUNK_K k, 1 MiB of bf16: it stays in L2) at a time: the panel's groups decoded (decode_group_pairs),
   rounded to bf16 and transposed into pairs of k side by side (the B operand, amx_tiles.h's VNNI layout),
   then every 32 rows of x through it on 2 x 2 tiles (tiles_2x2), straight into y; the rows past the last
   whole 32 go into the thread's edge buffer and are copied out at the end. A panel's K chunks accumulate in
   y (float32 stored and loaded back exactly).
   blocks_amx_gemm_interleaved: the same over a copy of W in the int8 GEMM's 16 interleaved rows (Q4_1, Q4_K:
   the decode copies), whose vectors hold 16 rows already: its panels need no transpose.
   Bits: y[m][n] is one tile lane's sum over K in k order, the same whatever M, the other rows, the chunking
   and the thread count, so a row's bits do not depend on the row count (tested). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx_tiles.h"
#include "block_decode.h"
#define R 16 /* the interleaved copies' rows a group: the AVX-512 build's (interleaved_rows.h) */
#include "interleaved_rows.h"

/* A panel: 1 MiB of bf16, which stays in L2 (2 MiB a core) beside the rows of x going through it; 64 or 128 rows
   and 512 to 1024 k ran 5-20% slower on the 1B model's shapes at 512 rows (docs/performance.md, "Prefill GEMMs on
   AMX tiles"). */
#define PANEL_ROWS 256 /* weight rows a panel: a multiple of 32 (a 2 x 2 tile product's columns) */
#define CHUNK_K 2048   /* k a panel: a multiple of 256 (a K-quant block) */

/* Asks Linux for the AMX tile state (amx_tiles.h). Returns 0 when granted. */
int64_t blocks_amx_ready(void) { return amx_tiles_ready(); }

/* xb (Mp x K bf16, Mp = M rounded up to 32) = the rows of x (M x K float32, x_stride floats apart) rounded to
   nearest even, zero rows from M to Mp. Returns 0, or -1 when K is not a multiple of 32. */
int blocks_amx_pack_rows(const float* x, int64_t M, int64_t K, int64_t x_stride, uint16_t* xb, int num_threads) {
  if (K % 32) return -1;
  const int64_t Mp = (M + 31) / 32 * 32;
  #pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t m = 0; m < Mp; m++) {
    uint16_t* out = xb + m * K;
    if (m >= M) {
      memset(out, 0, K * sizeof(uint16_t));
      continue;
    }
    const float* row = x + m * x_stride;
    for (int64_t k = 0; k < K; k += 32)
      _mm512_storeu_si512(out + k, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + k + 16), _mm512_loadu_ps(row + k)));
  }
  return 0;
}

/* 32 decoded weights (four __m256, in order) as 16 bf16 pairs, one 32-bit lane a pair */
static inline __m512i bf16_pairs(const __m256 v[4]) {
  __m512 low = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(v[0])), _mm256_castps_pd(v[1]), 1));
  __m512 high = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(v[2])), _mm256_castps_pd(v[3]), 1));
  return (__m512i)_mm512_cvtne2ps_pbh(high, low);
}

/* 16 bytes at p as 16 int32 lanes (unsigned) */
static inline __m512i bytes16(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }

/* Group g of `block` as 16 bf16 pairs, 512 bits at a time for the formats served most (half the instructions of
   decode_group_avx2's four 256-bit vectors); the same float32 values before the rounding (each scale product
   exact, one rounding of d * q +- m), so the same bf16. The other formats: decode_group_avx2. */
static inline __attribute__((always_inline)) __m512i decode_group_pairs(const int code, const uint8_t* b, int g) {
  const __m512i low4 = _mm512_set1_epi32(0x0F);
  switch (code) {
    case FORMAT_Q4_1: {
      __m512 d = _mm512_set1_ps(load_f32(b)), m = _mm512_set1_ps(load_f32(b + 4));
      __m512i q = bytes16(b + 8); /* weights j (low nibble) and 16 + j (high) */
      __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, low4)), d, m);
      __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, m);
      return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }
    case FORMAT_Q4_0: {
      __m512 d = _mm512_set1_ps(_cvtsh_ss(load_u16(b)));
      __m512i q = bytes16(b + 2), eight = _mm512_set1_epi32(8);
      __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(q, low4), eight)), d);
      __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight)), d);
      return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }
    case FORMAT_Q8_0: {
      __m512 d = _mm512_set1_ps(_cvtsh_ss(load_u16(b)));
      __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 2)))), d);
      __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b + 18)))), d);
      return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    }
    case FORMAT_Q4_K: {
      int sc, mn;
      scale_min_k4(b + 4, g, &sc, &mn);
      __m512 dl = _mm512_set1_ps(_cvtsh_ss(load_u16(b)) * (float)sc);
      __m512 ml = _mm512_set1_ps(_cvtsh_ss(load_u16(b + 2)) * (float)mn);
      const uint8_t* qs = b + 16 + 32 * (g / 2);
      const int shift = 4 * (g % 2);
      __m512i q0 = _mm512_and_si512(_mm512_srli_epi32(bytes16(qs), shift), low4);
      __m512i q1 = _mm512_and_si512(_mm512_srli_epi32(bytes16(qs + 16), shift), low4);
      return (__m512i)_mm512_cvtne2ps_pbh(_mm512_fmsub_ps(_mm512_cvtepi32_ps(q1), dl, ml),
                                           _mm512_fmsub_ps(_mm512_cvtepi32_ps(q0), dl, ml));
    }
    case FORMAT_Q6_K: {
      const float d = _cvtsh_ss(load_u16(b + 208));
      const int h = g / 4, r = g % 4;
      const uint8_t* ql = b + 64 * h + 32 * (r % 2);
      const uint8_t* qh = b + 128 + 32 * h;
      __m512 half[2];
      for (int i = 0; i < 2; i++) { /* weights 16 i .. 16 i + 15, one scale */
        __m512i low = _mm512_and_si512(_mm512_srli_epi32(bytes16(ql + 16 * i), 4 * (r / 2)), low4);
        __m512i high = _mm512_and_si512(_mm512_srli_epi32(bytes16(qh + 16 * i), 2 * r), _mm512_set1_epi32(3));
        __m512i q = _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)), _mm512_set1_epi32(32));
        half[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(d * (float)(int8_t)b[192 + 2 * g + i]));
      }
      return (__m512i)_mm512_cvtne2ps_pbh(half[1], half[0]);
    }
    default: {
      __m256 v[4];
      decode_group_avx2(code, b, g, v);
      return bf16_pairs(v);
    }
  }
}

/* panel (ck / 2 rows of `width` pairs) = W's rows n0 .. n0 + width over k0 .. k0 + ck in bf16, VNNI: row i,
   pair c = (W[n0 + c][k0 + 2 i], W[n0 + c][k0 + 2 i + 1]). Inlined with a constant code (decode_panel). */
static inline __attribute__((always_inline)) void decode_panel_as(const int code, const uint8_t* W, int64_t row_bytes,
                                                                   int64_t bytes, int groups, int64_t n0, int64_t width,
                                                                   int64_t k0, int64_t ck, uint16_t* panel) {
  /* known from the (constant) code, so the group loop unrolls and each group's shifts and scale positions fold
     to constants; a chunk starts on a block (CHUNK_K is whole blocks) */
  const int block_groups = code >= FORMAT_Q2_K && code <= FORMAT_Q6_K ? 8 : 1;
  (void)groups;
  for (int64_t c0 = 0; c0 < width; c0 += 16) {
    const uint8_t* rows = W + (n0 + c0) * row_bytes;
    for (int64_t k = 0; k < ck; k += 32 * block_groups) {
      const uint8_t* block = rows + (k0 + k) / (32 * block_groups) * bytes;
      #pragma GCC unroll 8
      for (int g = 0; g < block_groups; g++) {
        __m512i lanes[16]; /* row r: weight row n0 + c0 + r's 16 pairs of these 32 k */
        for (int r = 0; r < 16; r++) lanes[r] = decode_group_pairs(code, block + r * row_bytes, g);
        transpose16(lanes); /* row i: pair i of the 32 k for the 16 weight rows */
        for (int i = 0; i < 16; i++) _mm512_storeu_si512(panel + (((k + 32 * g) / 2 + i) * width + c0) * 2, lanes[i]);
      }
    }
  }
}

static void decode_panel(int code, const uint8_t* W, int64_t row_bytes, int64_t bytes, int groups, int64_t n0,
                         int64_t width, int64_t k0, int64_t ck, uint16_t* panel) {
  switch (code) {
#define PANEL_CASE(C) case C: decode_panel_as(C, W, row_bytes, bytes, groups, n0, width, k0, ck, panel); break;
    PANEL_CASE(0) PANEL_CASE(1) PANEL_CASE(2) PANEL_CASE(3) PANEL_CASE(4) PANEL_CASE(5) PANEL_CASE(6)
    PANEL_CASE(7) PANEL_CASE(8) PANEL_CASE(9) PANEL_CASE(10) PANEL_CASE(11) PANEL_CASE(12)
#undef PANEL_CASE
  }
}

/* A thread's buffers, kept between calls (OpenMP's threads persist) and grown on demand: a fresh
   megabyte a call would be a fresh mapping whose pages fault in and are zeroed every time. */
static __thread uint16_t* thread_panel;
static __thread float* thread_edge;
static __thread int64_t thread_edge_floats;

static float* edge_buffer(int64_t floats) {
  if (floats > thread_edge_floats) {
    free(thread_edge);
    thread_edge = aligned_alloc(64, (size_t)(floats + 15) / 16 * 64);
    thread_edge_floats = thread_edge ? floats : 0;
  }
  return thread_edge;
}

/* Where a panel's weights come from: W's blocks (code >= 0: block_decode.h's format, rows row_bytes apart), or a
   copy in the int8 GEMM's interleaved rows (code INTERLEAVED: kernels/csrc/gemm_q8.c's LAYOUT_SCALE_MIN or
   LAYOUT_K4, `layout`, 16 rows a group: interleaved_rows.h). */
#define INTERLEAVED (-1)
typedef struct {
  int code, layout;
  const uint8_t* W;
  int64_t row_bytes, bytes; /* blocks: a row's, a block's */
  int groups;
} panel_source;

/* panel rows = the same VNNI panel as decode_panel's, from the interleaved copy (layout LAYOUT_SCALE_MIN or
   LAYOUT_K4): its lanes are the rows already, so a weight vector gives pair rows without a transpose, and a
   block's scales and mins are one vector each. Per 32 columns, 4 vectors j of 16 x 4 bytes, lane r's byte i
   holding weight 4j + i (low nibble) and 4j + 16 + i (high nibble) of row r: w = d q + min, the blocks' own
   values (Q4_1's d and m; Q4_K's d sc and -dmin m, exact in float32). */
static void decode_interleaved_panel(int layout, const uint8_t* W, int64_t K, int64_t n0, int64_t width, int64_t k0,
                                     int64_t ck, uint16_t* panel) {
  const int64_t blocks = K / 32;
  const __m512i low4 = _mm512_set1_epi32(0x0F0F0F0F), byte = _mm512_set1_epi32(0xFF);
  for (int64_t c0 = 0; c0 < width; c0 += 16) {
    const uint8_t* group = W + (n0 + c0) / R * group_bytes(layout, blocks);
    for (int64_t k = 0; k < ck; k += 32) {
      const int64_t b = (k0 + k) / 32;
      const uint8_t* record = block_record(layout, group, b);
      __m512 d, min;
      block_scales(layout, group, b, record, &d, &min);
      const uint8_t* quants = record + scale_bytes(layout);
      uint16_t* rows = panel + ((k / 2) * width + c0) * 2; /* pair row i at rows + i * width * 2 */
      for (int j = 0; j < 4; j++) {
        const __m512i v = _mm512_loadu_si512(quants + 64 * j);
        for (int high = 0; high < 2; high++) { /* weights 4j + i, then 4j + 16 + i */
          const __m512i q = high ? _mm512_and_si512(_mm512_srli_epi32(v, 4), low4) : _mm512_and_si512(v, low4);
          __m512 w[4];
          for (int i = 0; i < 4; i++)
            w[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(q, 8 * i), byte)), d, min);
          const int64_t pair = 8 * high + 2 * j;
          _mm512_storeu_si512(rows + pair * width * 2, pairs_of(w[0], w[1]));
          _mm512_storeu_si512(rows + (pair + 1) * width * 2, pairs_of(w[2], w[3]));
        }
      }
    }
  }
}

/* y (M x N float32, row m at y + m * y_stride) = rows of x, packed by blocks_amx_pack_rows into xb, @ W^T, W's
   panels from `src`. Returns 0, or -3 when a buffer could not be allocated. */
static int gemm_over(const panel_source* src, const uint16_t* xb, int64_t M, int64_t N, int64_t K, float* y,
                     int64_t y_stride, int num_threads) {
  const int64_t whole = M / 32 * 32, edge = M - whole, pairs = N / 32;
  int failed = 0;
  #pragma omp parallel num_threads(num_threads)
  {
    const int64_t thread = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t n_begin = pairs * thread / count * 32, n_end = pairs * (thread + 1) / count * 32;
    const int64_t share = n_end - n_begin;
    if (!thread_panel) thread_panel = aligned_alloc(64, (size_t)PANEL_ROWS * CHUNK_K * sizeof(uint16_t));
    float* edge_out = edge && share ? edge_buffer(32 * share) : NULL;
    if (!thread_panel || (edge && share && !edge_out)) {
      #pragma omp atomic write
      failed = 1;
    } else if (share) {
      configure_tiles();
      for (int64_t n0 = n_begin; n0 < n_end; n0 += PANEL_ROWS) {
        const int64_t width = n_end - n0 < PANEL_ROWS ? n_end - n0 : PANEL_ROWS;
        for (int64_t k0 = 0; k0 < K; k0 += CHUNK_K) {
          const int64_t ck = K - k0 < CHUNK_K ? K - k0 : CHUNK_K;
          if (src->code == INTERLEAVED) decode_interleaved_panel(src->layout, src->W, K, n0, width, k0, ck, thread_panel);
          else decode_panel(src->code, src->W, src->row_bytes, src->bytes, src->groups, n0, width, k0, ck, thread_panel);
          for (int64_t m0 = 0; m0 < whole + (edge ? 32 : 0); m0 += 32) {
            float* c = m0 < whole ? y + m0 * y_stride + n0 : edge_out + (n0 - n_begin);
            const int64_t ldc = m0 < whole ? y_stride : share;
            for (int64_t j = 0; j < width; j += 32)
              tiles_2x2(c + j, ldc, k0 == 0, 2, xb + m0 * K + k0, 16 * K, K * 2, 32, thread_panel + j * 2, width * 4,
                        32 * width, ck / 32);
          }
        }
      }
      _tile_release();
      for (int64_t r = 0; r < edge; r++) memcpy(y + (whole + r) * y_stride + n_begin, edge_out + r * share, share * 4);
    }
  }
  return failed ? -3 : 0;
}

/* The product over W (N, K) in block format `code`. Returns 0; -1 for a bad code, -2 when K or N is not a
   multiple of 32, -3 when a buffer could not be allocated. */
int blocks_amx_gemm(int code, int64_t block_size, int64_t block_bytes, const uint8_t* W, const uint16_t* xb,
                    int64_t M, int64_t N, int64_t K, float* y, int64_t y_stride, int num_threads) {
  if (code < 0 || code >= NUM_FORMATS) return -1;
  if (K % 32 || N % 32) return -2;
  panel_source src = {.code = code, .W = W};
  int64_t num_blocks;
  row_shape(code, K, block_size, block_bytes, &num_blocks, &src.bytes, &src.groups);
  src.row_bytes = num_blocks * src.bytes;
  return gemm_over(&src, xb, M, N, K, y, y_stride, num_threads);
}

/* The product over a copy of W (N, K) in 16 interleaved rows (gemm_q8_repack's with AVX-512), `layout`
   LAYOUT_SCALE_MIN (Q4_1) or LAYOUT_K4 (Q4_K). Returns 0; -1 for another layout, -2 when K or N is not a multiple
   of 32 (of 256 for LAYOUT_K4), -3 when a buffer could not be allocated. */
int blocks_amx_gemm_interleaved(int layout, const uint8_t* W, const uint16_t* xb, int64_t M, int64_t N, int64_t K,
                                float* y, int64_t y_stride, int num_threads) {
  if (!has_min(layout)) return -1;
  if (K % 32 || N % 32 || (layout == LAYOUT_K4 && K % 256)) return -2;
  const panel_source src = {.code = INTERLEAVED, .layout = layout, .W = W};
  return gemm_over(&src, xb, M, N, K, y, y_stride, num_threads);
}
