// Low-bit GEMMs for a few rows of activations on x86 CPUs (minivllm's own
// kernels; the torch ops in lowbit_cpu.cpp and the fused decoder layer in
// decode_layer_cpu.cpp call them).
//
// Decoding one token reads every weight once, so a decode step is as fast as
// the weights are small and read at memory speed.  These kernels read GGUF
// weights in (close to) their file size and compute on integers:
//
// * activations are quantized per group (32 or 64 values) to int8, with one
//   float scale per group, as llama.cpp does for its dot products, plus a second
//   int8 term for what that rounding left (q4; q8 on AMX and the portable path;
//   optionally only in the groups where that remainder matters, `g_residual_cut`),
//   or (q8 on AVX2 and AVX-512) to one int16 code per input;
// * int4 weights ("q4", from Q4_0 / Q4_1 / Q4_K) are unsigned codes 0..15 with a
//   scale and min per 32 inputs (held as the file holds them: q4_scales.h), tiled
//   16 output rows at a time so one
//   512-bit register holds 16 rows x 4 inputs and `vpdpbusd` (u8 x s8 -> s32)
//   gives each row its own lane: no horizontal sums;
// * int8 weights ("q8") are plain row-major int8 with one scale per output row
//   (the layout torch's `_int_mm` and `_weight_int8pack_mm` also read), or with
//   one float16 scale per 32 inputs of each row: Q8_0's blocks, split into their
//   codes and scales (the file's bytes, so read as stored).
//
// Three code paths, picked once at load from the CPU (or forced, for tests):
// AVX-512 VNNI, AVX2 (`vpmaddubsw` + `vpmaddwd`) and portable C++.  Work is
// split over output rows with ATen's thread pool.

#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Half.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "q4_scales.h"

namespace minivllm_cpu {
// The kernels' code path in use (`lowbit_isa` sets it; defined in lowbit_cpu.cpp).
int64_t active_isa();
bool isa_lowered();  // whether a test lowered it below this CPU's best
}  // namespace minivllm_cpu

namespace {

constexpr int kRowTile = 16;   // q4: output rows per tile
constexpr int kQ4Group = 32;   // q4: inputs per scale / min
constexpr int kQ8Group = 64;   // q8: inputs per activation scale (AVX-512: up to 256)
constexpr int kQ8MaxGroup = 256;
constexpr int kQ8WGroup = 32;  // q8 with group scales (Q8_0): inputs per weight scale
constexpr int kTokTile = 4;    // tokens computed together (weights unpacked once)
// How far ahead the kernels prefetch the weight stream (q4 and tiled q8: bytes, 0
// for none; row-major q8: rows).  Measured on the default model with its weights in
// 4 KiB pages (benchmarks/decode_layer.py, best of 3 interleaved rounds): the 120 q4
// GEMMs of a batch-1 step 13.7 ms without, 5.5 ms at 1 KB, 4.4 ms at 2 KB; the LM
// head 1.80 / 0.88 / 0.80 ms.  On huge pages (minivllm/worker/weight_pages.py) the
// hardware prefetchers run on across what were page boundaries, and a one-token
// product (a batch-1 decode step) is faster without software prefetch: the Qwen3
// shape's head 1.36 ms without against 1.79 at 2 KB, its layers 1.27x with the huge
// pages; with more tokens the 2 KB stay ahead (8 rows: 2.70 ms against 3.21 without).
// `lowbit_prefetch` sets the one-token distance (`g_one_token_prefetch`).
constexpr int64_t kDefaultPrefetchBytes = 2048;
constexpr int64_t kQ8PrefetchRows = 16;
int64_t g_one_token_prefetch = kDefaultPrefetchBytes;
// Which groups of a token get the second int8 term (what the first one's rounding
// left): those whose remainder's energy (sum of squares) exceeds this fraction of
// the token's mean energy per group.  0 (the default) gives every group both terms.
// A group without one costs its int8 products once instead of twice: the q4 tiles
// skip it (the q8 kernels multiply its zeros).  Measured with benchmarks/accuracy.py (teacher-forced top-1 against the
// float32 model through prefill chunks / the decode graph; SmolLM2-135M Q4_1, Gemma
// 3 270M Q4_K_M): every group 100 / 100% and 99.1 / 99.1%; 3e-5 (about half the
// groups) 98.4 / 98.3% and 98.5 / 98.3%; 1e-4 (a sixth) Gemma's decode 97.5%; one
// term everywhere 94%.  Not the default: a threshold turns the last-bit differences
// between the prefill and decode paths (attention, the fused decode layers, dense
// GEMMs of long chunks) into whole int8 terms, and greedy tokens then change with
// chunking or a prefix-cache hit (exact again with VLLM_BATCH_INVARIANT=1).
float g_residual_cut = 0.f;

// The prefetch distance of a kernel computing `term_rows` activation rows (two per
// token, x and what its rounding left).
inline int64_t prefetch_ahead(int term_rows) {
  return term_rows <= 2 ? g_one_token_prefetch : kDefaultPrefetchBytes;
}

enum Isa : int64_t { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };
// A q8 code path, not an ISA of its own: AVX-512 on int16 activation codes
// (`q8_row16_avx512`), what `q8_path` picks where the matrix unit does not run.
constexpr int64_t kAvx512W16 = 3;

int64_t detect_isa() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    return kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return kAvx2;
#endif
  return kPortable;
}

const int64_t kBestIsa = detect_isa();

// Activations of M tokens quantized per `group` inputs: int8 codes, the float
// scale of each group, and (q4) the exact float sum of each group's inputs,
// which the weights' mins multiply.  A caller that keeps one across calls
// reuses its buffers (no allocation per GEMM).
struct QuantizedRows {
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> scale;   // [M, K / group]
  std::vector<float> sum;     // [M, K / group]
  std::vector<int32_t> qsum;  // [M, K / group]: sum of the codes
  std::vector<float> sum16;   // [M, K / 16]: exact sums of 16 inputs (odd rows 0; q6 mins)
  std::vector<float> fix;     // q8: [M], 128 * sum over groups of scale * code sum
  std::vector<int16_t> q16;   // q8 on AVX2: [M, K] int16 codes, scales [M, K / 64] in `scale`
};

struct GroupStats {
  float scale, sum;
  int32_t qsum;
};

