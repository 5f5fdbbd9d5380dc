// The ``minivllm_cpu::encoder_attention`` op: bidirectional attention within each
// prompt of a flat batch (encoder-only models such as BERT), with no padding.
//
// query [T, nh, hd] and key / value [T, nkv, hd] hold every prompt's rows back to
// back; `starts` [P + 1] gives each prompt's first row.  Torch's CPU flash
// attention needs the prompts padded to a common length and, at the head sizes of
// embedding models (32-64), spends most of its time around GEMMs too small for its
// BLAS calls: 16 prompts x 12 heads x 144 rows x 32 dims took 5.1 ms in bfloat16 on
// a 2-core EPYC, about 100 GFLOP/s where the model's linear layers run at 900.
//
// Here the work is one (prompt, KV head) pair at a time, handed out longest first
// to whichever thread is free (a pair costs its length squared).  A pair converts
// its keys once to float32 in a transposed [hd, L] layout, so the scores of one
// query row against 16 keys are one vector of fused multiply-adds, and its values
// to float32 rows.  Query rows then go through in blocks of four: the block's
// scores (4 rows x 64 keys per pass: 16 accumulators, each key vector loaded once
// for four rows), a float32 softmax per row, and the block's outputs as sums of
// value rows.  All arithmetic is float32 for both input types.  The AVX-512 path
// needs hd % 16 == 0; other head sizes and CPUs take the portable loops.

#include "attention_kernels.h"

#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <numeric>

namespace {

struct EncoderPair {
  const float* q;  // this pair's query heads, float32 [group, L, hd]
  const float* k;  // float32 [L, hd]
  const float* v;  // float32 [L, hd]
  float* out;      // float32 [group, L, hd]
  int64_t group, len, hd;
  float scale;
};

// Portable form: row at a time, vectorized by the compiler for each clone.
MINIVLLM_CLONES
void encoder_pair_portable(const EncoderPair& p, std::vector<float>& sc) {
  const int64_t n = p.len, hd = p.hd;
  sc.resize(n);
  for (int64_t g = 0; g < p.group; ++g) {
    for (int64_t i = 0; i < n; ++i) {
      const float* qi = p.q + (g * n + i) * hd;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < n; ++j) {
        sc[j] = dot(qi, p.k + j * hd, hd) * p.scale;
        top = std::max(top, sc[j]);
      }
      float total = 0.f;
      for (int64_t j = 0; j < n; ++j) total += (sc[j] = std::exp(sc[j] - top));
      float* o = p.out + (g * n + i) * hd;
      std::fill(o, o + hd, 0.f);
      for (int64_t j = 0; j < n; ++j) axpy(o, sc[j] / total, p.v + j * hd, hd);
    }
  }
}

#if defined(__x86_64__)
// Scores of R query rows (`q`, row stride hd) against keys j0 .. j0 + 16 * NC of
// the transposed keys `kt` [hd, lp], scaled, into `sc` (row stride lp).
template <int R, int NC>
MINIVLLM_AVX512 inline void scores_tile(const float* q, const float* kt, int64_t hd, int64_t lp,
                                        int64_t j0, float scale, float* sc) {
  __m512 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < hd; ++d) {
    __m512 key[NC];
    for (int c = 0; c < NC; ++c) key[c] = _mm512_loadu_ps(kt + d * lp + j0 + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 qb = _mm512_set1_ps(q[r * hd + d]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(qb, key[c], acc[r][c]);
    }
  }
  const __m512 s = _mm512_set1_ps(scale);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(sc + r * lp + j0 + 16 * c, _mm512_mul_ps(acc[r][c], s));
}

