// The ``minivllm_cpu`` low-bit GEMM ops: torch wrappers around lowbit_kernels.h
// (the kernels, their weight layouts and code paths are described there).

#include "lowbit_kernels.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace {

at::Tensor float_rows(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, "expected [rows, inputs] activations");
  return x.to(at::kFloat).contiguous();
}

// out[M, N] = x[M, K] @ W.T for a q4- or q5-tiled weight (layout: lowbit_kernels.h).
at::Tensor q4_gemm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales) {
  const at::Tensor xf = float_rows(x);
  const int64_t M = xf.size(0), K = xf.size(1);
  const Q4Weight q = q4_weight(qweight, scales, K, "q4_gemm");
  at::Tensor out = at::empty({M, q.N}, xf.options());
  thread_local QuantizedRows a;
  q4_gemm_raw(xf.data_ptr<float>(), M, K, q, out.data_ptr<float>(), a);
  return out;
}

// A q8 weight for K inputs: row-major int8 [outputs, K], K a multiple of 64.
void check_q8_weight(const at::Tensor& qweight, int64_t K, const char* op) {
  TORCH_CHECK(K % kQ8Group == 0, op, ": inputs must be a multiple of 64");
  TORCH_CHECK(qweight.scalar_type() == at::kChar && qweight.is_contiguous() && qweight.dim() == 2 &&
                  qweight.size(1) == K,
              op, ": weight must be int8 [outputs, inputs]");
}

// out[M, N] = x[M, K] @ (W * scale).T for row-major int8 W [N, K]: `scale` is one
// value per row (any float dtype, read as float32), or float16 [N, K / 32], one per
// 32 inputs of each row (Q8_0's scales: the file's values, as stored).
at::Tensor q8_gemm(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale,
                   bool amx) {
  const at::Tensor xf = float_rows(x);
  const int64_t M = xf.size(0), K = xf.size(1);
  check_q8_weight(qweight, K, "q8_gemm");
  const int64_t N = qweight.size(0);
  const bool grouped = scale.dim() == 2;
  TORCH_CHECK(!grouped || (scale.scalar_type() == at::kHalf && scale.is_contiguous() &&
                           scale.size(0) == N && scale.size(1) == K / kQ8WGroup),
              "q8_gemm: group scales must be float16 [outputs, inputs / 32]");
  const at::Tensor rs = grouped ? scale : scale.to(at::kFloat).contiguous();
  TORCH_CHECK(grouped || rs.numel() == N, "q8_gemm: one scale per output row");
  at::Tensor out = at::empty({M, N}, xf.options());
  thread_local QuantizedRows a;
  q8_gemm_raw(xf.data_ptr<float>(), M, K, qweight.data_ptr<int8_t>(),
              grouped ? nullptr : rs.data_ptr<float>(),
              grouped ? rs.data_ptr<c10::Half>() : nullptr, N, out.data_ptr<float>(), a, amx);
  return out;
}

// Coarse logits (`q8_gemm_coarse_raw`): one int8 term a token, per-row scales,
// AVX-512 VNNI only (the op's caller checks `lowbit_isa` first).
at::Tensor q8_gemm_coarse(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scale) {
  const at::Tensor xf = float_rows(x);
  const int64_t M = xf.size(0), K = xf.size(1);
  TORCH_CHECK(minivllm_cpu::active_isa() == kAvx512, "q8_gemm_coarse: needs AVX-512 VNNI");
  check_q8_weight(qweight, K, "q8_gemm_coarse");
  const int64_t N = qweight.size(0);
  const at::Tensor rs = scale.to(at::kFloat).contiguous();
  TORCH_CHECK(rs.numel() == N, "q8_gemm_coarse: one scale per output row");
  at::Tensor out = at::empty({M, N}, xf.options());
  thread_local QuantizedRows a;
#if defined(__x86_64__)
  q8_gemm_coarse_raw(xf.data_ptr<float>(), M, K, qweight.data_ptr<int8_t>(), rs.data_ptr<float>(),
                     N, out.data_ptr<float>(), a);
#endif
  return out;
}

