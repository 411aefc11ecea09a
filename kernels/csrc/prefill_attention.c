/* Paged prefill attention for CPU, float32 queries: each sequence's chunk of new query rows attends,
   causally, to its cached prefix and to its own just-written positions, K/V read from the pages in
   their stored format (kv_formats.h). See kernels/cpu_prefill_attention.py.

   Flash-attention style. A work item is (sequence, KV head, tile of about ROW_TILE_M / G token rows):
   the G query heads of each of those rows together, M = rows * G query vectors, so each K/V row is
   read once for all of them (GQA). Keys go in tiles of KT positions, aligned to multiples of KT. Per
   tile, with the queries held transposed (D x M, once per item) the scores come out transposed too,
   S^T = K Q^T (KT x M, each lane a query vector), times the scale, soft-capped, masked (causal, and
   the sliding window); the online softmax (running max and sum per query vector, float32) then runs
   lane-wise, with no horizontal reduction; O (M x D) += P V. Float32 pages are read in place (a K
   value broadcast, a V row loaded); bfloat16 and int8 ones are dequantized one tile of one KV head
   at a time into a scratch, never a copy of the pool; the next tile's rows are prefetched. Nothing
   larger than one tile's scores is held. Items run in parallel (OpenMP, dynamic, longest first).

   A row's result does not depend on how the rows are cut (into items, chunks of a prefill, or
   batches): its key tiles are the same aligned ones, every operation on it is lane-wise in a fixed
   order, and a tile it cannot see leaves its state as it was. Within one build, a row has the same
   bits in every batch.

   One source, four builds (kernels/native_build.py): AVX-512 (16 lanes), AVX2 + FMA (8 lanes) and
   portable (4 lanes of whatever the target has), written with GCC/Clang vector extensions, all float32;
   and amx_bf16 (AVX-512 with AMX-TILE, AMX-BF16 and AVX512_BF16: the products on AMX tiles in bf16, below). */

#include <omp.h>

#include "kv_formats.h"

#if defined(__AVX512F__)
#define VW 16   /* floats a vector */
#define NV 4    /* vectors of query lanes a score micro-tile: KR x NV accumulators */
#define OR 4    /* query vectors (rows of O) a P V micro-tile: OR x PV_NV accumulators */
#define PV_NV 4 /* vectors of D a P V micro-tile */
#elif defined(__AVX2__)
#define VW 8
#define NV 3
#define OR 6
#define PV_NV 2
#else
#define VW 4
#define NV 2
#define OR 4
#define PV_NV 2
#endif
#define KR 4 /* keys a score micro-tile */
#define LANES (NV * VW) /* query vectors of a score micro-tile: M is padded to a multiple of it (and of OR) */

#define KT 64             /* key positions a tile: a multiple of KR */
#if defined(__AMX_BF16__)
#define ROW_TILE_M 512    /* query vectors an item (rows * G) aims at: more rows a key tile's conversion */
#else
#define ROW_TILE_M 256
#endif
#define MAX_HEAD_DIM 256  /* also checked by the Python wrapper */
#define MAX_GROUP 64
_Static_assert(LANES % OR == 0 && KT % KR == 0, "micro-tiles must divide the padded sizes");
#define PARALLEL_MIN 262144 /* multiply-adds (positions x keys x H x D) from which the op forks */

typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));

static inline vf vload(const float* p) {
  vf x;
  memcpy(&x, p, sizeof x);
  return x;
}
static inline vi vload_i(const int32_t* p) {
  vi x;
  memcpy(&x, p, sizeof x);
  return x;
}
static inline void vstore(float* p, vf x) { memcpy(p, &x, sizeof x); }
static inline vf vset1(float x) { /* a broadcast ((vf){0} + x would add 0.0 first, a loop inserts lanes) */
#if defined(__AVX512F__)
  return (vf)_mm512_set1_ps(x);
#elif defined(__AVX2__)
  return (vf)_mm256_set1_ps(x);
#else
  return (vf){x, x, x, x};
#endif
}
static inline vi vset1_i(int32_t x) {
#if defined(__AVX512F__)
  return (vi)_mm512_set1_epi32(x);
#elif defined(__AVX2__)
  return (vi)_mm256_set1_epi32(x);
#else
  return (vi){x, x, x, x};
#endif
}
static inline vf vselect(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }

/* exp(x) for x <= 0 (scores minus their running max), Cephes' expf as simd.h's exp256: 0 below
   -87.3 (masked scores, -inf, included); NaN stays NaN. */
static inline vf vexp_nonpositive(vf x) {
  const vi under = x < vset1(-87.3f);
  x = vselect(under, vset1(-87.3f), x);
  vf fx = x * vset1(1.44269504088896341f);
  fx = (fx + vset1(12582912.0f)) - vset1(12582912.0f); /* round to nearest (|fx| < 2^22) */
  vf r = x - fx * vset1(0.693359375f);
  r = r - fx * vset1(-2.12194440e-4f);
  vf y = vset1(1.9875691500e-4f);
  y = y * r + vset1(1.3981999507e-3f);
  y = y * r + vset1(8.3334519073e-3f);
  y = y * r + vset1(4.1665795894e-2f);
  y = y * r + vset1(1.6666665459e-1f);
  y = y * r + vset1(5.0000001201e-1f);
  y = y * (r * r) + (r + vset1(1.0f));
  const vi n = __builtin_convertvector(fx, vi);
  const vf pow2n = (vf)((n + 127) << 23);
  return (vf)((vi)(y * pow2n) & ~under);
}

