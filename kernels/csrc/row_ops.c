/* Fused float32 decode-step ops for CPU, one row at a time: RMSNorm (plain and
   with the residual add), SiLU*mul, RoPE + KV store. Paged decode attention is in
   decode_attention.c; both build into one library.

   Built and loaded by kernels/native_build.py (gcc -O3 -mavx2 -mfma -mf16c
   -fopenmp); the Python side is kernels/cpu_decode_ops.py, which validates every
   argument before calling in. The torch ops in kernels/ stay the reference.

   Conventions: sizes and indices int64_t, `num_threads` last. Work below a
   per-op threshold runs on the calling thread (an OpenMP fork costs a few
   microseconds, more than a 576-wide row). Functions that index memory through
   caller-supplied indices (slot ids, page ids, rows) check those indices first
   and return nonzero, touching nothing, when one is out of range. */

#include "kv_formats.h"

#define ROW_MAX_KV_SIZE 8192 /* num_kv_heads * head_dim: a rotated K row on the stack */

/* Element counts from which an op forks. */
#define NORM_PARALLEL_MIN 8192
#define SILU_PARALLEL_MIN 16384
#define ROPE_PARALLEL_MIN 65536

/* ---------------------------------------------------------------- RMSNorm */

/* sum of squares of x[0..dim), in double */
static inline double sum_squares(const float* x, int64_t dim) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  __m256d a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= dim; i += 16) {
    __m256 v = _mm256_loadu_ps(x + i), w = _mm256_loadu_ps(x + i + 8);
    __m256d v0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), v1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(w)), w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1));
    a0 = _mm256_fmadd_pd(v0, v0, a0);
    a1 = _mm256_fmadd_pd(v1, v1, a1);
    a2 = _mm256_fmadd_pd(w0, w0, a2);
    a3 = _mm256_fmadd_pd(w1, w1, a3);
  }
  __m256d a = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
  double t[4];
  _mm256_storeu_pd(t, a);
  double s = (t[0] + t[1]) + (t[2] + t[3]);
  for (; i < dim; i++) s += (double)x[i] * (double)x[i];
  return s;
}

/* out = (x * inv_rms) * weight, the order of HF's LlamaRMSNorm */
static inline void scale_row(const float* x, const float* weight, float* out, int64_t dim, double sumsq, float eps) {
  float inv = (float)(1.0 / sqrt(sumsq / (double)dim + (double)eps));
  __m256 vinv = _mm256_set1_ps(inv);
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv), _mm256_loadu_ps(weight + i)));
  for (; i < dim; i++) out[i] = (x[i] * inv) * weight[i];
}

static void rms_norm_row(const float* x, const float* weight, float* out, int64_t dim, float eps) {
  scale_row(x, weight, out, dim, sum_squares(x, dim), eps);
}

static void add_rms_norm_row(float* residual, const float* x, const float* weight, float* out, int64_t dim,
                             float eps) {
  int64_t i = 0;
  for (; i + 8 <= dim; i += 8)
    _mm256_storeu_ps(residual + i, _mm256_add_ps(_mm256_loadu_ps(residual + i), _mm256_loadu_ps(x + i)));
  for (; i < dim; i++) residual[i] = residual[i] + x[i];
  scale_row(residual, weight, out, dim, sum_squares(residual, dim), eps);
}

void rms_norm_f32(const float* x, const float* weight, float* out, int64_t rows, int64_t dim, float eps,
                  int num_threads) {
  if (num_threads > 1 && rows > 1 && rows * dim >= NORM_PARALLEL_MIN) {
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++) rms_norm_row(x + r * dim, weight, out + r * dim, dim, eps);
  } else {
    for (int64_t r = 0; r < rows; r++) rms_norm_row(x + r * dim, weight, out + r * dim, dim, eps);
  }
}

/* y (rows, cols) += bias (cols,) in place, each sum one float add (as torch's y + bias). */
void add_bias_f32(float* y, const float* bias, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) y[r * cols + c] += bias[c];
}