// One group: codes round(x / scale) (to nearest, ties to even, like torch.round)
// with scale = max |x| / 127.
GroupStats quantize_group_portable(const float* src, int64_t n, int8_t* dst) {
  float amax = 0.f, sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    amax = std::max(amax, std::fabs(src[i]));
    sum += src[i];
  }
  const float scale = amax / 127.f;
  const float inv = scale > 0.f ? 1.f / scale : 0.f;
  int32_t qsum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int v = static_cast<int>(std::lrintf(src[i] * inv));
    dst[i] = static_cast<int8_t>(v);
    qsum += v;
  }
  return {scale, sum, qsum};
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw")))
GroupStats quantize_group_avx512(const float* src, int64_t n, int8_t* dst) {
  __m512 amax = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_loadu_ps(src + i);
    amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    sum = _mm512_add_ps(sum, v);
  }
  const float scale = _mm512_reduce_max_ps(amax) / 127.f;
  const __m512 inv = _mm512_set1_ps(scale > 0.f ? 1.f / scale : 0.f);
  __m512i qsum = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(src + i), inv));
    qsum = _mm512_add_epi32(qsum, q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtsepi32_epi8(q));
  }
  return {scale, _mm512_reduce_add_ps(sum), _mm512_reduce_add_epi32(qsum)};
}
#endif

#if defined(__x86_64__)
// n a multiple of 32.  Codes as the portable form's (the same scale, rounding
// to nearest even); the float sum is added in another order.
__attribute__((target("avx2,fma,f16c")))
GroupStats quantize_group_avx2(const float* src, int64_t n, int8_t* dst) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 amax = _mm256_setzero_ps(), sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
    sum = _mm256_add_ps(sum, v);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  const float scale = _mm_cvtss_f32(m4) / 127.f;
  const __m256 inv = _mm256_set1_ps(scale > 0.f ? 1.f / scale : 0.f);
  // packs interleave 128-bit lanes; this puts the 32 codes back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256i qsum = _mm256_setzero_si256();
  for (int64_t i = 0; i < n; i += 32) {
    __m256i q[4];
    for (int j = 0; j < 4; ++j) {
      q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 8 * j), inv));
      qsum = _mm256_add_epi32(qsum, q[j]);
    }
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                              _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm256_permutevar8x32_epi32(packed, order));
  }
  __m128i q4 = _mm_add_epi32(_mm256_castsi256_si128(qsum), _mm256_extracti128_si256(qsum, 1));
  q4 = _mm_add_epi32(q4, _mm_shuffle_epi32(q4, 0x4E));
  q4 = _mm_add_epi32(q4, _mm_shuffle_epi32(q4, 0xB1));
  return {scale, _mm_cvtss_f32(s4), _mm_cvtsi128_si32(q4)};
}
#endif

GroupStats quantize_group(const float* src, int64_t n, int8_t* dst, int64_t isa) {
#if defined(__x86_64__)
  if (isa == kAvx512) return quantize_group_avx512(src, n, dst);
  if (isa == kAvx2) return quantize_group_avx2(src, n, dst);
#endif
  return quantize_group_portable(src, n, dst);
}

// Each token becomes two rows of codes: row 2 m quantizes x, row 2 m + 1 what
// that rounding left (x - codes * scale), so together they carry x to about
// 1/127 of one int8 quantization's error (one term alone lost ~6% top-1
// agreement on the shipped models: the rounding error of every group adds up).
// With a `g_residual_cut` above 0 the second row is kept only for the groups whose
// remainder carries a share of the token's energy above it; elsewhere its codes and
// scale are 0, which the q4 tiles skip.  The decision reads the token's own inputs alone, so a
// token quantizes alike in every batch.  The second row's sums are 0, so the q4
// mins count the exact sum once.

// Sizes `r` for M tokens of K inputs (groups of 32 or more); `quantize_row` then
// writes into it without allocating, so threads may fill different rows at once.
void reserve_rows(QuantizedRows& r, int64_t M, int64_t K) {
  // 16 rows of padding: the AMX kernel loads term rows (codes, scales, sums) 16 at
  // a time.
  const int64_t most = (2 * M + 16) * (K / kQ4Group);
  if (static_cast<int64_t>(r.q.size()) < (2 * M + 16) * K) r.q.resize((2 * M + 16) * K);
  if (static_cast<int64_t>(r.scale.size()) < most) {
    r.scale.resize(most);
    r.sum.resize(most);
    r.qsum.resize(most);
  }
  if (static_cast<int64_t>(r.sum16.size()) < (2 * M + 16) * (K / 16))
    r.sum16.resize((2 * M + 16) * (K / 16));
  if (static_cast<int64_t>(r.fix.size()) < 2 * M) r.fix.resize(2 * M);
  if (static_cast<int64_t>(r.q16.size()) < M * K) r.q16.resize(M * K);
}

#if defined(__x86_64__)
// q8 activations on AVX2 (no VNNI): token m's K inputs as one int16 code each,
// round(x / scale) with scale = max |x| / 32767 per 64 inputs, at r.q16 [m, K] and
// r.scale [m * K / 64 + g].  One term carries x to ~1/65534 of its group's largest
// input, finer than the two int8 terms, and `vpmaddwd` multiplies int16 codes by
// int8 weights widened once per row, where two terms cost the int8 products twice
// (plus the sign trick's fix-ups) on a CPU without `vpdpbusd`.
__attribute__((target("avx2,fma,f16c")))
void quantize_row16_avx2(const float* x, int64_t m, int64_t K, QuantizedRows& r) {
  const int64_t groups = K / kQ8Group;
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t g = 0; g < groups; ++g) {
    const float* src = x + g * kQ8Group;
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < kQ8Group; i += 8)
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, _mm256_loadu_ps(src + i)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float scale = _mm_cvtss_f32(m4) / 32767.f;
    const __m256 inv = _mm256_set1_ps(scale > 0.f ? 1.f / scale : 0.f);
    int16_t* dst = r.q16.data() + m * K + g * kQ8Group;
    for (int i = 0; i < kQ8Group; i += 16) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i), inv));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + i + 8), inv));
      // packs interleaves 128-bit lanes: 0xD8 puts the 16 codes back in order.
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
    }
    r.scale[m * groups + g] = scale;
  }
}
#endif

