/* Paged decode attention for CPU, float32 queries: one query token per sequence, K/V read
   straight from the pages (see kernels/cpu_decode_ops.py), in their stored formats (kv_formats.h):
   float32 pages are read in place; bfloat16 pages are dequantized and int8 pages converted (their
   scales applied to the scores and the probabilities) per block of ATTN_BLOCK positions and one KV
   head into a scratch on the stack, once for all the head's query heads and for all the rows of the
   call that read the same slots there (a batch over one cached prefix; never a copy of the pool).
   Builds into one library with row_ops.c. Indices that point into memory (rows, context lengths,
   page ids) are checked first; on a bad one the call returns nonzero and writes nothing. */

#include <omp.h>

#include "kv_formats.h"

/* Multiply-adds from which the op forks. */
#define ATTN_PARALLEL_MIN 65536

/* Attention limits, also checked by the Python wrapper. */
#define ATTN_MAX_GROUP 64        /* query heads per KV head */
#define ATTN_MAX_HEADS_DIM 8192  /* num_heads * head_dim: the per-task accumulator, on the stack */
#define ATTN_BLOCK 64            /* KV positions per online-softmax block */
#define ATTN_MIN_SPLIT 256       /* shortest piece of a context one work item takes */
#define ATTN_MAX_SHARED_ROWS 16  /* rows attended in one pass over their pieces (attend_rows) */
#define ATTN_MAX_HEAD_DIM 256    /* a dequantized block of one head: ATTN_BLOCK x D floats on the stack */

/* ------------------------------------------------- paged decode attention */

/* acc (nv*8,) = acc * corr + sum_j p[j] * v[offs[j] ...]; nv a constant after inlining. Each value is one
   multiply then one FMA a position, in order, whatever the vector width: the AVX-512 build (16 floats a
   vector, one of 8 at the end when nv is odd) gives the AVX2 build's bits. */
static inline __attribute__((always_inline)) void pv_block(float* acc, float corr, const float* p, const float* v,
                                                          const int64_t* offs, int64_t n, const int nv) {
#if defined(__AVX512F__)
  const int nz = nv / 2, tail = nv % 2;
  __m512 z[4];
  __m256 y = _mm256_setzero_ps();
  const __m512 cz = _mm512_set1_ps(corr);
  for (int i = 0; i < nz; i++) z[i] = _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * i), cz);
  if (tail) y = _mm256_mul_ps(_mm256_loadu_ps(acc + 16 * nz), _mm256_set1_ps(corr));
  for (int64_t j = 0; j < n; j++) {
    const float* vj = v + offs[j];
    const __m512 pj = _mm512_set1_ps(p[j]);
    for (int i = 0; i < nz; i++) z[i] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16 * i), z[i]);
    if (tail) y = _mm256_fmadd_ps(_mm512_castps512_ps256(pj), _mm256_loadu_ps(vj + 16 * nz), y);
  }
  for (int i = 0; i < nz; i++) _mm512_storeu_ps(acc + 16 * i, z[i]);
  if (tail) _mm256_storeu_ps(acc + 16 * nz, y);
#else
  __m256 a[8];
  const __m256 c = _mm256_set1_ps(corr);
  for (int i = 0; i < nv; i++) a[i] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * i), c);
  for (int64_t j = 0; j < n; j++) {
    const float* vj = v + offs[j];
    const __m256 pj = _mm256_broadcast_ss(p + j);
    for (int i = 0; i < nv; i++) a[i] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * i), a[i]);
  }
  for (int i = 0; i < nv; i++) _mm256_storeu_ps(acc + 8 * i, a[i]);
#endif
}

/* offs[0..n): cache offsets (in floats) of the rows of the next n positions */
static inline void next_offsets(int64_t* offs, int64_t n, const int64_t* pages, int64_t page_size, int64_t row_size,
                                int64_t* page_index, int64_t* in_page) {
  for (int64_t j = 0; j < n; j++) {
    offs[j] = (pages[*page_index] * page_size + *in_page) * row_size;
    if (++*in_page == page_size) { *in_page = 0; ++*page_index; }
  }
}

