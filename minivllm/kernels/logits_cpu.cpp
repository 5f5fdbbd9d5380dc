// Row scans over the logits of a step (minivllm's own): the top-k candidates the
// low-bit LM head's refinement recomputes, the greedy token with the sampler's
// checks for rows that have no distribution, and a draw from softmax(logits / T)
// for rows sampled with a temperature alone.
//
// Over a 49k-262k vocabulary torch's CPU `argmax` and `topk` run one row on one
// thread with scalar compares (~70-80 us a row of 49k floats); each row here is
// one or two vectorised passes that stay in L2, and rows go to ATen's threads.

#include "attention_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace {

constexpr int64_t kChunk = 64;  // values per chunk whose maximum ranks it

// Ranking key: NaN above everything (as torch.topk orders it), so the order is strict.
inline float key(float v) { return std::isnan(v) ? std::numeric_limits<float>::infinity() : v; }

// The maximum of x [n] and whether x has a NaN (`nan`), and the first index of a
// value equal to `v` (-1: none): AVX-512 where the CPU has it (the compiler keeps
// these reductions scalar: 7 ms for 32 rows of 262k values instead of 0.8).
#if defined(__x86_64__)
MINIVLLM_AVX512 float row_max_avx512(const float* x, int64_t n, bool& nan) {
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    bad |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
    mx = _mm512_mask_max_ps(mx, m, mx, v);
  }
  nan = bad != 0;
  return _mm512_reduce_max_ps(mx);
}

MINIVLLM_AVX512 int64_t first_equal_avx512(const float* x, int64_t n, float v) {
  const __m512 target = _mm512_set1_ps(v);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, x + i), target,
                                                  _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  return -1;
}

MINIVLLM_AVX2 float row_max_avx2(const float* x, int64_t n, bool& nan) {
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    mx = _mm256_max_ps(v, mx);  // a NaN in v keeps mx (the second operand wins)
  }
  float m = hmax8(mx);
  nan = _mm256_movemask_ps(bad) != 0;
  for (; i < n; ++i) {
    nan |= std::isnan(x[i]);
    m = std::max(m, x[i]);
  }
  return m;
}

MINIVLLM_AVX2 int64_t first_equal_avx2(const float* x, int64_t n, float v) {
  const __m256 target = _mm256_set1_ps(v);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n; ++i)
    if (x[i] == v) return i;
  return -1;
}
#endif

float row_max(const float* x, int64_t n, bool& nan) {
#if defined(__x86_64__)
  if (kHasAvx512) return row_max_avx512(x, n, nan);
  if (kHasAvx2) return row_max_avx2(x, n, nan);
#endif
  float m = -std::numeric_limits<float>::infinity();
  nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan |= std::isnan(x[i]);
    m = std::max(m, x[i]);
  }
  return m;
}

int64_t first_equal(const float* x, int64_t n, float v) {
#if defined(__x86_64__)
  if (kHasAvx512) return first_equal_avx512(x, n, v);
  if (kHasAvx2) return first_equal_avx2(x, n, v);
#endif
  for (int64_t i = 0; i < n; ++i)
    if (x[i] == v) return i;
  return -1;
}

// The largest of a chunk's values, NaN ranking as +inf.
float chunk_max(const float* x) {
  bool nan = false;
  const float m = row_max(x, kChunk, nan);
  return nan ? std::numeric_limits<float>::infinity() : m;
}

// Column indices of the k largest values of x [V] (unordered) into out [k].  The k
// chunks of 64 with the largest maxima hold them all (a value outside those chunks
// has k chunk maxima, so k values, at least as large), so only those chunks and the
// last partial one are ranked.
void top_row(const float* x, int64_t V, int64_t k, int64_t* out) {
  thread_local std::vector<std::pair<float, int64_t>> ranked;
  ranked.clear();
  const int64_t chunks = V / kChunk;
  auto larger = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (chunks > k) {
    for (int64_t c = 0; c < chunks; ++c) ranked.emplace_back(chunk_max(x + c * kChunk), c);
    std::nth_element(ranked.begin(), ranked.begin() + (k - 1), ranked.end(), larger);
    thread_local std::vector<int64_t> picked;
    picked.clear();
    for (int64_t i = 0; i < k; ++i) picked.push_back(ranked[i].second);
    ranked.clear();
    for (int64_t c : picked)
      for (int64_t j = c * kChunk; j < (c + 1) * kChunk; ++j) ranked.emplace_back(key(x[j]), j);
    for (int64_t j = chunks * kChunk; j < V; ++j) ranked.emplace_back(key(x[j]), j);
  } else {
    for (int64_t j = 0; j < V; ++j) ranked.emplace_back(key(x[j]), j);
  }
  std::nth_element(ranked.begin(), ranked.begin() + (k - 1), ranked.end(), larger);
  for (int64_t i = 0; i < k; ++i) out[i] = ranked[i].second;
}

