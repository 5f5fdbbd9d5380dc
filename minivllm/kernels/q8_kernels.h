// The q8 GEMM kernels (minivllm's own; included by lowbit_kernels.h inside its
// namespace, after the activation quantizers and the q4 kernels, whose
// `QuantizedRows` and code paths they share): row-major int8 weights with a scale
// per row or per 32 inputs, on two int8 terms (AVX-512 VNNI, portable) or one int16
// code per input (AVX2 and AVX-512 without AMX).

#pragma once

namespace {

// q8: row-major int8 weights, one float scale per row; activations quantized
// per 64 inputs, or on the AVX-512 VNNI path per 256 (128) where K allows
// (`q8_act_group`): each group's products are summed in int32 and scaled once,
// so a larger group means fewer conversions and multiply-adds per product (the
// kernel was bound by them: 87 GMAC/s at 32 tokens against 183 for q4 on AMX).
// `vpdpbusd` wants unsigned x signed bytes, so the kernels
// flip the weights' sign bit (w + 128, unsigned) and subtract 128 times each
// activation group's code sum at the end (the same for every row).

// Inputs per activation scale of a q8 weight with K inputs on code path `isa`
// (as `q8_path` gives it).
inline int64_t q8_act_group(int64_t K, int64_t isa) {
  if (isa != kAvx512) return kQ8Group;
  return K % 256 == 0 ? 256 : K % 128 == 0 ? 128 : kQ8Group;
}

struct Q8Args {
  const int8_t* w;
  const float* row_scale;        // [N], or nullptr with group scales
  const c10::Half* group_scale;  // [N, K / 32] (Q8_0's scales), or nullptr
  const QuantizedRows* a;
  float* out;
  int64_t M, K, N;
  const float* bias_fix;  // [M]: 128 * sum over groups of scale * code sum
  int64_t group;          // inputs per activation scale (`q8_act_group`)
};

void q8_rows_portable(const Q8Args& p, int64_t r0, int64_t r1) {
  const int64_t groups = p.K / kQ8Group, halves = kQ8Group / kQ8WGroup;
  for (int64_t n = r0; n < r1; ++n) {
    const int8_t* w = p.w + n * p.K;
    const c10::Half* ws = p.group_scale ? p.group_scale + n * (p.K / kQ8WGroup) : nullptr;
    for (int64_t m = 0; m < p.M; ++m) {
      const int8_t* xq = p.a->q.data() + m * p.K;
      float acc = 0.f;
      for (int64_t g = 0; g < groups; ++g) {
        float dot = 0.f;  // this group's integer sums, each times its weight scale
        for (int64_t h = 0; h < halves; ++h) {
          int32_t part = 0;
          const int64_t i0 = g * kQ8Group + h * kQ8WGroup;
          for (int64_t i = i0; i < i0 + kQ8WGroup; ++i) part += w[i] * xq[i];
          dot += ws ? part * static_cast<float>(ws[g * halves + h]) : static_cast<float>(part);
        }
        acc += dot * p.a->scale[m * groups + g];
      }
      put_term(p.out + (m / 2) * p.N + n, ws ? acc : acc * p.row_scale[n], m);
    }
  }
}

#if defined(__x86_64__)
// kQ8Rows rows x NT tokens of accumulators, all in registers.
constexpr int kQ8Rows = 4;

// The lane sums of four vectors, as the four lanes of one: two rounds of 128-bit
// block shuffles add the vectors' halves pairwise, then two in-block shuffles.
__attribute__((target("avx512f")))
inline __m128 sum_lanes4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  // [v0 blocks 0+2, 1+3, v1 blocks 0+2, 1+3], and the same for v2, v3
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44),
                                   _mm512_shuffle_f32x4(v0, v1, 0xEE));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44),
                                   _mm512_shuffle_f32x4(v2, v3, 0xEE));
  // block i: four partial sums of v_i
  const __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88),
                                 _mm512_shuffle_f32x4(s01, s23, 0xDD));
  const __m512 u = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0x4E));
  const __m512 w = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, 0xB1));
  return _mm512_castps512_ps128(_mm512_maskz_compress_ps(0x1111, w));
}