// Sum of squares of n values (a multiple of 16) in a fixed order whatever the CPU:
// 16 running lanes (lane j takes inputs j, j + 16, ...), then halved pairwise
// (lane j + 8 onto j, then + 4, + 2, + 1).  The lanes vectorize; one running sum
// would be a chain of n dependent additions a token, the cost of a whole GEMM row.
inline float sum_squares(const float* v, int64_t n) {
  float lane[16] = {};
  for (int64_t i = 0; i < n; i += 16)
    for (int j = 0; j < 16; ++j) lane[j] += v[i + j] * v[i + j];
  for (int half = 8; half >= 1; half /= 2)
    for (int j = 0; j < half; ++j) lane[j] += lane[j + half];
  return lane[0];
}

// Rows 2 m + 1 of `r` for a token whose first terms are in place: the second term
// of the groups whose remainder (`rest`, K values) holds more than `g_residual_cut`
// of the token's mean energy per group (`energy` / groups), zeros elsewhere.
void second_terms(const float* rest, const float* left, float energy, int64_t m, int64_t K,
                  int64_t group, int64_t isa, QuantizedRows& r) {
  const int64_t groups = K / group;
  const float cut = g_residual_cut * energy / static_cast<float>(groups);
  float fix_lo = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    int8_t* lo = r.q.data() + (2 * m + 1) * K + g * group;
    GroupStats b{0.f, 0.f, 0};
    if (left[g] > cut) b = quantize_group(rest + g * group, group, lo, isa);
    else std::memset(lo, 0, group);
    const int64_t i = (2 * m + 1) * groups + g;
    r.scale[i] = b.scale;
    r.sum[i] = 0.f;
    r.qsum[i] = b.qsum;
    fix_lo += 128.f * b.scale * b.qsum;
  }
  r.fix[2 * m + 1] = fix_lo;
}

// Token m (its K inputs at x) into rows 2 m and 2 m + 1 of `r` (reserved for at
// least m + 1 tokens of K inputs), laid out for K and `group`; also the q8
// kernels' per-row correction `fix` (128 * sum over groups of scale * code sum).
void quantize_row(const float* x, int64_t m, int64_t K, int64_t group, int64_t isa,
                  QuantizedRows& r) {
#if defined(__x86_64__)
  if ((isa == kAvx2 || isa == kAvx512W16) && group == kQ8Group)
    return quantize_row16_avx2(x, m, K, r);
#endif
  const int64_t groups = K / group;
  const bool cut = g_residual_cut > 0.f;
  // With a cut, each group's remainder is kept until the token's energy is known.
  thread_local std::vector<float> kept, left;
  if (cut && static_cast<int64_t>(kept.size()) < K) kept.resize(K);
  if (cut && static_cast<int64_t>(left.size()) < groups) left.resize(groups);
  float local[kQ8MaxGroup];
  float fix_hi = 0.f, fix_lo = 0.f, energy = 0.f;
  for (int64_t g = 0; g < groups; ++g) {
    const float* src = x + g * group;
    int8_t* hi = r.q.data() + 2 * m * K + g * group;
    float* rest = cut ? kept.data() + g * group : local;
    const GroupStats a = quantize_group(src, group, hi, isa);
    for (int64_t i = 0; i < group; ++i) rest[i] = src[i] - hi[i] * a.scale;
    const int64_t i = 2 * m * groups + g;
    r.scale[i] = a.scale;
    r.sum[i] = a.sum;
    r.qsum[i] = a.qsum;
    fix_hi += 128.f * a.scale * a.qsum;
    if (cut) {
      left[g] = sum_squares(rest, group);
      energy += sum_squares(src, group);
    } else {
      const GroupStats b = quantize_group(rest, group, hi + K, isa);
      r.scale[i + groups] = b.scale;
      r.sum[i + groups] = 0.f;
      r.qsum[i + groups] = b.qsum;
      fix_lo += 128.f * b.scale * b.qsum;
    }
    for (int64_t h = 0; h < group / 16; ++h) {
      float s = 0.f;
      for (int j = 0; j < 16; ++j) s += src[16 * h + j];
      const int64_t at = 2 * m * (K / 16) + g * (group / 16) + h;
      r.sum16[at] = s;
      r.sum16[at + K / 16] = 0.f;
    }
  }
  r.fix[2 * m] = fix_hi;
  r.fix[2 * m + 1] = fix_lo;
  if (cut) second_terms(kept.data(), left.data(), energy, m, K, group, isa, r);
}

void quantize_rows(const float* x, int64_t M, int64_t K, int64_t group, int64_t isa,
                   QuantizedRows& r) {
  reserve_rows(r, M, K);
  for (int64_t m = 0; m < M; ++m) quantize_row(x + m * K, m, K, group, isa, r);
}

// One int8 term a token (row m of `r`, no remainder row): for `q8_gemm_coarse`.
void quantize_rows_coarse(const float* x, int64_t M, int64_t K, int64_t group, int64_t isa,
                          QuantizedRows& r) {
  reserve_rows(r, M, K);
  const int64_t groups = K / group;
  for (int64_t m = 0; m < M; ++m) {
    float fix = 0.f;
    for (int64_t g = 0; g < groups; ++g) {
      const GroupStats a = quantize_group(x + m * K + g * group, group, r.q.data() + m * K + g * group, isa);
      r.scale[m * groups + g] = a.scale;
      fix += 128.f * a.scale * a.qsum;
    }
    r.fix[m] = fix;
  }
}

// The kernels below walk the 2 M rows of `QuantizedRows` and write token
// m = row / 2 of the [M, N] output: an even row stores its result, the odd row
// after it adds its own, so each output is (x's term) + (the rest's term).
inline void put_term(float* dst, float v, int64_t row) {
  if (row & 1) *dst += v;
  else *dst = v;
}

// ---------------------------------------------------------------------------
// q4: weight tile layout.  For output rows [16 t, 16 t + 16) and inputs
// [8 c, 8 c + 8), 64 bytes: byte 4 r + j holds row r's code for input 8 c + j in
// its low nibble and for input 8 c + 4 + j in its high nibble.  Scales: per tile,
// in one of the forms of q4_scales.h (`Q4Scales`).
//
// 5-bit weights ("q5", from Q5_0 / Q5_1 / Q5_K: codes 0..31) are the same tiles
// of their low four bits plus a plane of the fifth bits, 16 bytes per tile and
// input octet: a 64-bit mask for the low nibbles' codes (bit 4 r + j: row r's
// input 8 c + j), then one for the high nibbles'.  Bit i of a mask is byte i of
// the tile's 64 bytes, so AVX-512 applies it as a byte mask.  The plane follows
// all the tiles in the same buffer (N K / 8 bytes after N K / 2).