#if !defined(__AMX_BF16__) /* the float32 builds' products (the AMX build's: below) */
/* st rows j0 .. j0 + KR (Mp apart), lanes c0 .. c0 + LANES = scale * k_j . q over d: k rows at krow[j0 ..],
   q transposed (qt: D x Mp). */
static inline void scores_micro(const float* const* krow, const float* qt, int64_t D, int64_t Mp, int64_t c0,
                                float scale, float* st) {
  vf acc[KR][NV];
  for (int r = 0; r < KR; r++)
    for (int c = 0; c < NV; c++) acc[r][c] = vset1(0.0f);
  const float *k0 = krow[0], *k1 = krow[1], *k2 = krow[2], *k3 = krow[3];
  for (int64_t d = 0; d < D; d++) {
    vf q[NV];
    for (int c = 0; c < NV; c++) q[c] = vload(qt + d * Mp + c0 + c * VW);
    const vf b0 = vset1(k0[d]), b1 = vset1(k1[d]), b2 = vset1(k2[d]), b3 = vset1(k3[d]);
    for (int c = 0; c < NV; c++) {
      acc[0][c] += b0 * q[c];
      acc[1][c] += b1 * q[c];
      acc[2][c] += b2 * q[c];
      acc[3][c] += b3 * q[c];
    }
  }
  const vf vs = vset1(scale);
  for (int r = 0; r < KR; r++)
    for (int c = 0; c < NV; c++) vstore(st + r * Mp + c0 + c * VW, acc[r][c] * vs);
}

/* o rows m0 .. m0 + OR (Dp apart), columns d0 .. d0 + nv * VW = o * corr + sum_j p[j][m] v_j over the n
   keys; p = st (KT x Mp), v rows at vrow[j]. */
static inline __attribute__((always_inline)) void pv_micro(float* o, int64_t Dp, int64_t m0, int64_t d0,
                                                          const float* corr, const float* st, int64_t Mp,
                                                          const float* const* vrow, int64_t n, const int nv) {
  vf acc[OR][PV_NV];
  for (int r = 0; r < OR; r++) {
    const vf c = vset1(corr[m0 + r]);
    for (int i = 0; i < nv; i++) acc[r][i] = vload(o + (m0 + r) * Dp + d0 + i * VW) * c;
  }
  for (int64_t j = 0; j < n; j++) {
    vf v[PV_NV];
    for (int i = 0; i < nv; i++) v[i] = vload(vrow[j] + d0 + i * VW);
    const float* p = st + j * Mp + m0;
    for (int r = 0; r < OR; r++) {
      const vf pb = vset1(p[r]);
      for (int i = 0; i < nv; i++) acc[r][i] += pb * v[i];
    }
  }
  for (int r = 0; r < OR; r++)
    for (int i = 0; i < nv; i++) vstore(o + (m0 + r) * Dp + d0 + i * VW, acc[r][i]);
}

static void pv_tile(float* o, int64_t Dp, int64_t Mp, const float* corr, const float* st,
                    const float* const* vrow, int64_t n) {
  for (int64_t m0 = 0; m0 < Mp; m0 += OR)
    for (int64_t d0 = 0; d0 < Dp; d0 += PV_NV * VW) {
      const int64_t left = (Dp - d0) / VW;
      if (left >= PV_NV) pv_micro(o, Dp, m0, d0, corr, st, Mp, vrow, n, PV_NV);
#if PV_NV > 3
      else if (left == 3) pv_micro(o, Dp, m0, d0, corr, st, Mp, vrow, n, 3);
#endif
#if PV_NV > 2
      else if (left == 2) pv_micro(o, Dp, m0, d0, corr, st, Mp, vrow, n, 2);
#endif
      else pv_micro(o, Dp, m0, d0, corr, st, Mp, vrow, n, 1);
    }
}
#endif

typedef struct {
  const float* q;
  kv_pages k_cache, v_cache;
  const int64_t *page_table, *q_starts, *query_lens, *context_lens, *item_start;
  float* out;
  int64_t q_row_stride, max_pages, num_seqs, num_heads, num_kv_heads, G, D, Dp, page_size, tile_rows, Mp;
  int64_t window; /* a sliding window W: a query at position p sees keys in (p - W, p]; 0: none */
  float scale, softcap; /* softcap 0: none */
} prefill_job;

/* One thread's scratch. */
typedef struct {
  float *kc, *vc, *st, *o, *m, *l, *zero;
  int32_t* pos;
#if defined(__AMX_BF16__)
  uint16_t *qb, *ka, *pb, *vt; /* bf16 tile operands (see the AMX build) */
#else
  float *qt, *corr;
#endif
} scratch;

/* Lays the scratch out from base (64-byte aligned, or NULL to only count): each piece starts 64-byte
   aligned. Returns the floats it takes. */
