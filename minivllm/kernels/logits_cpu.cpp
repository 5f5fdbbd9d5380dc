// Row scans over the logits of a step (minivllm's own): the top-k candidates the
// low-bit LM head's refinement recomputes, and the greedy token with the sampler's
// checks for rows that have no distribution.
//
// Over a 49k-262k vocabulary torch's CPU `argmax` and `topk` run one row on one
// thread with scalar compares (~70-80 us a row of 49k floats); each row here is
// one or two vectorised passes that stay in L2, and rows go to ATen's threads.

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

// Maximum of n values; NaN ranks as +inf.
__attribute__((target_clones("avx512f", "avx2", "default")))
float chunk_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = std::max(m, key(x[i]));
  return m;
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
    for (int64_t c = 0; c < chunks; ++c) ranked.emplace_back(chunk_max(x + c * kChunk, kChunk), c);
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
__attribute__((target_clones("avx512f", "avx2", "default")))
int64_t greedy_row(const float* x, int64_t V, int64_t invalid, int64_t none_allowed) {
  float m = -std::numeric_limits<float>::infinity();
  int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t i = 0; i < V; ++i) {
    nan |= x[i] != x[i];
    m = std::max(m, x[i]);
  }
  if (nan || m == std::numeric_limits<float>::infinity()) return invalid;
  if (m == -std::numeric_limits<float>::infinity()) return none_allowed;
  // First index of the maximum: whole blocks compared without branches, then the
  // block that holds it.
  constexpr int64_t kBlock = 256;
  int64_t start = 0;
  for (; start + kBlock <= V; start += kBlock) {
    int hit = 0;
#pragma omp simd reduction(| : hit)
    for (int64_t i = start; i < start + kBlock; ++i) hit |= x[i] == m;
    if (hit) break;
  }
  for (int64_t i = start; i < V; ++i)
    if (x[i] == m) return i;
  return invalid;  // unreachable: m is one of the values
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

}  // namespace

TORCH_LIBRARY_FRAGMENT(minivllm_cpu, m) {
  m.def("top_logit_indices(Tensor logits, int k) -> Tensor");
  m.def("greedy_tokens(Tensor logits, int invalid, int none_allowed) -> Tensor");
}

TORCH_LIBRARY_IMPL(minivllm_cpu, CPU, m) {
  m.impl("top_logit_indices", top_logit_indices);
  m.impl("greedy_tokens", greedy_tokens);
}