struct Q4Args {
  const uint8_t* w;
  const uint8_t* hb;  // the fifth bits' plane (q5), or nullptr (q4)
  Q4Scales sm;
  const QuantizedRows* a;
  float* out;
  int64_t M, K, N;
};

void q4_tile_portable(const Q4Args& p, int64_t tile) {
  const int64_t groups = p.K / kQ4Group;
  const uint8_t* w = p.w + tile * (p.K / 8) * 64;
  const uint8_t* hb = p.hb == nullptr ? nullptr : p.hb + tile * (p.K / 8) * 16;
  const uint8_t* sm = p.sm.tile(tile);
  const bool six = p.sm.form == kSixForm;
  float scale[kRowTile], mins[kRowTile], second[kRowTile];
  for (int64_t m = 0; m < p.M; ++m) {
    float acc[kRowTile] = {0};
    const int8_t* xq = p.a->q.data() + m * p.K;
    for (int64_t g = 0; g < groups; ++g) {
      int32_t dot[2][kRowTile] = {};  // the group's inputs 0-15 and 16-31
      for (int64_t c = 0; c < kQ4Group / 8; ++c) {
        const uint8_t* b = w + (g * 4 + c) * 64;
        const int8_t* xs = xq + g * kQ4Group + c * 8;
        uint64_t m_lo = 0, m_hi = 0, m6_lo = 0, m6_hi = 0;
        if (hb != nullptr) {
          std::memcpy(&m_lo, hb + (g * 4 + c) * 16, 8);
          std::memcpy(&m_hi, hb + (g * 4 + c) * 16 + 8, 8);
        }
        if (six) {
          std::memcpy(&m6_lo, hb + p.sm.sixth + (g * 4 + c) * 16, 8);
          std::memcpy(&m6_hi, hb + p.sm.sixth + (g * 4 + c) * 16 + 8, 8);
        }
        for (int r = 0; r < kRowTile; ++r)
          for (int j = 0; j < 4; ++j) {
            const uint8_t v = b[4 * r + j];
            const int bit = 4 * r + j;
            const int lo = (v & 0x0F) | static_cast<int>((m_lo >> bit) & 1) << 4 |
                           static_cast<int>((m6_lo >> bit) & 1) << 5;
            const int hi = (v >> 4) | static_cast<int>((m_hi >> bit) & 1) << 4 |
                           static_cast<int>((m6_hi >> bit) & 1) << 5;
            dot[c / 2][r] += lo * xs[j] + hi * xs[4 + j];
          }
      }
      const float xs = p.a->scale[m * groups + g];
      if (six) {  // each half its own scale; mins -32 d sc times the half's input sum
        const float* s16 = p.a->sum16.data() + m * (p.K / 16) + 2 * g;
        six_scales_scalar(sm, g, scale, second);
        for (int r = 0; r < kRowTile; ++r)
          acc[r] += scale[r] * xs * dot[0][r] + second[r] * xs * dot[1][r] +
                    (-32.f * scale[r] * s16[0] + -32.f * second[r] * s16[1]);
        continue;
      }
      const float xsum = p.a->sum[m * groups + g];
      group_scales_scalar(p.sm, sm, g, scale, mins);
      for (int r = 0; r < kRowTile; ++r)
        acc[r] += scale[r] * xs * (dot[0][r] + dot[1][r]) + mins[r] * xsum;
    }
    float* dst = p.out + (m / 2) * p.N + tile * kRowTile;
    for (int r = 0; r < kRowTile; ++r) put_term(dst + r, acc[r], m);
  }
}

#if defined(__x86_64__)
// Asks for group g's codes `ahead` bytes ahead of the kernel (`prefetch_ahead`).
inline void prefetch_group(const uint8_t* w, int64_t g, int64_t ahead) {
  if (ahead == 0) return;
  for (int c = 0; c < 4; ++c)
    _mm_prefetch(reinterpret_cast<const char*>(w + ahead + (g * 4 + c) * 64), _MM_HINT_T0);
}

// Group g's codes of a tile as the eight vectors the dot products take: octet c's
// low nibbles in lo[c], high nibbles in hi[c], each byte 0..15, plus 16 where the
// fifth bits' plane (kBits >= 5) has the bit and 32 where the sixth's (kBits 6,
// at `hb + sixth`) has it.
template <int kBits>
__attribute__((target("avx512f,avx512bw")))
inline void unpack_group_avx512(const uint8_t* __restrict w, const uint8_t* __restrict hb,
                                int64_t sixth, int64_t g, __m512i lo[4], __m512i hi[4]) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int c = 0; c < 4; ++c) {
    const __m512i v = _mm512_loadu_si512(w + (g * 4 + c) * 64);
    lo[c] = _mm512_and_si512(v, low);
    hi[c] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if (kBits >= 5) {
      uint64_t m[2];
      std::memcpy(m, hb + (g * 4 + c) * 16, 16);
      const __m512i sixteen = _mm512_set1_epi8(16);
      lo[c] = _mm512_mask_add_epi8(lo[c], _cvtu64_mask64(m[0]), lo[c], sixteen);
      hi[c] = _mm512_mask_add_epi8(hi[c], _cvtu64_mask64(m[1]), hi[c], sixteen);
    }
    if (kBits == 6) {
      uint64_t m[2];
      std::memcpy(m, hb + sixth + (g * 4 + c) * 16, 16);
      const __m512i thirty_two = _mm512_set1_epi8(32);
      lo[c] = _mm512_mask_add_epi8(lo[c], _cvtu64_mask64(m[0]), lo[c], thirty_two);
      hi[c] = _mm512_mask_add_epi8(hi[c], _cvtu64_mask64(m[1]), hi[c], thirty_two);
    }
  }
}