// Logits from a q8-tiled LM head (`q8_tiled_gemm_raw`): `tiles` uint8 [N / 16, K / 4,
// 64] (lowbit_kernels.h's q8 tiles), one float32 scale per row, `terms` int8 terms a
// token (1 or 2); AVX-512 VNNI only.
at::Tensor q8_tiled_gemm(const at::Tensor& x, const at::Tensor& tiles, const at::Tensor& scale,
                         int64_t terms) {
  const at::Tensor xf = float_rows(x);
  const int64_t M = xf.size(0), K = xf.size(1);
  TORCH_CHECK(minivllm_cpu::active_isa() == kAvx512, "q8_tiled_gemm: needs AVX-512 VNNI");
  TORCH_CHECK(K % kQ8Group == 0, "q8_tiled_gemm: inputs must be a multiple of 64");
  TORCH_CHECK(tiles.scalar_type() == at::kByte && tiles.is_contiguous() && tiles.dim() == 3 &&
                  tiles.size(1) == K / 4 && tiles.size(2) == 64,
              "q8_tiled_gemm: tiles must be uint8 [outputs / 16, inputs / 4, 64]");
  const int64_t N = tiles.size(0) * 16;
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == N,
              "q8_tiled_gemm: one float32 scale per output row");
  TORCH_CHECK(terms == 1 || terms == 2, "q8_tiled_gemm: one or two int8 terms a token");
  at::Tensor out = at::empty({M, N}, xf.options());
  thread_local QuantizedRows a;
#if defined(__x86_64__)
  q8_tiled_gemm_raw(xf.data_ptr<float>(), M, K, tiles.data_ptr<uint8_t>(), scale.data_ptr<float>(),
                    N, out.data_ptr<float>(), a, terms);
#endif
  return out;
}

// Tile t's rows as dense values, one scalar at a time (any CPU; any dtype via float).
void dequantize_tile_portable(const uint8_t* w, const uint8_t* hb, const Q4Scales& sm, int64_t K,
                              int64_t t, float* o) {
  const bool six = sm.form == kSixForm;
  float sc[kRowTile], mn[kRowTile], second[kRowTile];
  for (int64_t c = 0; c < K / 8; ++c) {
    const uint8_t* b = w + (t * (K / 8) + c) * 64;
    if (c % 4 == 0 && six) six_scales_scalar(sm.tile(t), c / 4, sc, second);
    else if (c % 4 == 0) group_scales_scalar(sm, sm.tile(t), c / 4, sc, mn);
    uint64_t m_lo = 0, m_hi = 0, m6_lo = 0, m6_hi = 0;
    if (hb != nullptr) {
      std::memcpy(&m_lo, hb + (t * (K / 8) + c) * 16, 8);
      std::memcpy(&m_hi, hb + (t * (K / 8) + c) * 16 + 8, 8);
    }
    if (six) {
      std::memcpy(&m6_lo, hb + sm.sixth + (t * (K / 8) + c) * 16, 8);
      std::memcpy(&m6_hi, hb + sm.sixth + (t * (K / 8) + c) * 16 + 8, 8);
    }
    for (int r = 0; r < kRowTile; ++r) {
      float* row = o + (t * kRowTile + r) * K + c * 8;
      for (int j = 0; j < 4; ++j) {
        const int bit = 4 * r + j;
        const int lo = (b[bit] & 0x0F) | static_cast<int>((m_lo >> bit) & 1) << 4 |
                       static_cast<int>((m6_lo >> bit) & 1) << 5;
        const int hi = (b[bit] >> 4) | static_cast<int>((m_hi >> bit) & 1) << 4 |
                       static_cast<int>((m6_hi >> bit) & 1) << 5;
        if (six) {  // d sc (q - 32), rounded once as gguf rounds it
          const float s = (c % 4) < 2 ? sc[r] : second[r];
          row[j] = (lo - 32) * s;
          row[4 + j] = (hi - 32) * s;
          continue;
        }
        row[j] = lo * sc[r] + mn[r];
        row[4 + j] = hi * sc[r] + mn[r];
      }
    }
  }
}

#if defined(__x86_64__)
// 16 floats as bfloat16, rounded to nearest even (finite values): the high half of
// each float plus 0x7FFF and its lowest kept bit.
__attribute__((target("avx512f"))) inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(up, 16));
}

