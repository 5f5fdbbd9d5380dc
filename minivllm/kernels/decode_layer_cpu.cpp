// One decoder layer of a decode step as one C++ call (minivllm's own).
//
// At one token a layer's real work is reading its four low-bit weights; the
// compiled decode graph around them adds what is not: an op dispatch per GEMM,
// Inductor's loops for the norms, rotary and activation, and a wake-up of the
// thread pool each time the threads have gone idle between calls.  This op runs
// the whole layer
//
//   residual += hidden (unless there is none yet: residual = hidden)
//   x = norm_in(residual);  qkv = x @ Wqkv.T (+ bias);  [q/k: per-head norm]
//   rotary on q, k;  K/V rows into the paged cache;  a = attention(q)
//   a = a @ Wo.T (+ bias);  [a = norm_post_attn(a)];  residual += a
//   x = norm_pre_mlp(residual);  gu = x @ Wgu.T (+ bias);  h = act(g) * u
//   out = h @ Wdown.T (+ bias);  [out = norm_post_mlp(out)];  [out += residual]
//
// with the kernels of lowbit_kernels.h and attention_kernels.h, back to back,
// on one team of threads for all the layers of a call (thread_team.h): each
// phase (token rows, GEMM columns, (request, KV head) pairs) is split over the
// team and ends at a spinning barrier, so no thread sleeps between the parts
// and nothing is allocated but the two outputs.  Everything between the GEMMs is float32, as
// in the models' own ops.
//
// What differs between model families is read from the layer's `form` (bits
// below) and from which inputs are given: Llama is form 0; Qwen2 adds biases;
// Qwen3 adds the q/k norms; Gemma 3 has all four norms scaling by 1 + weight,
// q/k norms, a tanh-GELU MLP, and returns one stream (`kSumOutput`).  A model
// stack (`decoder_stack`) may mix KV cache groups, sliding windows and rotary
// tables per layer, as Gemma 3's local and global layers do.
//
// With LoRA on, each projection may carry the per-row adapter delta of
// minivllm/lora/layers.py's LoRALinear (its stacked slots and the step's
// one-hot slot mask, read in place), added to the projection's output before
// anything reads it (`LoRALayer`).

#include "attention_kernels.h"
#include "lowbit_kernels.h"
#include "thread_team.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

namespace {

constexpr int64_t kQ4Kind = 5;  // quantized_linear.Q4
constexpr int64_t kQ8Kind = 8;  // quantized_linear.INT8

// Bits of a layer's `form` (fused_decoder_layer.py names them too).
constexpr int64_t kNormPlusOne = 1;  // every norm scales by 1 + weight (Gemma)
constexpr int64_t kSandwich = 2;     // norms on the attention and MLP outputs as well
constexpr int64_t kQKNorm = 4;       // per-head RMSNorm of q and k before rotary
constexpr int64_t kGeluTanh = 8;     // GeGLU with tanh GELU instead of SwiGLU
constexpr int64_t kSumOutput = 16;   // first output is out + residual (one stream)
constexpr int64_t kFormBits = 31;

// Norm weights a layer of `form` takes: input and pre-MLP, then the two output
// norms (kSandwich), then q and k (kQKNorm).
int64_t norm_count(int64_t form) {
  return 2 + ((form & kSandwich) ? 2 : 0) + ((form & kQKNorm) ? 2 : 0);
}

// One low-bit linear map of the layer, with an optional float32 bias.
struct Linear {
  int64_t kind, in, out;
  const at::Tensor* w;
  at::Tensor scales;  // q4: the tiles' scales (q4_weight.h); q8: float32 per row or float16 per 32
  Q4Weight q4;        // q4: the weight and `scales` read
  at::Tensor bias;    // undefined: none

  // q8: the per-row scales, or the group scales (Q8_0's [out, in / 32]); else nullptr.
  bool grouped() const { return kind == kQ8Kind && scales.dim() == 2; }
  const float* row_scale() const { return grouped() ? nullptr : scales.data_ptr<float>(); }
  const c10::Half* group_scale() const {
    return grouped() ? scales.data_ptr<c10::Half>() : nullptr;
  }

