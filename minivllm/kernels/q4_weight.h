// A q4-tiled weight as the ops receive it (its codes and its scales), read into
// runs of output rows that share one scale form (q4_scales.h), and the GEMM over
// them.  One form is the usual case; a weight stacked from GGUF tensors of
// different types (Q4_K q and k with a Q6_K v) keeps each part in its own form
// instead of all of it as int8, so it stays the file's bytes.
//
// The scales tensor says how to read it:
// * float16 [N, K / 32]: the offset form; other float16 (N K / 16 values): pair;
//   uint8 (N K / 16 bytes, K a multiple of 256): super; int8 (9 N K / 128 bytes):
//   six.  The codes are N K / 2 bytes of tiles, then the fifth bits' plane (N K / 8
//   bytes: q5; the offset form's bias is then 16, else 8) and, for six, the sixth
//   bits' plane (N K / 8 more).
// * int32 [N, ...]: stacked segments.  Words 0-3: the segment count S, K, 0, 0;
//   then for each segment 8 words: its rows, its form, the byte offset and size of
//   its codes in the weight, the byte offset (from the scales' start) and size of
//   its scales, 0, 0.  Segment i's rows follow segment i - 1's.

#pragma once

#include <vector>

namespace {

// Output rows [row0, row0 + rows) of a weight, all in one scale form.
struct Q4Segment {
  int64_t row0, rows;
  const uint8_t* w;
  const uint8_t* hb;  // the fifth bits' plane (q5, q6), or nullptr
  Q4Scales scales;
};

struct Q4Weight {
  int64_t N;
  std::vector<Q4Segment> segs;
};

// One segment from its codes' and scales' bytes, checked against its rows and K.
inline Q4Segment q4_segment(const uint8_t* w, int64_t w_bytes, const uint8_t* s, int64_t s_bytes,
                            int form, int64_t rows, int64_t K, const char* op) {
  TORCH_CHECK(form >= kPairForm && form <= kSixForm, op, ": unknown scale form ", form);
  TORCH_CHECK(rows > 0 && rows % kRowTile == 0, op, ": outputs must be a multiple of 16");
  TORCH_CHECK(form == kPairForm || form == kOffsetForm || K % kSuperInputs == 0, op,
              ": super-block scales need inputs a multiple of 256");
  Q4Scales sc;
  sc.form = form;
  sc.p = s;
  sc.tile_bytes = q4_tile_scale_bytes(form, K / kQ4Group);
  TORCH_CHECK(rows / kRowTile * sc.tile_bytes == s_bytes, op, ": scales do not match the inputs");
  const int64_t q4_bytes = rows * K / 2, plane = rows * K / 8;
  if (form == kSixForm) {  // both planes, always
    TORCH_CHECK(w_bytes == q4_bytes + 2 * plane, op, ": weight does not match its scales");
    sc.sixth = plane;
  } else {
    TORCH_CHECK(w_bytes == q4_bytes || w_bytes == q4_bytes + plane, op,
                ": weight does not match its scales");
  }
  const uint8_t* hb = w_bytes == q4_bytes ? nullptr : w + q4_bytes;
  sc.bias = hb == nullptr ? 8.f : 16.f;
  return {0, rows, w, hb, sc};
}

inline Q4Weight q4_weight(const at::Tensor& qweight, const at::Tensor& scales, int64_t K,
                          const char* op) {
  TORCH_CHECK(K % kQ4Group == 0, op, ": inputs must be a multiple of 32");
  TORCH_CHECK(qweight.scalar_type() == at::kByte && qweight.is_contiguous(), op, ": uint8 tiles");
  TORCH_CHECK(scales.is_contiguous(), op, ": contiguous scales");
  const uint8_t* w = qweight.data_ptr<uint8_t>();
  const auto* s = static_cast<const uint8_t*>(scales.data_ptr());
  const int64_t groups = K / kQ4Group, w_bytes = qweight.numel(), s_bytes = scales.nbytes();
  Q4Weight q;
  if (scales.scalar_type() == at::kInt) {  // stacked segments
    const int32_t* h = scales.data_ptr<int32_t>();
    TORCH_CHECK(scales.numel() >= 4 && h[0] > 0 && scales.numel() >= 4 + 8 * h[0] && h[1] == K,
                op, ": stacked scales do not match the inputs");
    int64_t row0 = 0;
    for (int32_t i = 0; i < h[0]; ++i) {
      const int32_t* e = h + 4 + 8 * i;
      TORCH_CHECK(e[2] >= 0 && e[3] >= 0 && e[2] + int64_t{e[3]} <= w_bytes && e[4] >= 0 &&
                      e[5] >= 0 && e[4] + int64_t{e[5]} <= s_bytes,
                  op, ": a stacked segment lies outside its tensors");
      Q4Segment seg = q4_segment(w + e[2], e[3], s + e[4], e[5], e[1], e[0], K, op);
      seg.row0 = row0;
      row0 += seg.rows;
      q.segs.push_back(seg);
    }
    q.N = row0;
    return q;
  }
  const auto type = scales.scalar_type();
  TORCH_CHECK(type == at::kHalf || type == at::kByte || type == at::kChar, op,
              ": float16, uint8, int8 or int32 scales");
  const int form = type == at::kChar   ? kSixForm
                   : type == at::kByte ? kSuperForm
                   : scales.dim() == 2 && scales.size(1) == groups ? kOffsetForm
                                                                    : kPairForm;
  TORCH_CHECK(form == kPairForm || form == kOffsetForm || K % kSuperInputs == 0, op,
              ": super-block scales need inputs a multiple of 256");
  q.N = s_bytes / q4_tile_scale_bytes(form, groups) * kRowTile;
  q.segs.push_back(q4_segment(w, w_bytes, s, s_bytes, form, q.N, K, op));
  return q;
}

// Output tiles [t0, t1) (columns [16 t0, 16 t1)) of out [M, N], segment by segment.
inline void q4_weight_tiles(const Q4Weight& q, const QuantizedRows& a, int64_t M, int64_t K,
                            float* out, int64_t t0, int64_t t1, int64_t isa) {
  for (const Q4Segment& s : q.segs) {
    const int64_t first = s.row0 / kRowTile, last = first + s.rows / kRowTile;
    const int64_t lo = std::max(t0, first), hi = std::min(t1, last);
    // The segment's tiles, numbered from its own first; its outputs N apart.
    if (lo < hi) q4_tiles(s.w, s.hb, s.scales, a, M, K, q.N, out + s.row0, lo - first, hi - first, isa);
  }
}

// The whole q4 GEMM, on ATen's threads.
void q4_gemm_raw(const float* x, int64_t M, int64_t K, const Q4Weight& q, float* out,
                 QuantizedRows& a) {
  const int64_t isa = minivllm_cpu::active_isa();
  quantize_rows(x, M, K, kQ4Group, isa, a);
  at::parallel_for(0, q.N / kRowTile, 1, [&](int64_t t0, int64_t t1) {
    q4_weight_tiles(q, a, M, K, out, t0, t1, isa);
  });
}

}  // namespace