// An NR x NT block of float or int32 accumulators set to zero.
template <int NR, int NT, typename V>
__attribute__((target("avx512f"))) inline void zero_block(V (&v)[NR][NT]) {
  for (int r = 0; r < NR; ++r)
    for (int t = 0; t < NT; ++t) v[r][t] = V{};
}

// One activation group's int32 sums (`d`) into the float accumulators, each term
// row's times its scale for group g.
template <int NR, int NT>
__attribute__((target("avx512f")))
inline void add_group_sums(__m512 (&acc)[NR][NT], const __m512i (&d)[NR][NT],
                           const float* __restrict xscale, int64_t groups, int64_t g) {
  for (int t = 0; t < NT; ++t) {
    const __m512 xs = _mm512_set1_ps(xscale[t * groups + g]);
    for (int r = 0; r < NR; ++r)
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][t]), xs, acc[r][t]);
  }
}

// NR weight rows x NT term rows, activation groups of 64 CH inputs: each group's
// CH products per lane summed in int32, then scaled into float accumulators.
// kPairs false: NT tokens of one term each (`quantize_rows_coarse`), not term pairs.
template <int NT, int NR, int CH, bool kPairs = true>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void q8_block_avx512(const int8_t* __restrict w, const int8_t* __restrict xq,
                     const float* __restrict xscale, const float* __restrict bias_fix,
                     const float* __restrict row_scale, float* __restrict out, int64_t K,
                     int64_t N) {
  constexpr int64_t G = 64 * CH;
  const int64_t groups = K / G;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[NR][NT];
  zero_block(acc);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i d[NR][NT];
    zero_block(d);
    for (int c = 0; c < CH; ++c) {
      const int64_t at = g * G + 64 * c;
      __m512i u[NR];
      for (int r = 0; r < NR; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + kQ8PrefetchRows) * K + at),
                     _MM_HINT_T0);
        u[r] = _mm512_xor_si512(_mm512_loadu_si512(w + r * K + at), flip);
      }
      for (int t = 0; t < NT; ++t) {
        const __m512i x = _mm512_loadu_si512(xq + t * K + at);
        for (int r = 0; r < NR; ++r) d[r][t] = _mm512_dpbusd_epi32(d[r][t], u[r], x);
      }
    }
    add_group_sums(acc, d, xscale, groups, g);
  }
  // Rows in pairs: a token's two terms share the row's scale, so their lanes are
  // added before the one horizontal sum; four rows' sums come out of one shuffle
  // tree (`sum_lanes4`).  Short rows (Gemma 3's 640-input LM head) spent a quarter
  // of their time in eight separate reductions per block: 262144 x 640 at one token
  // 10.2 -> 9.5 ms, 49152 x 576 1.82 -> 1.63 ms, 49152 x 2048 4.71 -> 4.65 ms (2-core
  // Zen 4; both forms built side by side, medians of 12 alternating rounds).
  if constexpr (!kPairs) {
    for (int t = 0; t < NT; ++t) {
      if constexpr (NR == 4) {
        const __m128 sums = sum_lanes4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
        _mm_storeu_ps(out + t * N, _mm_mul_ps(_mm_sub_ps(sums, _mm_set1_ps(bias_fix[t])),
                                              _mm_loadu_ps(row_scale)));
      } else {
        for (int r = 0; r < NR; ++r)
          out[t * N + r] = (_mm512_reduce_add_ps(acc[r][t]) - bias_fix[t]) * row_scale[r];
      }
    }
    return;
  }
  for (int t = 0; t < NT; t += 2) {
    const float fix = bias_fix[t] + bias_fix[t + 1];
    __m512 both[NR];
    for (int r = 0; r < NR; ++r) both[r] = _mm512_add_ps(acc[r][t], acc[r][t + 1]);
    if constexpr (NR == 4) {
      const __m128 sums = sum_lanes4(both[0], both[1], both[2], both[3]);
      _mm_storeu_ps(out + (t / 2) * N,
                    _mm_mul_ps(_mm_sub_ps(sums, _mm_set1_ps(fix)), _mm_loadu_ps(row_scale)));
    } else {
      for (int r = 0; r < NR; ++r)
        out[(t / 2) * N + r] = (_mm512_reduce_add_ps(both[r]) - fix) * row_scale[r];
    }
  }
}