static int64_t scratch_at(float* base, int64_t Mp, int64_t D, int64_t Dp, scratch* sc) {
  int64_t at = 0;
#define TAKE(field, count) sc->field = base ? (void*)(base + at) : NULL; at += ((count) + 15) / 16 * 16
  TAKE(kc, KT * Dp);
  TAKE(vc, KT * Dp);
  TAKE(st, KT * Mp);
  TAKE(o, Mp * Dp);
  TAKE(m, Mp);
  TAKE(l, Mp);
  TAKE(zero, Dp);
  TAKE(pos, Mp);
#if defined(__AMX_BF16__)
  const int64_t Dk = (D + 31) / 32 * 32;
  TAKE(qb, Mp * Dk / 2);
  TAKE(ka, KT * Dk / 2);
  TAKE(pb, Mp * KT / 2);
  TAKE(vt, Dp * KT / 2);
#else
  TAKE(qt, D * Mp);
  TAKE(corr, Mp);
#endif
#undef TAKE
  return at;
}

/* slots[t] = the slot of position pos + t, t < n (one division, not one a position) */
static inline void slots_of(const int64_t* pages, int64_t page_size, int64_t pos, int64_t n, int64_t* slots) {
  int64_t page = pos / page_size, offset = pos % page_size;
  for (int64_t t = 0; t < n; t++) {
    slots[t] = pages[page] * page_size + offset;
    if (++offset == page_size) { offset = 0; page++; }
  }
}

/* Where the rows of keys [k0, k0 + n) of KV head kvh are, as float32: krow, vrow (KT entries; past n
   the zero row). Float32 pages in place (V only when D is whole vectors: a row is read VW at a time),
   else dequantized into the scratch. Prefetches the next n_next keys' rows. */
static void locate_tile(const prefill_job* j, const int64_t* pages, int64_t kvh, int64_t k0, int64_t n,
                        int64_t n_next, const scratch* sc, const float** krow, const float** vrow) {
  const int64_t D = j->D, Dp = j->Dp, KVH = j->num_kv_heads, page_size = j->page_size;
  const int k_in_place = j->k_cache.format == KV_F32;
  const int v_in_place = j->v_cache.format == KV_F32 && D == Dp;
  int64_t slots[KT];
  slots_of(pages, page_size, k0, n, slots);
  for (int64_t t = 0; t < n; t++) {
    const int64_t slot = slots[t], at = (slot * KVH + kvh) * D;
    if (k_in_place) {
      krow[t] = (const float*)j->k_cache.values + at;
    } else {
      kv_load_head(&j->k_cache, slot, kvh, KVH, D, sc->kc + t * Dp);
      krow[t] = sc->kc + t * Dp;
    }
    if (v_in_place) {
      vrow[t] = (const float*)j->v_cache.values + at;
    } else {
      float* row = sc->vc + t * Dp;
      kv_load_head(&j->v_cache, slot, kvh, KVH, D, row);
      for (int64_t d = D; d < Dp; d++) row[d] = 0.0f;
      vrow[t] = row;
    }
  }
  for (int64_t t = n; t < KT; t++) krow[t] = vrow[t] = sc->zero;
  const int64_t k_bytes = D * kv_element_size(j->k_cache.format), v_bytes = D * kv_element_size(j->v_cache.format);
  slots_of(pages, page_size, k0 + KT, n_next, slots);
  for (int64_t t = 0; t < n_next; t++) {
    const int64_t at = slots[t] * KVH + kvh;
    const char* k = (const char*)j->k_cache.values + at * k_bytes;
    const char* v = (const char*)j->v_cache.values + at * v_bytes;
    for (int64_t b = 0; b < k_bytes; b += 64) __builtin_prefetch(k + b);
    for (int64_t b = 0; b < v_bytes; b += 64) __builtin_prefetch(v + b);
  }
}

/* The scores st (n keys from k0, `lanes` lanes a row, their positions pos) soft-capped, then masked: -inf
   where a lane cannot see the key (causal, the window), unless every row of the item sees every key of the
   tile (padding lanes, whose results are never read, then keep their scores). p_first, p_last: the
   positions of the item's first and last rows. */
static void mask_scores(const prefill_job* j, float* st, const int32_t* pos_of, int64_t lanes, int64_t k0, int64_t n,
                        int64_t p_first, int64_t p_last) {
  const int64_t W = j->window;
  if (j->softcap > 0.0f)
    for (int64_t t2 = 0; t2 < n; t2++)
      for (int64_t m = 0; m < lanes; m++) st[t2 * lanes + m] = j->softcap * tanhf(st[t2 * lanes + m] / j->softcap);
  const int is_full = k0 + n - 1 <= p_first && (W == 0 || k0 > p_last - W);
  if (!is_full)
    for (int64_t t2 = 0; t2 < n; t2++) {
      const int32_t key = (int32_t)(k0 + t2);
      const vi vkey = vset1_i(key), vkey_w = vset1_i(W > 0 ? key + (int32_t)W : INT32_MAX);
      for (int64_t m = 0; m < lanes; m += VW) {
        const vi pos = vload_i(pos_of + m);
        const vi visible = (pos >= vkey) & (pos < vkey_w); /* key <= pos < key + W */
        vstore(st + t2 * lanes + m, vselect(visible, vload(st + t2 * lanes + m), vset1(-INFINITY)));
      }
    }
}

/* Item t: sequence b, KV head kvh, token rows [r0, r1) of its chunk (items longest first). */
typedef struct {
  int64_t b, kvh, r0, r1, first_pos; /* first_pos: the position of the chunk's first row */
} item;