// The same values as the portable form (a product, then a sum: no fused
// multiply-add), a group of 32 inputs of one row at a time: the row's four bytes of
// each of the group's four blocks hold its 32 codes.  Written as float32, or as
// bfloat16 rounded to nearest even as a tensor's `.to` rounds (finite values).
template <bool kBf16>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void dequantize_tile_avx512(
    const uint8_t* w, const uint8_t* hb, const Q4Scales& sm, int64_t K, int64_t t, void* out) {
  const int64_t groups = K / kQ4Group;
  const __m128i low = _mm_set1_epi8(0x0F), sixteen = _mm_set1_epi8(16);
  const bool six = sm.form == kSixForm;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* b = w + (t * (K / 8) + 4 * g) * 64;
    __m512 scales, mins;  // six form: the scales of the group's two halves
    if (six) six_scales_avx512(sm.tile(t), g, scales, mins);
    else group_scales_avx512(sm, sm.tile(t), g, scales, mins);
    alignas(64) float sc[kRowTile], mn[kRowTile];
    _mm512_store_ps(sc, scales);
    _mm512_store_ps(mn, mins);
    uint64_t planes[4][2] = {}, sixth[4][2] = {};
    if (hb != nullptr) std::memcpy(planes, hb + (t * (K / 8) + 4 * g) * 16, sizeof(planes));
    if (six) std::memcpy(sixth, hb + sm.sixth + (t * (K / 8) + 4 * g) * 16, sizeof(sixth));
    for (int r = 0; r < kRowTile; ++r) {
      int32_t d[4];
      for (int c = 0; c < 4; ++c) std::memcpy(&d[c], b + c * 64 + 4 * r, 4);
      const __m128i v = _mm_setr_epi32(d[0], d[1], d[2], d[3]);
      __m128i lo = _mm_and_si128(v, low), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low);
      if (hb != nullptr) {  // the fifth bits of row r: bits 4 r .. 4 r + 3 of each block's plane
        uint32_t m_lo = 0, m_hi = 0;
        for (int c = 0; c < 4; ++c) {
          m_lo |= static_cast<uint32_t>((planes[c][0] >> (4 * r)) & 15) << (4 * c);
          m_hi |= static_cast<uint32_t>((planes[c][1] >> (4 * r)) & 15) << (4 * c);
        }
        lo = _mm_mask_add_epi8(lo, static_cast<__mmask16>(m_lo), lo, sixteen);
        hi = _mm_mask_add_epi8(hi, static_cast<__mmask16>(m_hi), hi, sixteen);
      }
      if (six) {  // the sixth bits, the same way: +32
        uint32_t m_lo = 0, m_hi = 0;
        for (int c = 0; c < 4; ++c) {
          m_lo |= static_cast<uint32_t>((sixth[c][0] >> (4 * r)) & 15) << (4 * c);
          m_hi |= static_cast<uint32_t>((sixth[c][1] >> (4 * r)) & 15) << (4 * c);
        }
        const __m128i thirty_two = _mm_set1_epi8(32);
        lo = _mm_mask_add_epi8(lo, static_cast<__mmask16>(m_lo), lo, thirty_two);
        hi = _mm_mask_add_epi8(hi, static_cast<__mmask16>(m_hi), hi, thirty_two);
      }
      // Inputs 8 c .. 8 c + 3 are block c's low nibbles, 8 c + 4 .. 8 c + 7 its high ones.
      const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi32(lo, hi)));
      const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi32(lo, hi)));
      __m512 v0, v1;
      if (six) {  // d sc (q - 32), each half with its scale, rounded once as gguf rounds it
        const __m512 off = _mm512_set1_ps(32.f);
        v0 = _mm512_mul_ps(_mm512_sub_ps(q0, off), _mm512_set1_ps(sc[r]));
        v1 = _mm512_mul_ps(_mm512_sub_ps(q1, off), _mm512_set1_ps(mn[r]));
      } else {
        const __m512 sr = _mm512_set1_ps(sc[r]), mr = _mm512_set1_ps(mn[r]);
        v0 = _mm512_add_ps(_mm512_mul_ps(q0, sr), mr);
        v1 = _mm512_add_ps(_mm512_mul_ps(q1, sr), mr);
      }
      const int64_t at = (t * kRowTile + r) * K + g * kQ4Group;
      if constexpr (kBf16) {
        auto* o = reinterpret_cast<__m256i*>(static_cast<c10::BFloat16*>(out) + at);
        _mm256_storeu_si256(o, to_bf16(v0));
        _mm256_storeu_si256(o + 1, to_bf16(v1));
      } else {
        _mm512_storeu_ps(static_cast<float*>(out) + at, v0);
        _mm512_storeu_ps(static_cast<float*>(out) + at + 16, v1);
      }
    }
  }
}
#endif