at::Tensor top_logit_indices(const at::Tensor& logits, int64_t k) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat,
              "top_logit_indices: logits must be float32 [rows, vocab]");
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), V = x.size(1);
  TORCH_CHECK(k >= 1 && k <= V, "top_logit_indices: k must be in [1, vocab]");
  at::Tensor out = at::empty({rows, k}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) top_row(xp + r * V, V, k, op + r * k);
  });
  return out;
}

// Greedy token of one row: the first index of its maximum; `invalid` when the row
// has a NaN or +inf (no distribution), `none_allowed` when every value is -inf.
int64_t greedy_row(const float* x, int64_t V, int64_t invalid, int64_t none_allowed) {
  bool nan = false;
  const float m = row_max(x, V, nan);
  if (nan || m == std::numeric_limits<float>::infinity()) return invalid;
  if (m == -std::numeric_limits<float>::infinity()) return none_allowed;
  const int64_t i = first_equal(x, V, m);
  return i >= 0 ? i : invalid;  // always found: m is one of the values
}

at::Tensor greedy_tokens(const at::Tensor& logits, int64_t invalid, int64_t none_allowed) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.size(1) > 0,
              "greedy_tokens: logits must be float32 [rows, vocab]");
  const at::Tensor x = logits.contiguous();
  const int64_t rows = x.size(0), V = x.size(1);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) op[r] = greedy_row(xp + r * V, V, invalid, none_allowed);
  });
  return out;
}

constexpr int64_t kCdfBlock = 1024;  // tokens per block of the two-level CDF (sampler.CDF_CHUNK)

#if defined(__x86_64__)
MINIVLLM_AVX512 float exp_block_avx512(const float* x, float inv_t, float top, int64_t n,
                                       float* e) {
  const __m512 it = _mm512_set1_ps(inv_t), tp = _mm512_set1_ps(top);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    const __mmask16 live = m & _mm512_cmp_ps_mask(v, ninf, _CMP_NEQ_OQ);
    const __m512 ex = _mm512_maskz_mov_ps(live, exp_nonpositive(_mm512_fmsub_ps(v, it, tp)));
    sum = _mm512_add_ps(sum, ex);
    _mm512_mask_storeu_ps(e + i, m, ex);
  }
  return _mm512_reduce_add_ps(sum);
}

MINIVLLM_AVX2 float exp_block_avx2(const float* x, float inv_t, float top, int64_t n, float* e) {
  const __m256 it = _mm256_set1_ps(inv_t), tp = _mm256_set1_ps(top);
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 live = _mm256_cmp_ps(v, ninf, _CMP_NEQ_OQ);
    const __m256 ex = _mm256_and_ps(live, exp_nonpositive_avx2(_mm256_fmsub_ps(v, it, tp)));
    sum = _mm256_add_ps(sum, ex);
    _mm256_storeu_ps(e + i, ex);
  }
  float total = hsum8(sum);
  for (; i < n; ++i) {
    e[i] = x[i] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(x[i] * inv_t - top);
    total += e[i];
  }
  return total;
}
#endif

// exp(x - top) for x <= top, 0 for x = -inf, over n values into e; their float32 sum.
float exp_block(const float* x, float inv_t, float top, int64_t n, float* e) {
#if defined(__x86_64__)
  if (kHasAvx512) return exp_block_avx512(x, inv_t, top, n, e);
  if (kHasAvx2) return exp_block_avx2(x, inv_t, top, n, e);
#endif
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    e[i] = x[i] == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(x[i] * inv_t - top);
    sum += e[i];
  }
  return sum;
}

