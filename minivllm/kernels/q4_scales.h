// The scales of a q4- or q5-tiled weight (lowbit_kernels.h): what turns each
// row's integer dot product over a group of 32 inputs into its float share,
// `scale * dot + min * (sum of the inputs)`.  Three forms, each the bytes the
// GGUF file holds for them, re-laid per tile of 16 output rows:
//
// * pair (Q4_1, Q5_1, and anything else given a float scale and min per group):
//   per tile and group, 16 float16 scales then 16 float16 mins (64 bytes);
// * offset (Q4_0, Q5_0: w = (q - bias) d): per tile and group, 16 float16
//   scales d (32 bytes); the min is -bias d, bias 8 for q4 and 16 for q5;
// * super (Q4_K, Q5_K: per 256 inputs a float16 d and dmin, per 32 a 6-bit
//   scale sc and min m, w = d sc q - dmin m): per tile and 256 inputs, 256 bytes:
//   16 float16 d, 16 float16 -dmin, then for each of the 8 groups 16 bytes of
//   low four bits (sc & 15 | (m & 15) << 4, a byte a row), then for each group 8
//   bytes of high two bits (row r in nibble r % 2 of byte r / 2: sc >> 4 in its
//   bits 0-1, m >> 4 in bits 2-3).  d sc and dmin m are exact in float32, so the
//   kernels compute on the file's values (a float16 per-group scale would round them).
//
// * six (Q6_K: codes 0..63 in the q4 tiles plus two planes of fifth and sixth
//   bits; per 256 inputs a float16 d, per 16 an int8 scale sc, w = d sc (q - 32)):
//   per tile and 256 inputs, 288 bytes: 16 float16 d, then for each of the 16
//   sub-blocks of 16 inputs 16 int8 sc (a byte a row).  A group of 32 has two
//   scales, so the kernels keep its two halves' dot products apart; the min of
//   each half is -32 d sc, times the exact sum of that half's inputs.
//
// * float (never stored: `q4_tile_blocks` decodes a super tile's scales into it once
//   when several token blocks will read them): per tile and group, 16 float32 scales
//   then 16 float32 mins (128 bytes), the values the super form's decoding gives.
//
// The pair form was the only one; the others read 0.5 bits a weight less (Q4_0
// and Q4_K files at 4.5 bits, not 5) and Q6_K 1.4 less than int8 (6.56, not 8):
// the file's own size.

#pragma once

#include <c10/util/Half.h>
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace {

constexpr int kScaleRows = 16;     // output rows per tile (kRowTile)
constexpr int kSuperInputs = 256;  // inputs per super-block (super form)
constexpr int kSuperBytes = 256;   // bytes per tile and super-block (super form)

enum Q4Form : int { kPairForm = 0, kOffsetForm = 1, kSuperForm = 2, kSixForm = 3, kFloatForm = 4 };
constexpr int kFloatBytes = 128;  // bytes per tile and group (float form)
constexpr int kSixBytes = 288;  // bytes per tile and super-block (six form)

// A weight's scales: where they start, their form, and (offset form) the bias.
struct Q4Scales {
  const uint8_t* p = nullptr;
  int form = kPairForm;
  float bias = 0.f;
  int64_t tile_bytes = 0;  // bytes per tile of 16 output rows
  int64_t sixth = 0;       // six form: bytes from the fifth bits' plane to the sixth's

  const uint8_t* tile(int64_t t) const { return p + t * tile_bytes; }
};

// Bytes per tile of each form for `groups` groups of 32 inputs.
inline int64_t q4_tile_scale_bytes(int form, int64_t groups) {
  return form == kPairForm ? groups * 64 : form == kSixForm ? groups / 8 * kSixBytes : groups * 32;
}

// Six form: group g's scales d sc of its two halves (inputs 0-15 and 16-31), per row.
inline void six_scales_scalar(const uint8_t* tile, int64_t g, float* first, float* second) {
  const uint8_t* b = tile + (g / 8) * kSixBytes;
  const auto* d = reinterpret_cast<const c10::Half*>(b);
  const auto* sc = reinterpret_cast<const int8_t*>(b + 32 + 32 * (g % 8));
  for (int r = 0; r < kScaleRows; ++r) {
    first[r] = static_cast<float>(d[r]) * sc[r];
    second[r] = static_cast<float>(d[r]) * sc[kScaleRows + r];
  }
}

// Group g's 16 scales and mins, one row at a time (portable code, dequantizing).
inline void group_scales_scalar(const Q4Scales& s, const uint8_t* tile, int64_t g, float* scale,
                                float* mins) {
  if (s.form == kSuperForm) {
    const uint8_t* b = tile + (g / 8) * kSuperBytes;
    const int j = static_cast<int>(g % 8);
    const auto* d = reinterpret_cast<const c10::Half*>(b);
    const auto* nm = reinterpret_cast<const c10::Half*>(b + 32);
    for (int r = 0; r < kScaleRows; ++r) {
      const int lo = b[64 + 16 * j + r];
      const int hi = (b[192 + 8 * j + r / 2] >> (4 * (r % 2))) & 15;
      scale[r] = static_cast<float>(d[r]) * static_cast<float>((lo & 15) | (hi & 3) << 4);
      mins[r] = static_cast<float>(nm[r]) * static_cast<float>((lo >> 4) | (hi >> 2) << 4);
    }
    return;
  }
  if (s.form == kFloatForm) {
    std::memcpy(scale, tile + g * kFloatBytes, 64);
    std::memcpy(mins, tile + g * kFloatBytes + 64, 64);
    return;
  }
  const auto* h = reinterpret_cast<const c10::Half*>(tile + g * (s.form == kPairForm ? 64 : 32));
  for (int r = 0; r < kScaleRows; ++r) {
    scale[r] = static_cast<float>(h[r]);
    mins[r] = s.form == kPairForm ? static_cast<float>(h[kScaleRows + r]) : -s.bias * scale[r];
  }
}

#if defined(__x86_64__)
// Group g's scales and mins for all 16 rows of a tile, 16 lanes.
__attribute__((target("avx512f"), always_inline)) inline void group_scales_avx512(
    const Q4Scales& s, const uint8_t* tile, int64_t g, __m512& scale, __m512& mins) {
  if (s.form == kSuperForm) {
    const uint8_t* b = tile + (g / 8) * kSuperBytes;
    const int j = static_cast<int>(g % 8);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    const __m512 nm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
    const __m512i lo =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 64 + 16 * j)));
    const __m128i h8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 192 + 8 * j));
    const __m128i nib = _mm_set1_epi8(15);
    const __m512i hi = _mm512_cvtepu8_epi32(
        _mm_unpacklo_epi8(_mm_and_si128(h8, nib), _mm_and_si128(_mm_srli_epi16(h8, 4), nib)));
    const __m512i f = _mm512_set1_epi32(15), three = _mm512_set1_epi32(3);
    const __m512i sc = _mm512_or_si512(_mm512_and_si512(lo, f),
                                       _mm512_slli_epi32(_mm512_and_si512(hi, three), 4));
    const __m512i m = _mm512_or_si512(_mm512_srli_epi32(lo, 4),
                                      _mm512_slli_epi32(_mm512_srli_epi32(hi, 2), 4));
    scale = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    mins = _mm512_mul_ps(nm, _mm512_cvtepi32_ps(m));
    return;
  }
  if (s.form == kFloatForm) {
    scale = _mm512_loadu_ps(tile + g * kFloatBytes);
    mins = _mm512_loadu_ps(tile + g * kFloatBytes + 64);
    return;
  }
  const uint8_t* h = tile + g * (s.form == kPairForm ? 64 : 32);
  scale = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  mins = s.form == kPairForm
             ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + 32)))
             : _mm512_mul_ps(scale, _mm512_set1_ps(-s.bias));
}