/* Scores s (G x ATTN_BLOCK, n valid) -> probabilities in place, the online softmax's running max mh,
   sum lh (G) and rescale factors corr (G) updated; soft-capped first when softcap > 0. */
static inline void softmax_block(float* s, int64_t n, int64_t G, float softcap, float* corr, float* mh, float* lh) {
  const int64_t n8 = (n + 7) & ~(int64_t)7;
  /* soft cap (Gemma 2): s = cap * tanh(s / cap), before the softmax */
  if (softcap > 0.0f)
    for (int64_t g = 0; g < G; g++)
      for (int64_t j = 0; j < n; j++) s[g * ATTN_BLOCK + j] = softcap * tanhf(s[g * ATTN_BLOCK + j] / softcap);
  /* softmax bookkeeping: new running max, rescale factor, probabilities in place */
  for (int64_t g = 0; g < G; g++) {
    float* sg = s + g * ATTN_BLOCK;
    for (int64_t j = n; j < n8; j++) sg[j] = -INFINITY;
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n8; j += 8) vmax = _mm256_max_ps(vmax, _mm256_load_ps(sg + j));
    const float m_new = fmaxf(mh[g], hmax256(vmax));
    corr[g] = expf(mh[g] - m_new); /* 0 on the first block (m = -inf) */
    const __m256 vm = _mm256_set1_ps(m_new);
    for (int64_t j = 0; j < n8; j += 8)
      _mm256_store_ps(sg + j, exp256(_mm256_sub_ps(_mm256_load_ps(sg + j), vm)));
    for (int64_t j = n; j < n8; j++) sg[j] = 0.0f; /* padding lanes: exp clamps -inf to ~1e-38 */
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t j = 0; j < n8; j += 8) vsum = _mm256_add_ps(vsum, _mm256_load_ps(sg + j));
    lh[g] = lh[g] * corr[g] + hsum256(vsum);
    mh[g] = m_new;
  }
}

/* One KV head's G query heads (qh: G x D contiguous) over the n positions at offs,
   online softmax: m, l (G,) and acc (G, D) updated; s (G * ATTN_BLOCK) and corr (G) scratch.
   k_scale, v_scale (ATTN_BLOCK,) or NULL: per-position factors of K and V (int8 pages' scales, the
   values at kh, vh being the unscaled integers): a score is q . k_j * k_scale[j], a probability
   multiplies v_j * v_scale[j]. Entries from n up to the next multiple of 8 must be finite. */
static inline void attend_block_head(const float* qh, const float* kh, const float* vh, const int64_t* offs,
                                     int64_t n, int64_t G, int64_t D, __m256 vscale, const float* k_scale,
                                     const float* v_scale, float softcap, float* s, float* corr, float* mh,
                                     float* lh, float* acc_h) {
  /* scores s[g][j] = scale * q_g . k_j, eight positions at a time */
  for (int64_t j0 = 0; j0 < n; j0 += 8) {
    const float* kp[8];
    for (int jj = 0; jj < 8; jj++) kp[jj] = kh + offs[j0 + jj < n ? j0 + jj : n - 1];
    const __m256 kscale = k_scale ? _mm256_mul_ps(_mm256_loadu_ps(k_scale + j0), vscale) : vscale;
    for (int64_t g = 0; g < G; g++) {
      const float* qg = qh + g * D;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();
      __m256 a3 = _mm256_setzero_ps(), a4 = _mm256_setzero_ps(), a5 = _mm256_setzero_ps();
      __m256 a6 = _mm256_setzero_ps(), a7 = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qg + d);
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(kp[0] + d), qv, a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(kp[1] + d), qv, a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(kp[2] + d), qv, a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(kp[3] + d), qv, a3);
        a4 = _mm256_fmadd_ps(_mm256_loadu_ps(kp[4] + d), qv, a4);
        a5 = _mm256_fmadd_ps(_mm256_loadu_ps(kp[5] + d), qv, a5);
        a6 = _mm256_fmadd_ps(_mm256_loadu_ps(kp[6] + d), qv, a6);
        a7 = _mm256_fmadd_ps(_mm256_loadu_ps(kp[7] + d), qv, a7);
      }
      _mm256_store_ps(s + g * ATTN_BLOCK + j0, _mm256_mul_ps(hsum8x8(a0, a1, a2, a3, a4, a5, a6, a7), kscale));
    }
  }
  softmax_block(s, n, G, softcap, corr, mh, lh);
  if (v_scale) /* p_gj * v_scale[j]: the sum l keeps the plain probabilities */
    for (int64_t g = 0; g < G; g++)
      for (int64_t j = 0; j < n; j += 8)
        _mm256_store_ps(s + g * ATTN_BLOCK + j,
                        _mm256_mul_ps(_mm256_load_ps(s + g * ATTN_BLOCK + j), _mm256_loadu_ps(v_scale + j)));
  /* acc_g = acc_g * corr_g + sum_j p_gj v_j, D in chunks of 64 floats held in registers */
  for (int64_t g = 0; g < G; g++) {
    float* ag = acc_h + g * D;
    const float* pg = s + g * ATTN_BLOCK;
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
      switch ((D - d0) >= 64 ? 8 : (D - d0) / 8) {
        case 8: pv_block(ag + d0, corr[g], pg, vh + d0, offs, n, 8); break;
        case 7: pv_block(ag + d0, corr[g], pg, vh + d0, offs, n, 7); break;
        case 6: pv_block(ag + d0, corr[g], pg, vh + d0, offs, n, 6); break;
        case 5: pv_block(ag + d0, corr[g], pg, vh + d0, offs, n, 5); break;
        case 4: pv_block(ag + d0, corr[g], pg, vh + d0, offs, n, 4); break;
        case 3: pv_block(ag + d0, corr[g], pg, vh + d0, offs, n, 3); break;
        case 2: pv_block(ag + d0, corr[g], pg, vh + d0, offs, n, 2); break;
        default: pv_block(ag + d0, corr[g], pg, vh + d0, offs, n, 1); break;
      }
    }
  }
}