// `p.M` term rows: token pairs, or (kPairs false) tokens of one term each.
template <int NR, int CH, bool kPairs>
void q8_rows_avx512_nr(const Q8Args& p, int64_t n) {
  const int64_t groups = p.K / (64 * CH), per_token = kPairs ? 2 : 1;
  for (int64_t m = 0; m < p.M; m += kTokTile) {
    const int64_t nt = std::min<int64_t>(kTokTile, p.M - m);
    const int8_t* w = p.w + n * p.K;
    const int8_t* xq = p.a->q.data() + m * p.K;
    const float* xs = p.a->scale.data() + m * groups;
    const float* fix = p.bias_fix + m;
    float* out = p.out + (m / per_token) * p.N + n;
    const float* rs = p.row_scale + n;
    if (nt == 4) q8_block_avx512<4, NR, CH, kPairs>(w, xq, xs, fix, rs, out, p.K, p.N);
    else if (nt == 2) q8_block_avx512<2, NR, CH, kPairs>(w, xq, xs, fix, rs, out, p.K, p.N);
    else if constexpr (!kPairs) {  // pairs come two rows at a time
      if (nt == 3) q8_block_avx512<3, NR, CH, false>(w, xq, xs, fix, rs, out, p.K, p.N);
      else q8_block_avx512<1, NR, CH, false>(w, xq, xs, fix, rs, out, p.K, p.N);
    }
  }
}

template <int CH, bool kPairs>
void q8_rows_avx512_ch(const Q8Args& p, int64_t r0, int64_t r1) {
  int64_t n = r0;
  for (; n + kQ8Rows <= r1; n += kQ8Rows) q8_rows_avx512_nr<kQ8Rows, CH, kPairs>(p, n);
  for (; n < r1; ++n) q8_rows_avx512_nr<1, CH, kPairs>(p, n);
}

template <bool kPairs = true>
void q8_rows_avx512(const Q8Args& p, int64_t r0, int64_t r1) {
  if (p.group == 256) return q8_rows_avx512_ch<4, kPairs>(p, r0, r1);
  if (p.group == 128) return q8_rows_avx512_ch<2, kPairs>(p, r0, r1);
  q8_rows_avx512_ch<1, kPairs>(p, r0, r1);
}

// ---------------------------------------------------------------------------
// q8 tiles: a per-row-scaled int8 LM head laid out like the q4 tiles, for the
// AVX-512 VNNI path without AMX.  For rows [16 t, 16 t + 16) and inputs
// [4 c, 4 c + 4), 64 bytes: byte 4 r + j holds row r's weight for input 4 c + j plus
// 128 (unsigned, `vpdpbusd`'s first operand).  Four input codes of a token,
// broadcast, against one such vector give 16 rows' partial sums in their own
// lanes: no horizontal sums at the end, so a short row (Gemma 3's 640 inputs) costs
// no more a product than a long one.  Activations: one int8 term a token per 256 /
// 128 / 64 inputs (`quantize_rows_coarse`), or (kPairs) two, x and what its
// rounding left (`quantize_rows`: NT term rows, token pairs), the +128 taken off
// once per term row (its `fix`).  An accumulator's operations do not depend on NR or
// NT, so a token's logits are the same alone as in any batch of the same terms.
template <int NR, int NT, int CH, bool kPairs>
__attribute__((target("avx512f,avx512bw,avx512vnni")))
void q8_tiled_block_avx512(const uint8_t* __restrict w, int64_t tile_bytes,
                           const int8_t* __restrict xq, const float* __restrict xscale,
                           const float* __restrict fix, const float* __restrict row_scale,
                           float* __restrict out, int64_t K, int64_t N) {
  constexpr int64_t kQuads = 16 * CH;  // 4-input steps per activation group
  const int64_t groups = K / (64 * CH);
  const int64_t ahead = prefetch_ahead(NT);
  __m512 acc[NR][NT];
  zero_block(acc);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i d[NR][NT];
    zero_block(d);
#pragma GCC unroll 4
    for (int64_t c = 0; c < kQuads; ++c) {
      const int64_t q = g * kQuads + c;
      __m512i u[NR];
      for (int r = 0; r < NR; ++r) {
        if (ahead != 0)
          _mm_prefetch(reinterpret_cast<const char*>(w + r * tile_bytes + q * 64 + ahead),
                       _MM_HINT_T0);
        u[r] = _mm512_loadu_si512(w + r * tile_bytes + q * 64);
      }
      for (int t = 0; t < NT; ++t) {
        int32_t four;
        std::memcpy(&four, xq + t * K + 4 * q, 4);
        const __m512i x = _mm512_set1_epi32(four);
        for (int r = 0; r < NR; ++r) d[r][t] = _mm512_dpbusd_epi32(d[r][t], u[r], x);
      }
    }
    add_group_sums(acc, d, xscale, groups, g);
  }
  for (int r = 0; r < NR; ++r) {
    const __m512 rs = _mm512_loadu_ps(row_scale + 16 * r);
    if constexpr (kPairs) {
      for (int t = 0; t < NT; t += 2) {
        const __m512 sum = _mm512_add_ps(acc[r][t], acc[r][t + 1]);
        _mm512_storeu_ps(out + (t / 2) * N + 16 * r,
                         _mm512_mul_ps(_mm512_sub_ps(sum, _mm512_set1_ps(fix[t] + fix[t + 1])), rs));
      }
    } else {
      for (int t = 0; t < NT; ++t)
        _mm512_storeu_ps(out + t * N + 16 * r,
                         _mm512_mul_ps(_mm512_sub_ps(acc[r][t], _mm512_set1_ps(fix[t])), rs));
    }
  }
}