// Outputs c0 .. c0 + 16 * NC of R rows: sum over the n keys of the rows'
// probabilities (`pr`, row stride lp) times the value rows `v` [n, hd].
template <int R, int NC>
MINIVLLM_AVX512 inline void values_tile(const float* pr, int64_t lp, const float* v, int64_t n,
                                        int64_t hd, int64_t c0, float* o) {
  __m512 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    __m512 val[NC];
    for (int c = 0; c < NC; ++c) val[c] = _mm512_loadu_ps(v + j * hd + c0 + 16 * c);
    for (int r = 0; r < R; ++r) {
      const __m512 pb = _mm512_set1_ps(pr[r * lp + j]);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(pb, val[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(o + r * hd + c0 + 16 * c, acc[r][c]);
}

// R query rows (R <= 4) of one head: scores, softmax, outputs.
template <int R>
MINIVLLM_AVX512 void row_block(const EncoderPair& p, const float* kt, int64_t lp, const float* q,
                               float* sc, float* o) {
  const int64_t n = p.len, hd = p.hd;
  int64_t j0 = 0;
  for (; j0 + 64 <= lp; j0 += 64) scores_tile<R, 4>(q, kt, hd, lp, j0, p.scale, sc);
  switch ((lp - j0) / 16) {
    case 3: scores_tile<R, 3>(q, kt, hd, lp, j0, p.scale, sc); break;
    case 2: scores_tile<R, 2>(q, kt, hd, lp, j0, p.scale, sc); break;
    case 1: scores_tile<R, 1>(q, kt, hd, lp, j0, p.scale, sc); break;
    default: break;
  }
  for (int r = 0; r < R; ++r) softmax_avx512(sc + r * lp, n);
  int64_t c0 = 0;
  for (; c0 + 64 <= hd; c0 += 64) values_tile<R, 4>(sc, lp, p.v, n, hd, c0, o);
  switch ((hd - c0) / 16) {
    case 3: values_tile<R, 3>(sc, lp, p.v, n, hd, c0, o); break;
    case 2: values_tile<R, 2>(sc, lp, p.v, n, hd, c0, o); break;
    case 1: values_tile<R, 1>(sc, lp, p.v, n, hd, c0, o); break;
    default: break;
  }
}

MINIVLLM_AVX512 void encoder_pair_avx512(const EncoderPair& p, std::vector<float>& kt,
                                         std::vector<float>& sc) {
  const int64_t n = p.len, hd = p.hd, lp = (n + 15) / 16 * 16;
  kt.assign(hd * lp, 0.f);  // padded key columns score 0 and are left out of the softmax
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < hd; ++d) kt[d * lp + j] = p.k[j * hd + d];
  sc.resize(4 * lp);
  for (int64_t g = 0; g < p.group; ++g) {
    const float* q = p.q + g * n * hd;
    float* o = p.out + g * n * hd;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) row_block<4>(p, kt.data(), lp, q + i * hd, sc.data(), o + i * hd);
    switch (n - i) {
      case 3: row_block<3>(p, kt.data(), lp, q + i * hd, sc.data(), o + i * hd); break;
      case 2: row_block<2>(p, kt.data(), lp, q + i * hd, sc.data(), o + i * hd); break;
      case 1: row_block<1>(p, kt.data(), lp, q + i * hd, sc.data(), o + i * hd); break;
      default: break;
    }
  }
}
#endif

// Rows [T, heads, hd] of `x` for head h, rows b .. b + n, as float32 [n, hd].
template <typename T>
void gather_head(const T* x, int64_t heads, int64_t hd, int64_t b, int64_t n, int64_t h, float* dst) {
  for (int64_t t = 0; t < n; ++t) {
    const T* src = x + ((b + t) * heads + h) * hd;
    for (int64_t d = 0; d < hd; ++d) dst[t * hd + d] = static_cast<float>(src[d]);
  }
}

template <typename T>
void encoder_attention_impl(const T* q, const T* k, const T* v, const int64_t* starts,
                            int64_t prompts, int64_t nh, int64_t nkv, int64_t hd, float scale,
                            bool vector_path, float* out) {
  const int64_t group = nh / nkv, pairs = prompts * nkv;
  std::vector<int64_t> order(pairs);
  std::iota(order.begin(), order.end(), 0);
  auto length = [&](int64_t pair) { return starts[pair / nkv + 1] - starts[pair / nkv]; };
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return length(a) > length(b); });
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), pairs);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    thread_local std::vector<float> qf, kf, vf, of, kt, sc;
    for (int64_t w = next++; w < pairs; w = next++) {
      const int64_t pair = order[w], prompt = pair / nkv, h = pair % nkv;
      const int64_t b = starts[prompt], n = starts[prompt + 1] - b;
      if (n <= 0) continue;
      qf.resize(group * n * hd), kf.resize(n * hd), vf.resize(n * hd), of.resize(group * n * hd);
      for (int64_t g = 0; g < group; ++g) gather_head(q, nh, hd, b, n, h * group + g, qf.data() + g * n * hd);
      gather_head(k, nkv, hd, b, n, h, kf.data());
      gather_head(v, nkv, hd, b, n, h, vf.data());
      const EncoderPair p{qf.data(), kf.data(), vf.data(), of.data(), group, n, hd, scale};
#if defined(__x86_64__)
      if (vector_path) encoder_pair_avx512(p, kt, sc);
      else encoder_pair_portable(p, sc);
#else
      encoder_pair_portable(p, sc);
#endif
      for (int64_t g = 0; g < group; ++g)
        for (int64_t t = 0; t < n; ++t)
          std::copy_n(of.data() + (g * n + t) * hd, hd, out + ((b + t) * nh + h * group + g) * hd);
    }
  });
}