/* ------------------------------------------------- int8 pages */

/* dst (n, D) floats, row j at j * D = the int8 values at src + offs[j], converted but not scaled (the
   scale goes on the score, or on the probability: attend_block_head). Once per block and KV head,
   for all its G query heads and all R rows: reading int8 in place converted each value G * R times. */
static inline void convert_block_i8(float* dst, const int8_t* src, const int64_t* offs, int64_t n, int64_t D) {
  for (int64_t j = 0; j < n; j++) {
    const int8_t* row = src + offs[j];
    float* out = dst + j * D;
    for (int64_t d = 0; d < D; d += 8)
      _mm256_store_ps(out + d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(row + d)))));
  }
}

/* R query rows over positions [t0, t1[r]), every head; row r reads its own page table
   pages[r]; online softmax over blocks of ATTN_BLOCK positions from t0. q[r] (H, D)
   contiguous: row r's query. Within a block the KV heads go one after the other, the G
   query heads of a KV head together, and the R rows one after the other while that KV
   head's block is still in L1. Rows whose block holds the same slots as the row before
   them (rows of a batch over one cached prefix, the rows of a speculative verify chunk)
   share its reading: a quantized block is converted or dequantized once for all of
   them, a float32 block read from memory once. The next block's rows are prefetched
   meanwhile. Row r goes through exactly the blocks, and the positions in each, that it
   would alone (R = 1): the same bits. Measured on the 2-core machines (H 9, KVH 3, D 64,
   cold caches), one task per (sequence, KV head) instead was as fast for one sequence
   and 5-20% slower for 16. On return acc[r] (H, D) holds sum_t exp(s_t - m) v_t
   unnormalised, m[r] (H,) the running max, l[r] (H,) sum_t exp(s_t - m). R <=
   ATTN_MAX_SHARED_ROWS. */