// Six form, 16 lanes: `six_scales_scalar`.
__attribute__((target("avx512f"), always_inline)) inline void six_scales_avx512(
    const uint8_t* tile, int64_t g, __m512& first, __m512& second) {
  const uint8_t* b = tile + (g / 8) * kSixBytes;
  const uint8_t* sc = b + 32 + 32 * (g % 8);
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  first = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)))));
  second = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16)))));
}

// Six form, rows [8 half, 8 half + 8): `six_scales_scalar`.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void six_scales_avx2(
    const uint8_t* tile, int64_t g, int half, __m256& first, __m256& second) {
  const uint8_t* b = tile + (g / 8) * kSixBytes;
  const uint8_t* sc = b + 32 + 32 * (g % 8) + 8 * half;
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * half)));
  first = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                               _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)))));
  second = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16)))));
}

// Group g's scales and mins for rows [8 half, 8 half + 8) of a tile, 8 lanes.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void group_scales_avx2(
    const Q4Scales& s, const uint8_t* tile, int64_t g, int half, __m256& scale, __m256& mins) {
  if (s.form == kSuperForm) {
    const uint8_t* b = tile + (g / 8) * kSuperBytes;
    const int j = static_cast<int>(g % 8);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * half)));
    const __m256 nm =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 32 + 16 * half)));
    const __m256i lo = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 64 + 16 * j + 8 * half)));
    int32_t h4;
    std::memcpy(&h4, b + 192 + 8 * j + 4 * half, 4);
    const __m128i h8 = _mm_cvtsi32_si128(h4), nib = _mm_set1_epi8(15);
    const __m256i hi = _mm256_cvtepu8_epi32(
        _mm_unpacklo_epi8(_mm_and_si128(h8, nib), _mm_and_si128(_mm_srli_epi16(h8, 4), nib)));
    const __m256i f = _mm256_set1_epi32(15), three = _mm256_set1_epi32(3);
    const __m256i sc = _mm256_or_si256(_mm256_and_si256(lo, f),
                                       _mm256_slli_epi32(_mm256_and_si256(hi, three), 4));
    const __m256i m = _mm256_or_si256(_mm256_srli_epi32(lo, 4),
                                      _mm256_slli_epi32(_mm256_srli_epi32(hi, 2), 4));
    scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
    mins = _mm256_mul_ps(nm, _mm256_cvtepi32_ps(m));
    return;
  }
  if (s.form == kFloatForm) {
    const auto* f = reinterpret_cast<const float*>(tile + g * kFloatBytes);
    scale = _mm256_loadu_ps(f + 8 * half);
    mins = _mm256_loadu_ps(f + 16 + 8 * half);
    return;
  }
  const uint8_t* h = tile + g * (s.form == kPairForm ? 64 : 32) + 16 * half;
  scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  mins = s.form == kPairForm
             ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 32)))
             : _mm256_mul_ps(scale, _mm256_set1_ps(-s.bias));
}
#endif

}  // namespace