  void operator()(const float* x, int64_t M, float* y, QuantizedRows& a) const {
    if (kind == kQ4Kind)
      q4_gemm_raw(x, M, in, q4, y, a);
    else
      q8_gemm_raw(x, M, in, w->data_ptr<int8_t>(), row_scale(), group_scale(), out, y, a);
    if (!bias.defined()) return;
    const float* b = bias.data_ptr<float>();
    for (int64_t r = 0; r < M; ++r) {
      float* yr = y + r * out;
#pragma omp simd
      for (int64_t i = 0; i < out; ++i) yr[i] += b[i];
    }
  }
};

// `make_linear`'s result with `bias` (None: no bias) attached.
Linear with_bias(Linear lin, const c10::optional<at::Tensor>& bias, const char* name) {
  if (!bias.has_value() || !bias->defined()) return lin;
  TORCH_CHECK(bias->numel() == lin.out, "decoder_layer: ", name, " bias does not match its rows");
  lin.bias = bias->to(at::kFloat).contiguous();
  return lin;
}

Linear make_linear(const at::Tensor& w, const at::Tensor& s, int64_t kind, int64_t in,
                   const char* name) {
  TORCH_CHECK(w.is_contiguous() && s.is_contiguous(), "decoder_layer: ", name, " not contiguous");
  if (kind == kQ4Kind) {
    const std::string what = std::string("decoder_layer: ") + name;
    Q4Weight q = q4_weight(w, s, in, what.c_str());
    const int64_t out = q.N;
    return {kind, in, out, &w, s, std::move(q)};
  }
  TORCH_CHECK(kind == kQ8Kind && w.scalar_type() == at::kChar && w.dim() == 2 && w.size(1) == in &&
                  in % kQ8Group == 0,
              "decoder_layer: ", name, " is neither a q4 nor an int8 weight");
  if (s.dim() == 2) {  // Q8_0's own scales, one per 32 inputs
    TORCH_CHECK(s.scalar_type() == at::kHalf && s.size(0) == w.size(0) &&
                    s.size(1) == in / kQ8WGroup,
                "decoder_layer: ", name, " group scales must be float16 [outputs, inputs / 32]");
    return {kind, in, w.size(0), &w, s};
  }
  TORCH_CHECK(s.numel() == w.size(0), "decoder_layer: ", name, " needs one scale per row");
  return {kind, in, w.size(0), &w, s.to(at::kFloat).reshape(-1).contiguous()};
}

// x [n] -> x * rsqrt(mean(x^2) + eps) * (weight + offset), into y (may be x).
// These loops are built per instruction set too (`MINIVLLM_CLONES`).
MINIVLLM_CLONES void rms_norm(const float* x, const float* weight, float offset, float eps, int64_t n, float* y) {
  float ss = 0.f;
#pragma omp simd reduction(+ : ss)
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * inv * (weight[i] + offset);
}

// Rotary embedding of one head (neox layout: element i pairs with i + rot / 2;
// elements past `rot` pass through), from `src` into `dst` (may be `src`).
MINIVLLM_CLONES void rotate(const float* src, const float* cos, const float* sin, int64_t rot, int64_t hd,
            float* dst) {
  const int64_t half = rot / 2;
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = src[i], x2 = src[i + half];
    dst[i] = x1 * cos[i] - x2 * sin[i];
    dst[i + half] = x2 * cos[i] + x1 * sin[i];
  }
  for (int64_t i = rot; i < hd; ++i) dst[i] = src[i];
}

// h[i] = act(g[i]) * u[i] for i < n, where act(x) = x * sigmoid(c(x)): SiLU has
// c(x) = x; tanh GELU, 0.5 x (1 + tanh(z)) = x * sigmoid(2 z), has
// c(x) = 2 sqrt(2 / pi) (x + 0.044715 x^3).
constexpr float kGeluC0 = 1.5957691216057308f;  // 2 * sqrt(2 / pi)
constexpr float kGeluC1 = 0.044715f;

inline float gate_arg(float x, bool gelu) {
  return gelu ? kGeluC0 * (x + kGeluC1 * x * x * x) : x;
}

void act_mul_portable(const float* g, const float* u, int64_t n, bool gelu, float* h) {
  for (int64_t i = 0; i < n; ++i) h[i] = g[i] / (1.f + std::exp(-gate_arg(g[i], gelu))) * u[i];
}

#if defined(__x86_64__)
// sigmoid(c) from e = exp(-|c|) <= 1, which `exp_nonpositive` computes:
// 1 / (1 + e) for c >= 0, e / (1 + e) below.
MINIVLLM_AVX512 void act_mul_avx512(const float* g, const float* u, int64_t n, bool gelu,
                                    float* h) {
  const __m512 one = _mm512_set1_ps(1.f), c0 = _mm512_set1_ps(kGeluC0);
  const __m512 c1 = _mm512_set1_ps(kGeluC1);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    __m512 c = x;
    if (gelu) {
      const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
      c = _mm512_mul_ps(c0, _mm512_fmadd_ps(c1, x3, x));
    }
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(c)));
    const __m512 num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(c, _mm512_setzero_ps(), _CMP_GE_OQ),
                                            e, one);
    const __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(h + i, m, _mm512_mul_ps(_mm512_mul_ps(x, sig), _mm512_maskz_loadu_ps(m, u + i)));
  }
}

MINIVLLM_AVX2 void act_mul_avx2(const float* g, const float* u, int64_t n, bool gelu, float* h) {
  const __m256 one = _mm256_set1_ps(1.f), c0 = _mm256_set1_ps(kGeluC0);
  const __m256 c1 = _mm256_set1_ps(kGeluC1);
  const __m256 sign = _mm256_set1_ps(-0.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    __m256 c = x;
    if (gelu) {
      const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
      c = _mm256_mul_ps(c0, _mm256_fmadd_ps(c1, x3, x));
    }
    const __m256 e = exp_nonpositive_avx2(_mm256_or_ps(c, sign));  // exp(-|c|)
    const __m256 num = _mm256_blendv_ps(e, one, _mm256_cmp_ps(c, _mm256_setzero_ps(), _CMP_GE_OQ));
    const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
    _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_mul_ps(x, sig), _mm256_loadu_ps(u + i)));
  }
  act_mul_portable(g + i, u + i, n - i, gelu, h + i);
}
#endif

void act_mul(const float* g, const float* u, int64_t n, bool gelu, float* h) {
#if defined(__x86_64__)
  if (kHasAvx512) return act_mul_avx512(g, u, n, gelu, h);
  if (kHasAvx2) return act_mul_avx2(g, u, n, gelu, h);
#endif
  act_mul_portable(g, u, n, gelu, h);
}

constexpr int64_t kMaxLoRARank = 512;  // LoRAConfig's largest max_lora_rank

