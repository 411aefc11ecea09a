/* What the AMX builds share (kernels/csrc/prefill_attention.c's amx_bf16 build, kernels/csrc/gemm_amx.c):
   the tile state asked of Linux, one tile configuration (every tile 16 rows of 64 bytes: 16 float32, or 32
   bf16), bf16 packing helpers, a 16 x 16 transpose of 32-bit lanes, and the 2 x 2 tile product that both
   kernels' inner loops are.

   A B operand holds pairs along its K dimension side by side (the VNNI layout: B[k / 2][2 n + k % 2]);
   TDPBF16PS sums each C lane's products over a tile's 32 k in a fixed order, from that lane's inputs alone,
   so a lane's bits do not depend on what its neighbours hold. Compiled with -mamx-tile -mamx-bf16
   -mavx512bf16 (kernels/native_build.py's LIBRARY_EXTRA_FLAGS). */
#ifndef RADIXSERVE_AMX_TILES_H
#define RADIXSERVE_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Asks Linux for the AMX tile state (once a process; without it the first tile instruction faults).
   Returns 0 when granted. */
static inline int64_t amx_tiles_ready(void) {
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 0 : -1;
}

typedef struct {
  uint8_t palette_id, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* Every tile 16 rows of 64 bytes. A constant in memory: stores into a local the compiler may drop, since it
   does not see ldtilecfg read them. Loaded on each thread at each call: oneDNN configures tiles its own way
   between our calls. */
static const tile_config TILES_16X64 = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

static inline void configure_tiles(void) { _tile_loadconfig(&TILES_16X64); }

/* 16 floats' bits as bf16 (to nearest even) in the low 16 bits of each 32-bit lane */
static inline __m512i bf16_lanes(__m512 x) { return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(x)); }

/* 16 bf16 pairs (a[i], b[i]): two rows side by side, one 32-bit lane a pair */
static inline __m512i pairs_of(__m512 a, __m512 b) {
  return _mm512_or_si512(bf16_lanes(a), _mm512_slli_epi32(bf16_lanes(b), 16));
}

/* x[i] (16 x 16 32-bit lanes) transposed in place */
static inline void transpose16(__m512i x[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    x[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    x[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    x[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    x[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm512_shuffle_i32x4(x[i], x[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(x[i], x[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(x[i + 8], x[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(x[i + 8], x[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; i++) {
    x[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    x[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    x[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    x[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

/* c (rows x 16 rows x 32 columns of float32, ldc floats apart: tiles 0, 1 its first 16 rows, 2, 3 the next
   16) = c, or 0 (from_zero), + the sum over `steps` of A B: A two bf16 tiles of 16 rows (4 at a, 5 at a +
   a_half; rows a_stride bytes apart), B two tiles of 16 pair columns in VNNI (6 at b, 7 at b + 32; rows
   b_stride bytes apart); each step moves a by a_step and b by b_step. rows: 2, or 1 (tiles 0, 1 alone). */
static inline __attribute__((always_inline)) void tiles_2x2(float* c, int64_t ldc, int from_zero, int rows,
                                                           const uint16_t* a, int64_t a_half, int64_t a_stride,
                                                           int64_t a_step, const uint16_t* b, int64_t b_stride,
                                                           int64_t b_step, int64_t steps) {
  float* c_low = c + 16 * ldc;
  if (from_zero) {
    _tile_zero(0);
    _tile_zero(1);
    if (rows == 2) { _tile_zero(2); _tile_zero(3); }
  } else {
    _tile_loadd(0, c, ldc * 4);
    _tile_loadd(1, c + 16, ldc * 4);
    if (rows == 2) { _tile_loadd(2, c_low, ldc * 4); _tile_loadd(3, c_low + 16, ldc * 4); }
  }
  for (int64_t s = 0; s < steps; s++, a += a_step, b += b_step) {
    _tile_loadd(4, a, a_stride);
    if (rows == 2) _tile_loadd(5, a + a_half, a_stride);
    _tile_loadd(6, b, b_stride);
    _tile_loadd(7, b + 32, b_stride);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (rows == 2) { _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7); }
  }
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  if (rows == 2) { _tile_stored(2, c_low, ldc * 4); _tile_stored(3, c_low + 16, ldc * 4); }
}

#endif
