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
// multiple of 8) the inner loops are intrinsics held in registers: scores four
// keys at a time for up to four (AVX2: three) query heads, each key chunk loaded
// once for all of them, and the weighted values summed in registers over 64 (24)
// columns while the keys stream past; softmax's exp is a polynomial.  Elsewhere
// plain C++ built for AVX-512, AVX2 and baseline x86-64, picked at load by the CPU
// (`target_clones`).

#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace minivllm_cpu {
// The kernels' code path (0 portable, 1 AVX2, 2 AVX-512) and whether a test lowered
// it below this CPU's best (`lowbit_isa`; defined in lowbit_cpu.cpp).
int64_t active_isa();
bool isa_lowered();
}  // namespace minivllm_cpu

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

// Every context block request b reads (the table entries of its window, or of
// its whole context) and every slot written lies inside the cache: the kernels
// read and write through them unchecked.  O(blocks read) a call.
inline void check_paged(const Shape& s, const int32_t* table, const int32_t* lens,
                        const int64_t* slots, const char* op) {
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t len = lens[b];
    TORCH_CHECK(len > 0 && len <= s.table_width * s.block_size, op, ": request ", b, "'s ",
                len, " tokens do not fit its block table");
    const int64_t start = s.window > 0 ? std::max<int64_t>(0, len - s.window) : 0;
    const int64_t used = (len + s.block_size - 1) / s.block_size;
    for (int64_t i = start / s.block_size; i < used; ++i) {
      const int64_t blk = table[b * s.table_width + i];
      TORCH_CHECK(blk >= 0 && blk < s.num_blocks, op, ": block ", blk, " of request ", b,
                  " is outside the cache's ", s.num_blocks, " blocks");
    }
    TORCH_CHECK(slots[b] >= 0 && slots[b] < s.num_blocks * s.block_size, op, ": slot ",
                slots[b], " of request ", b, " is outside the cache");
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

// Sums of four vectors' lanes: {sum a, sum b, sum c, sum d}.
MINIVLLM_AVX512 inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 all = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(all),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(all), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// Scores of G query heads (at q, hd apart) against keys [t0, t0 + 4): each key
// chunk is loaded once for the G heads, 4 G dot products in registers.
template <int G, typename T>
MINIVLLM_AVX512 inline void scores4_avx512(const float* q, const T* cache, const int64_t* rows,
                                           int64_t koff, int64_t hd, int64_t t0, int64_t n,
                                           float scale, float* sc) {
  __m512 acc[G][4];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < 4; ++j) acc[g][j] = _mm512_setzero_ps();
  const T* k[4];
  for (int j = 0; j < 4; ++j) k[j] = cache + rows[t0 + j] + koff;
  for (int64_t i = 0; i < hd; i += 16) {
    __m512 kv[4];
    for (int j = 0; j < 4; ++j) kv[j] = load16(k[j] + i);
    for (int g = 0; g < G; ++g) {
      const __m512 qv = _mm512_loadu_ps(q + g * hd + i);
      for (int j = 0; j < 4; ++j) acc[g][j] = _mm512_fmadd_ps(qv, kv[j], acc[g][j]);
    }
  }
  const __m128 sv = _mm_set1_ps(scale);
  for (int g = 0; g < G; ++g)
    _mm_storeu_ps(sc + g * n + t0,
                  _mm_mul_ps(sum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sv));
}

// out[g][c0, c0 + 16 C) = sum over the n keys of p[g][t] V[t][c0 ...] for G heads,
// the sums held in registers while the keys stream past.
template <int G, int C, typename T>
MINIVLLM_AVX512 inline void values_avx512(const float* p, const T* cache, const int64_t* rows,
                                          int64_t voff, int64_t n, int64_t hd, float* out) {
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const T* v = cache + rows[t] + voff;
    __m512 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load16(v + 16 * c);
    for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(p[g * n + t]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(w, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + g * hd + 16 * c, acc[g][c]);
}

// One key's scores for G heads (the keys left over from blocks of four).
template <int G, typename T>
MINIVLLM_AVX512 void score1_avx512(const float* q, const T* k, int64_t hd, float scale, float* sc,
                                   int64_t n) {
  for (int g = 0; g < G; ++g) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < hd; i += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * hd + i), load16(k + i), acc);
    sc[g * n] = _mm512_reduce_add_ps(acc) * scale;
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

// {sum a, sum b, sum c, sum d} of four 8-lane vectors.
MINIVLLM_AVX2 inline __m128 sum4_avx2(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 all = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(all), _mm256_extractf128_ps(all, 1));
}

// `scores4_avx512` on 8 lanes (G <= 3: 12 accumulators of the 16 registers).
template <int G, typename T>
MINIVLLM_AVX2 inline void scores4_avx2(const float* q, const T* cache, const int64_t* rows,
                                       int64_t koff, int64_t hd, int64_t t0, int64_t n,
                                       float scale, float* sc) {
  __m256 acc[G][4];
  for (int g = 0; g < G; ++g)
    for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_setzero_ps();
  const T* k[4];
  for (int j = 0; j < 4; ++j) k[j] = cache + rows[t0 + j] + koff;
  for (int64_t i = 0; i < hd; i += 8) {
    for (int j = 0; j < 4; ++j) {
      const __m256 kv = load8(k[j] + i);
      for (int g = 0; g < G; ++g)
        acc[g][j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * hd + i), kv, acc[g][j]);
    }
  }
  const __m128 sv = _mm_set1_ps(scale);
  for (int g = 0; g < G; ++g)
    _mm_storeu_ps(sc + g * n + t0,
                  _mm_mul_ps(sum4_avx2(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), sv));
}