// Tiles [t0, t0 + NR) against every term row of `p` (`p.M`: tokens, or with kPairs
// two a token): blocks of 8 term rows while 8 are left, then 4, 2 and (one term) 1.
template <int NR, int CH, bool kPairs>
void q8_tiled_tiles(const Q8Args& p, const uint8_t* w, int64_t t0) {
  const int64_t groups = p.K / (64 * CH), tile_bytes = 16 * p.K;
  const uint8_t* wt = w + t0 * tile_bytes;
  const float* rs = p.row_scale + 16 * t0;
  for (int64_t m = 0; m < p.M;) {
    const int64_t left = p.M - m;
    const int8_t* xq = p.a->q.data() + m * p.K;
    const float* xs = p.a->scale.data() + m * groups;
    float* out = p.out + (kPairs ? m / 2 : m) * p.N + 16 * t0;
    const float* fix = p.bias_fix + m;
    const int nt = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
    auto block = [&](auto rows) {
      constexpr int NT = decltype(rows)::value;
      q8_tiled_block_avx512<NR, NT, CH, kPairs>(wt, tile_bytes, xq, xs, fix, rs, out, p.K, p.N);
    };
    if (nt == 8) block(std::integral_constant<int, 8>{});
    else if (nt == 4) block(std::integral_constant<int, 4>{});
    else if (nt == 2) block(std::integral_constant<int, 2>{});
    else if constexpr (!kPairs) block(std::integral_constant<int, 1>{});
    m += nt;
  }
}

// Tiles [t0, t1) of a q8-tiled weight.  Under 4 term rows the step reads the weight
// at memory speed, four tiles at a time (more loads in flight); from 4 it is bound
// by the products, one tile at a time against 8 term rows (1 x 8 measured ahead of
// 2 x 4, 2 x 8 and 4 x 4 on Gemma 3's 262144 x 640 head at 32 tokens, 2-core Zen 4:
// 19.3 against 19.9 / 22.6 / 22.5 ms; at one token 4 tiles 6.1 ms, 1 tile 7.6).
template <int CH, bool kPairs>
void q8_tiled_range(const Q8Args& p, const uint8_t* w, int64_t t0, int64_t t1) {
  int64_t t = t0;
  if (p.M < 4)
    for (; t + 4 <= t1; t += 4) q8_tiled_tiles<4, CH, kPairs>(p, w, t);
  for (; t < t1; ++t) q8_tiled_tiles<1, CH, kPairs>(p, w, t);
}