static item item_at(const prefill_job* j, int64_t t) {
  int64_t lo = 0, hi = j->num_seqs; /* b: item_start[b] <= t < item_start[b + 1] */
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (j->item_start[mid] <= t) lo = mid; else hi = mid;
  }
  const int64_t b = lo, i = t - j->item_start[b], T = j->query_lens[b];
  const int64_t num_tiles = (T + j->tile_rows - 1) / j->tile_rows;
  const int64_t tile = num_tiles - 1 - i / j->num_kv_heads; /* the last rows (the most keys) first */
  const int64_t r0 = tile * j->tile_rows, r1 = r0 + j->tile_rows < T ? r0 + j->tile_rows : T;
  return (item){b, i % j->num_kv_heads, r0, r1, j->context_lens[b] - T};
}

/* lane m's query vector (the item's token row r0 + m / G, query head kvh * G + m % G), m < M */
static inline const float* query_of(const prefill_job* j, const item* it, int64_t m) {
  return j->q + (j->q_starts[it->b] + it->r0 + m / j->G) * j->q_row_stride + (it->kvh * j->G + m % j->G) * j->D;
}

#if !defined(__AMX_BF16__)
/* The float32 builds' two hooks of prefill_item (the AMX build has its own below). */

/* qt (D x Mp) = the item's query vectors transposed: lane m = r * G + g is token row r0 + r's query head
   kvh * G + g; padding lanes 0. */
static void load_queries(const prefill_job* j, const item* it, int64_t M, int64_t Mp, const scratch* sc) {
  const int64_t D = j->D;
  for (int64_t m = 0; m < Mp; m++) {
    const float* qm = m < M ? query_of(j, it, m) : NULL;
    for (int64_t d = 0; d < D; d++) sc->qt[d * Mp + m] = qm ? qm[d] : 0.0f;
  }
}

/* One key tile (n keys from k0, rows krow / vrow): scores, masks, the online softmax lane-wise (a lane with
   nothing visible yet keeps m = -inf, l = 0 and corr 1), O (M x Dp) = O * corr + P V. */
static void attend_tile(const prefill_job* j, const scratch* sc, const float* const* krow, const float* const* vrow,
                        int64_t k0, int64_t n, int64_t M, int64_t Mp, int64_t p_first, int64_t p_last) {
  const int64_t n_up = (n + KR - 1) / KR * KR; /* key rows scored; those past n are never read */
  for (int64_t c0 = 0; c0 < Mp; c0 += LANES)
    for (int64_t j0 = 0; j0 < n_up; j0 += KR) scores_micro(krow + j0, sc->qt, j->D, Mp, c0, j->scale, sc->st + j0 * Mp);
  mask_scores(j, sc->st, sc->pos, Mp, k0, n, p_first, p_last);
  for (int64_t m = 0; m < Mp; m += VW) {
    const vf m_old = vload(sc->m + m);
    vf m_new = m_old;
    for (int64_t t2 = 0; t2 < n; t2++) m_new = vmax(m_new, vload(sc->st + t2 * Mp + m));
    const vi none = m_new == vset1(-INFINITY);
    const vf m_use = vselect(none, vset1(0.0f), m_new);
    const vf corr = vselect(none, vset1(1.0f), vexp_nonpositive(m_old - m_use)); /* 0 on a lane's first */
    vf sum = vset1(0.0f);
    for (int64_t t2 = 0; t2 < n; t2++) {
      const vf p = vexp_nonpositive(vload(sc->st + t2 * Mp + m) - m_use);
      vstore(sc->st + t2 * Mp + m, p);
      sum += p;
    }
    vstore(sc->l + m, vload(sc->l + m) * corr + sum);
    vstore(sc->m + m, m_new);
    vstore(sc->corr + m, corr);
  }
  pv_tile(sc->o, j->Dp, Mp, sc->corr, sc->st, vrow, n);
}

#define O_AT(o, m, d, Mp, Dp) (o)[(m) * (Dp) + (d)] /* O is M x Dp */
#define BEGIN_THREAD() (void)0
#define END_THREAD() (void)0

#else
/* ------------------------------------------------------------------ the AMX build (bf16 products)

   The same items, key tiles, masks and online softmax (lane-wise, one lane a query vector), with the two
   products on AMX tiles: bf16 inputs (Q, K, P and V rounded to nearest even), float32 accumulation. A tile
   is 16 rows of 64 bytes (16 float32, or 32 bf16); a B operand holds pairs along its K dimension side by
   side (the VNNI layout: B[k / 2][2 n + k % 2]).
   The lanes go through a key tile a slab (SLAB lanes) at a time, each slab's scores, probabilities and O^T
   laid out on their own (attend_tile):
   - S^T (KT x SLAB) = K Q^T: A = K (kp x Dk bf16, rows of the tile's keys, Dk = D rounded up to 32, zeros
     past D), B = the slab's part of qb, Q^T in VNNI (Dk / 2 rows of SLAB pairs a slab), made once per item.
   - O^T (Dp x SLAB a slab) = O^T * corr + V^T P^T: A = vt, V^T (Dp x KT bf16, once per key tile), B = pb,
     P^T in VNNI (KT / 2 rows of SLAB pairs), two rows of P^T interleaved.
   Q^T and V^T come from 32-bit transposes of bf16 pairs. Keys past a tile's n are zero rows of K and V and
   0 in P. l sums the P that goes into the product (rounded to bf16), so O / l is a weighted mean of V.
   Every value of a query vector is computed from its own lane alone, in a fixed order: its bits do not
   depend on the cut (as above). */