// NT rows (a compile-time count, even: whole tokens, so every accumulator stays
// in a register).  Each group's dot products run as two independent chains (low
// and high nibbles), and groups do not depend on each other, so the core
// overlaps them.  Odd rows (what the first term's rounding left) have a group
// sum of 0, so only even rows carry the mins.
template <int NT, bool kHigh, bool kSkip>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void q4_tile_avx512_nt(const uint8_t* __restrict w, const uint8_t* __restrict hb,
                       const Q4Scales& ss, const uint8_t* __restrict sm,
                       const int8_t* __restrict xq, const float* __restrict xscale,
                       const float* __restrict xsum, float* __restrict out, int64_t K, int64_t N) {
  const int64_t groups = K / kQ4Group;
  __m512 acc[NT], accm[NT];
  for (int t = 0; t < NT; ++t) acc[t] = accm[t] = _mm512_setzero_ps();
  const int64_t ahead = prefetch_ahead(NT);
  for (int64_t g = 0; g < groups; ++g) {
    // The weights stream from memory once per step: ask for the bytes a few
    // groups ahead (into the next tile at the end; a prefetch never faults).
    prefetch_group(w, g, ahead);
    __m512i lo[4], hi[4];
    unpack_group_avx512<kHigh ? 5 : 4>(w, hb, 0, g, lo, hi);
    __m512 scale, mins;
    group_scales_avx512(ss, sm, g, scale, mins);
    for (int t = 0; t < NT; ++t) {
      if (kSkip && (t & 1) && xscale[t * groups + g] == 0.f) continue;  // no second term
      const int32_t* x = reinterpret_cast<const int32_t*>(xq + t * K + g * kQ4Group);
      __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], _mm512_set1_epi32(x[0]));
      __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[0], _mm512_set1_epi32(x[1]));
      for (int c = 1; c < 4; ++c) {
        d0 = _mm512_dpbusd_epi32(d0, lo[c], _mm512_set1_epi32(x[2 * c]));
        d1 = _mm512_dpbusd_epi32(d1, hi[c], _mm512_set1_epi32(x[2 * c + 1]));
      }
      const int64_t i = t * groups + g;
      const __m512 ws = _mm512_mul_ps(scale, _mm512_set1_ps(xscale[i]));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), ws, acc[t]);
      if (t % 2 == 0) accm[t] = _mm512_fmadd_ps(mins, _mm512_set1_ps(xsum[i]), accm[t]);
    }
  }
  for (int t = 0; t < NT; t += 2)
    _mm512_storeu_ps(out + (t / 2) * N, _mm512_add_ps(_mm512_add_ps(acc[t], accm[t]), acc[t + 1]));
}

// Six form (Q6_K): codes 0..63 (the tiles' low four bits, +16 and +32 where the
// two planes' bits are set).  Each group's halves (octets 0-1, inputs 0-15, and
// octets 2-3) are summed apart and scaled by their own d sc; their mins (-32 d sc)
// multiply the halves' exact input sums (`sum16`), on even rows only.
template <int NT, bool kSkip>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void q6_tile_avx512_nt(const uint8_t* __restrict w, const uint8_t* __restrict hb,
                       const Q4Scales& ss, const uint8_t* __restrict sm,
                       const int8_t* __restrict xq, const float* __restrict xscale,
                       const float* __restrict xsum16, float* __restrict out, int64_t K, int64_t N) {
  const int64_t groups = K / kQ4Group;
  const __m512 neg32 = _mm512_set1_ps(-32.f);
  __m512 acc[NT], accm[NT];
  for (int t = 0; t < NT; ++t) acc[t] = accm[t] = _mm512_setzero_ps();
  const int64_t ahead = prefetch_ahead(NT);
  for (int64_t g = 0; g < groups; ++g) {
    prefetch_group(w, g, ahead);
    __m512i lo[4], hi[4];
    unpack_group_avx512<6>(w, hb, ss.sixth, g, lo, hi);
    __m512 first, second;
    six_scales_avx512(sm, g, first, second);
    for (int t = 0; t < NT; ++t) {
      if (kSkip && (t & 1) && xscale[t * groups + g] == 0.f) continue;  // no second term
      const int32_t* x = reinterpret_cast<const int32_t*>(xq + t * K + g * kQ4Group);
      __m512i da = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], _mm512_set1_epi32(x[0]));
      __m512i db = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[2], _mm512_set1_epi32(x[4]));
      da = _mm512_dpbusd_epi32(da, hi[0], _mm512_set1_epi32(x[1]));
      db = _mm512_dpbusd_epi32(db, hi[2], _mm512_set1_epi32(x[5]));
      da = _mm512_dpbusd_epi32(da, lo[1], _mm512_set1_epi32(x[2]));
      db = _mm512_dpbusd_epi32(db, lo[3], _mm512_set1_epi32(x[6]));
      da = _mm512_dpbusd_epi32(da, hi[1], _mm512_set1_epi32(x[3]));
      db = _mm512_dpbusd_epi32(db, hi[3], _mm512_set1_epi32(x[7]));
      const __m512 xs = _mm512_set1_ps(xscale[t * groups + g]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(da), _mm512_mul_ps(first, xs), acc[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(db), _mm512_mul_ps(second, xs), acc[t]);
      if (t % 2 == 0) {
        const float* s16 = xsum16 + t * (K / 16) + 2 * g;
        accm[t] = _mm512_fmadd_ps(_mm512_mul_ps(first, neg32), _mm512_set1_ps(s16[0]), accm[t]);
        accm[t] = _mm512_fmadd_ps(_mm512_mul_ps(second, neg32), _mm512_set1_ps(s16[1]), accm[t]);
      }
    }
  }
  for (int t = 0; t < NT; t += 2)
    _mm512_storeu_ps(out + (t / 2) * N, _mm512_add_ps(_mm512_add_ps(acc[t], accm[t]), acc[t + 1]));
}

// The 32 bits of `m` as 32 bytes: 16 where bit i is set (byte i), 0 elsewhere.
__attribute__((target("avx2,fma,f16c")))
inline __m256i fifth_bits_avx2(uint32_t m) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)), spread), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