template <bool kPairs>
void q8_tiled_rows_avx512(const Q8Args& p, const uint8_t* w, int64_t t0, int64_t t1) {
  if (p.group == 256) return q8_tiled_range<4, kPairs>(p, w, t0, t1);
  if (p.group == 128) return q8_tiled_range<2, kPairs>(p, w, t0, t1);
  q8_tiled_range<1, kPairs>(p, w, t0, t1);
}

__attribute__((target("avx2,fma,f16c")))
inline float q8_hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// One int8 weight row against NT tokens' int16 codes (`quantize_row16_avx2`): each
// group's 64 weights are widened to int16 once for the NT tokens, and each token
// sums its 4 `vpmaddwd` products in int32 (8 products a lane, each under 2^22).
// With group scales (`ws`: Q8_0's, one per 32 inputs) each half of the group is
// scaled by its own before the activation scale.  A token's sums run the same way
// whatever NT is, so its result does not depend on the batch.
template <int NT, bool kGrouped>
__attribute__((target("avx2,fma,f16c")))
void q8_row16_avx2(const int8_t* __restrict w, const c10::Half* __restrict ws,
                   const int16_t* __restrict x, const float* __restrict xscale, float row_scale,
                   float* __restrict out, int64_t K, int64_t N, bool prefetch) {
  const int64_t groups = K / kQ8Group;
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    if (prefetch)
      _mm_prefetch(reinterpret_cast<const char*>(w + kQ8PrefetchRows * K + g * kQ8Group),
                   _MM_HINT_T0);
    __m256i wv[4];
    for (int j = 0; j < 4; ++j)
      wv[j] = _mm256_cvtepi8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + g * kQ8Group + 16 * j)));
    __m256 s0, s1;
    if constexpr (kGrouped) {
      s0 = _mm256_set1_ps(_cvtsh_ss(ws[2 * g].x));
      s1 = _mm256_set1_ps(_cvtsh_ss(ws[2 * g + 1].x));
    }
    for (int t = 0; t < NT; ++t) {
      const __m256i* xt = reinterpret_cast<const __m256i*>(x + t * K + g * kQ8Group);
      const __m256i d01 = _mm256_add_epi32(_mm256_madd_epi16(wv[0], _mm256_loadu_si256(xt)),
                                           _mm256_madd_epi16(wv[1], _mm256_loadu_si256(xt + 1)));
      const __m256i d23 = _mm256_add_epi32(_mm256_madd_epi16(wv[2], _mm256_loadu_si256(xt + 2)),
                                           _mm256_madd_epi16(wv[3], _mm256_loadu_si256(xt + 3)));
      const __m256 xs = _mm256_set1_ps(xscale[t * groups + g]);
      if constexpr (kGrouped) {
        const __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d23), s1,
                                         _mm256_mul_ps(_mm256_cvtepi32_ps(d01), s0));
        acc[t] = _mm256_fmadd_ps(v, xs, acc[t]);
      } else {
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(d01, d23)), xs, acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) out[t * N] = q8_hsum_avx2(acc[t]) * row_scale;
}