/* Qwen3's and Gemma 3's q/k norms, in place: qkv (rows, H + 2*KVH, D); each q head's D values normed with
   q_weight (D,), each k head's with k_weight, as rms_norm_f32 norms a row; the v heads are left as they are. */
void qk_norm_f32(float* qkv, int64_t rows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 const float* q_weight, const float* k_weight, float eps, int num_threads) {
  const int64_t row_size = (num_heads + 2 * num_kv_heads) * head_dim, normed = num_heads + num_kv_heads;
  const int parallel = num_threads > 1 && rows > 1 && rows * normed * head_dim >= NORM_PARALLEL_MIN;
  #pragma omp parallel for schedule(static) num_threads(num_threads) if (parallel)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t h = 0; h < normed; h++) {
      float* head = qkv + r * row_size + h * head_dim;
      rms_norm_row(head, h < num_heads ? q_weight : k_weight, head, head_dim, eps);
    }
}

void add_rms_norm_f32(float* residual, const float* x, const float* weight, float* out, int64_t rows, int64_t dim,
                      float eps, int num_threads) {
  if (num_threads > 1 && rows > 1 && rows * dim >= NORM_PARALLEL_MIN) {
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++)
      add_rms_norm_row(residual + r * dim, x + r * dim, weight, out + r * dim, dim, eps);
  } else {
    for (int64_t r = 0; r < rows; r++)
      add_rms_norm_row(residual + r * dim, x + r * dim, weight, out + r * dim, dim, eps);
  }
}

/* ----------------------------------------------------------- SiLU and mul */

static void silu_and_mul_row(const float* g, float* o, int64_t inter) {
  const float* u = g + inter;
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= inter; i += 8) {
    __m256 gv = _mm256_loadu_ps(g + i);
    __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(_mm256_xor_ps(gv, sign))));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
  }
  for (; i < inter; i++) o[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

void silu_and_mul_f32(const float* gate_up, float* out, int64_t rows, int64_t inter, int num_threads) {
  if (num_threads > 1 && rows > 1 && rows * inter >= SILU_PARALLEL_MIN) {
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++) silu_and_mul_row(gate_up + r * 2 * inter, out + r * inter, inter);
  } else {
    for (int64_t r = 0; r < rows; r++) silu_and_mul_row(gate_up + r * 2 * inter, out + r * inter, inter);
  }
}

/* -------------------------------------------------- GeGLU (gelu tanh) */

/* gelu_tanh(g) = 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3), which is g * sigmoid(2u):
   the SiLU form with 2u in place of g. */
static void gelu_tanh_and_mul_row(const float* g, float* o, int64_t inter) {
  const float* u = g + inter;
  const float k2 = 2.0f * 0.7978845608028654f, c = 0.044715f;
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  const __m256 vk2 = _mm256_set1_ps(k2), vc = _mm256_set1_ps(c);
  int64_t i = 0;
  for (; i + 8 <= inter; i += 8) {
    __m256 gv = _mm256_loadu_ps(g + i);
    __m256 inner = _mm256_mul_ps(vk2, _mm256_fmadd_ps(_mm256_mul_ps(vc, gv), _mm256_mul_ps(gv, gv), gv));
    __m256 gelu = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(_mm256_xor_ps(inner, sign))));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(u + i)));
  }
  for (; i < inter; i++) {
    const float x = g[i], inner = k2 * (x + c * x * x * x);
    o[i] = (x / (1.0f + expf(-inner))) * u[i];
  }
}

void gelu_tanh_and_mul_f32(const float* gate_up, float* out, int64_t rows, int64_t inter, int num_threads) {
  if (num_threads > 1 && rows > 1 && rows * inter >= SILU_PARALLEL_MIN) {
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++) gelu_tanh_and_mul_row(gate_up + r * 2 * inter, out + r * inter, inter);
  } else {
    for (int64_t r = 0; r < rows; r++) gelu_tanh_and_mul_row(gate_up + r * 2 * inter, out + r * inter, inter);
  }
}