// NT rows (even: whole tokens) against one tile, 8 output rows (one half of the
// tile, `h`) at a time.  Per group the half's 8 unpacked code vectors stay in
// registers while each row's 8 `vpmaddubsw` products are summed in int16 (each is
// at most 2 * 15 * 127 in size, so 8 fit) and widened once; with fifth bits
// (`kHigh`, codes up to 31) every 4 are.  (Rows inside chunks instead let the
// compiler schedule all 32 products first and spill them to the stack.)
template <int NT, bool kHigh, bool kSkip>
__attribute__((target("avx2,fma,f16c")))
void q4_tile_avx2_nt(const uint8_t* __restrict w, const uint8_t* __restrict hb,
                     const Q4Scales& ss, const uint8_t* __restrict sm, const int8_t* __restrict xq,
                     const float* __restrict xscale, const float* __restrict xsum,
                     float* __restrict out, int64_t K, int64_t N) {
  const int64_t groups = K / kQ4Group;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    const int64_t ahead = prefetch_ahead(NT);
    for (int64_t g = 0; g < groups; ++g) {
      if (h == 0) prefetch_group(w, g, ahead);  // the second half reads the tile again, from L1
      __m256i code[8];  // chunk c's low nibbles' codes at 2 c, high nibbles' at 2 c + 1
      for (int c = 0; c < 4; ++c) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (g * 4 + c) * 64 + h * 32));
        code[2 * c] = _mm256_and_si256(v, low);
        code[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if (kHigh) {
          uint32_t m[2];
          std::memcpy(&m[0], hb + (g * 4 + c) * 16 + 4 * h, 4);
          std::memcpy(&m[1], hb + (g * 4 + c) * 16 + 8 + 4 * h, 4);
          code[2 * c] = _mm256_or_si256(code[2 * c], fifth_bits_avx2(m[0]));
          code[2 * c + 1] = _mm256_or_si256(code[2 * c + 1], fifth_bits_avx2(m[1]));
        }
      }
      __m256 scale, mins;
      group_scales_avx2(ss, sm, g, h, scale, mins);
      for (int t = 0; t < NT; ++t) {
        if (kSkip && (t & 1) && xscale[t * groups + g] == 0.f) continue;  // no second term
        const int32_t* x = reinterpret_cast<const int32_t*>(xq + t * K + g * kQ4Group);
        __m256i d32 = _mm256_setzero_si256();
        __m256i d16 = _mm256_maddubs_epi16(code[0], _mm256_set1_epi32(x[0]));
        for (int q = 1; q < 8; ++q) {
          const __m256i prod = _mm256_maddubs_epi16(code[q], _mm256_set1_epi32(x[q]));
          if (kHigh && q == 4) {  // 4 products of codes <= 31: widen before a fifth
            d32 = _mm256_madd_epi16(d16, ones);
            d16 = prod;
          } else {
            d16 = _mm256_add_epi16(d16, prod);
          }
        }
        d32 = _mm256_add_epi32(d32, _mm256_madd_epi16(d16, ones));
        const int64_t i = t * groups + g;
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d32),
                                 _mm256_mul_ps(scale, _mm256_set1_ps(xscale[i])), acc[t]);
        if (t % 2 == 0) acc[t] = _mm256_fmadd_ps(mins, _mm256_set1_ps(xsum[i]), acc[t]);
      }
    }
    for (int t = 0; t < NT; t += 2)
      _mm256_storeu_ps(out + (t / 2) * N + 8 * h, _mm256_add_ps(acc[t], acc[t + 1]));
  }
}

// Six form on AVX2 (as `q6_tile_avx512_nt`), 8 output rows at a time like
// `q4_tile_avx2_nt`; `vpmaddubsw` products of codes up to 63 are widened every
// two (2 * 2 * 63 * 127 fits int16).
template <int NT, bool kSkip>
__attribute__((target("avx2,fma,f16c")))
void q6_tile_avx2_nt(const uint8_t* __restrict w, const uint8_t* __restrict hb,
                     const Q4Scales& ss, const uint8_t* __restrict sm, const int8_t* __restrict xq,
                     const float* __restrict xscale, const float* __restrict xsum16,
                     float* __restrict out, int64_t K, int64_t N) {
  const int64_t groups = K / kQ4Group;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m256 neg32 = _mm256_set1_ps(-32.f);
  const uint8_t* h6 = hb + ss.sixth;
  for (int h = 0; h < 2; ++h) {
    __m256 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
    const int64_t ahead = prefetch_ahead(NT);
    for (int64_t g = 0; g < groups; ++g) {
      if (h == 0) prefetch_group(w, g, ahead);
      __m256i code[8];  // octet c's low nibbles' codes at 2 c, high nibbles' at 2 c + 1
      for (int c = 0; c < 4; ++c) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + (g * 4 + c) * 64 + h * 32));
        uint32_t m5[2], m6[2];
        std::memcpy(&m5[0], hb + (g * 4 + c) * 16 + 4 * h, 4);
        std::memcpy(&m5[1], hb + (g * 4 + c) * 16 + 8 + 4 * h, 4);
        std::memcpy(&m6[0], h6 + (g * 4 + c) * 16 + 4 * h, 4);
        std::memcpy(&m6[1], h6 + (g * 4 + c) * 16 + 8 + 4 * h, 4);
        code[2 * c] = _mm256_or_si256(_mm256_and_si256(v, low), fifth_bits_avx2(m5[0]));
        code[2 * c + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                          fifth_bits_avx2(m5[1]));
        // 16 << 1 stays inside its byte: the sixth bits' 32.
        code[2 * c] = _mm256_or_si256(code[2 * c], _mm256_slli_epi16(fifth_bits_avx2(m6[0]), 1));
        code[2 * c + 1] =
            _mm256_or_si256(code[2 * c + 1], _mm256_slli_epi16(fifth_bits_avx2(m6[1]), 1));
      }
      __m256 first, second;
      six_scales_avx2(sm, g, h, first, second);
      for (int t = 0; t < NT; ++t) {
        if (kSkip && (t & 1) && xscale[t * groups + g] == 0.f) continue;  // no second term
        const int32_t* x = reinterpret_cast<const int32_t*>(xq + t * K + g * kQ4Group);
        __m256i half[2];
        for (int k = 0; k < 2; ++k) {  // inputs 16 k .. 16 k + 15: codes 4 k .. 4 k + 3
          const int q = 4 * k;
          __m256i d16 = _mm256_add_epi16(_mm256_maddubs_epi16(code[q], _mm256_set1_epi32(x[q])),
                                         _mm256_maddubs_epi16(code[q + 1], _mm256_set1_epi32(x[q + 1])));
          half[k] = _mm256_madd_epi16(d16, ones);
          d16 = _mm256_add_epi16(_mm256_maddubs_epi16(code[q + 2], _mm256_set1_epi32(x[q + 2])),
                                 _mm256_maddubs_epi16(code[q + 3], _mm256_set1_epi32(x[q + 3])));
          half[k] = _mm256_add_epi32(half[k], _mm256_madd_epi16(d16, ones));
        }
        const __m256 xs = _mm256_set1_ps(xscale[t * groups + g]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half[0]), _mm256_mul_ps(first, xs), acc[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(half[1]), _mm256_mul_ps(second, xs), acc[t]);
        if (t % 2 == 0) {
          const float* s16 = xsum16 + t * (K / 16) + 2 * g;
          acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(first, neg32), _mm256_set1_ps(s16[0]), acc[t]);
          acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(second, neg32), _mm256_set1_ps(s16[1]), acc[t]);
        }
      }
    }
    for (int t = 0; t < NT; t += 2)
      _mm256_storeu_ps(out + (t / 2) * N + 8 * h, _mm256_add_ps(acc[t], acc[t + 1]));
  }
}