static void attend_rows(const float* const* q, int64_t R, const int64_t* const* pages, const kv_pages* k_cache,
                        const kv_pages* v_cache, int64_t page_size, int64_t t0, const int64_t* t1,
                        int64_t num_kv_heads, int64_t G, int64_t D, float scale, float softcap, float* const* acc,
                        float* const* m, float* const* l) {
  const int64_t H = num_kv_heads * G, row_size = num_kv_heads * D;
  const int is_f32 = k_cache->format == KV_F32 && v_cache->format == KV_F32;
  const int is_i8 = k_cache->format == KV_I8 && v_cache->format == KV_I8;
  const int64_t k_row_bytes = row_size * kv_element_size(k_cache->format);
  const int64_t v_row_bytes = row_size * kv_element_size(v_cache->format);
  const int64_t k_element = kv_element_size(k_cache->format), v_element = kv_element_size(v_cache->format);
  /* offsets (in elements, slot * row_size) of each row's block, computed a block ahead (prefetch) */
  int64_t offs[ATTN_MAX_SHARED_ROWS][ATTN_BLOCK], offs_next[ATTN_MAX_SHARED_ROWS][ATTN_BLOCK];
  int64_t page_index[ATTN_MAX_SHARED_ROWS], in_page[ATTN_MAX_SHARED_ROWS];
  int64_t n_of[ATTN_MAX_SHARED_ROWS], n_next_of[ATTN_MAX_SHARED_ROWS]; /* positions of the row in a block */
  int is_shared[ATTN_MAX_SHARED_ROWS]; /* this block: the row's slots are the last reading row's */
  float s[ATTN_MAX_GROUP * ATTN_BLOCK] __attribute__((aligned(32)));
  float corr[ATTN_MAX_GROUP];
  /* a quantized block of one KV head, converted (int8: unscaled) or dequantized: row j at j * D */
  float k_block[is_f32 ? 1 : ATTN_BLOCK * D] __attribute__((aligned(32)));
  float v_block[is_f32 ? 1 : ATTN_BLOCK * D] __attribute__((aligned(32)));
  float k_scale[ATTN_BLOCK] = {0}, v_scale[ATTN_BLOCK] = {0}; /* int8: this head's scales of the block */
  int64_t block_offs[ATTN_BLOCK];
  for (int64_t j = 0; j < ATTN_BLOCK; j++) block_offs[j] = j * D;
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t t_end = t0;
  for (int64_t r = 0; r < R; r++) {
    for (int64_t h = 0; h < H; h++) { m[r][h] = -INFINITY; l[r][h] = 0.0f; }
    memset(acc[r], 0, (size_t)(H * D) * sizeof(float));
    if (t1[r] > t_end) t_end = t1[r];
    page_index[r] = t0 / page_size;
    in_page[r] = t0 % page_size;
    n_next_of[r] = t1[r] - t0 < ATTN_BLOCK ? t1[r] - t0 : ATTN_BLOCK;
    next_offsets(offs_next[r], n_next_of[r], pages[r], page_size, row_size, &page_index[r], &in_page[r]);
  }
  const char* k_bytes = (const char*)k_cache->values;
  const char* v_bytes = (const char*)v_cache->values;
  for (int64_t tb = t0; tb < t_end; tb += ATTN_BLOCK) {
    int64_t reader = -1; /* the last row that read its own block */
    for (int64_t r = 0; r < R; r++) {
      const int64_t n = n_of[r] = n_next_of[r];
      if (n <= 0) continue;
      memcpy(offs[r], offs_next[r], (size_t)n * sizeof(int64_t));
      is_shared[r] = reader >= 0 && n <= n_of[reader] && !memcmp(offs[r], offs[reader], (size_t)n * sizeof(int64_t));
      if (!is_shared[r]) reader = r;
    }
    for (int64_t r = 0, prefetcher = -1; r < R; r++) { /* the next block's offsets; distinct rows prefetched */
      const int64_t after = t1[r] - tb - n_of[r];
      const int64_t n_next = n_next_of[r] = after <= 0 ? 0 : (after < ATTN_BLOCK ? after : ATTN_BLOCK);
      if (n_next <= 0) continue;
      next_offsets(offs_next[r], n_next, pages[r], page_size, row_size, &page_index[r], &in_page[r]);
      if (prefetcher >= 0 && n_next <= n_next_of[prefetcher] &&
          !memcmp(offs_next[r], offs_next[prefetcher], (size_t)n_next * sizeof(int64_t)))
        continue;
      prefetcher = r;
      for (int64_t j = 0; j < n_next; j++) { /* offs = slot * row_size: a row's bytes start at offs * element size */
        const char* k_row = k_bytes + offs_next[r][j] * k_element, *v_row = v_bytes + offs_next[r][j] * v_element;
        for (int64_t b = 0; b < k_row_bytes; b += 64) _mm_prefetch(k_row + b, _MM_HINT_T0);
        for (int64_t b = 0; b < v_row_bytes; b += 64) _mm_prefetch(v_row + b, _MM_HINT_T0);
      }
    }
    for (int64_t kvh = 0; kvh < num_kv_heads; kvh++) {
      for (int64_t r = 0; r < R; r++) {
        const int64_t n = n_of[r];
        if (n <= 0) continue;
        const float *kh = k_block, *vh = v_block;
        const int64_t* block = block_offs;
        if (is_f32) {
          kh = (const float*)k_cache->values + kvh * D;
          vh = (const float*)v_cache->values + kvh * D;
          block = offs[r];
        } else if (is_shared[r]) {
          /* the block the reading row before converted: the same slots */
        } else if (is_i8) { /* this head's n rows converted and their scales gathered */
          for (int64_t j = 0; j < n; j++) {
            const int64_t at = offs[r][j] / D + kvh; /* (slot * KVH + kvh) */
            k_scale[j] = k_cache->scales[at];
            v_scale[j] = v_cache->scales[at];
          }
          convert_block_i8(k_block, (const int8_t*)k_cache->values + kvh * D, offs[r], n, D);
          convert_block_i8(v_block, (const int8_t*)v_cache->values + kvh * D, offs[r], n, D);
        } else { /* this head's n rows, dequantized */
          for (int64_t j = 0; j < n; j++) {
            const int64_t slot = offs[r][j] / row_size;
            kv_load_head(k_cache, slot, kvh, num_kv_heads, D, k_block + j * D);
            kv_load_head(v_cache, slot, kvh, num_kv_heads, D, v_block + j * D);
          }
        }
        attend_block_head(q[r] + kvh * G * D, kh, vh, block, n, G, D, vscale, is_i8 ? k_scale : NULL,
                          is_i8 ? v_scale : NULL, softcap, s, corr, m[r] + kvh * G, l[r] + kvh * G,
                          acc[r] + kvh * G * D);
      }
    }
  }
}