#include "amx_tiles.h"

/* Asks Linux for the AMX tile state (amx_tiles.h). Returns 0 when granted. */
int64_t prefill_attention_amx_ready(void) { return amx_tiles_ready(); }

#define SLAB 64 /* query lanes taken through a key tile together: a multiple of LANES (and of 32, two tiles' columns) */
_Static_assert(SLAB % LANES == 0 && SLAB % 32 == 0, "a slab is whole vectors of lanes and whole tile pairs");

/* 16 floats of row at d0 (0 past D) */
static inline __m512 load_head_part(const float* row, int64_t d0, int64_t D) {
  const int64_t left = D - d0;
  if (left >= 16) return _mm512_loadu_ps(row + d0);
  if (left <= 0) return _mm512_setzero_ps();
  return _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), row + d0);
}

/* 32 bf16 of row at d0 .. d0 + 32 (0 past D), in order: 16 pairs */
static inline __m512i bf16_row_part(const float* row, int64_t d0, int64_t D) {
  return (__m512i)_mm512_cvtne2ps_pbh(load_head_part(row, d0 + 16, D), load_head_part(row, d0, D));
}

/* qb (Dk / 2 rows of Mp pairs) = (scale Q)^T in VNNI: row i, pair m = scale (q_m[2 i], q_m[2 i + 1]); q rows
   qrow[m] (NULL: a padding row, zeros) */
static void pack_queries(const float* const* qrow, float scale, int64_t Mp, int64_t D, int64_t Dk, uint16_t* qb) {
  const __m512 vs = _mm512_set1_ps(scale);
  for (int64_t m0 = 0; m0 < Mp; m0 += 16)
    for (int64_t d0 = 0; d0 < Dk; d0 += 32) {
      __m512i x[16]; /* lane i of row r: query vector m0 + r's pair i of d0 .. d0 + 32 */
      for (int r = 0; r < 16; r++)
        x[r] = qrow[m0 + r] ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(load_head_part(qrow[m0 + r], d0 + 16, D), vs),
                                                          _mm512_mul_ps(load_head_part(qrow[m0 + r], d0, D), vs))
                            : _mm512_setzero_si512();
      transpose16(x);
      for (int i = 0; i < 16; i++) _mm512_storeu_si512(qb + (d0 / 2 + i) * (Mp * 2) + m0 * 2, x[i]);
    }
}

/* ka (kp x Dk) = the keys' rows in bf16 (krow[j]: the zero row past n) */
static void pack_keys(const float* const* krow, int64_t kp, int64_t D, int64_t Dk, uint16_t* ka) {
  for (int64_t j = 0; j < kp; j++)
    for (int64_t d0 = 0; d0 < Dk; d0 += 32) _mm512_storeu_si512(ka + j * Dk + d0, bf16_row_part(krow[j], d0, D));
}

/* vt (Dp x KT) = V^T in bf16 over keys < kp: rows of V paired two keys at a time, then transposed */
static void pack_values(const float* const* vrow, int64_t kp, int64_t D, int64_t Dp, uint16_t* vt) {
  for (int64_t i0 = 0; i0 < kp / 2; i0 += 16) /* key pairs */
    for (int64_t d0 = 0; d0 < Dp; d0 += 16) {
      __m512i x[16]; /* lane d of row r: (v_{2 (i0 + r)}[d0 + d], v_{2 (i0 + r) + 1}[d0 + d]) */
      for (int r = 0; r < 16; r++)
        x[r] = pairs_of(load_head_part(vrow[2 * (i0 + r)], d0, D), load_head_part(vrow[2 * (i0 + r) + 1], d0, D));
      transpose16(x);
      for (int c = 0; c < 16; c++) _mm512_storeu_si512(vt + (d0 + c) * KT + i0 * 2, x[c]);
    }
}

/* st (KT x Mp) = K Q^T over keys < kp (a multiple of 32), 32 x 32 at a time */
static void scores_amx(const uint16_t* ka, const uint16_t* qb, int64_t Mp, int64_t Dk, int64_t kp, float* st) {
  for (int64_t j0 = 0; j0 < kp; j0 += 32)
    for (int64_t m0 = 0; m0 < Mp; m0 += 32)
      tiles_2x2(st + j0 * Mp + m0, Mp, 1, 2, ka + j0 * Dk, 16 * Dk, Dk * 2, 32, qb + m0 * 2, Mp * 4, 32 * Mp, Dk / 32);
}

/* ot (Dp x Mp) += V^T P^T over keys < kp: 32 x 32 of ot at a time (four accumulator tiles, one load a
   product), 16 rows at the end when Dp is an odd number of 16s */
static void pv_amx(const uint16_t* vt, const uint16_t* pb, int64_t Mp, int64_t Dp, int64_t kp, float* ot) {
  for (int64_t d0 = 0; d0 < Dp; d0 += 32)
    for (int64_t m0 = 0; m0 < Mp; m0 += 32)
      tiles_2x2(ot + d0 * Mp + m0, Mp, 0, Dp - d0 >= 32 ? 2 : 1, vt + d0 * KT, 16 * KT, KT * 2, 32, pb + m0 * 2, Mp * 4,
                32 * Mp, kp / 32);
}

