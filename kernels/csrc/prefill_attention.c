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

   One source, three builds (kernels/native_build.py): AVX-512 (16 lanes), AVX2 + FMA (8 lanes) and
   portable (4 lanes of whatever the target has), written with GCC/Clang vector extensions. */

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
#define ROW_TILE_M 256    /* query vectors an item (rows * G) aims at */
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
  float *qt, *kc, *vc, *st, *o, *m, *l, *corr, *zero;
  int32_t* pos;
} scratch;

/* Lays the scratch out from base (64-byte aligned, or NULL to only count): each piece starts 64-byte
   aligned. Returns the floats it takes. */
static int64_t scratch_at(float* base, int64_t Mp, int64_t D, int64_t Dp, scratch* sc) {
  int64_t at = 0;
#define TAKE(field, count) sc->field = base ? (void*)(base + at) : NULL; at += ((count) + 15) / 16 * 16
  TAKE(qt, D * Mp);
  TAKE(kc, KT * Dp);
  TAKE(vc, KT * Dp);
  TAKE(st, KT * Mp);
  TAKE(o, Mp * Dp);
  TAKE(m, Mp);
  TAKE(l, Mp);
  TAKE(corr, Mp);
  TAKE(zero, Dp);
  TAKE(pos, Mp);
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

/* Item t: sequence b, KV head kvh, token rows [r0, r1) of its chunk (items longest first). */
static void prefill_item(const prefill_job* j, int64_t t, const scratch* sc) {
  int64_t lo = 0, hi = j->num_seqs; /* b: item_start[b] <= t < item_start[b + 1] */
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (j->item_start[mid] <= t) lo = mid; else hi = mid;
  }
  const int64_t b = lo, i = t - j->item_start[b], KVH = j->num_kv_heads, G = j->G, D = j->D, Dp = j->Dp;
  const int64_t T = j->query_lens[b], C = j->context_lens[b], first_pos = C - T, W = j->window;
  const int64_t num_tiles = (T + j->tile_rows - 1) / j->tile_rows;
  const int64_t kvh = i % KVH, tile = num_tiles - 1 - i / KVH; /* the last rows (the most keys) first */
  const int64_t r0 = tile * j->tile_rows, r1 = r0 + j->tile_rows < T ? r0 + j->tile_rows : T;
  const int64_t M = (r1 - r0) * G, Mp = (M + LANES - 1) / LANES * LANES; /* Mp <= j->Mp */
  const int64_t* pages = j->page_table + b * j->max_pages;

  /* lane m = r * G + g: token row r0 + r, query head kvh * G + g; padding lanes see no key (pos -1) */
  for (int64_t r = 0; r < r1 - r0; r++) {
    const float* qr = j->q + (j->q_starts[b] + r0 + r) * j->q_row_stride + kvh * G * D;
    for (int64_t g = 0; g < G; g++) {
      const int64_t m = r * G + g;
      for (int64_t d = 0; d < D; d++) sc->qt[d * Mp + m] = qr[g * D + d];
      sc->pos[m] = (int32_t)(first_pos + r0 + r);
    }
  }
  for (int64_t m = M; m < Mp; m++) {
    for (int64_t d = 0; d < D; d++) sc->qt[d * Mp + m] = 0.0f;
    sc->pos[m] = -1;
  }
  memset(sc->o, 0, (size_t)(Mp * Dp) * sizeof(float));
  memset(sc->zero, 0, (size_t)Dp * sizeof(float));
  for (int64_t m = 0; m < Mp; m++) { sc->m[m] = -INFINITY; sc->l[m] = 0.0f; }

  const float* krow[KT];
  const float* vrow[KT];
  const int64_t p_first = first_pos + r0, p_last = first_pos + r1 - 1; /* positions of the first, last row */
  int64_t k_lo = W > 0 && p_first - W + 1 > 0 ? p_first - W + 1 : 0;
  k_lo = k_lo / KT * KT;
  const int64_t k_hi = p_last + 1;
  for (int64_t k0 = k_lo; k0 < k_hi; k0 += KT) {
    const int64_t n = k_hi - k0 < KT ? k_hi - k0 : KT, after = k_hi - k0 - n;
    locate_tile(j, pages, kvh, k0, n, after < KT ? after : KT, sc, krow, vrow);
    const int64_t n_up = (n + KR - 1) / KR * KR; /* key rows scored; those past n are never read */
    for (int64_t c0 = 0; c0 < Mp; c0 += LANES)
      for (int64_t j0 = 0; j0 < n_up; j0 += KR) scores_micro(krow + j0, sc->qt, D, Mp, c0, j->scale, sc->st + j0 * Mp);
    if (j->softcap > 0.0f)
      for (int64_t t2 = 0; t2 < n; t2++)
        for (int64_t m = 0; m < Mp; m++) sc->st[t2 * Mp + m] = j->softcap * tanhf(sc->st[t2 * Mp + m] / j->softcap);
    /* masks, unless every lane sees every key of the tile (padding lanes then score 0s, never read) */
    const int is_full = M == Mp && k0 + n - 1 <= p_first && (W == 0 || k0 > p_last - W);
    if (!is_full)
      for (int64_t t2 = 0; t2 < n; t2++) {
        const int32_t key = (int32_t)(k0 + t2);
        const vi vkey = vset1_i(key), vkey_w = vset1_i(W > 0 ? key + (int32_t)W : INT32_MAX);
        for (int64_t m = 0; m < Mp; m += VW) {
          const vi pos = vload_i(sc->pos + m);
          const vi visible = (pos >= vkey) & (pos < vkey_w); /* key <= pos < key + W */
          vstore(sc->st + t2 * Mp + m, vselect(visible, vload(sc->st + t2 * Mp + m), vset1(-INFINITY)));
        }
      }
    /* online softmax, lane-wise: a lane with nothing visible yet keeps m = -inf, l = 0 and corr 1 */
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
    pv_tile(sc->o, Dp, Mp, sc->corr, sc->st, vrow, n);
  }
  for (int64_t m = 0; m < M; m++) {
    const int64_t r = m / G, g = m % G;
    float* dst = j->out + ((j->q_starts[b] + r0 + r) * j->num_heads + kvh * G + g) * D;
    const float inv = 1.0f / sc->l[m];
    for (int64_t d = 0; d < D; d++) dst[d] = sc->o[m * Dp + d] * inv;
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
      #pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < num_items; t++) prefill_item(&job, t, &own);
    }
  } else {
    scratch_at(scratch_all, Mp, D, Dp, &sc);
    for (int64_t t = 0; t < num_items; t++) prefill_item(&job, t, &sc);
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