static inline int64_t num_pieces(int64_t context_len, int64_t piece) {
  return context_len > piece ? (context_len + piece - 1) / piece : 1; /* piece may be INT64_MAX */
}

/* The piece length a context of ctx positions is cut into (INT64_MAX: whole). It depends on that
   context and the thread count only, never on the other sequences of the call, so a row's result
   is the same in any batch: a plain decode and the same position in a speculative verify chunk
   (one row per token) round alike. ~4 items per thread for one long context, at least 256
   positions; the length taken from a ladder of four steps an octave (256, 320, 384, 448, 512, 640,
   ...), so that sequences of nearby lengths are cut at the same positions and their pieces over a
   shared prefix can be attended together (attend_rows). */
static inline int64_t piece_of(int64_t ctx, int64_t H, int64_t D, int num_threads) {
  if (num_threads <= 1 || ctx * H * D < ATTN_PARALLEL_MIN) return INT64_MAX;
  const int64_t want = (ctx + 4 * num_threads - 1) / (4 * num_threads);
  if (want <= ATTN_MIN_SPLIT) return ATTN_MIN_SPLIT;
  int64_t octave = ATTN_MIN_SPLIT; /* the power of two at or below want; its quarter a multiple of 64 */
  while (octave * 2 <= want) octave *= 2;
  const int64_t step = octave / 4;
  return (want + step - 1) / step * step;
}

/* dst (heads, D) = acc / l per head */
static inline void store_normalised(float* dst, const float* acc, const float* l, int64_t heads, int64_t D) {
  for (int64_t h = 0; h < heads; h++) {
    const __m256 inv = _mm256_set1_ps(1.0f / l[h]);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(dst + h * D + d, _mm256_mul_ps(_mm256_loadu_ps(acc + h * D + d), inv));
  }
}

/* A piece of one sequence's context: sequence b's p-th; t0 its first position, first_page the page
   that holds t0 (the pieces of a task share both). */
typedef struct {
  int64_t t0, first_page, b, p;
} attention_item;