// One projection's LoRA slots: A [slices * slots * rank, in] (slice-major), one
// B [slots * rank, width] per slice, the slices' outputs side by side.
struct LoRADelta {
  const float* a = nullptr;
  std::vector<std::pair<const float*, int64_t>> b;  // per slice: B and its width
  int64_t rank = 0, in = 0, out = 0;
};

// yr += the delta of slot `s` of `d` on one row xr: per slice, xa = A[slice, s] @ xr
// (rank dots), then yr[slice] += xa @ B[s] (rank axpys); cloned per instruction set.
MINIVLLM_CLONES void lora_row(const LoRADelta& d, int64_t slots, int64_t s, const float* xr,
                              float* yr) {
  float xa[kMaxLoRARank];
  int64_t col = 0;
  for (size_t i = 0; i < d.b.size(); ++i) {
    const float* a = d.a + (static_cast<int64_t>(i) * slots + s) * d.rank * d.in;
    for (int64_t j = 0; j < d.rank; ++j) xa[j] = dot(a + j * d.in, xr, d.in);
    const int64_t width = d.b[i].second;
    const float* bm = d.b[i].first + s * d.rank * width;
    for (int64_t j = 0; j < d.rank; ++j) axpy(yr + col, xa[j], bm + j * width, width);
    col += width;
  }
}

// The LoRA deltas of one layer's four projections and each row's slot.
struct LoRALayer {
  std::vector<int64_t> slot;  // per row: the slot its mask row marks, -1 for none
  LoRADelta proj[4];
  int64_t slots = 0;
};

// Tensors of `lora` one layer's projections take: per projection with n > 0
// slices in `counts`, its A and n Bs.
int64_t lora_tensors(at::IntArrayRef counts) {
  int64_t n = 0;
  for (int64_t c : counts) n += c > 0 ? 1 + c : 0;
  return n;
}

// The LoRA part of `decoder_layer`'s inputs (no `lora` tensors: no LoRA).
LoRALayer make_lora(const c10::optional<at::Tensor>& mask, at::IntArrayRef counts,
                    at::TensorList lora, int64_t rows, const int64_t (&ins)[4],
                    const int64_t (&outs)[4]) {
  LoRALayer l;
  if (lora.empty()) return l;
  TORCH_CHECK(counts.size() == 4 && lora_tensors(counts) == static_cast<int64_t>(lora.size()),
              "decoder_layer: lora_slices and lora tensors do not match");
  TORCH_CHECK(mask.has_value() && mask->dim() == 2 && mask->scalar_type() == at::kFloat &&
                  mask->size(0) >= rows && mask->stride(1) == 1,
              "decoder_layer: the LoRA mask must be float32 [>= tokens, slots]");
  l.slots = mask->size(1);
  const float* m = mask->data_ptr<float>();
  l.slot.assign(rows, -1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < l.slots; ++j)
      if (m[r * mask->stride(0) + j] != 0.f) {
        l.slot[r] = j;
        break;
      }
  size_t next = 0;
  for (int p = 0; p < 4; ++p) {
    const int64_t n = counts[p];
    if (n == 0) continue;
    const at::Tensor& a = lora[next++];
    TORCH_CHECK(a.is_contiguous() && a.scalar_type() == at::kFloat && a.dim() == 2 &&
                    a.size(1) == ins[p] && a.size(0) % (n * l.slots) == 0,
                "decoder_layer: a LoRA A is not float32 [slices * slots * rank, in]");
    LoRADelta& d = l.proj[p];
    d.a = a.data_ptr<float>();
    d.in = ins[p];
    d.rank = a.size(0) / (n * l.slots);
    TORCH_CHECK(d.rank <= kMaxLoRARank, "decoder_layer: LoRA rank above 512");
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor& b = lora[next++];
      TORCH_CHECK(b.is_contiguous() && b.scalar_type() == at::kFloat && b.dim() == 2 &&
                      b.size(0) == l.slots * d.rank,
                  "decoder_layer: a LoRA B is not float32 [slots * rank, out]");
      d.b.emplace_back(b.data_ptr<float>(), b.size(1));
      d.out += b.size(1);
    }
    TORCH_CHECK(d.out == outs[p], "decoder_layer: LoRA B widths do not add up to the output");
  }
  return l;
}

using Biases = c10::List<c10::optional<at::Tensor>>;

// What one layer reads besides the step's shared inputs.
struct LayerInputs {
  at::TensorList norms;            // norm_count(form) weights
  at::TensorList weights;          // 8: (qkv, o, gate_up, down) weights and scales
  at::IntArrayRef kinds;           // 4
  const Biases* biases;            // 4 optional biases, from `bias0` on
  size_t bias0;
  const at::Tensor* cos_sin;       // the layer's rotary table
  at::Tensor cache;                // its KV cache
  const at::Tensor* block_table;   // of its KV cache group
  const at::Tensor* slots;         // of its KV cache group
  int64_t window;
};

// The step's inputs every layer shares.
struct StepInputs {
  const at::Tensor* positions;
  const at::Tensor* seq_lens;
  int64_t num_heads, form;
  double eps, scale;
  const c10::optional<at::Tensor>* lora_mask;
};

