// Paged decode attention kernels for CPUs (minivllm's own), shared by the
// decode_attention op (decode_attention_cpu.cpp) and the fused decoder layer
// (decode_layer_cpu.cpp).
//
// The CPU decode graph runs a decode step as compiled code; these kernels are
// its attention.  The step's K/V rows are written into the paged cache (in
// place), then each request's attention is computed over its context, reading
// K/V through the block table where they lie: nothing is gathered into a copy.  The query heads
// that share a KV head are computed together, so each cached row is read once
// per KV head.  Scores, softmax and sums are float32 whatever the cache dtype
// (float32 or bfloat16).
//
// Work is split over (request, KV head) pairs with ATen's thread pool (even 3
// pairs: one request of the default model measured faster on both threads than
// on one).  On AVX-512 CPUs (head size a multiple of 16) and AVX2 ones (a
// multiple of 8) the inner loops are intrinsics, softmax's exp a polynomial;
// elsewhere plain C++ built for AVX-512, AVX2 and baseline x86-64, picked at
// load by the CPU (`target_clones`).

#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kSerialPairs = 2;  // (request, KV head) pairs below which one thread runs

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MINIVLLM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MINIVLLM_CLONES
#endif

#define MINIVLLM_INLINE inline __attribute__((always_inline))

// The loops below are inlined into each target clone of `one_pair_*`, so each
// is vectorized for that clone's instruction set (no call per row).
MINIVLLM_INLINE float load(float v) { return v; }
MINIVLLM_INLINE float load(c10::BFloat16 v) { return static_cast<float>(v); }

template <typename T>
MINIVLLM_INLINE float dot(const float* __restrict a, const T* __restrict b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * load(b[i]);
  return s;
}

template <typename T>
MINIVLLM_INLINE void axpy(float* __restrict y, float a, const T* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += a * load(x[i]);
}

struct Shape {
  int64_t batch, num_heads, num_kv, head_dim, block_size, num_blocks, table_width;
  float scale;
  int64_t window;  // 0: no sliding window
};

// Element offset of each context row (tokens start .. end - 1) in the K half of
// the cache: one division per block, not per token.
inline void row_offsets(const Shape& s, const int32_t* blocks, int64_t start, int64_t end,
                        std::vector<int64_t>& rows) {
  const int64_t row = s.num_kv * s.head_dim;
  rows.resize(std::max<int64_t>(end - start, 1));
  int64_t pos = start, t = 0;
  while (pos < end) {
    const int64_t off = pos % s.block_size;
    const int64_t stop = std::min(end, pos - off + s.block_size);
    const int64_t base = static_cast<int64_t>(blocks[pos / s.block_size]) * s.block_size - (pos - off);
    for (; pos < stop; ++pos) rows[t++] = (base + pos) * row;
  }
}

// What attention of request b's KV head h reads: its `group` query heads at `q`,
// its context's n rows (from `start`; K at cache + rows[t] + h * hd, V `half`
// elements further), with `scores` zeroed for group x n values.
struct PairSpan {
  int64_t group, hd, n, half;
  const float* q;
  const int64_t* rows;
};

inline PairSpan pair_span(const Shape& s, const float* q, const int32_t* table, int64_t seq_len,
                          int64_t b, int64_t h, std::vector<float>& scores) {
  const int64_t group = s.num_heads / s.num_kv, hd = s.head_dim;
  const int64_t start = s.window > 0 ? std::max<int64_t>(0, seq_len - s.window) : 0;
  const int64_t n = seq_len - start;
  const int64_t half = s.num_blocks * s.block_size * s.num_kv * hd;  // V follows all of K
  scores.assign(group * std::max<int64_t>(n, 1), 0.f);
  thread_local std::vector<int64_t> rows;
  row_offsets(s, table + b * s.table_width, start, seq_len, rows);
  return {group, hd, n, half, q + (b * s.num_heads + h * group) * hd, rows.data()};
}