typedef struct {
  const float* q;
  kv_pages k_cache, v_cache;
  const int64_t *page_table, *context_lens, *rows, *item_start;
  const attention_item* items; /* sorted: a task's pieces are consecutive */
  const int64_t* task_first;   /* task t: items[task_first[t] .. task_first[t + 1]) */
  float *out, *parts;
  int64_t q_row_stride, max_pages, num_seqs, num_heads, num_kv_heads, G, D, page_size, part_size;
  int64_t window; /* a sliding window W: a row sees its last W positions only; 0: none */
  int num_threads;
  float scale, softcap; /* softcap 0: none */
} attention_job;

/* The first position sequence b's row sees. */
static inline int64_t seq_start(const attention_job* j, int64_t b) {
  const int64_t ctx = j->context_lens[b];
  return j->window > 0 && ctx > j->window ? ctx - j->window : 0;
}

/* Pieces are cut from the positions a row sees (its span), which depend on its context and the
   window only: a row's bits stay independent of the batch. */
static inline int64_t seq_piece(const attention_job* j, int64_t b) {
  return piece_of(j->context_lens[b] - seq_start(j, b), j->num_heads, j->D, j->num_threads);
}

static inline int64_t seq_pieces(const attention_job* j, int64_t b) {
  return num_pieces(j->context_lens[b] - seq_start(j, b), seq_piece(j, b));
}

static int compare_items(const void* x, const void* y) {
  const attention_item *a = (const attention_item*)x, *b = (const attention_item*)y;
  if (a->t0 != b->t0) return a->t0 < b->t0 ? -1 : 1;
  if (a->first_page != b->first_page) return a->first_page < b->first_page ? -1 : 1;
  return a->b < b->b ? -1 : (a->b > b->b);
}

/* Work item t: the pieces of one or more sequences that start at one position on one page (the
   rows of a batch over a shared prefix), attended together (attend_rows). A whole context is
   normalised straight into out; a piece leaves its partial softmax in parts (m (H), l (H),
   acc (H, D)) for attention_merge. scratch: ATTN_MAX_SHARED_ROWS * part_size floats. */
static void attention_task(const attention_job* j, int64_t t, float* scratch) {
  const int64_t H = j->num_heads, D = j->D, first = j->task_first[t], R = j->task_first[t + 1] - first;
  const float* q[ATTN_MAX_SHARED_ROWS];
  const int64_t* pages[ATTN_MAX_SHARED_ROWS];
  float *acc[ATTN_MAX_SHARED_ROWS], *m[ATTN_MAX_SHARED_ROWS], *l[ATTN_MAX_SHARED_ROWS];
  int64_t t1[ATTN_MAX_SHARED_ROWS];
  int is_whole[ATTN_MAX_SHARED_ROWS];
  for (int64_t r = 0; r < R; r++) {
    const attention_item* item = &j->items[first + r];
    const int64_t b = item->b, ctx = j->context_lens[b], piece = seq_piece(j, b);
    is_whole[r] = seq_pieces(j, b) == 1;
    t1[r] = ctx - item->t0 > piece ? item->t0 + piece : ctx;
    q[r] = j->q + j->rows[b] * j->q_row_stride;
    pages[r] = j->page_table + b * j->max_pages;
    float* part = is_whole[r] ? scratch + r * j->part_size : j->parts + (j->item_start[b] + item->p) * j->part_size;
    m[r] = part;
    l[r] = part + H;
    acc[r] = part + 2 * H;
  }
  attend_rows(q, R, pages, &j->k_cache, &j->v_cache, j->page_size, j->items[first].t0, t1, j->num_kv_heads, j->G,
              D, j->scale, j->softcap, acc, m, l);
  for (int64_t r = 0; r < R; r++)
    if (is_whole[r]) store_normalised(j->out + j->rows[j->items[first + r].b] * H * D, acc[r], l[r], H, D);
}