// `values_avx512` on 8 lanes.
template <int G, int C, typename T>
MINIVLLM_AVX2 inline void values_avx2(const float* p, const T* cache, const int64_t* rows,
                                      int64_t voff, int64_t n, int64_t hd, float* out) {
  __m256 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < n; ++t) {
    const T* v = cache + rows[t] + voff;
    __m256 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load8(v + 8 * c);
    for (int g = 0; g < G; ++g) {
      const __m256 w = _mm256_broadcast_ss(p + g * n + t);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm256_fmadd_ps(w, vv[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + g * hd + 8 * c, acc[g][c]);
}

template <int G, typename T>
MINIVLLM_AVX2 void score1_avx2(const float* q, const T* k, int64_t hd, float scale, float* sc,
                               int64_t n) {
  for (int g = 0; g < G; ++g) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd; i += 8)
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * hd + i), load8(k + i), acc);
    sc[g * n] = hsum8(acc) * scale;
  }
}

// The steps of `one_pair_simd`, one set per instruction set: kWidth lanes, up to
// kHeads query heads at once, values kChunk vectors wide.
struct Avx512Attention {
  static constexpr int kWidth = 16, kHeads = 4, kChunk = 4;
  template <int G, typename T, typename... A>
  static void scores4(A... a) { scores4_avx512<G, T>(a...); }
  template <int G, typename T, typename... A>
  static void score1(A... a) { score1_avx512<G, T>(a...); }
  template <int G, int C, typename T, typename... A>
  static void values(A... a) { values_avx512<G, C, T>(a...); }
  static void softmax(float* sc, int64_t n) { softmax_avx512(sc, n); }
};

struct Avx2Attention {
  static constexpr int kWidth = 8, kHeads = 3, kChunk = 3;
  template <int G, typename T, typename... A>
  static void scores4(A... a) { scores4_avx2<G, T>(a...); }
  template <int G, typename T, typename... A>
  static void score1(A... a) { score1_avx2<G, T>(a...); }
  template <int G, int C, typename T, typename... A>
  static void values(A... a) { values_avx2<G, C, T>(a...); }
  static void softmax(float* sc, int64_t n) { softmax_avx2(sc, n); }
};

// G query heads' attention (G <= Isa::kHeads): scores four keys at a time,
// softmax, then the weighted values kChunk vectors (then one) at a time.
template <typename Isa, int G, typename T>
void heads_simd(const PairSpan& p, const T* cache, int64_t koff, float scale, const float* q,
                float* sc, float* o) {
  const int64_t n = p.n, hd = p.hd, whole = n & ~int64_t{3};
  for (int64_t t = 0; t < whole; t += 4)
    Isa::template scores4<G, T>(q, cache, p.rows, koff, hd, t, n, scale, sc);
  for (int64_t t = whole; t < n; ++t)
    Isa::template score1<G, T>(q, cache + p.rows[t] + koff, hd, scale, sc + t, n);
  for (int g = 0; g < G; ++g) Isa::softmax(sc + g * n, n);
  constexpr int64_t wide = Isa::kWidth * Isa::kChunk;
  const int64_t voff = p.half + koff;
  int64_t c = 0;
  for (; c + wide <= hd; c += wide)
    Isa::template values<G, Isa::kChunk, T>(sc, cache, p.rows, voff + c, n, hd, o + c);
  for (; c < hd; c += Isa::kWidth)
    Isa::template values<G, 1, T>(sc, cache, p.rows, voff + c, n, hd, o + c);
}

// Request b's KV head h, its query heads kHeads at a time.
template <typename Isa, typename T>
void one_pair_simd(const Shape& s, const float* q, const T* cache, const int32_t* table,
                   int64_t seq_len, int64_t b, int64_t h, float* out, std::vector<float>& scores) {
  const PairSpan p = pair_span(s, q, table, seq_len, b, h, scores);
  const int64_t hd = p.hd, koff = h * hd;
  float* o = out + (b * s.num_heads + h * p.group) * hd;
  for (int64_t g = 0; g < p.group; g += Isa::kHeads) {
    const float* qg = p.q + g * hd;
    float* sc = scores.data() + g * p.n;
    float* og = o + g * hd;
    const int64_t left = std::min<int64_t>(Isa::kHeads, p.group - g);
    if constexpr (Isa::kHeads >= 4)
      if (left == 4) { heads_simd<Isa, 4>(p, cache, koff, s.scale, qg, sc, og); continue; }
    if (left == 3) heads_simd<Isa, 3>(p, cache, koff, s.scale, qg, sc, og);
    else if (left == 2) heads_simd<Isa, 2>(p, cache, koff, s.scale, qg, sc, og);
    else heads_simd<Isa, 1>(p, cache, koff, s.scale, qg, sc, og);
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

// Request b's KV head h on the best form for this CPU and head size; a code path
// lowered for tests (`lowbit_isa`) lowers this one too.
template <typename T>
inline void one_pair_any(const Shape& s, const float* q, const T* cache, const int32_t* table,
                         int64_t seq_len, int64_t b, int64_t h, float* out, std::vector<float>& sc) {
#if defined(__x86_64__)
  const int64_t cap = minivllm_cpu::isa_lowered() ? minivllm_cpu::active_isa() : 2;
  if (cap >= 2 && kHasAvx512 && s.head_dim % 16 == 0)
    return one_pair_simd<Avx512Attention>(s, q, cache, table, seq_len, b, h, out, sc);
  if (cap >= 1 && kHasAvx2 && s.head_dim % 8 == 0)
    return one_pair_simd<Avx2Attention>(s, q, cache, table, seq_len, b, h, out, sc);
#endif
  if constexpr (std::is_same_v<T, float>) one_pair_f32(s, q, cache, table, seq_len, b, h, out, sc);
  else one_pair_bf16(s, q, cache, table, seq_len, b, h, out, sc);
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