// AVX-512 on int16 activation codes (`quantize_row16_avx2`'s): one weight row
// against NT tokens, each group's 64 int8 weights widened to int16 in two
// registers once for the NT tokens, and `vpdpwssd` adds a token's products pairwise
// into int32 lanes (4 products a lane a group, each under 2^22), converted and
// scaled once per group.  At one token the two-int8-term kernel above was bound by
// its per-term float work and horizontal sums (2-core Zen 4, weights out of cache,
// medians of alternating rounds): Gemma 3's 262144 x 640 head 10.1 -> ~7 ms, a
// 49152 x 2048 head 4.7 -> ~3.9 ms; 32 tokens of the first 75 -> 55 ms.  Four rows
// at a time (one shuffle tree for their sums) measured 15-30% slower at one token.
// A token's sums run in the same order whatever NT is, so its result does not
// depend on the batch.
template <int NT, bool kGrouped>
__attribute__((target("avx512f,avx512bw,avx512vnni,f16c")))
void q8_row16_avx512(const int8_t* __restrict w, const c10::Half* __restrict ws,
                     const int16_t* __restrict x, const float* __restrict xscale,
                     float row_scale, float* __restrict out, int64_t K, int64_t N,
                     bool prefetch) {
  const int64_t groups = K / kQ8Group;
  __m512 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t at = g * kQ8Group;
    if (prefetch)
      _mm_prefetch(reinterpret_cast<const char*>(w + kQ8PrefetchRows * K + at), _MM_HINT_T0);
    const __m512i lo =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + at)));
    const __m512i hi =
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + at + 32)));
    __m512 s0, s1;
    if constexpr (kGrouped) {
      s0 = _mm512_set1_ps(_cvtsh_ss(ws[2 * g].x));
      s1 = _mm512_set1_ps(_cvtsh_ss(ws[2 * g + 1].x));
    }
    for (int t = 0; t < NT; ++t) {
      const __m512i x0 = _mm512_loadu_si512(x + t * K + at);
      const __m512i x1 = _mm512_loadu_si512(x + t * K + at + 32);
      const __m512 xs = _mm512_set1_ps(xscale[t * groups + g]);
      const __m512i zero = _mm512_setzero_si512();
      if constexpr (kGrouped) {
        const __m512 d0 = _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(zero, lo, x0));
        const __m512 d1 = _mm512_cvtepi32_ps(_mm512_dpwssd_epi32(zero, hi, x1));
        acc[t] = _mm512_fmadd_ps(_mm512_fmadd_ps(d1, s1, _mm512_mul_ps(d0, s0)), xs, acc[t]);
      } else {
        const __m512i d = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(zero, lo, x0), hi, x1);
        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), xs, acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) out[t * N] = _mm512_reduce_add_ps(acc[t]) * row_scale;
}

// The int16-code kernels above as `run<NT, kGrouped>`, for the shared driver below.
struct Avx2Q8 {
  template <int NT, bool kGrouped, typename... Args>
  static void run(Args... args) { q8_row16_avx2<NT, kGrouped>(args...); }
};

struct Avx512Q8 {
  template <int NT, bool kGrouped, typename... Args>
  static void run(Args... args) { q8_row16_avx512<NT, kGrouped>(args...); }
};

// Row n of `p` against NT (8, 4, 2 or 1) tokens from token m (int16 codes).
template <typename Kernel, bool kGrouped>
void q8_row16_tokens(const Q8Args& p, int64_t n, int64_t m, int64_t nt) {
  const int64_t groups = p.K / kQ8Group;
  const int8_t* w = p.w + n * p.K;
  const c10::Half* ws = kGrouped ? p.group_scale + n * (p.K / kQ8WGroup) : nullptr;
  const int16_t* x = p.a->q16.data() + m * p.K;
  const float* xs = p.a->scale.data() + m * groups;
  const float rs = kGrouped ? 1.f : p.row_scale[n];
  float* out = p.out + m * p.N + n;
  const bool pf = m == 0;
  if (nt == 8) Kernel::template run<8, kGrouped>(w, ws, x, xs, rs, out, p.K, p.N, pf);
  else if (nt == 4) Kernel::template run<4, kGrouped>(w, ws, x, xs, rs, out, p.K, p.N, pf);
  else if (nt == 2) Kernel::template run<2, kGrouped>(w, ws, x, xs, rs, out, p.K, p.N, pf);
  else Kernel::template run<1, kGrouped>(w, ws, x, xs, rs, out, p.K, p.N, pf);
}

// Rows [r0, r1) against every token, in blocks of kQ8Block16 rows x 8 tokens, so
// that both the rows and the tokens' codes stay in L1 while they meet.
constexpr int64_t kQ8Block16 = 16;

template <typename Kernel>
void q8_rows16(const Q8Args& p, int64_t r0, int64_t r1) {
  const int64_t M = p.M / 2;  // p.M counts two term rows a token
  for (int64_t n0 = r0; n0 < r1; n0 += kQ8Block16) {
    const int64_t n1 = std::min(r1, n0 + kQ8Block16);
    for (int64_t m = 0; m < M;) {
      const int64_t left = M - m, nt = left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      for (int64_t n = n0; n < n1; ++n) {
        if (p.group_scale) q8_row16_tokens<Kernel, true>(p, n, m, nt);
        else q8_row16_tokens<Kernel, false>(p, n, m, nt);
      }
      m += nt;
    }
  }
}
#endif

}  // namespace