// `Kernel::template tile<NT, kBits, kSkip>(args...)` for the runtime choice: NT term
// rows (2, 4 or, where `Kernel::kWide`, 8), 4-, 5- or 6-bit codes, and whether second
// terms may be missing (a residual cut is set).  The tiles that skip a missing term
// test each odd row a group: that branch alone cost the Qwen3-0.6B shape's 32-row
// step ~12% where nothing is missing, so the default (no cut) runs tiles without it.
template <typename Kernel, typename... Args>
void run_tile(int nt, int kind, Args... args) {
  auto rows = [&](auto bits, auto skip) {
    constexpr int kBits = decltype(bits)::value;
    constexpr bool kSkip = decltype(skip)::value;
    if (nt == 2) Kernel::template tile<2, kBits, kSkip>(args...);
    else if (nt == 4) Kernel::template tile<4, kBits, kSkip>(args...);
    else if constexpr (Kernel::kWide) Kernel::template tile<8, kBits, kSkip>(args...);
  };
  auto codes = [&](auto skip) {
    if (kind == 6) rows(std::integral_constant<int, 6>{}, skip);
    else if (kind == 5) rows(std::integral_constant<int, 5>{}, skip);
    else rows(std::integral_constant<int, 4>{}, skip);
  };
  if (g_residual_cut > 0.f) codes(std::true_type{});
  else codes(std::false_type{});
}

// One tile for every token block of `p`, on `run_tile`: blocks of NT term rows
// (8 where the kernel is wide and 8 are left, else 4 or 2: whole tokens; a row's
// operations do not depend on NT, so neither do its bits), with 4-bit codes, a
// fifth bits' plane, or the six form's two planes.  Wider blocks unpack a group's
// codes (~12 to ~36 operations) once for more rows.
template <typename Kernel>
void q4_tile_blocks(const Q4Args& p, int64_t tile) {
  const int64_t groups = p.K / kQ4Group;
  const uint8_t* w = p.w + tile * (p.K / 8) * 64;
  const uint8_t* hb = p.hb == nullptr ? nullptr : p.hb + tile * (p.K / 8) * 16;
  const uint8_t* sm = p.sm.tile(tile);
  Q4Scales ss = p.sm;
  // Super-block scales take ~15 operations a group to decode (6-bit fields): with
  // several token blocks to run, decode the tile's once into the float form
  // (the same values, so the same bits) and let every block load them.
  thread_local std::vector<float> decoded;
  if (ss.form == kSuperForm && p.M > kTokTile) {
    decoded.resize(groups * 32);
    for (int64_t g = 0; g < groups; ++g) Kernel::decode(ss, sm, g, decoded.data() + 32 * g);
    ss.form = kFloatForm;
    sm = reinterpret_cast<const uint8_t*>(decoded.data());
  }
  const int kind = ss.form == kSixForm ? 6 : hb != nullptr ? 5 : 4;
  for (int64_t m = 0; m < p.M;) {
    const int64_t left = p.M - m;
    const int nt = left >= 8 && Kernel::kWide ? 8 : left >= 4 ? 4 : 2;
    const int8_t* xq = p.a->q.data() + m * p.K;
    const float* xs = p.a->scale.data() + m * groups;
    const float* xsum = p.a->sum.data() + m * groups;
    float* out = p.out + (m / 2) * p.N + tile * kRowTile;
    const float* s16 = p.a->sum16.data() + m * (p.K / 16);
    run_tile<Kernel>(nt, kind, w, hb, ss, sm, xq, xs, kind == 6 ? s16 : xsum, out, p.K, p.N);
    m += nt;
  }
}

// The kernels `q4_tile_blocks` runs, one per code path.
struct Avx512Q4 {
  static constexpr bool kWide = true;  // 8 term rows fit its 32 registers
  template <int NT, int kBits, bool kSkip, typename... Args>
  static void tile(Args... args) {
    if constexpr (kBits == 6) q6_tile_avx512_nt<NT, kSkip>(args...);
    else q4_tile_avx512_nt<NT, kBits == 5, kSkip>(args...);
  }
  __attribute__((target("avx512f"))) static void decode(const Q4Scales& s, const uint8_t* tile,
                                                        int64_t g, float* dst) {
    __m512 scale, mins;
    group_scales_avx512(s, tile, g, scale, mins);
    _mm512_storeu_ps(dst, scale);
    _mm512_storeu_ps(dst + 16, mins);
  }
};

struct Avx2Q4 {
  static constexpr bool kWide = false;  // 16 registers: 4 term rows at most
  template <int NT, int kBits, bool kSkip, typename... Args>
  static void tile(Args... args) {
    if constexpr (kBits == 6) q6_tile_avx2_nt<NT, kSkip>(args...);
    else q4_tile_avx2_nt<NT, kBits == 5, kSkip>(args...);
  }
  __attribute__((target("avx2,fma,f16c"))) static void decode(const Q4Scales& s,
                                                               const uint8_t* tile, int64_t g,
                                                               float* dst) {
    for (int half = 0; half < 2; ++half) {
      __m256 scale, mins;
      group_scales_avx2(s, tile, g, half, scale, mins);
      _mm256_storeu_ps(dst + 8 * half, scale);
      _mm256_storeu_ps(dst + 16 + 8 * half, mins);
    }
  }
};
#endif

#include "q8_kernels.h"

#include "amx_kernels.h"