/* ------------------------------------------------------- RoPE + KV store */

/* x (R,) rotated in place: x * cos + (-x2, x1) * sin, halves x1 = x[:R/2], x2 = x[R/2:] (R: the
   rotary dimensions, the leading R of a head; the rest of the head is left as it is).
   Products rounded before the sum (no FMA contraction), as torch computes it, so
   the result agrees with RotaryEmbedding.apply to the bit. */
__attribute__((optimize("fp-contract=off")))
static void rotate_half_inplace(float* x, const float* cos, const float* sin, int64_t head_dim) {
  int64_t half = head_dim / 2, i = 0;
  for (; i + 8 <= half; i += 8) {
    __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i);
    __m256 o1 = _mm256_sub_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(cos + i)), _mm256_mul_ps(x2, _mm256_loadu_ps(sin + i)));
    __m256 o2 = _mm256_add_ps(_mm256_mul_ps(x2, _mm256_loadu_ps(cos + half + i)),
                              _mm256_mul_ps(x1, _mm256_loadu_ps(sin + half + i)));
    _mm256_storeu_ps(x + i, o1);
    _mm256_storeu_ps(x + half + i, o2);
  }
  for (; i < half; i++) {
    float x1 = x[i], x2 = x[half + i];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[half + i] = x2 * cos[half + i] + x1 * sin[half + i];
  }
}

static void rope_store_kv_row(float* row, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                              int64_t rotary_dim, const float* cos, const float* sin, const kv_pages* k_cache,
                              const kv_pages* v_cache, int64_t slot) {
  for (int64_t h = 0; h < num_heads + num_kv_heads; h++)
    rotate_half_inplace(row + h * head_dim, cos, sin, rotary_dim);
  kv_store_slot(k_cache, slot, row + num_heads * head_dim, num_kv_heads, head_dim);
  kv_store_slot(v_cache, slot, row + (num_heads + num_kv_heads) * head_dim, num_kv_heads, head_dim);
}

/* Rotates q and k of each row of qkv in place and stores k and v into slot slot_ids[r] of the caches,
   in their formats (kv_formats.h: values, scales (NULL unless int8), format). Returns r + 1 for the
   first out-of-range slot id (nothing written), else 0. */
int64_t rope_store_kv(float* qkv, int64_t rows, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                      const float* cos, const float* sin, kv_pages k_cache, kv_pages v_cache,
                      const int64_t* slot_ids, int64_t num_slots, int num_threads, int64_t rotary_dim) {
  for (int64_t r = 0; r < rows; r++)
    if (slot_ids[r] < 0 || slot_ids[r] >= num_slots) return r + 1;
  const int64_t row_size = (num_heads + 2 * num_kv_heads) * head_dim;
  if (num_threads > 1 && rows > 1 && rows * row_size >= ROPE_PARALLEL_MIN) {
    #pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < rows; r++)
      rope_store_kv_row(qkv + r * row_size, num_heads, num_kv_heads, head_dim, rotary_dim, cos + r * rotary_dim,
                        sin + r * rotary_dim, &k_cache, &v_cache, slot_ids[r]);
  } else {
    for (int64_t r = 0; r < rows; r++)
      rope_store_kv_row(qkv + r * row_size, num_heads, num_kv_heads, head_dim, rotary_dim, cos + r * rotary_dim,
                        sin + r * rotary_dim, &k_cache, &v_cache, slot_ids[r]);
  }
  return 0;
}

/* Stored document KV placed at a new position: k rotated by one delta (cos, sin (R,)), v as is,
   both (rows, KVH, D) float32, stored into the caches in their formats. */
