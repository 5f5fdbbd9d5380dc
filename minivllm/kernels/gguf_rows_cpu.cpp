// Selected rows of a raw GGUF table, gathered and expanded to float32 in one pass:
// the embedding lookup and the LM head's exact top logits read a few rows of the
// file's blocks every decode step (`gguf_blocks.gather_rows`).
//
// Each format's values come out exactly as gguf-py's `gguf.quants.dequantize` gives
// them: every product it rounds to float32 is rounded here in the same order (for
// the k-quants the per-32 scale `d * sc` and offset `dmin * m` first, then
// `scale * q - offset`), and the build's -ffp-contract=off keeps the compiler from
// fusing a multiply into an add.  Rows are independent, so a large call is split
// over ATen's threads; a few rows run on the caller's thread.

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {
namespace gguf_rows_impl {

// ggml's numeric type ids (gguf.GGMLQuantizationType).
enum Type : int64_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

// Elements per block and bytes per block of a type; {0, 0} for one not covered here.
struct Layout {
  int64_t elems, bytes;
};

Layout layout_of(int64_t type) {
  switch (type) {
    case kF32: return {1, 4};
    case kF16: return {1, 2};
    case kBF16: return {1, 2};
    case kQ4_0: return {32, 18};
    case kQ4_1: return {32, 20};
    case kQ5_0: return {32, 22};
    case kQ5_1: return {32, 24};
    case kQ8_0: return {32, 34};
    case kQ4_K: return {256, 144};
    case kQ5_K: return {256, 176};
    case kQ6_K: return {256, 210};
    default: return {0, 0};
  }
}

// The float16 at `p` (any alignment), widened (exactly) to float32.
inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

// --- 32-element formats.  Byte j of the 16 code bytes holds element j in its low
// nibble and element j + 16 in its high one; Q5's fifth bits are bit e of a 32-bit
// little-endian word for element e.

// The 32 fifth bits at `qh`, one a byte: spread with constant shifts first, so the
// loops that use them shift every lane alike (and vectorize).
inline void fifth_bits(const uint8_t* qh, uint8_t* bits) {
  for (int k = 0; k < 4; ++k)
    for (int s = 0; s < 8; ++s) bits[8 * k + s] = (qh[k] >> s) & 1;
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1: d, then (kMin: Q4_1, Q5_1) m, then (kFive: Q5_0, Q5_1)
// the fifth bits, then the codes.  Without a min w = d * (q - bias), bias 8 or 16
// (q4 or q5); with one w = d * q + m.
template <bool kFive, bool kMin>
inline void block_32(const uint8_t* b, float* out) {
  const float d = half_at(b), m = kMin ? half_at(b + 2) : 0.f;
  const uint8_t* after = b + (kMin ? 4 : 2);
  uint8_t high[32] = {};
  if (kFive) fifth_bits(after, high);
  const uint8_t* qs = after + (kFive ? 4 : 0);
  constexpr int kBias = kFive ? 16 : 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0F) | (high[j] << 4);
    const int hi = (qs[j] >> 4) | (high[j + 16] << 4);
    if (kMin) {
      out[j] = d * static_cast<float>(lo) + m;
      out[j + 16] = d * static_cast<float>(hi) + m;
    } else {
      out[j] = d * static_cast<float>(lo - kBias);
      out[j + 16] = d * static_cast<float>(hi - kBias);
    }
  }
}

// Q8_0: d, then 32 int8 codes; w = q * d.
inline void block_q8_0(const uint8_t* b, float* out) {
  const float d = half_at(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(qs[j]) * d;
}

// --- 256-element super-blocks.

// Q4_K / Q5_K: eight 6-bit scales and eight 6-bit mins (one of each per 32 elements)
// packed into 12 bytes.  Groups 0-3 keep theirs whole in the low six bits of bytes
// 0-3 (scales) and 4-7 (mins); groups 4-7 keep their low four bits in the nibbles of
// bytes 8-11 (scale low, min high) and their top two bits in the spare top bits of
// bytes 0-3 (scales) and 4-7 (mins).
inline void k_scale_min(const uint8_t* s, int g, int* sc, int* m) {
  if (g < 4) {
    *sc = s[g] & 0x3F;
    *m = s[g + 4] & 0x3F;
  } else {
    *sc = (s[g + 4] & 0x0F) | ((s[g - 4] >> 6) << 4);
    *m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}

// Q4_K: d, dmin, the packed scales, then 128 code bytes.  Group g of 32 reads code
// bytes 32 (g / 2) .. + 31, the low nibbles for even g and the high ones for odd g;
// w = (d * sc) * q - (dmin * m).  Q5_K (kFive): the same with 32 bytes of fifth bits
// between the scales and the codes: bit g of byte l is element 32 g + l's.
template <bool kFive>
inline void block_k(const uint8_t* b, float* out) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* high = b + 16;
  const uint8_t* qs = b + (kFive ? 48 : 16);
  for (int g = 0; g < 8; ++g) {
    int sc, m;
    k_scale_min(b + 4, g, &sc, &m);
    const float scale = d * static_cast<float>(sc);
    const float offset = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (g / 2);
    const int shift = 4 * (g & 1);
    for (int l = 0; l < 32; ++l) {
      int code = (q[l] >> shift) & 0x0F;
      if (kFive) code |= ((high[l] >> g) & 1) << 4;
      out[32 * g + l] = scale * static_cast<float>(code) - offset;
    }
  }
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8 scales (one per
// 16 elements), then d; w = (d * sc) * (q - 32).  Each half of 128 elements has 64
// low bytes and 32 high bytes: element r of a half takes the nibble r / 64 of low
// byte r % 64 and the bit pair r / 32 of high byte r % 32.  The loops below walk a
// half by quarters of 32 (one nibble and one bit pair each), then by groups of 16
// (one scale each), so the innermost loop shifts every byte alike.
inline void block_q6_k(const uint8_t* b, float* out) {
  const float d = half_at(b + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* hi = b + 128 + 32 * h;
    for (int t = 0; t < 4; ++t) {
      const uint8_t* lo = b + 64 * h + 32 * (t & 1);
      const int lo_shift = 4 * (t >> 1), hi_shift = 2 * t;
      float* o = out + 128 * h + 32 * t;
      for (int k = 0; k < 2; ++k) {
        const float scale = d * static_cast<float>(sc[8 * h + 2 * t + k]);
        for (int l = 16 * k; l < 16 * k + 16; ++l) {
          const int q = ((lo[l] >> lo_shift) & 0x0F) | (((hi[l] >> hi_shift) & 0x03) << 4);
          o[l] = scale * static_cast<float>(q - 32);
        }
      }
    }
  }
}

// --- Plain formats: one element per "block".

inline void block_f32(const uint8_t* b, float* out) { std::memcpy(out, b, 4); }

inline void block_f16(const uint8_t* b, float* out) { *out = half_at(b); }

inline void block_bf16(const uint8_t* b, float* out) {
  uint16_t bits;
  std::memcpy(&bits, b, 2);
  *out = static_cast<float>(c10::BFloat16(bits, c10::BFloat16::from_bits()));
}

// Rows `ids[i0..i1)` of the table into rows i0..i1 of `out`, block by block.
template <int64_t Elems, int64_t Bytes, typename Block>
void expand_rows(const uint8_t* table, int64_t row_stride, const int64_t* ids, int64_t i0,
                 int64_t i1, int64_t dim, float* out, Block block) {
  const int64_t blocks = dim / Elems;
  for (int64_t i = i0; i < i1; ++i) {
    const uint8_t* src = table + ids[i] * row_stride;
    float* dst = out + i * dim;
    for (int64_t k = 0; k < blocks; ++k) block(src + k * Bytes, dst + k * Elems);
  }
}

// Past this many output values a call is split over ATen's threads: below it the
// work (a few microseconds) is less than waking them.
constexpr int64_t kParallelValues = int64_t{1} << 16;

template <int64_t Elems, int64_t Bytes, typename Block>
void run(const uint8_t* table, int64_t row_stride, const int64_t* ids, int64_t n, int64_t dim,
         float* out, Block block) {
  if (n * dim < kParallelValues) {
    expand_rows<Elems, Bytes>(table, row_stride, ids, 0, n, dim, out, block);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kParallelValues / 4 / dim);
  at::parallel_for(0, n, grain, [&](int64_t i0, int64_t i1) {
    expand_rows<Elems, Bytes>(table, row_stride, ids, i0, i1, dim, out, block);
  });
}

at::Tensor gguf_rows(const at::Tensor& table, const at::Tensor& ids, int64_t qtype,
                     int64_t dim) {
  TORCH_CHECK(table.device().is_cpu() && table.scalar_type() == at::kByte && table.dim() == 2,
              "gguf_rows: table must be a CPU uint8 tensor [rows, row_bytes]");
  TORCH_CHECK(table.size(1) == 0 || table.stride(1) == 1,
              "gguf_rows: each row of the table must be contiguous");
  const Layout lay = layout_of(qtype);
  TORCH_CHECK(lay.elems > 0, "gguf_rows: GGUF type ", qtype, " is not supported");
  TORCH_CHECK(dim > 0 && dim % lay.elems == 0, "gguf_rows: dim ", dim,
              " is not a multiple of the type's block size ", lay.elems);
  TORCH_CHECK(table.size(1) == dim / lay.elems * lay.bytes, "gguf_rows: rows of ",
              table.size(1), " bytes do not hold ", dim, " values of GGUF type ", qtype,
              " (", dim / lay.elems * lay.bytes, " bytes)");
  TORCH_CHECK(ids.device().is_cpu(), "gguf_rows: ids must be on the CPU");
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong).contiguous();
  const int64_t n = flat.numel(), rows = table.size(0);
  const int64_t* idx = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(idx[i] >= 0 && idx[i] < rows, "gguf_rows: id ", idx[i],
                " is out of range for a table of ", rows, " rows");

  at::Tensor out = at::empty({n, dim}, table.options().dtype(at::kFloat));
  if (n == 0) return out;
  const uint8_t* base = table.data_ptr<uint8_t>();
  const int64_t stride = table.stride(0);
  float* dst = out.data_ptr<float>();
  switch (qtype) {
    case kF32: run<1, 4>(base, stride, idx, n, dim, dst, block_f32); break;
    case kF16: run<1, 2>(base, stride, idx, n, dim, dst, block_f16); break;
    case kBF16: run<1, 2>(base, stride, idx, n, dim, dst, block_bf16); break;
    case kQ4_0: run<32, 18>(base, stride, idx, n, dim, dst, (block_32<false, false>)); break;
    case kQ4_1: run<32, 20>(base, stride, idx, n, dim, dst, (block_32<false, true>)); break;
    case kQ5_0: run<32, 22>(base, stride, idx, n, dim, dst, (block_32<true, false>)); break;
    case kQ5_1: run<32, 24>(base, stride, idx, n, dim, dst, (block_32<true, true>)); break;
    case kQ8_0: run<32, 34>(base, stride, idx, n, dim, dst, block_q8_0); break;
    case kQ4_K: run<256, 144>(base, stride, idx, n, dim, dst, block_k<false>); break;
    case kQ5_K: run<256, 176>(base, stride, idx, n, dim, dst, block_k<true>); break;
    case kQ6_K: run<256, 210>(base, stride, idx, n, dim, dst, block_q6_k); break;
    default: TORCH_CHECK(false, "gguf_rows: GGUF type ", qtype, " is not supported");
  }
  return out;
}

}  // namespace gguf_rows_impl
}  // namespace

TORCH_LIBRARY_FRAGMENT(minivllm_cpu, m) {
  m.def("gguf_rows(Tensor table, Tensor ids, int qtype, int dim) -> Tensor");
}

TORCH_LIBRARY_IMPL(minivllm_cpu, CPU, m) { m.impl("gguf_rows", gguf_rows_impl::gguf_rows); }