// Attention of request b's `group` query heads (sharing KV head h) over its context.
template <typename T>
MINIVLLM_INLINE void one_pair(const Shape& s, const float* q, const T* cache, const int32_t* table,
              int64_t seq_len, int64_t b, int64_t h, float* out, std::vector<float>& scores) {
  const PairSpan p = pair_span(s, q, table, seq_len, b, h, scores);
  const int64_t group = p.group, hd = p.hd, n = p.n, half = p.half;
  const int64_t* rows = p.rows;
  for (int64_t t = 0; t < n; ++t) {
    const T* k = cache + rows[t] + h * hd;
    for (int64_t g = 0; g < group; ++g)
      scores[g * n + t] = dot(p.q + g * hd, k, hd) * s.scale;
  }
  for (int64_t g = 0; g < group; ++g) {
    float* sc = scores.data() + g * n;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < n; ++t) mx = std::max(mx, sc[t]);
    float sum = 0.f;
    for (int64_t t = 0; t < n; ++t) {
      sc[t] = std::exp(sc[t] - mx);
      sum += sc[t];
    }
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int64_t t = 0; t < n; ++t) sc[t] *= inv;
  }
  float* o = out + (b * s.num_heads + h * group) * hd;
  std::fill(o, o + group * hd, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    const T* v = cache + half + rows[t] + h * hd;
    for (int64_t g = 0; g < group; ++g) axpy(o + g * hd, scores[g * n + t], v, hd);
  }
}

#if defined(__x86_64__)
// AVX-512 form for head sizes that are a multiple of 16: each cached K/V row is
// loaded once per token and used by all the query heads that share it.
#define MINIVLLM_AVX512 __attribute__((target("avx512f,avx512bw")))

MINIVLLM_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
MINIVLLM_AVX512 inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// e^x for x <= 0 (softmax inputs less their maximum): 2^(x log2 e) split into an
// integer power (`scalef`) and e^r for |r| <= ln2 / 2 as a degree-6 polynomial,
// relative error ~1e-7.
MINIVLLM_AVX512 inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693147181f), x);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// In place: sc[0..n) -> softmax(sc).
MINIVLLM_AVX512 inline void softmax_avx512(float* sc, int64_t n) {
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 m = n - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - t)) - 1);
    mx = _mm512_mask_max_ps(mx, m, mx, _mm512_maskz_loadu_ps(m, sc + t));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 m = n - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - t)) - 1);
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sc + t), top));
    sum = _mm512_mask_add_ps(sum, m, sum, e);
    _mm512_mask_storeu_ps(sc + t, m, e);
  }
  const float total = _mm512_reduce_add_ps(sum);
  const __m512 inv = _mm512_set1_ps(total > 0.f ? 1.f / total : 0.f);
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 m = n - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - t)) - 1);
    _mm512_mask_storeu_ps(sc + t, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, sc + t), inv));
  }
}

template <typename T>
MINIVLLM_AVX512 void one_pair_avx512(const Shape& s, const float* q, const T* cache,
                                     const int32_t* table, int64_t seq_len, int64_t b, int64_t h,
                                     float* out, std::vector<float>& scores) {
  const PairSpan p = pair_span(s, q, table, seq_len, b, h, scores);
  const int64_t group = p.group, hd = p.hd, n = p.n, half = p.half;
  const int64_t* rows = p.rows;
  const float* qh = p.q;
  for (int64_t t = 0; t < n; ++t) {
    const T* k = cache + rows[t] + h * hd;
    for (int64_t g = 0; g < group; ++g) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < hd; i += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + g * hd + i), load16(k + i), acc);
      scores[g * n + t] = _mm512_reduce_add_ps(acc) * s.scale;
    }
  }
  for (int64_t g = 0; g < group; ++g) softmax_avx512(scores.data() + g * n, n);
  float* o = out + (b * s.num_heads + h * group) * hd;
  std::fill(o, o + group * hd, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    const T* v = cache + half + rows[t] + h * hd;
    for (int64_t i = 0; i < hd; i += 16) {
      const __m512 vv = load16(v + i);
      for (int64_t g = 0; g < group; ++g) {
        float* og = o + g * hd + i;
        _mm512_storeu_ps(og, _mm512_fmadd_ps(_mm512_set1_ps(scores[g * n + t]), vv, _mm512_loadu_ps(og)));
      }
    }
  }
}