/* Merges the pieces of (sequence b, head h), i = b * H + h, into out; acc: D floats of scratch. */
static void attention_merge(const attention_job* j, int64_t i, float* acc) {
  const int64_t H = j->num_heads, D = j->D, b = i / H, h = i % H;
  const int64_t pieces = seq_pieces(j, b);
  if (pieces == 1) return;
  const float* first = j->parts + j->item_start[b] * j->part_size;
  float m_all = -INFINITY, l_all = 0.0f;
  for (int64_t p = 0; p < pieces; p++) m_all = fmaxf(m_all, first[p * j->part_size + h]);
  memset(acc, 0, (size_t)D * sizeof(float));
  for (int64_t p = 0; p < pieces; p++) {
    const float* part = first + p * j->part_size;
    const float w = expf(part[h] - m_all);
    l_all += part[H + h] * w;
    const __m256 vw = _mm256_set1_ps(w);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(acc + d,
                       _mm256_fmadd_ps(_mm256_loadu_ps(part + 2 * H + h * D + d), vw, _mm256_loadu_ps(acc + d)));
  }
  store_normalised(j->out + (j->rows[b] * H + h) * D, acc, &l_all, 1, D);
}

/* Cuts the sorted items into tasks (task_first, returns their count): each run of items with one
   (t0, first_page) into ceil(run / max_rows) tasks of near-equal size. */
static int64_t make_tasks(const attention_item* items, int64_t num_items, int64_t max_rows, int64_t* task_first) {
  int64_t num_tasks = 0;
  for (int64_t i = 0; i < num_items;) {
    int64_t run = 1;
    while (i + run < num_items && items[i + run].t0 == items[i].t0 && items[i + run].first_page == items[i].first_page)
      run++;
    const int64_t parts = (run + max_rows - 1) / max_rows;
    for (int64_t k = 0; k < parts; k++) task_first[num_tasks++] = i + run * k / parts;
    i += run;
  }
  task_first[num_tasks] = num_items;
  return num_tasks;
}

/* Decode attention, one query token per sequence (see kernels/cpu_decode_ops.py).
   With more than one thread, a long context is cut into pieces (of at least ATTN_MIN_SPLIT
   positions, ~4 per thread: piece_of) and the pieces' partial softmaxes merged afterwards.
   A work item (attention_task) takes the pieces of up to ATTN_MAX_SHARED_ROWS sequences
   that start at the same position on the same page, in one pass block by block
   (attend_rows): the sequences of a batch over one cached prefix, and the rows of a
   speculative verify chunk (one sequence's consecutive positions, the same pages), read
   that prefix once; with several threads fewer rows go together where that leaves fewer
   than ~4 items per thread.
   Returns 0; -1 for sizes beyond the kernel's limits or a failed malloc; else
   kind + 4 * b for the first sequence b with a bad index: kind 1 rows[b] outside
   [0, num_rows), 2 context_lens[b] outside [1, max_pages * page_size], 3 a page
   id outside [0, num_pages) among its first ceil(context_lens[b] / page_size).
   Nothing is written unless it returns 0. */