int64_t rerotate_store_kv(const float* k, const float* v, int64_t rows, int64_t num_kv_heads, int64_t head_dim,
                          const float* cos, const float* sin, kv_pages k_cache, kv_pages v_cache,
                          const int64_t* slot_ids, int64_t num_slots, int num_threads, int64_t rotary_dim) {
  for (int64_t r = 0; r < rows; r++)
    if (slot_ids[r] < 0 || slot_ids[r] >= num_slots) return r + 1;
  const int64_t kv_size = num_kv_heads * head_dim;
  if (k_cache.format == KV_F32) {
    const size_t kv_bytes = (size_t)kv_size * sizeof(float);
    #pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && rows * kv_size >= ROPE_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
      float* k_slot = (float*)k_cache.values + slot_ids[r] * kv_size;
      memcpy(k_slot, k + r * kv_size, kv_bytes);
      for (int64_t h = 0; h < num_kv_heads; h++) rotate_half_inplace(k_slot + h * head_dim, cos, sin, rotary_dim);
      kv_store_slot(&v_cache, slot_ids[r], v + r * kv_size, num_kv_heads, head_dim);
    }
    return 0;
  }
  /* a quantized K is rotated in float first (a row on the stack), then quantized as it is stored */
  #pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1 && rows * kv_size >= ROPE_PARALLEL_MIN)
  for (int64_t r = 0; r < rows; r++) {
    float rotated[ROW_MAX_KV_SIZE];
    memcpy(rotated, k + r * kv_size, (size_t)kv_size * sizeof(float));
    for (int64_t h = 0; h < num_kv_heads; h++) rotate_half_inplace(rotated + h * head_dim, cos, sin, rotary_dim);
    kv_store_slot(&k_cache, slot_ids[r], rotated, num_kv_heads, head_dim);
    kv_store_slot(&v_cache, slot_ids[r], v + r * kv_size, num_kv_heads, head_dim);
  }
  return 0;
}

/* Packed-argument entry points (simd.h). */

int64_t rms_norm_f32_packed(const int64_t* a) {
  rms_norm_f32(P(const float*, 0), P(const float*, 1), P(float*, 2), a[3], a[4], F(5), (int)a[6]);
  return 0;
}

int64_t add_rms_norm_f32_packed(const int64_t* a) {
  add_rms_norm_f32(P(float*, 0), P(const float*, 1), P(const float*, 2), P(float*, 3), a[4], a[5], F(6), (int)a[7]);
  return 0;
}

int64_t add_bias_f32_packed(const int64_t* a) {
  add_bias_f32(P(float*, 0), P(const float*, 1), a[2], a[3]);
  return 0;
}

int64_t qk_norm_f32_packed(const int64_t* a) {
  qk_norm_f32(P(float*, 0), a[1], a[2], a[3], a[4], P(const float*, 5), P(const float*, 6), F(7), (int)a[8]);
  return 0;
}

int64_t silu_and_mul_f32_packed(const int64_t* a) {
  silu_and_mul_f32(P(const float*, 0), P(float*, 1), a[2], a[3], (int)a[4]);
  return 0;
}

int64_t gelu_tanh_and_mul_f32_packed(const int64_t* a) {
  gelu_tanh_and_mul_f32(P(const float*, 0), P(float*, 1), a[2], a[3], (int)a[4]);
  return 0;
}

/* kv_pages from three fields: values, scales, format */
static inline kv_pages kv_pages_at(const int64_t* a) {
  kv_pages pages = {(void*)(intptr_t)a[0], (float*)(intptr_t)a[1], a[2]};
  return pages;
}

int64_t rope_store_kv_packed(const int64_t* a) {
  return rope_store_kv(P(float*, 0), a[1], a[2], a[3], a[4], P(const float*, 5), P(const float*, 6),
                       kv_pages_at(a + 7), kv_pages_at(a + 10), P(const int64_t*, 13), a[14], (int)a[15], a[16]);
}

int64_t rerotate_store_kv_packed(const int64_t* a) {
  if (a[3] * a[4] > ROW_MAX_KV_SIZE) return -1;
  return rerotate_store_kv(P(const float*, 0), P(const float*, 1), a[2], a[3], a[4], P(const float*, 5),
                           P(const float*, 6), kv_pages_at(a + 7), kv_pages_at(a + 10), P(const int64_t*, 13), a[14],
                           (int)a[15], a[16]);
}