// The code path of a q8 GEMM of M tokens on `isa` (a path `q8_path` gave is kept):
// on AVX-512 the matrix unit's where it runs (per-row scales, from 3 tokens, AMX
// allowed; its tiles take two int8 terms a token), else int16 codes.
inline int64_t q8_path(int64_t isa, bool grouped, int64_t M, bool allow_amx = true) {
  if (isa != kAvx512) return isa;
#if defined(__x86_64__)
  if (!grouped && allow_amx && use_amx(2 * M, kQ8AmxMinRows)) return kAvx512;
#endif
  return kAvx512W16;
}

// ---------------------------------------------------------------------------
// GEMMs on raw pointers (the ops and the fused decoder layer call these).
// `a` holds the quantized activations (`quantize_rows`); a range of the output's
// columns at a time, so a caller's own threads can share one GEMM.

// Tiles [t0, t1) (columns [16 t0, 16 t1)) of out[M, N] = x[M, K] @ W.T for a
// q4-tiled weight (K a multiple of 32, N of 16); `hb` its fifth bits (q5) or
// nullptr.  From 12 tokens on AMX tiles where the CPU has them (q4 and q5).
void q4_tiles(const uint8_t* w, const uint8_t* hb, const Q4Scales& sm, const QuantizedRows& a,
              int64_t M, int64_t K, int64_t N, float* out, int64_t t0, int64_t t1, int64_t isa) {
#if defined(__x86_64__)
  // (The six form has two scales a group, which the AMX kernel does not read.)
  if (isa == kAvx512 && use_amx(2 * M) && sm.form != kSixForm)
    return q4_tiles_amx(w, hb, sm, a, M, K, N, out, t0, t1);
#endif
  const Q4Args p{w, hb, sm, &a, out, 2 * M, K, N};
  for (int64_t t = t0; t < t1; ++t) {
#if defined(__x86_64__)
    if (isa == kAvx512) { q4_tile_blocks<Avx512Q4>(p, t); continue; }
    if (isa == kAvx2) { q4_tile_blocks<Avx2Q4>(p, t); continue; }
#endif
    q4_tile_portable(p, t);
  }
}

// Columns [r0, r1) of out[M, N] = x[M, K] @ (W * scale).T for row-major int8
// W [N, K] (K a multiple of 64), scaled per row (`row_scale`) or, if `group_scale`
// is given, per 32 inputs of each row; `a` quantized on `q8_path(isa, ...)`.
// From 3 tokens, whole 16-row tiles of a per-row-scaled weight run on AMX where the
// CPU has it, unless `allow_amx` is false (a row's result then does not depend on
// the batch size: the two kernels round their float steps differently).
void q8_rows(const int8_t* w, const float* row_scale, const c10::Half* group_scale,
             const QuantizedRows& a, int64_t M, int64_t K, int64_t N, float* out, int64_t r0,
             int64_t r1, int64_t isa, bool allow_amx = true) {
  isa = q8_path(isa, group_scale != nullptr, M, allow_amx);
  const Q8Args p{w, row_scale, group_scale, &a, out, 2 * M, K, N, a.fix.data(),
                 q8_act_group(K, isa)};
#if defined(__x86_64__)
  if (isa == kAvx512) {  // AMX's whole tiles, the VNNI kernel the rest
    r0 = q8_cols_amx(w, row_scale, a, M, K, N, out, r0, r1, p.group);
    if (r0 == r1) return;
    return q8_rows_avx512(p, r0, r1);
  }
  if (isa == kAvx512W16) return q8_rows16<Avx512Q8>(p, r0, r1);
  if (isa == kAvx2) return q8_rows16<Avx2Q8>(p, r0, r1);
#endif
  q8_rows_portable(p, r0, r1);
}

// The whole q8 GEMM (per-row or group scales, as `q8_rows`), on ATen's threads.
void q8_gemm_raw(const float* x, int64_t M, int64_t K, const int8_t* w, const float* row_scale,
                 const c10::Half* group_scale, int64_t N, float* out, QuantizedRows& a,
                 bool allow_amx = true) {
  const int64_t isa = q8_path(minivllm_cpu::active_isa(), group_scale != nullptr, M, allow_amx);
  quantize_rows(x, M, K, q8_act_group(K, isa), isa, a);
  // Ranges of whole 16-row tiles (the AMX kernel's unit), the last one short.
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t t0, int64_t t1) {
    q8_rows(w, row_scale, group_scale, a, M, K, N, out, 16 * t0, std::min(N, 16 * t1), isa,
            allow_amx);
  });
}

#if defined(__x86_64__)
// Coarse logits for many tokens on AVX-512 VNNI: out[M, N] = x @ (W * row_scale).T
// with one int8 term a token (per 256 / 128 / 64 inputs), half the products of the
// two-term kernel.  For an LM head whose top logits are recomputed exactly after.
void q8_gemm_coarse_raw(const float* x, int64_t M, int64_t K, const int8_t* w,
                        const float* row_scale, int64_t N, float* out, QuantizedRows& a) {
  const int64_t group = q8_act_group(K, kAvx512);
  quantize_rows_coarse(x, M, K, group, kAvx512, a);
  const Q8Args p{w, row_scale, nullptr, &a, out, M, K, N, a.fix.data(), group};
  at::parallel_for(0, (N + 15) / 16, 1, [&](int64_t t0, int64_t t1) {
    q8_rows_avx512<false>(p, 16 * t0, std::min(N, 16 * t1));
  });
}

// Logits for M tokens from a q8-tiled LM head (`q8_tiled_block_avx512`) on ATen's
// threads: one int8 term a token (`terms` 1), or two (x and what its rounding left:
// near the exact product, for the same weight bytes).
void q8_tiled_gemm_raw(const float* x, int64_t M, int64_t K, const uint8_t* w,
                       const float* row_scale, int64_t N, float* out, QuantizedRows& a,
                       int64_t terms) {
  const int64_t group = q8_act_group(K, kAvx512);
  if (terms == 2) quantize_rows(x, M, K, group, kAvx512, a);
  else quantize_rows_coarse(x, M, K, group, kAvx512, a);
  const Q8Args p{nullptr, row_scale, nullptr, &a, out, terms * M, K, N, a.fix.data(), group};
  at::parallel_for(0, N / 16, 4, [&](int64_t t0, int64_t t1) {
    if (terms == 2) q8_tiled_rows_avx512<true>(p, w, t0, t1);
    else q8_tiled_rows_avx512<false>(p, w, t0, t1);
  });
}
#endif

}  // namespace

#include "q4_weight.h"