int64_t paged_decode_attention(const float* q, int64_t q_row_stride, kv_pages k_cache, kv_pages v_cache,
                                   const int64_t* page_table, int64_t max_pages, const int64_t* context_lens,
                                   const int64_t* rows, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                                   int64_t head_dim, int64_t page_size, float scale, float* out, int64_t num_rows,
                                   int64_t num_pages, int num_threads, int64_t window, float softcap) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads || head_dim <= 0 || head_dim % 8 || page_size <= 0 ||
      window < 0 || softcap < 0.0f || head_dim > ATTN_MAX_HEAD_DIM)
    return -1;
  const int64_t G = num_heads / num_kv_heads, D = head_dim, H = num_heads;
  if (G > ATTN_MAX_GROUP || H * D > ATTN_MAX_HEADS_DIM) return -1;
  int64_t total = 0;
  for (int64_t b = 0; b < num_seqs; b++) {
    const int64_t ctx = context_lens[b];
    if (rows[b] < 0 || rows[b] >= num_rows) return 1 + 4 * b;
    if (ctx < 1 || ctx > max_pages * page_size) return 2 + 4 * b;
    const int64_t* pages = page_table + b * max_pages;
    for (int64_t p = 0; p < (ctx + page_size - 1) / page_size; p++)
      if (pages[p] < 0 || pages[p] >= num_pages) return 3 + 4 * b;
    total += ctx;
  }
  if (num_seqs == 0) return 0;

  const int64_t part_size = H * D + 2 * H;
  attention_job job = {q, k_cache, v_cache, page_table, context_lens, rows, NULL, NULL, NULL, out, NULL,
                       q_row_stride, max_pages, num_seqs, num_heads, num_kv_heads, G, D, page_size,
                       part_size, window, num_threads, scale, softcap};
  /* item_start[b]: sequence b's first piece among all (its partial softmaxes' place in parts) */
  int64_t* item_start = (int64_t*)malloc((size_t)(num_seqs + 1) * sizeof(int64_t));
  if (!item_start) return -1;
  int any_split = 0;
  item_start[0] = 0;
  job.item_start = item_start;
  for (int64_t b = 0; b < num_seqs; b++) {
    const int64_t pieces = seq_pieces(&job, b);
    any_split |= pieces > 1;
    item_start[b + 1] = item_start[b] + pieces;
  }
  const int64_t num_items = item_start[num_seqs];
  const int is_parallel = num_items > 1 && num_threads > 1 && total * H * D >= ATTN_PARALLEL_MIN;
  attention_item* items = (attention_item*)malloc((size_t)num_items * sizeof(attention_item));
  int64_t* task_first = (int64_t*)malloc((size_t)(num_items + 1) * sizeof(int64_t));
  float* parts = any_split ? (float*)malloc((size_t)(num_items * part_size) * sizeof(float)) : NULL;
  const int num_scratches = is_parallel ? num_threads : 1;
  float* scratch = (float*)malloc((size_t)(num_scratches * ATTN_MAX_SHARED_ROWS * part_size) * sizeof(float));
  int64_t status = -1;
  if (!items || !task_first || (any_split && !parts) || !scratch) goto done;
  for (int64_t b = 0; b < num_seqs; b++) {
    const int64_t start = seq_start(&job, b), piece = seq_piece(&job, b);
    for (int64_t p = 0; p < item_start[b + 1] - item_start[b]; p++) {
      const int64_t t0 = start + p * piece;
      items[item_start[b] + p] = (attention_item){t0, page_table[b * max_pages + t0 / page_size], b, p};
    }
  }
  qsort(items, (size_t)num_items, sizeof(attention_item), compare_items);
  /* rows a task: all that share a piece's start, unless that leaves fewer than ~4 tasks a thread */
  int64_t max_rows = is_parallel ? num_items / (4 * num_threads) : ATTN_MAX_SHARED_ROWS;
  max_rows = max_rows < 1 ? 1 : (max_rows > ATTN_MAX_SHARED_ROWS ? ATTN_MAX_SHARED_ROWS : max_rows);
  const int64_t num_tasks = make_tasks(items, num_items, max_rows, task_first);
  job.items = items;
  job.task_first = task_first;
  job.parts = parts;
  if (is_parallel) {
    #pragma omp parallel num_threads(num_threads)
    {
      float* own = scratch + (int64_t)omp_get_thread_num() * ATTN_MAX_SHARED_ROWS * part_size;
      #pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < num_tasks; t++) attention_task(&job, t, own);
      if (any_split) {
        #pragma omp for schedule(dynamic, 4)
        for (int64_t i = 0; i < num_seqs * H; i++) attention_merge(&job, i, own);
      }
    }
  } else {
    for (int64_t t = 0; t < num_tasks; t++) attention_task(&job, t, scratch);
    if (any_split)
      for (int64_t i = 0; i < num_seqs * H; i++) attention_merge(&job, i, scratch);
  }
  status = 0;
done:
  free(scratch);
  free(parts);
  free(task_first);
  free(items);
  free(item_start);
  return status;
}

/* Packed-argument entry point (simd.h). */

int64_t paged_decode_attention_packed(const int64_t* a) {
  kv_pages k_cache = {(void*)(intptr_t)a[2], (float*)(intptr_t)a[3], a[4]};
  kv_pages v_cache = {(void*)(intptr_t)a[5], (float*)(intptr_t)a[6], a[7]};
  return paged_decode_attention(P(const float*, 0), a[1], k_cache, v_cache, P(const int64_t*, 8), a[9],
                                P(const int64_t*, 10), P(const int64_t*, 11), a[12], a[13], a[14], a[15], a[16],
                                F(17), P(float*, 18), a[19], a[20], (int)a[21], a[22], F(23));
}