/* exp(x) for x <= 0 to about 1e-4 relative (what bf16's 2^-9 rounding of P needs): 2^t, t = x log2(e) =
   n + f, |f| <= 1/2, 2^f by its degree-4 Taylor polynomial, times 2^n by scalef. 0 where t <= -125 (a
   masked score's -inf included): those lanes are masked off, so no result is denormal (a denormal or an
   underflow costs a microcode assist of ~150 cycles for the whole vector). */
static inline __m512 exp_for_bf16(__m512 x) {
  __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __mmask16 kept = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_GT_OQ);
  t = _mm512_max_ps(t, _mm512_set1_ps(-125.0f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 y = _mm512_set1_ps(9.6181291e-3f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.5504109e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.4022651e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.9314718e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(kept, y, n);
}

/* The online softmax over a key tile's scores st (n rows of keys, Mp lanes; already scaled, capped and
   masked): per lane the running max m and sum l, ot's column scaled by the correction, and pb = P^T in
   VNNI over keys < kp (0 past n). A lane with nothing visible yet keeps m = -inf, l = 0, corr 1. Lanes go
   four vectors at a time (a row's 256 contiguous bytes; four independent exp chains). */
static void softmax_amx(const float* st, int64_t n, int64_t kp, int64_t Mp, int64_t Dp, float* mrun, float* l,
                        float* ot, uint16_t* pb) {
  enum { V = 4 };
  for (int64_t m = 0; m < Mp; m += V * 16) {
    __m512 m_new[V], m_use[V], corr[V], sum[V];
    for (int c = 0; c < V; c++) m_new[c] = _mm512_loadu_ps(mrun + m + c * 16);
    for (int64_t t = 0; t < n; t++)
      for (int c = 0; c < V; c++) m_new[c] = _mm512_max_ps(m_new[c], _mm512_loadu_ps(st + t * Mp + m + c * 16));
    for (int c = 0; c < V; c++) {
      const __mmask16 none = _mm512_cmp_ps_mask(m_new[c], _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
      m_use[c] = _mm512_mask_blend_ps(none, m_new[c], _mm512_setzero_ps());
      corr[c] = _mm512_mask_blend_ps(none, exp_for_bf16(_mm512_sub_ps(_mm512_loadu_ps(mrun + m + c * 16), m_use[c])),
                                     _mm512_set1_ps(1.0f));
      sum[c] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < kp / 2; i++) {
      const int64_t t = 2 * i;
      for (int c = 0; c < V; c++) {
        const __m512 e0 = t < n ? exp_for_bf16(_mm512_sub_ps(_mm512_loadu_ps(st + t * Mp + m + c * 16), m_use[c]))
                                : _mm512_setzero_ps();
        const __m512 e1 = t + 1 < n ? exp_for_bf16(_mm512_sub_ps(_mm512_loadu_ps(st + (t + 1) * Mp + m + c * 16), m_use[c]))
                                    : _mm512_setzero_ps();
        const __m512i r0 = bf16_lanes(e0), r1 = bf16_lanes(e1);
        _mm512_storeu_si512(pb + i * (Mp * 2) + (m + c * 16) * 2, _mm512_or_si512(r0, _mm512_slli_epi32(r1, 16)));
        sum[c] = _mm512_add_ps(sum[c], _mm512_castsi512_ps(_mm512_slli_epi32(r0, 16)));
        sum[c] = _mm512_add_ps(sum[c], _mm512_castsi512_ps(_mm512_slli_epi32(r1, 16)));
      }
    }
    for (int c = 0; c < V; c++) {
      _mm512_storeu_ps(l + m + c * 16, _mm512_fmadd_ps(_mm512_loadu_ps(l + m + c * 16), corr[c], sum[c]));
      _mm512_storeu_ps(mrun + m + c * 16, m_new[c]);
    }
    for (int c = 0; c < V; c++) /* (a column whose corr is 1 in every lane, as when no max rose, stays as it is) */
      if (_mm512_cmp_ps_mask(corr[c], _mm512_set1_ps(1.0f), _CMP_NEQ_UQ))
        for (int64_t d = 0; d < Dp; d++)
          _mm512_storeu_ps(ot + d * Mp + m + c * 16, _mm512_mul_ps(_mm512_loadu_ps(ot + d * Mp + m + c * 16), corr[c]));
  }
}

/* qb = (scale Q)^T in VNNI for the item's query vectors (lane m = r * G + g, as the float32 builds), slab by
   slab: slab s (lanes s * SLAB ..) at qb + s * SLAB * Dk, Dk / 2 rows of SLAB pairs */
static void load_queries(const prefill_job* j, const item* it, int64_t M, int64_t Mp, const scratch* sc) {
  const float* qrow[ROW_TILE_M + LANES];
  const int64_t Dk = (j->D + 31) / 32 * 32;
  for (int64_t m = 0; m < Mp; m++) qrow[m] = m < M ? query_of(j, it, m) : NULL;
  for (int64_t m0 = 0; m0 < Mp; m0 += SLAB) pack_queries(qrow + m0, j->scale, SLAB, j->D, Dk, sc->qb + m0 * Dk);
}

/* One key tile: K and V^T in bf16 once, then slab by slab of query lanes: S^T = K Q^T on tiles, masks, the
   online softmax (softmax_amx), O^T += V^T P^T on tiles. A slab's scores, probabilities and O^T (SLAB
   lanes: 16, 8 and 16 KiB at D = 64) stay in L1 through the four steps, where the whole item's (Mp lanes)
   went through L2 between them. A slab none of whose lanes sees a key of the tile is skipped: for it the
   four steps change nothing (corr 1, P 0). */
static void attend_tile(const prefill_job* j, const scratch* sc, const float* const* krow, const float* const* vrow,
                        int64_t k0, int64_t n, int64_t M, int64_t Mp, int64_t p_first, int64_t p_last) {
  const int64_t D = j->D, Dp = j->Dp, Dk = (D + 31) / 32 * 32, W = j->window;
  const int64_t kp = (n + 31) / 32 * 32; /* keys in the products; those past n are zero rows */
  pack_keys(krow, kp, D, Dk, sc->ka);
  pack_values(vrow, kp, D, Dp, sc->vt);
  for (int64_t m0 = 0; m0 < Mp && m0 < M; m0 += SLAB) {
    const int64_t first_seen = sc->pos[m0], last_seen = sc->pos[(m0 + SLAB < M ? m0 + SLAB : M) - 1];
    if (last_seen < k0 || (W > 0 && first_seen - W >= k0 + n - 1)) continue; /* lanes' positions increase */
    float* ot = sc->o + m0 * Dp;
    scores_amx(sc->ka, sc->qb + m0 * Dk, SLAB, Dk, kp, sc->st);
    mask_scores(j, sc->st, sc->pos + m0, SLAB, k0, n, p_first, p_last);
    softmax_amx(sc->st, n, kp, SLAB, Dp, sc->m + m0, sc->l + m0, ot, sc->pb);
    pv_amx(sc->vt, sc->pb, SLAB, Dp, kp, ot);
  }
}

/* O^T slab by slab: slab s (lanes s * SLAB ..) is Dp x SLAB at o + s * SLAB * Dp */
#define O_AT(o, m, d, Mp, Dp) (o)[((m) / SLAB * (Dp) + (d)) * SLAB + (m) % SLAB]
#define BEGIN_THREAD() configure_tiles()
#define END_THREAD() _tile_release()
#endif

static void prefill_item(const prefill_job* j, int64_t t, const scratch* sc) {
  const item it = item_at(j, t);
  const int64_t b = it.b, kvh = it.kvh, r0 = it.r0, r1 = it.r1, first_pos = it.first_pos;
  const int64_t G = j->G, D = j->D, Dp = j->Dp, W = j->window;
  const int64_t M = (r1 - r0) * G, Mp = (M + LANES - 1) / LANES * LANES; /* Mp <= j->Mp */
  const int64_t* pages = j->page_table + b * j->max_pages;

  /* lane m = r * G + g: token row r0 + r, query head kvh * G + g; padding lanes see no key (pos -1) */
  for (int64_t m = 0; m < Mp; m++) {
    sc->pos[m] = m < M ? (int32_t)(first_pos + r0 + m / G) : -1;
    sc->m[m] = -INFINITY;
    sc->l[m] = 0.0f;
  }
  load_queries(j, &it, M, Mp, sc);
  memset(sc->o, 0, (size_t)(Mp * Dp) * sizeof(float));
  memset(sc->zero, 0, (size_t)Dp * sizeof(float));

  const float* krow[KT];
  const float* vrow[KT];
  const int64_t p_first = first_pos + r0, p_last = first_pos + r1 - 1; /* positions of the first, last row */
  int64_t k_lo = W > 0 && p_first - W + 1 > 0 ? p_first - W + 1 : 0;
  k_lo = k_lo / KT * KT;
  const int64_t k_hi = p_last + 1;
  for (int64_t k0 = k_lo; k0 < k_hi; k0 += KT) {
    const int64_t n = k_hi - k0 < KT ? k_hi - k0 : KT, after = k_hi - k0 - n;
    locate_tile(j, pages, kvh, k0, n, after < KT ? after : KT, sc, krow, vrow);
    attend_tile(j, sc, krow, vrow, k0, n, M, Mp, p_first, p_last);
  }
  for (int64_t m = 0; m < M; m++) {
    float* dst = j->out + ((j->q_starts[b] + r0 + m / G) * j->num_heads + kvh * G + m % G) * D;
    const float inv = 1.0f / sc->l[m];
    for (int64_t d = 0; d < D; d++) dst[d] = O_AT(sc->o, m, d, Mp, Dp) * inv;
  }
}

/* Prefill attention over pages (see kernels/cpu_prefill_attention.py). Sequence b's query rows are
   q rows [q_starts[b], q_starts[b] + query_lens[b]) (q_row_stride floats apart, each H x D), at
   positions context_lens[b] - query_lens[b] onwards, its K/V the first context_lens[b] positions of
   its pages (page_table row b, max_pages wide; the chunk's own K/V already stored). out (num_rows,
   H, D) contiguous: only the sequences' rows are written.
   Returns 0; -1 for sizes beyond the kernel's limits or a failed malloc; else kind + 4 * b for the
   first sequence b with a bad index: kind 1 its rows outside [0, num_rows) or query_lens[b] < 1,
   2 context_lens[b] outside [query_lens[b], min(max_pages * page_size, 2^31 - 1)], 3 a page id outside
   [0, num_pages) among its first ceil(context_lens[b] / page_size). Nothing is written unless it
   returns 0. */
int64_t paged_prefill_attention(const float* q, int64_t q_row_stride, kv_pages k_cache, kv_pages v_cache,
                                const int64_t* page_table, int64_t max_pages, const int64_t* q_starts,
                                const int64_t* query_lens, const int64_t* context_lens, int64_t num_seqs,
                                int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int64_t page_size,
                                float scale, float* out, int64_t num_rows, int64_t num_pages, int num_threads,
                                int64_t window, float softcap) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads || head_dim <= 0 || head_dim % 8 || page_size <= 0 ||
      window < 0 || window > INT32_MAX / 2 || softcap < 0.0f || head_dim > MAX_HEAD_DIM ||
      num_heads / num_kv_heads > MAX_GROUP)
    return -1;
  const int64_t G = num_heads / num_kv_heads, D = head_dim;
  double work = 0.0;
  for (int64_t b = 0; b < num_seqs; b++) {
    const int64_t T = query_lens[b], C = context_lens[b];
    if (T < 1 || q_starts[b] < 0 || q_starts[b] > num_rows - T) return 1 + 4 * b;
    if (C < T || C > max_pages * page_size || C > INT32_MAX / 2) return 2 + 4 * b; /* positions as int32 */
    const int64_t* pages = page_table + b * max_pages;
    for (int64_t p = 0; p < (C + page_size - 1) / page_size; p++)
      if (pages[p] < 0 || pages[p] >= num_pages) return 3 + 4 * b;
    work += (double)T * (double)C;
  }
  if (num_seqs == 0) return 0;

  const int64_t tile_rows = ROW_TILE_M / G > 0 ? ROW_TILE_M / G : 1;
  const int64_t Mp = (tile_rows * G + LANES - 1) / LANES * LANES, Dp = (D + VW - 1) / VW * VW;
  int64_t* item_start = (int64_t*)malloc((size_t)(num_seqs + 1) * sizeof(int64_t));
  if (!item_start) return -1;
  item_start[0] = 0;
  for (int64_t b = 0; b < num_seqs; b++)
    item_start[b + 1] = item_start[b] + num_kv_heads * ((query_lens[b] + tile_rows - 1) / tile_rows);
  const int64_t num_items = item_start[num_seqs];
  const int threads = num_threads > 1 && num_items > 1 && work * (double)(num_heads * D) >= PARALLEL_MIN
                          ? (num_items < num_threads ? (int)num_items : num_threads) : 1;
  scratch sc;
  const int64_t per_thread = scratch_at(NULL, Mp, D, Dp, &sc); /* a multiple of 16 floats */
  float* scratch_all = (float*)aligned_alloc(64, (size_t)(threads * per_thread) * sizeof(float));
  if (!scratch_all) {
    free(item_start);
    return -1;
  }
  const prefill_job job = {q, k_cache, v_cache, page_table, q_starts, query_lens, context_lens, item_start, out,
                           q_row_stride, max_pages, num_seqs, num_heads, num_kv_heads, G, D, Dp, page_size,
                           tile_rows, Mp, window, scale, softcap};
  if (threads > 1) {
    #pragma omp parallel num_threads(threads)
    {
      scratch own;
      scratch_at(scratch_all + omp_get_thread_num() * per_thread, Mp, D, Dp, &own);
      BEGIN_THREAD(); /* (the AMX build's tile configuration, per thread) */
      #pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < num_items; t++) prefill_item(&job, t, &own);
      END_THREAD();
    }
  } else {
    scratch_at(scratch_all, Mp, D, Dp, &sc);
    BEGIN_THREAD();
    for (int64_t t = 0; t < num_items; t++) prefill_item(&job, t, &sc);
    END_THREAD();
  }
  free(scratch_all);
  free(item_start);
  return 0;
}

/* Packed-argument entry point: consecutive 8-byte fields in parameter order (each kv_pages as values,
   scales, format; floats as double), as simd.h describes. */
static inline double unpack_f64(const int64_t* field) {
  double value;
  memcpy(&value, field, sizeof value);
  return value;
}

int64_t paged_prefill_attention_packed(const int64_t* a) {
  kv_pages k_cache = {(void*)(intptr_t)a[2], (float*)(intptr_t)a[3], a[4]};
  kv_pages v_cache = {(void*)(intptr_t)a[5], (float*)(intptr_t)a[6], a[7]};
  return paged_prefill_attention((const float*)(intptr_t)a[0], a[1], k_cache, v_cache, (const int64_t*)(intptr_t)a[8],
                                 a[9], (const int64_t*)(intptr_t)a[10], (const int64_t*)(intptr_t)a[11],
                                 (const int64_t*)(intptr_t)a[12], a[13], a[14], a[15], a[16], a[17],
                                 (float)unpack_f64(a + 18), (float*)(intptr_t)a[19], a[20], a[21], (int)a[22], a[23],
                                 (float)unpack_f64(a + 24));
}