// One layer, checked and reduced to what its computation reads (`plan_layer`):
// made before the threads start, so nothing inside them can throw.
struct LayerPlan {
  Shape s;
  Linear qkv, o, gu, down;
  LoRALayer lora;
  std::vector<at::Tensor> keep;  // the float32 / contiguous copies the pointers read
  const float *n_in, *n_mlp, *n_post_attn, *n_post_mlp, *n_q, *n_k;
  float off, eps;
  bool sandwich, qk_norm, gelu, sum_output;
  const float* cos_sin;
  int64_t rot;
  void* cache;
  bool bf16_cache;
  const int64_t *pos, *slots;
  const int32_t *table, *lens;
  int64_t H, qs, kvs, inter;
};

LayerPlan plan_layer(int64_t B, int64_t H, const LayerInputs& in, const StepInputs& st,
                     at::IntArrayRef lora_slices, at::TensorList lora) {
  const int64_t form = st.form, num_heads = st.num_heads;
  TORCH_CHECK((form & ~kFormBits) == 0, "decoder_layer: unknown bits in form");
  TORCH_CHECK(in.weights.size() == 8 && in.kinds.size() == 4 && in.biases->size() >= in.bias0 + 4,
              "decoder_layer: expects 4 weights (qkv, o, gate_up, down) with scales, kinds and "
              "biases");
  TORCH_CHECK(static_cast<int64_t>(in.norms.size()) == norm_count(form),
              "decoder_layer: the norm weights do not match the layer's form");
  const at::Tensor& cache = in.cache;
  TORCH_CHECK(cache.dim() == 5 && cache.size(0) == 2 && cache.is_contiguous() &&
                  (cache.scalar_type() == at::kFloat || cache.scalar_type() == at::kBFloat16),
              "decoder_layer: cache must be contiguous float32 or bfloat16 [2, blocks, block_size, "
              "kv_heads, head_dim]");
  const at::Tensor& cos_sin = *in.cos_sin;
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.is_contiguous() &&
                  st.positions->scalar_type() == at::kLong &&
                  in.block_table->scalar_type() == at::kInt &&
                  st.seq_lens->scalar_type() == at::kInt && in.slots->scalar_type() == at::kLong,
              "decoder_layer: float32 rotary table, int64 positions and slots, int32 table and "
              "lengths");
  LayerPlan p;
  Shape& s = p.s;
  s.batch = B;
  s.num_blocks = cache.size(1);
  s.block_size = cache.size(2);
  s.num_kv = cache.size(3);
  s.head_dim = cache.size(4);
  s.num_heads = num_heads;
  s.table_width = in.block_table->size(1);
  s.scale = static_cast<float>(st.scale);
  s.window = in.window;
  const int64_t hd = s.head_dim;
  p.H = H;
  p.qs = num_heads * hd;
  p.kvs = s.num_kv * hd;
  p.rot = cos_sin.size(1);
  TORCH_CHECK(num_heads % s.num_kv == 0 && p.rot % 2 == 0 && p.rot <= hd,
              "decoder_layer: head counts or rotary size do not match the cache");
  const Biases& bs = *in.biases;
  const size_t b0 = in.bias0;
  const at::TensorList w = in.weights;
  p.qkv = with_bias(make_linear(w[0], w[1], in.kinds[0], H, "qkv_proj"), bs.get(b0), "qkv_proj");
  p.o = with_bias(make_linear(w[2], w[3], in.kinds[1], p.qs, "o_proj"), bs.get(b0 + 1), "o_proj");
  p.gu = with_bias(make_linear(w[4], w[5], in.kinds[2], H, "gate_up_proj"), bs.get(b0 + 2),
                   "gate_up_proj");
  p.inter = p.gu.out / 2;
  p.down = with_bias(make_linear(w[6], w[7], in.kinds[3], p.inter, "down_proj"), bs.get(b0 + 3),
                     "down_proj");
  TORCH_CHECK(p.qkv.out == p.qs + 2 * p.kvs && p.o.out == H && p.down.out == H &&
                  p.gu.out == 2 * p.inter,
              "decoder_layer: weight shapes do not match the hidden size and heads");
  p.lora = make_lora(*st.lora_mask, lora_slices, lora, B, {H, p.qs, H, p.inter},
                     {p.qkv.out, H, p.gu.out, H});
  p.sandwich = form & kSandwich;
  p.qk_norm = form & kQKNorm;
  p.gelu = form & kGeluTanh;
  p.sum_output = form & kSumOutput;
  p.off = (form & kNormPlusOne) ? 1.f : 0.f;
  p.eps = static_cast<float>(st.eps);
  // Norm weights as float32, in the order norm_count names them.
  std::vector<const float*> nw;
  for (size_t i = 0; i < in.norms.size(); ++i) {
    p.keep.push_back(in.norms[i].to(at::kFloat).contiguous());
    const int64_t want = (i < 2 || (p.sandwich && i < 4)) ? H : hd;
    TORCH_CHECK(p.keep.back().numel() == want, "decoder_layer: norm weight ", i, " has ",
                p.keep.back().numel(), " values, not ", want);
    nw.push_back(p.keep.back().data_ptr<float>());
  }
  p.n_in = nw[0];
  p.n_mlp = nw[1];
  p.n_post_attn = p.sandwich ? nw[2] : nullptr;
  p.n_post_mlp = p.sandwich ? nw[3] : nullptr;
  p.n_q = p.qk_norm ? nw[p.sandwich ? 4 : 2] : nullptr;
  p.n_k = p.qk_norm ? nw[p.sandwich ? 5 : 3] : nullptr;
  for (const at::Tensor* t : {st.positions, in.block_table, st.seq_lens, in.slots})
    p.keep.push_back(t->contiguous());
  const size_t k0 = p.keep.size() - 4;
  p.pos = p.keep[k0].data_ptr<int64_t>();
  p.table = p.keep[k0 + 1].data_ptr<int32_t>();
  p.lens = p.keep[k0 + 2].data_ptr<int32_t>();
  p.slots = p.keep[k0 + 3].data_ptr<int64_t>();
  TORCH_CHECK(p.keep[k0].numel() >= B && p.keep[k0 + 2].numel() >= B &&
                  p.keep[k0 + 3].numel() >= B && in.block_table->size(0) >= B,
              "decoder_layer: positions, lengths, slots and block table need a row per token");
  check_paged(s, p.table, p.lens, p.slots, "decoder_layer");
  const int64_t max_pos = cos_sin.size(0);
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(p.pos[b] >= 0 && p.pos[b] < max_pos, "decoder_layer: position past the rotary table");
  p.cos_sin = cos_sin.data_ptr<float>();
  p.bf16_cache = cache.scalar_type() == at::kBFloat16;
  p.cache = cache.data_ptr();
  return p;
}