// Rows [row0, row0 + rows) of the dense [N, K] weight of a q4- or q5-tiled one (all
// of it with rows < 0), in `dtype` (large batches, a band of rows at a time, and
// tests), on ATen's threads: an AVX-512 CPU writes float32 or bfloat16 rows directly
// (Llama-3.2-1B's 16384 x 2048 gate/up weight: 68 ms in scalar code, 18 here), others
// float32 then cast.
at::Tensor q4_dequantize(const at::Tensor& qweight, const at::Tensor& scales, int64_t K,
                         at::ScalarType dtype, int64_t row0, int64_t rows) {
  const Q4Weight q = q4_weight(qweight, scales, K, "q4_dequantize");
  if (rows < 0) rows = q.N - row0;
  TORCH_CHECK(row0 >= 0 && rows > 0 && row0 + rows <= q.N && row0 % kRowTile == 0 &&
                  rows % kRowTile == 0,
              "q4_dequantize: rows [", row0, ", ", row0 + rows, ") are not whole 16-row tiles of ",
              q.N);
  // Tile t of the weight: its segment, and its number and rows' offset there.
  auto tile = [&](int64_t t) {
    for (const Q4Segment& s : q.segs)
      if (t < (s.row0 + s.rows) / kRowTile) return std::make_pair(&s, t - s.row0 / kRowTile);
    TORCH_CHECK(false, "q4_dequantize: tile past the weight");
  };
  const int64_t first = row0 / kRowTile, last = (row0 + rows) / kRowTile;
  // The kernels write a segment's tile `local` at rows 16 local on from the pointer
  // they get: the place of the segment's row 0 in the output (whose row 0 is row0).
  auto seg_rows = [&](const at::Tensor& out, const Q4Segment* s) {
    return static_cast<char*>(out.data_ptr()) + (s->row0 - row0) * K * out.element_size();
  };
#if defined(__x86_64__)
  const bool bf16 = dtype == at::kBFloat16;
  if (minivllm_cpu::active_isa() == kAvx512 && (dtype == at::kFloat || bf16)) {
    at::Tensor out = at::empty({rows, K}, qweight.options().dtype(dtype));
    at::parallel_for(first, last, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const auto [s, local] = tile(t);
        void* o = seg_rows(out, s);
        if (bf16) dequantize_tile_avx512<true>(s->w, s->hb, s->scales, K, local, o);
        else dequantize_tile_avx512<false>(s->w, s->hb, s->scales, K, local, o);
      }
    });
    return out;
  }
#endif
  at::Tensor out = at::empty({rows, K}, qweight.options().dtype(at::kFloat));
  at::parallel_for(first, last, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const auto [s, local] = tile(t);
      auto* o = reinterpret_cast<float*>(seg_rows(out, s));
      dequantize_tile_portable(s->w, s->hb, s->scales, K, local, o);
    }
  });
  return out.to(dtype);
}

// One row's columns [0, n) of `int8_mm_scale`, compiled for AVX-512, AVX2 and plain
// x86-64 (the loader picks the best this CPU runs: 8-16 lanes instead of 4), without
// fused multiply-adds, so each step rounds as the separate torch ops do.
__attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))
void scale_row(const int32_t* x, const int32_t* y, float hr, float lr, const float* sp, int64_t n,
    float* o) {
  for (int64_t c = 0; c < n; ++c) {
    const float first = static_cast<float>(x[c]) * hr;
    const float second = static_cast<float>(y[c]) * lr;
    const float sum = first + second;
    o[c] = sum * sp[c];
  }
}