const bool kHasAvx512 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
}();

// AVX2 forms of the same (CPUs without AVX-512: head sizes a multiple of 8).
#define MINIVLLM_AVX2 __attribute__((target("avx2,fma,f16c")))

const bool kHasAvx2 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}();

MINIVLLM_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
MINIVLLM_AVX2 inline __m256 load8(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

MINIVLLM_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

MINIVLLM_AVX2 inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

// `exp_nonpositive` on 8 lanes: the same reduction and polynomial; 2^n is built in
// the exponent bits (n >= -126 after the clamp, so always a normal float).
MINIVLLM_AVX2 inline __m256 exp_nonpositive_avx2(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693147181f), x);
  __m256 p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// Lanes [0, n - i) of a tail: a mask for maskload / maskstore (n - i < 8).
MINIVLLM_AVX2 inline __m256i tail_mask(int64_t left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

MINIVLLM_AVX2 inline void softmax_avx2(float* sc, int64_t n) {
  const int64_t whole = n & ~int64_t{7};
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < whole; t += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(sc + t));
  float top = hmax8(mx);
  for (int64_t t = whole; t < n; ++t) top = std::max(top, sc[t]);
  const __m256 tp = _mm256_set1_ps(top);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t t = 0; t < whole; t += 8) {
    const __m256 e = exp_nonpositive_avx2(_mm256_sub_ps(_mm256_loadu_ps(sc + t), tp));
    sum = _mm256_add_ps(sum, e);
    _mm256_storeu_ps(sc + t, e);
  }
  if (whole < n) {
    const __m256i m = tail_mask(n - whole);
    const __m256 v = _mm256_maskload_ps(sc + whole, m);
    const __m256 e = _mm256_and_ps(exp_nonpositive_avx2(_mm256_sub_ps(v, tp)),
                                   _mm256_castsi256_ps(m));
    sum = _mm256_add_ps(sum, e);
    _mm256_maskstore_ps(sc + whole, m, e);
  }
  const float total = hsum8(sum);
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const __m256 iv = _mm256_set1_ps(inv);
  for (int64_t t = 0; t < whole; t += 8) _mm256_storeu_ps(sc + t, _mm256_mul_ps(_mm256_loadu_ps(sc + t), iv));
  for (int64_t t = whole; t < n; ++t) sc[t] *= inv;
}

template <typename T>
MINIVLLM_AVX2 void one_pair_avx2(const Shape& s, const float* q, const T* cache,
                                 const int32_t* table, int64_t seq_len, int64_t b, int64_t h,
                                 float* out, std::vector<float>& scores) {
  const PairSpan p = pair_span(s, q, table, seq_len, b, h, scores);
  const int64_t group = p.group, hd = p.hd, n = p.n, half = p.half;
  const int64_t* rows = p.rows;
  const float* qh = p.q;
  for (int64_t t = 0; t < n; ++t) {
    const T* k = cache + rows[t] + h * hd;
    for (int64_t g = 0; g < group; ++g) {
      __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
      int64_t i = 0;
      for (; i + 16 <= hd; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + g * hd + i), load8(k + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + g * hd + i + 8), load8(k + i + 8), acc1);
      }
      if (i < hd) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + g * hd + i), load8(k + i), acc0);
      scores[g * n + t] = hsum8(_mm256_add_ps(acc0, acc1)) * s.scale;
    }
  }
  for (int64_t g = 0; g < group; ++g) softmax_avx2(scores.data() + g * n, n);
  float* o = out + (b * s.num_heads + h * group) * hd;
  std::fill(o, o + group * hd, 0.f);
  for (int64_t t = 0; t < n; ++t) {
    const T* v = cache + half + rows[t] + h * hd;
    for (int64_t i = 0; i < hd; i += 8) {
      const __m256 vv = load8(v + i);
      for (int64_t g = 0; g < group; ++g) {
        float* og = o + g * hd + i;
        _mm256_storeu_ps(og, _mm256_fmadd_ps(_mm256_set1_ps(scores[g * n + t]), vv, _mm256_loadu_ps(og)));
      }
    }
  }
}
#endif