// One draw from row x [V] at temperature t with uniform u (see `sample_rows`).
int64_t sample_row(const float* x, int64_t V, float t, double u, int64_t invalid,
                   int64_t none_allowed) {
  bool nan = false;
  const float m = row_max(x, V, nan);
  if (nan || m == std::numeric_limits<float>::infinity()) return invalid;
  if (m == -std::numeric_limits<float>::infinity()) return none_allowed;
  const float inv_t = 1.f / t, top = m * inv_t;
  const int64_t blocks = (V + kCdfBlock - 1) / kCdfBlock;
  thread_local std::vector<double> cumulative;
  thread_local std::vector<float> e;
  cumulative.resize(blocks);
  e.resize(kCdfBlock);
  double total = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n = std::min(kCdfBlock, V - b * kCdfBlock);
    total += exp_block(x + b * kCdfBlock, inv_t, top, n, e.data());
    cumulative[b] = total;
  }
  if (!(total > 0.0) || !std::isfinite(total)) return invalid;
  const double target = u * total;
  // The first block whose cumulative sum passes the target, then the first token in it.
  const int64_t b = std::min<int64_t>(
      std::upper_bound(cumulative.begin(), cumulative.end(), target) - cumulative.begin(),
      blocks - 1);
  const int64_t start = b * kCdfBlock, n = std::min(kCdfBlock, V - start);
  exp_block(x + start, inv_t, top, n, e.data());
  double cdf = b > 0 ? cumulative[b - 1] : 0.0;
  int64_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (e[i] > 0.f) last = i;
    cdf += e[i];
    if (cdf > target) return start + i;
  }
  // Past the block's end (its float32 sum rounded above the float64 CDF): its last
  // token of positive probability.
  return last >= 0 ? start + last : invalid;
}

// Row rows[i] of `logits` drawn from softmax(logits / temperature[i]) by inverting
// its CDF at u[i] * total, as the sampler's `random_sample` does (a two-level CDF:
// float32 sums of 1024-token blocks accumulated in float64, then float64 within
// the picked block), without writing the scaled logits or the probabilities: two
// passes a row, one exp per token.  A token at -inf is never drawn; rows with a NaN
// or +inf get `invalid`, rows at -inf everywhere `none_allowed`.
at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& rows,
                       const at::Tensor& temperature, const at::Tensor& u, int64_t invalid,
                       int64_t none_allowed) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.size(1) > 0 &&
                  logits.stride(1) == 1,
              "sample_rows: logits must be float32 [rows, vocab] with contiguous rows");
  const at::Tensor r = rows.to(at::kLong).contiguous();
  const at::Tensor t = temperature.to(at::kFloat).contiguous();
  const at::Tensor uu = u.to(at::kDouble).contiguous();
  const int64_t n = r.numel(), V = logits.size(1), stride = logits.stride(0);
  TORCH_CHECK(t.numel() == n && uu.numel() == n,
              "sample_rows: one temperature and one uniform number per row");
  const int64_t* rp = r.data_ptr<int64_t>();
  const float* tp = t.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(rp[i] >= 0 && rp[i] < logits.size(0) && tp[i] > 0.f,
                "sample_rows: rows must be in range and temperatures positive");
  at::Tensor out = at::empty({n}, r.options());
  const float* xp = logits.data_ptr<float>();
  const double* up = uu.data_ptr<double>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, n, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      op[i] = sample_row(xp + rp[i] * stride, V, tp[i], up[i], invalid, none_allowed);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minivllm_cpu, m) {
  m.def("top_logit_indices(Tensor logits, int k) -> Tensor");
  m.def("greedy_tokens(Tensor logits, int invalid, int none_allowed) -> Tensor");
  m.def(
      "sample_rows(Tensor logits, Tensor rows, Tensor temperature, Tensor u, int invalid, "
      "int none_allowed) -> Tensor");
}

TORCH_LIBRARY_IMPL(minivllm_cpu, CPU, m) {
  m.impl("top_logit_indices", top_logit_indices);
  m.impl("greedy_tokens", greedy_tokens);
  m.impl("sample_rows", sample_rows);
}