// Buffers of one call, shared by its threads (each writes only its share).
struct Scratch {
  QuantizedRows act;  // the activations the next GEMM reads, quantized
  std::vector<float> x, qkv, q, k, attn, o, gu, h;

  void reserve(const std::vector<LayerPlan>& plans, int64_t B) {
    int64_t most_in = 0;
    for (const LayerPlan& p : plans) {
      most_in = std::max({most_in, p.H, p.qs, p.inter});
      grow(x, B * std::max(p.H, p.inter));
      grow(qkv, B * p.qkv.out);
      grow(q, B * p.qs);
      grow(k, B * p.kvs);
      grow(attn, B * p.qs);
      grow(o, B * p.H);
      grow(gu, B * p.gu.out);
      grow(h, B * p.inter);
    }
    reserve_rows(act, B, most_in);
  }

  static void grow(std::vector<float>& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  }
};

// Token r's inputs of `lin` (at x) into the shared quantized activations, grouped
// as its GEMM reads them.
void quantize_for(const Linear& lin, const float* x, int64_t r, int64_t B, QuantizedRows& act) {
  const int64_t isa = q8_path(minivllm_cpu::active_isa(), lin.grouped(), B);
  const int64_t group = lin.kind == kQ4Kind ? kQ4Group : q8_act_group(lin.in, isa);
  quantize_row(x, r, lin.in, group, isa, act);
}

// This thread's columns of y [B, out] = act @ W.T (+ bias), in runs of 16 (one q4
// tile), then a barrier; with LoRA, each row's delta on x after it (rows split,
// another barrier).  An even split measured faster than threads claiming runs as
// they go (3.3-3.5 against 3.8-3.9 ms for the default model's 30 layers at batch 1):
// each thread then reads one stretch of the weight, which the prefetches follow.
void team_linear(const Team& team, const Linear& lin, const QuantizedRows& act, int64_t B,
                 float* y, const LoRALayer& lora, int proj, const float* x) {
  const int64_t isa = minivllm_cpu::active_isa();
  const auto [u0, u1] = team.share((lin.out + kRowTile - 1) / kRowTile);
  const int64_t c0 = u0 * kRowTile, c1 = std::min(lin.out, u1 * kRowTile);
  if (lin.kind == kQ4Kind)
    q4_weight_tiles(lin.q4, act, B, lin.in, y, u0, u1, isa);
  else
    q8_rows(lin.w->data_ptr<int8_t>(), lin.row_scale(), lin.group_scale(), act, B, lin.in, lin.out, y,
            c0, c1, isa);
  if (lin.bias.defined()) {
    const float* b = lin.bias.data_ptr<float>();
    for (int64_t r = 0; r < B; ++r) {
      float* yr = y + r * lin.out;
#pragma omp simd
      for (int64_t i = c0; i < c1; ++i) yr[i] += b[i];
    }
  }
  team.sync();
  const LoRADelta& d = lora.proj[proj];
  if (d.a == nullptr) return;
  const auto [r0, r1] = team.share(B);
  for (int64_t r = r0; r < r1; ++r)
    if (lora.slot[r] >= 0) lora_row(d, lora.slots, lora.slot[r], x + r * d.in, y + r * d.out);
  team.sync();
}

// Request b's KV head h: q/k norms and rotary of its heads, its K/V row into the
// cache, then its attention.
template <typename T>
void attend_pair(const LayerPlan& p, Scratch& t, int64_t b, int64_t h, std::vector<float>& sc) {
  const Shape& s = p.s;
  const int64_t hd = s.head_dim, group = s.num_heads / s.num_kv;
  const float* row = t.qkv.data() + b * p.qkv.out;
  const float* cos = p.cos_sin + p.pos[b] * p.rot;
  const float* sin = cos + p.rot / 2;
  for (int64_t j = h * group; j < (h + 1) * group; ++j) {
    const float* src = row + j * hd;
    float* dst = t.q.data() + b * p.qs + j * hd;
    if (p.qk_norm) rms_norm(src, p.n_q, p.off, p.eps, hd, dst);
    rotate(p.qk_norm ? dst : src, cos, sin, p.rot, hd, dst);
  }
  const float* ksrc = row + p.qs + h * hd;
  float* key = t.k.data() + b * p.kvs + h * hd;
  if (p.qk_norm) rms_norm(ksrc, p.n_k, p.off, p.eps, hd, key);
  rotate(p.qk_norm ? key : ksrc, cos, sin, p.rot, hd, key);
  const float* value = row + p.qs + p.kvs + h * hd;
  T* cache = static_cast<T*>(p.cache);
  T* kc = cache + p.slots[b] * p.kvs + h * hd;
  T* vc = kc + s.num_blocks * s.block_size * p.kvs;
  for (int64_t i = 0; i < hd; ++i) {
    kc[i] = static_cast<T>(key[i]);
    vc[i] = static_cast<T>(value[i]);
  }
  one_pair_any(s, t.q.data(), cache, p.table, p.lens[b], b, h, t.attn.data(), sc);
}