MINIVLLM_CLONES
void one_pair_f32(const Shape& s, const float* q, const float* cache, const int32_t* table,
                  int64_t seq_len, int64_t b, int64_t h, float* out, std::vector<float>& scores) {
  one_pair(s, q, cache, table, seq_len, b, h, out, scores);
}

MINIVLLM_CLONES
void one_pair_bf16(const Shape& s, const float* q, const c10::BFloat16* cache, const int32_t* table,
                   int64_t seq_len, int64_t b, int64_t h, float* out, std::vector<float>& scores) {
  one_pair(s, q, cache, table, seq_len, b, h, out, scores);
}

inline void one_pair_any(const Shape& s, const float* q, const float* cache, const int32_t* table,
                         int64_t seq_len, int64_t b, int64_t h, float* out, std::vector<float>& sc) {
#if defined(__x86_64__)
  if (kHasAvx512 && s.head_dim % 16 == 0)
    return one_pair_avx512(s, q, cache, table, seq_len, b, h, out, sc);
  if (kHasAvx2 && s.head_dim % 8 == 0)
    return one_pair_avx2(s, q, cache, table, seq_len, b, h, out, sc);
#endif
  one_pair_f32(s, q, cache, table, seq_len, b, h, out, sc);
}

inline void one_pair_any(const Shape& s, const float* q, const c10::BFloat16* cache,
                         const int32_t* table, int64_t seq_len, int64_t b, int64_t h, float* out,
                         std::vector<float>& sc) {
#if defined(__x86_64__)
  if (kHasAvx512 && s.head_dim % 16 == 0)
    return one_pair_avx512(s, q, cache, table, seq_len, b, h, out, sc);
  if (kHasAvx2 && s.head_dim % 8 == 0)
    return one_pair_avx2(s, q, cache, table, seq_len, b, h, out, sc);
#endif
  one_pair_bf16(s, q, cache, table, seq_len, b, h, out, sc);
}

// This step's K/V rows (request b's at key + b * key_stride, value + b *
// value_stride) into the cache at `slots`.
template <typename T>
void write_rows(const Shape& s, T* cache, const float* key, int64_t key_stride, const float* value,
                int64_t value_stride, const int64_t* slots) {
  const int64_t row = s.num_kv * s.head_dim;
  const int64_t half = s.num_blocks * s.block_size * row;
  for (int64_t b = 0; b < s.batch; ++b) {
    T* k = cache + slots[b] * row;
    for (int64_t i = 0; i < row; ++i) {
      k[i] = static_cast<T>(key[b * key_stride + i]);
      k[half + i] = static_cast<T>(value[b * value_stride + i]);
    }
  }
}

// out [B, nh * hd] = each request's attention of `q` [B, nh * hd] over its
// context in `cache` (rows already written), `table` [B, table_width] its blocks.
template <typename T>
void attend(const Shape& s, const float* qp, const T* cache, const int32_t* tp,
            const int32_t* lens, float* out) {
  const int64_t pairs = s.batch * s.num_kv;
  auto body = [&](int64_t p0, int64_t p1) {
    thread_local std::vector<float> scores;
    for (int64_t p = p0; p < p1; ++p)
      one_pair_any(s, qp, cache, tp, lens[p / s.num_kv], p / s.num_kv, p % s.num_kv, out, scores);
  };
  if (pairs < kSerialPairs) body(0, pairs);
  else at::parallel_for(0, pairs, 1, body);
}

}  // namespace