// out [T, nh, hd] (query's dtype) = attention within each prompt of the flat batch.
// `portable` forces the portable loops (tests).
at::Tensor encoder_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const at::Tensor& starts, double scale, bool portable) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.sizes() == key.sizes() &&
                  key.size(0) == query.size(0) && key.size(2) == query.size(2),
              "encoder_attention: query [T, heads, hd], key and value [T, kv_heads, hd]");
  TORCH_CHECK(query.scalar_type() == key.scalar_type() && key.scalar_type() == value.scalar_type() &&
                  (query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16),
              "encoder_attention: float32 or bfloat16 query, key and value of one dtype");
  const int64_t nh = query.size(1), nkv = key.size(1), hd = query.size(2);
  TORCH_CHECK(nkv > 0 && nh % nkv == 0, "encoder_attention: heads must be a multiple of kv heads");
  const at::Tensor st = starts.to(at::kLong).contiguous();
  const int64_t prompts = st.numel() - 1;
  const int64_t* sp = st.data_ptr<int64_t>();
  TORCH_CHECK(prompts >= 0 && (prompts == 0 || (sp[0] >= 0 && sp[prompts] <= query.size(0))),
              "encoder_attention: prompt starts outside the batch");
  for (int64_t i = 0; i < prompts; ++i)
    TORCH_CHECK(sp[i] <= sp[i + 1], "encoder_attention: prompt starts must not decrease");
  at::Tensor out = at::zeros({query.size(0), nh, hd}, query.options().dtype(at::kFloat));
  const at::Tensor q = query.contiguous(), k = key.contiguous(), v = value.contiguous();
  bool vector_path = false;
#if defined(__x86_64__)
  vector_path = !portable && kHasAvx512 && hd % 16 == 0;
#endif
  const float s = static_cast<float>(scale);
  if (q.scalar_type() == at::kFloat)
    encoder_attention_impl(q.data_ptr<float>(), k.data_ptr<float>(), v.data_ptr<float>(), sp, prompts,
                           nh, nkv, hd, s, vector_path, out.data_ptr<float>());
  else
    encoder_attention_impl(q.data_ptr<c10::BFloat16>(), k.data_ptr<c10::BFloat16>(),
                           v.data_ptr<c10::BFloat16>(), sp, prompts, nh, nkv, hd, s, vector_path,
                           out.data_ptr<float>());
  return out.to(query.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minivllm_cpu, m) {
  m.def(
      "encoder_attention(Tensor query, Tensor key, Tensor value, Tensor starts, float scale, "
      "bool portable=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(minivllm_cpu, CPU, m) { m.impl("encoder_attention", encoder_attention); }