// One layer on this thread's shares.  `res` [B, H] is the residual stream; `out`
// [B, H] holds the previous layer's output on entry (added to `res` first when
// `add_out`) and this layer's on return.  Row phases split the tokens the same way
// every time, so a thread reads back only rows it wrote itself between them.
void layer_on_team(const Team& team, const LayerPlan& p, Scratch& t, float* res, float* out,
                   bool add_out, int64_t B) {
  const int64_t H = p.H;
  const auto [r0, r1] = team.share(B);
  thread_local std::vector<float> scores;
  std::vector<float>& sc = scores;  // this thread's own (team threads run this too)

  // Attention block.
  for (int64_t r = r0; r < r1; ++r) {
    float* rr = res + r * H;
    if (add_out)
      for (int64_t i = 0; i < H; ++i) rr[i] += out[r * H + i];
    rms_norm(rr, p.n_in, p.off, p.eps, H, t.x.data() + r * H);
    quantize_for(p.qkv, t.x.data() + r * H, r, B, t.act);
  }
  team.sync();
  team_linear(team, p.qkv, t.act, B, t.qkv.data(), p.lora, 0, t.x.data());
  const auto [a0, a1] = team.share(B * p.s.num_kv);
  for (int64_t i = a0; i < a1; ++i) {
    if (p.bf16_cache) attend_pair<c10::BFloat16>(p, t, i / p.s.num_kv, i % p.s.num_kv, sc);
    else attend_pair<float>(p, t, i / p.s.num_kv, i % p.s.num_kv, sc);
  }
  team.sync();
  for (int64_t r = r0; r < r1; ++r) quantize_for(p.o, t.attn.data() + r * p.qs, r, B, t.act);
  team.sync();
  team_linear(team, p.o, t.act, B, t.o.data(), p.lora, 1, t.attn.data());

  // MLP block.
  for (int64_t r = r0; r < r1; ++r) {
    float* rr = res + r * H;
    float* a = t.o.data() + r * H;
    if (p.sandwich) rms_norm(a, p.n_post_attn, p.off, p.eps, H, a);
    for (int64_t i = 0; i < H; ++i) rr[i] += a[i];
    rms_norm(rr, p.n_mlp, p.off, p.eps, H, t.x.data() + r * H);
    quantize_for(p.gu, t.x.data() + r * H, r, B, t.act);
  }
  team.sync();
  team_linear(team, p.gu, t.act, B, t.gu.data(), p.lora, 2, t.x.data());
  for (int64_t r = r0; r < r1; ++r) {
    const float* row = t.gu.data() + r * p.gu.out;
    float* h = t.h.data() + r * p.inter;
    act_mul(row, row + p.inter, p.inter, p.gelu, h);
    quantize_for(p.down, h, r, B, t.act);
  }
  team.sync();
  team_linear(team, p.down, t.act, B, out, p.lora, 3, t.h.data());
  for (int64_t r = r0; r < r1; ++r) {
    float* y = out + r * H;
    if (p.sandwich) rms_norm(y, p.n_post_mlp, p.off, p.eps, H, y);
    if (p.sum_output)
      for (int64_t i = 0; i < H; ++i) y[i] += res[r * H + i];
  }
}

// Runs `plans` one after the other on one team: (out, res) after the last.  `res`
// starts as hidden (+ residual, when given).
std::tuple<at::Tensor, at::Tensor> run_layers(const at::Tensor& hidden,
                                              const c10::optional<at::Tensor>& residual,
                                              const std::vector<LayerPlan>& plans) {
  const int64_t B = hidden.size(0), H = hidden.size(1);
  at::Tensor res = at::empty({B, H}, hidden.options());
  at::Tensor out = at::empty({B, H}, hidden.options());
  float* rp = res.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* hp = hidden.data_ptr<float>();
  if (residual.has_value()) {
    const at::Tensor r0 = residual->to(at::kFloat).contiguous();
    TORCH_CHECK(r0.sizes() == hidden.sizes(), "decoder_layer: residual and hidden differ in shape");
    const float* r0p = r0.data_ptr<float>();
    for (int64_t i = 0; i < B * H; ++i) rp[i] = hp[i] + r0p[i];
  } else {
    std::copy(hp, hp + B * H, rp);
  }
  thread_local Scratch scratch;
  // The team's threads reach the caller's buffers through this reference, not
  // through the thread_local's name (which would be each thread's own).
  Scratch& t = scratch;
  t.reserve(plans, B);
  run_team([&](const Team& team) {
    // No barrier between layers: a layer ends with its own rows (the split the next
    // layer's first phase uses too), after the last GEMM's barrier.
    for (size_t l = 0; l < plans.size(); ++l) layer_on_team(team, plans[l], t, rp, op, l > 0, B);
  });
  return {out, res};
}