// The float result of an int8 x int8 product computed for two activation terms:
// out[r, n] = (acc[r, n] * hi[r] + acc[rows + r, n] * lo[r]) * scale[n], where acc is
// the int32 [2 * rows, N] product.  One pass over acc (`scale_row`), instead of a float
// copy of acc and four passes, with the same roundings.
at::Tensor int8_mm_scale(const at::Tensor& acc, const at::Tensor& hi, const at::Tensor& lo,
                         const at::Tensor& scale) {
  TORCH_CHECK(acc.scalar_type() == at::kInt && acc.dim() == 2 && acc.size(0) % 2 == 0,
              "int8_mm_scale: acc must be int32 [2 * rows, N]");
  const at::Tensor a = acc.contiguous();
  const int64_t rows = a.size(0) / 2, N = a.size(1);
  const at::Tensor h = hi.to(at::kFloat).contiguous(), l = lo.to(at::kFloat).contiguous();
  const at::Tensor s = scale.to(at::kFloat).contiguous();
  TORCH_CHECK(h.numel() == rows && l.numel() == rows && s.numel() == N,
              "int8_mm_scale: one hi and lo scale per row, one scale per column");
  at::Tensor out = at::empty({rows, N}, a.options().dtype(at::kFloat));
  const int32_t* ap = a.data_ptr<int32_t>();
  const float *hp = h.data_ptr<float>(), *lp = l.data_ptr<float>(), *sp = s.data_ptr<float>();
  float* op = out.data_ptr<float>();
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  at::parallel_for(0, rows * blocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / blocks, c0 = (t % blocks) * kBlock, c1 = std::min(N, c0 + kBlock);
      scale_row(ap + r * N + c0, ap + (rows + r) * N + c0, hp[r], lp[r], sp + c0, c1 - c0,
                op + r * N + c0);
    }
  });
  return out;
}

int64_t g_isa = kBestIsa;

// The code path in use: `force` < 0 keeps it, otherwise sets it (capped at the
// best this CPU has).  Returns the path now in use.
int64_t lowbit_isa(int64_t force) {
  if (force >= 0) g_isa = std::min(force, kBestIsa);
  return g_isa;
}

// How far ahead (bytes) the q4 and tiled q8 kernels prefetch the weights they
// stream in one-token products: `bytes` >= 0 sets it (0: no software prefetch, the
// hardware's alone), < 0 keeps it.  Returns the distance now in use.
int64_t lowbit_prefetch(int64_t bytes) {
  TORCH_CHECK(bytes < (1 << 20), "lowbit_prefetch: at most 1 MiB ahead");
  if (bytes >= 0) g_one_token_prefetch = bytes / 64 * 64;
  return g_one_token_prefetch;
}

// Which groups of a token get the second int8 activation term (`g_residual_cut`,
// lowbit_kernels.h): `cut` >= 0 sets the share of the token's mean energy per group
// a group's remainder must exceed (0: every group), < 0 keeps it.  Returns the
// share now in use.
double lowbit_residual(double cut) {
  if (cut >= 0) g_residual_cut = static_cast<float>(cut);
  return g_residual_cut;
}

// Whether q4 GEMMs of 8 tokens or more run on AMX tiles: `force` 0 turns that off,
// 1 on (where the CPU has AMX), < 0 keeps it.  Returns the setting now in use.
int64_t lowbit_amx(int64_t force) {
  if (force >= 0) g_amx_on.store(force > 0 && kHasAmx);
  return g_amx_on.load() ? 1 : 0;
}

}  // namespace

int64_t minivllm_cpu::active_isa() { return g_isa; }
bool minivllm_cpu::isa_lowered() { return g_isa < kBestIsa; }

TORCH_LIBRARY(minivllm_cpu, m) {
  m.def("q4_gemm(Tensor x, Tensor qweight, Tensor scales) -> Tensor");
  m.def("q8_gemm(Tensor x, Tensor qweight, Tensor row_scale, bool amx=True) -> Tensor");
  m.def("q8_gemm_coarse(Tensor x, Tensor qweight, Tensor row_scale) -> Tensor");
  m.def("q8_tiled_gemm(Tensor x, Tensor tiles, Tensor row_scale, int terms) -> Tensor");
  m.def(
      "q4_dequantize(Tensor qweight, Tensor scales, int inputs, ScalarType dtype, int row0=0, "
      "int rows=-1) -> Tensor");
  m.def("int8_mm_scale(Tensor acc, Tensor hi, Tensor lo, Tensor scale) -> Tensor");
  m.def("lowbit_isa(int force) -> int", lowbit_isa);
  m.def("lowbit_amx(int force) -> int", lowbit_amx);
  m.def("lowbit_prefetch(int bytes) -> int", lowbit_prefetch);
  m.def("lowbit_residual(float cut) -> float", lowbit_residual);
}

TORCH_LIBRARY_IMPL(minivllm_cpu, CPU, m) {
  m.impl("q4_gemm", q4_gemm);
  m.impl("q8_gemm", q8_gemm);
  m.impl("q8_gemm_coarse", q8_gemm_coarse);
  m.impl("q8_tiled_gemm", q8_tiled_gemm);
  m.impl("q4_dequantize", q4_dequantize);
  m.impl("int8_mm_scale", int8_mm_scale);
}