void check_hidden(const at::Tensor& hidden) {
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "decoder_layer: hidden must be contiguous float32 [tokens, hidden]");
}

std::tuple<at::Tensor, at::Tensor> decoder_layer(
    const at::Tensor& hidden, const c10::optional<at::Tensor>& residual, at::TensorList norms,
    at::TensorList weights, at::IntArrayRef kinds, const Biases& biases, const at::Tensor& cos_sin,
    const at::Tensor& positions, at::Tensor cache, const at::Tensor& block_table,
    const at::Tensor& seq_lens, const at::Tensor& slots, int64_t num_heads, double eps,
    double scale, int64_t window, int64_t form, const c10::optional<at::Tensor>& lora_mask,
    at::IntArrayRef lora_slices, at::TensorList lora) {
  check_hidden(hidden);
  const LayerInputs in{norms, weights, kinds, &biases, 0, &cos_sin, cache, &block_table, &slots,
                       window};
  const StepInputs st{&positions, &seq_lens, num_heads, form, eps, scale, &lora_mask};
  std::vector<LayerPlan> plans;
  plans.push_back(plan_layer(hidden.size(0), hidden.size(1), in, st, lora_slices, lora));
  return run_layers(hidden, residual, plans);
}

// All of a model's decoder layers in one call: `decoder_layer` for each, the
// first without a residual.  Per layer: norm_count(form) weights in `norms`, 8
// tensors in `weights`, 4 kinds in `kinds` and 4 optional biases in `biases` (as
// `decoder_layer` takes them), its rotary table in `cos_sins`, its KV cache
// (an index into `caches` in `cache_index`), its KV cache group in `groups` (an
// index into `block_tables` and `slots`) and its sliding window in `windows`.
// Layers of different groups may share one cache tensor (Gemma 3's six groups
// share three): each tensor is listed once, so the op's in-place writes to it
// are one mutated input, never two aliases of it that a traced graph would
// copy back one over the other.  With `kSumOutput` in `form` the
// last layer's output carries the residual added.  With LoRA, 4 counts per layer
// in `lora_slices` and the layers' `lora` tensors one layer after the other.  One
// op call per step instead of one per layer, and one team of threads for all
// the layers (`run_team`).
std::tuple<at::Tensor, at::Tensor> decoder_stack(
    const at::Tensor& hidden, at::TensorList norms, at::TensorList weights, at::IntArrayRef kinds,
    const Biases& biases, at::TensorList cos_sins, const at::Tensor& positions,
    at::TensorList caches, at::IntArrayRef cache_index, at::TensorList block_tables,
    const at::Tensor& seq_lens, at::TensorList slots, at::IntArrayRef groups, int64_t num_heads,
    double eps, double scale, at::IntArrayRef windows, int64_t form,
    const c10::optional<at::Tensor>& lora_mask, at::IntArrayRef lora_slices, at::TensorList lora) {
  check_hidden(hidden);
  const size_t layers = cache_index.size();
  const size_t per = static_cast<size_t>(norm_count(form));
  TORCH_CHECK(layers > 0 && norms.size() == per * layers && weights.size() == 8 * layers &&
                  kinds.size() == 4 * layers && biases.size() == 4 * layers &&
                  cos_sins.size() == layers && groups.size() == layers &&
                  windows.size() == layers,
              "decoder_stack: per layer its norms, 8 weight tensors, 4 kinds, 4 biases, a rotary "
              "table, a KV cache, a KV cache group and a window");
  TORCH_CHECK(block_tables.size() == slots.size(), "decoder_stack: a block table and slots per group");
  TORCH_CHECK(lora.empty() || lora_slices.size() == 4 * layers,
              "decoder_stack: 4 lora_slices per layer");
  std::vector<LayerPlan> plans;
  plans.reserve(layers);
  size_t next = 0;
  for (size_t l = 0; l < layers; ++l) {
    const int64_t g = groups[l], c = cache_index[l];
    TORCH_CHECK(c >= 0 && c < static_cast<int64_t>(caches.size()),
                "decoder_stack: a layer's KV cache index is out of range");
    TORCH_CHECK(g >= 0 && g < static_cast<int64_t>(block_tables.size()),
                "decoder_stack: a layer's KV cache group has no block table");
    at::IntArrayRef counts = lora.empty() ? at::IntArrayRef() : lora_slices.slice(4 * l, 4);
    const size_t n = lora.empty() ? 0 : static_cast<size_t>(lora_tensors(counts));
    TORCH_CHECK(next + n <= lora.size(), "decoder_stack: too few lora tensors");
    const LayerInputs in{norms.slice(per * l, per), weights.slice(8 * l, 8), kinds.slice(4 * l, 4),
                         &biases, 4 * l, &cos_sins[l], caches[c], &block_tables[g], &slots[g],
                         windows[l]};
    const int64_t layer_form = l + 1 == layers ? form : form & ~kSumOutput;
    const StepInputs st{&positions, &seq_lens, num_heads, layer_form, eps, scale, &lora_mask};
    plans.push_back(
        plan_layer(hidden.size(0), hidden.size(1), in, st, counts, lora.slice(next, n)));
    next += n;
  }
  return run_layers(hidden, c10::nullopt, plans);
}

// What `decoder_stack` takes that stays the same from step to step (the layers'
// norms, weights, biases, rotary tables and KV caches, and the shapes), held once
// by `decoder_stack_bind` so that a step passes only its own inputs
// (`decoder_stack_bound`): a 30-layer model's stack call had ~480 list entries,
// each a graph input the compiled decode step gathered, checked and boxed every
// step.  Without LoRA only (its slots and masks are read per call).
struct StackBinding {
  std::vector<at::Tensor> norms, weights, cos_sins, caches;
  std::vector<int64_t> kinds, cache_index, groups, windows;
  Biases biases;
  int64_t num_heads = 0, form = 0;
  double eps = 0, scale = 0;
};

std::mutex g_bindings_mutex;
std::unordered_map<int64_t, std::shared_ptr<const StackBinding>> g_bindings;
int64_t g_next_binding = 1;

int64_t decoder_stack_bind(at::TensorList norms, at::TensorList weights, at::IntArrayRef kinds,
                           const Biases& biases, at::TensorList cos_sins, at::TensorList caches,
                           at::IntArrayRef cache_index, at::IntArrayRef groups, int64_t num_heads,
                           double eps, double scale, at::IntArrayRef windows, int64_t form) {
  auto b = std::make_shared<StackBinding>();
  b->norms = norms.vec();
  b->weights = weights.vec();
  b->cos_sins = cos_sins.vec();
  b->caches = caches.vec();
  b->kinds = kinds.vec();
  b->cache_index = cache_index.vec();
  b->groups = groups.vec();
  b->windows = windows.vec();
  for (const c10::optional<at::Tensor>& bias : biases) b->biases.push_back(bias);
  b->num_heads = num_heads;
  b->form = form;
  b->eps = eps;
  b->scale = scale;
  std::lock_guard<std::mutex> lock(g_bindings_mutex);
  const int64_t id = g_next_binding++;
  g_bindings.emplace(id, std::move(b));
  return id;
}

void decoder_stack_unbind(int64_t binding) {
  std::lock_guard<std::mutex> lock(g_bindings_mutex);
  g_bindings.erase(binding);
}

// `decoder_stack` of a bound stack: `binding` is a one-element int64 tensor holding
// `decoder_stack_bind`'s number (a tensor, so that a compiled step reads it at run
// time rather than keeping the number of the process that traced it).
std::tuple<at::Tensor, at::Tensor> decoder_stack_bound(
    const at::Tensor& hidden, const at::Tensor& binding, const at::Tensor& positions,
    at::TensorList block_tables, const at::Tensor& seq_lens, at::TensorList slots) {
  TORCH_CHECK(binding.numel() == 1 && binding.scalar_type() == at::kLong && binding.is_cpu(),
              "decoder_stack_bound: the binding is one int64 on the CPU");
  const int64_t id = *binding.data_ptr<int64_t>();
  std::shared_ptr<const StackBinding> b;
  {
    std::lock_guard<std::mutex> lock(g_bindings_mutex);
    auto it = g_bindings.find(id);
    TORCH_CHECK(it != g_bindings.end(), "decoder_stack_bound: no stack is bound as ", id,
                " in this process (unbound, or traced elsewhere)");
    b = it->second;
  }
  return decoder_stack(hidden, b->norms, b->weights, b->kinds, b->biases, b->cos_sins, positions,
                       b->caches, b->cache_index, block_tables, seq_lens, slots, b->groups,
                       b->num_heads, b->eps, b->scale, b->windows, b->form, c10::nullopt, {}, {});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minivllm_cpu, m) {
  m.def(
      "decoder_stack(Tensor hidden, Tensor[] norms, Tensor[] weights, int[] kinds, "
      "Tensor?[] biases, Tensor[] cos_sins, Tensor positions, Tensor(a!)[] caches, "
      "int[] cache_index, Tensor[] block_tables, Tensor seq_lens, Tensor[] slots, int[] groups, int num_heads, "
      "float eps, float scale, int[] windows, int form, Tensor? lora_mask, int[] lora_slices, "
      "Tensor[] lora) -> (Tensor, Tensor)");
  m.def(
      "decoder_stack_bind(Tensor[] norms, Tensor[] weights, int[] kinds, Tensor?[] biases, "
      "Tensor[] cos_sins, Tensor[] caches, int[] cache_index, int[] groups, int num_heads, "
      "float eps, float scale, int[] windows, int form) -> int");
  m.def("decoder_stack_unbind(int binding) -> ()");
  m.def(
      "decoder_stack_bound(Tensor hidden, Tensor binding, Tensor positions, "
      "Tensor[] block_tables, Tensor seq_lens, Tensor[] slots) -> (Tensor, Tensor)");
  m.def(
      "decoder_layer(Tensor hidden, Tensor? residual, Tensor[] norms, Tensor[] weights, "
      "int[] kinds, Tensor?[] biases, Tensor cos_sin, Tensor positions, Tensor(a!) cache, "
      "Tensor block_table, Tensor seq_lens, Tensor slots, int num_heads, float eps, float scale, "
      "int window, int form, Tensor? lora_mask, int[] lora_slices, Tensor[] lora) -> "
      "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(minivllm_cpu, CPU, m) {
  m.impl("decoder_layer", decoder_layer);
  m.impl("decoder_stack", decoder_stack);
  m.impl("decoder_stack_bound", decoder_stack_bound);
}

TORCH_LIBRARY_IMPL(minivllm_cpu, CompositeExplicitAutograd, m) {
  m.impl("decoder_stack_bind", decoder_stack_bind);
  m.impl("decoder_stack_unbind", decoder_stack_unbind);
}
