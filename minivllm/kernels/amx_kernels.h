// The q4 GEMM on Intel AMX tiles, for batches of tokens (minivllm's own; included by
// lowbit_kernels.h, whose weight layout and quantized activations it reads).
//
// A q4 weight tile's 64-byte blocks are already the layout AMX wants for its B
// operand: byte 4 r + j of block c holds output row r's codes for inputs 8 c + j
// (low nibble) and 8 c + 4 + j (high nibble), so the low nibbles of a block are one
// B row (16 columns x 4 inputs) and the high nibbles the next.  Per group of 32
// inputs, `tdpbsud` multiplies 16 activation rows (signed int8 codes) by the 16
// output rows' unsigned codes: 16 x 16 x 32 products in one instruction, where the
// AVX-512 VNNI kernel needs 128 `vpdpbusd`.  Each group's int32 sums are then
// scaled in float32 (activation scale x weight scale, plus weight min x activation
// sum) with exactly the VNNI kernel's operations, so the two give the same bits and
// a row's result does not depend on how many rows its batch has.
//
// AMX needs the kernel's permission once per process (`arch_prctl`) and a tile
// configuration on every thread that uses it; `amx_ready` does both, and
// `lowbit_amx` (lowbit_cpu.cpp) turns the path off for tests.

#pragma once

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kAmxMinRows = 24;  // term rows (12 tokens) from which AMX is used
constexpr int64_t kQ8AmxMinRows = 6;  // the same for q8 (3 tokens; at 2 the two tie)

#if defined(__x86_64__)
// Whether this CPU has AMX-TILE and AMX-INT8 and Linux let this process use them.
bool amx_supported() {
  unsigned eax, ebx, ecx, edx;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool tile = edx & (1u << 24), int8 = edx & (1u << 25);
  if (!tile || !int8) return false;
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

const bool kHasAmx = amx_supported();
std::atomic<bool> g_amx_on{kHasAmx};

// The tile configuration of `q4_rows_amx`, two sets used by alternate groups: tiles
// 0 and 1 the int32 sums (16 x 16), 2 and 3 the activations (16 rows x 32 codes),
// 4 and 5 the weights (8 rows x 64 bytes).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Set on every call: other code on this thread (oneDNN's AMX GEMMs) may have loaded
// a configuration of its own since.
__attribute__((target("amx-tile"))) void configure_tiles() {
  TileConfig c;
  for (int i = 0; i < 2; ++i) {
    c.colsb[i] = 64;
    c.rows[i] = 16;
    c.colsb[2 + i] = 32;
    c.rows[2 + i] = 16;
    c.colsb[4 + i] = 64;
    c.rows[4 + i] = 8;
  }
  _tile_loadconfig(&c);
}

// One weight tile's codes as AMX B rows, all groups: [groups][8 rows][64 bytes];
// with a fifth bits' plane (`hb`: q5) 16 is added where its bit is set, as the
// VNNI kernel adds it (codes 0..31 are still unsigned bytes for `tdpbsud`).
__attribute__((target("avx512f,avx512bw"))) void unpack_tile(const uint8_t* __restrict w,
                                                             const uint8_t* __restrict hb,
                                                             int64_t groups, uint8_t* b) {
  const __m512i low = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
  for (int64_t blk = 0; blk < groups * 4; ++blk) {
    const __m512i v = _mm512_loadu_si512(w + blk * 64);
    __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    if (hb != nullptr) {
      uint64_t m[2];
      std::memcpy(m, hb + blk * 16, 16);
      lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(m[0]), lo, sixteen);
      hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(m[1]), hi, sixteen);
    }
    _mm512_store_si512(b + (2 * blk) * 64, lo);
    _mm512_store_si512(b + (2 * blk + 1) * 64, hi);
  }
}

// acc[i] += group g's int32 sums of term row r0 + i (in c, 16 x 16) scaled, and for
// the even (first-term) rows accm[i / 2] += the weight mins times the group sum: the
// VNNI kernel's operations in its order, so every row comes out bit for bit as it
// does there, whatever the batch (batch invariance).
// All 16 rows, padding included (its scales are allocated, its results dropped), so
// the loop is unrolled and the sums stay in registers.
__attribute__((target("avx512f"), always_inline)) inline void scale_sums(
    const int32_t* __restrict c, __m512 scale, __m512 mins, const float* __restrict xscale,
    const float* __restrict xsum, int64_t r0, int64_t groups, int64_t g, __m512* acc,
    __m512* accm) {
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) {
    const int64_t at = (r0 + i) * groups + g;
    const __m512 sums = _mm512_cvtepi32_ps(_mm512_load_si512(c + i * 16));
    acc[i] = _mm512_fmadd_ps(sums, _mm512_mul_ps(scale, _mm512_set1_ps(xscale[at])), acc[i]);
    if ((i & 1) == 0)
      accm[i / 2] = _mm512_fmadd_ps(mins, _mm512_set1_ps(xsum[at]), accm[i / 2]);
  }
}

// Group g's products for term rows [r0, r0 + 16) into sums tile P, activations in
// tile A, weights in B (GCC's tile intrinsics take literal tile numbers: macros,
// not templates).
#define MINIVLLM_GROUP_PRODUCT(P, A, B, g)               \
  do {                                                   \
    _tile_zero(P);                                       \
    _tile_loadd(B, b + (g) * 512, 64);                   \
    _tile_loadd(A, xq + r0 * K + (g) * kQ4Group, K);     \
    _tile_dpbsud(P, A, B);                               \
  } while (0)

// Group g's sums (tile P) stored and scaled into acc / accm.
#define MINIVLLM_GROUP_SCALED(P, g)                                           \
  do {                                                                        \
    _tile_stored(P, c[P], 64);                                                \
    group_scaled(ss, sm, xscale, xsum, r0, groups, g, c[P], acc, accm);       \
  } while (0)

// `scale_sums` of group g with the weight tile's scales and mins for it.
__attribute__((target("avx512f"), always_inline)) inline void group_scaled(
    const Q4Scales& ss, const uint8_t* __restrict sm, const float* __restrict xscale,
    const float* __restrict xsum, int64_t r0, int64_t groups, int64_t g, const int32_t* c,
    __m512* acc, __m512* accm) {
  __m512 scale, mins;
  group_scales_avx512(ss, sm, g, scale, mins);
  scale_sums(c, scale, mins, xscale, xsum, r0, groups, g, acc, accm);
}

// Output columns [16 t, 16 t + 16) (at `out`, rows N apart) of the tokens whose
// term rows are [r0, r0 + 16): rows past the activations' end are computed from
// padding and dropped.  `b` is the tile's unpacked codes (`unpack_tile`).  Groups
// alternate between two tile sets, so the matrix unit computes group g + 1 while
// the vector units scale group g (with one set each product waited for its
// store: 32 tokens x a 16384 x 2048 weight 7.8 ms, now 5.6; VNNI 7.1).
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw"))) void q4_rows_amx(
    const uint8_t* __restrict b, const Q4Scales& ss, const uint8_t* __restrict sm,
    const int8_t* __restrict xq,
    const float* __restrict xscale, const float* __restrict xsum, int64_t r0, int64_t rows,
    int64_t K, int64_t N, float* __restrict out) {
  const int64_t groups = K / kQ4Group;
  alignas(64) int32_t c[2][16 * 16];
  __m512 acc[16], accm[8];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
  for (int i = 0; i < 8; ++i) accm[i] = _mm512_setzero_ps();
  MINIVLLM_GROUP_PRODUCT(0, 2, 4, 0);
  int64_t g = 1;
  for (; g + 1 < groups; g += 2) {
    MINIVLLM_GROUP_PRODUCT(1, 3, 5, g);
    MINIVLLM_GROUP_SCALED(0, g - 1);
    MINIVLLM_GROUP_PRODUCT(0, 2, 4, g + 1);
    MINIVLLM_GROUP_SCALED(1, g);
  }
  if (g < groups) {  // an even number of groups: one left to start
    MINIVLLM_GROUP_PRODUCT(1, 3, 5, g);
    MINIVLLM_GROUP_SCALED(0, g - 1);
    MINIVLLM_GROUP_SCALED(1, g);
  } else {
    MINIVLLM_GROUP_SCALED(0, g - 1);
  }
  const int64_t tokens = std::min<int64_t>(16, rows - r0) / 2;
  for (int64_t i = 0; i < tokens; ++i)
    _mm512_storeu_ps(out + (r0 / 2 + i) * N,
                     _mm512_add_ps(_mm512_add_ps(acc[2 * i], accm[i]), acc[2 * i + 1]));
}

// Tiles [t0, t1) of out [rows / 2, N] from the 2 M term rows of `a` (whose codes
// and scales are padded to a multiple of 16 rows): token m's output is term row
// 2 m's sum plus term row 2 m + 1's, as in the VNNI kernel.
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw"))) void q4_tiles_amx(
    const uint8_t* w, const uint8_t* hb, const Q4Scales& sm, const QuantizedRows& a, int64_t M,
    int64_t K, int64_t N, float* out, int64_t t0, int64_t t1) {
  configure_tiles();
  const int64_t groups = K / kQ4Group, rows = 2 * M;
  thread_local std::vector<uint8_t> codes;
  codes.resize(groups * 512 + 64);  // 512 bytes a group, aligned to 64 below
  uint8_t* b = codes.data() + (64 - reinterpret_cast<uintptr_t>(codes.data()) % 64) % 64;
  for (int64_t t = t0; t < t1; ++t) {
    unpack_tile(w + t * (K / 8) * 64, hb == nullptr ? nullptr : hb + t * (K / 8) * 16, groups, b);
    const uint8_t* st = sm.tile(t);
    for (int64_t r0 = 0; r0 < rows; r0 += 16)
      q4_rows_amx(b, sm, st, a.q.data(), a.scale.data(), a.sum.data(), r0, rows, K, N,
                  out + t * kRowTile);
  }
}

// ---------------------------------------------------------------------------
// The q8 GEMM (row-major int8 weights, one float scale per row) on AMX.  Here the
// weights are the A operand, loaded straight from their rows (16 weight rows x 64
// inputs a tile, K bytes apart), and the activations are B: for each 64 inputs,
// 16 B rows (4 inputs each) of 16 term rows' codes, re-laid once per call
// (`pack_q8_b`, a gather a B row).  `tdpbssd` (s8 x s8, no sign fix-up) gives the
// int32 sums C[weight row][term row] of 64 inputs; each activation group's sums
// (its 256, 128 or 64 inputs: `q8_act_group`) are converted and scaled once by the
// term rows' scales, a vector along C's row.  The row scale and the token's two
// terms are applied last.  The sums are exact, but the float steps (and, below 3
// tokens, the activation codes: int16 there) differ from the vector kernels', so a
// row's last bits depend on which kernel its batch size picks: the row-independent
// path (`VLLM_BATCH_INVARIANT=1`) keeps the int16-code kernel at every size.

constexpr int64_t kQ8AmxChunk = 64;  // inputs per `tdpbssd`

// Tiles 0-3 the int32 sums of four blocks of term rows, 4 the weights, 5-7 the
// activations: all 16 rows x 64 bytes.
__attribute__((target("amx-tile"))) void configure_q8_tiles() {
  TileConfig c;
  for (int i = 0; i < 8; ++i) {
    c.colsb[i] = 64;
    c.rows[i] = 16;
  }
  _tile_loadconfig(&c);
}

// Term rows [r0, r0 + 16) of the codes `q` ([rows, K]) as B operands: B row k4
// (inputs 4 k4 .. 4 k4 + 3 of every term row) at b + 64 k4, so input chunk c's
// tile starts at b + 1024 c; and their scales per group as [groups][16].
__attribute__((target("avx512f"))) void pack_q8_b(const int8_t* __restrict q,
                                                  const float* __restrict scale, int64_t r0,
                                                  int64_t K, int64_t groups, int8_t* __restrict b,
                                                  float* __restrict xs) {
  const __m512i rows = _mm512_mullo_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
      _mm512_set1_epi32(static_cast<int>(K)));
  const int8_t* base = q + r0 * K;
  for (int64_t k4 = 0; k4 < K / 4; ++k4)
    _mm512_store_si512(b + 64 * k4, _mm512_i32gather_epi32(rows, base + 4 * k4, 1));
  for (int64_t g = 0; g < groups; ++g)
    for (int i = 0; i < 16; ++i) xs[g * 16 + i] = scale[(r0 + i) * groups + g];
}

// Block R's sums of input chunk ch into tile R (the weights' chunk is in tile 4).
#define MINIVLLM_Q8_BLOCK_PRODUCT(R, B)                       \
  do {                                                        \
    _tile_loadd(B, b + (R) * block_bytes + ch * 1024, 64);    \
    _tile_dpbssd(R, 4, B);                                    \
  } while (0)

// Weight rows [n, n + 16) (`w` at row n) against `nb` (1-4) blocks of 16 term rows
// packed in `b` / `xs` (block r at b + r block_bytes, xs + r block_scales): the
// outputs of token t (counted from the first block's) for t < `tokens` into
// out + t N.  Per activation group, each block's sums accumulate over its CH
// chunks in a tile of its own (four independent chains keep the matrix unit busy,
// where one block at a time waited on each product's latency: Gemma 3's head at
// 32 rows 24 -> 15 ms), then are stored, converted and scaled into float sums.
template <int CH>
__attribute__((target("amx-tile,amx-int8,avx512f"))) void q8_tile_amx(
    const int8_t* __restrict w, const int8_t* __restrict b, int64_t block_bytes,
    const float* __restrict xs, int64_t block_scales, const float* __restrict row_scale,
    int64_t K, int64_t groups, int nb, int64_t tokens, int64_t N, float* __restrict out) {
  alignas(64) int32_t c[4][16 * 16];
  alignas(64) float acc[4][16][16];
  std::memset(acc, 0, sizeof(acc));
  for (int64_t g = 0; g < groups; ++g) {
    _tile_zero(0);
    if (nb > 1) _tile_zero(1);
    if (nb > 2) _tile_zero(2);
    if (nb > 3) _tile_zero(3);
    for (int64_t ch = g * CH; ch < (g + 1) * CH; ++ch) {
      _tile_loadd(4, w + ch * kQ8AmxChunk, K);
      MINIVLLM_Q8_BLOCK_PRODUCT(0, 5);
      if (nb > 1) MINIVLLM_Q8_BLOCK_PRODUCT(1, 6);
      if (nb > 2) MINIVLLM_Q8_BLOCK_PRODUCT(2, 7);
      if (nb > 3) MINIVLLM_Q8_BLOCK_PRODUCT(3, 5);
    }
    _tile_stored(0, c[0], 64);
    if (nb > 1) _tile_stored(1, c[1], 64);
    if (nb > 2) _tile_stored(2, c[2], 64);
    if (nb > 3) _tile_stored(3, c[3], 64);
    for (int r = 0; r < nb; ++r) {
      const __m512 s = _mm512_load_ps(xs + r * block_scales + g * 16);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        _mm512_store_ps(acc[r][i],
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[r] + i * 16)), s,
                                        _mm512_load_ps(acc[r][i])));
    }
  }
  // acc[r][i] lane j: weight row n + i, term row j of block r; a token is lanes
  // 2 t and 2 t + 1.
  for (int r = 0; r < nb; ++r) {
    alignas(64) float sums[16][16];
    for (int i = 0; i < 16; ++i) {
      const __m512 v = _mm512_load_ps(acc[r][i]);
      _mm512_store_ps(sums[i], _mm512_mul_ps(_mm512_add_ps(v, _mm512_permute_ps(v, 0xB1)),
                                             _mm512_set1_ps(row_scale[i])));
    }
    const int64_t left = std::min<int64_t>(8, tokens - 8 * r);
    for (int64_t t = 0; t < left; ++t)
      for (int i = 0; i < 16; ++i) out[(8 * r + t) * N + i] = sums[i][2 * t];
  }
}

// Columns [n0, n1) of out [M, N] for whole 16-row weight tiles from n0; the column
// where they stop (the caller computes the rest).  CH chunks of 64 inputs per
// activation scale.
template <int CH>
__attribute__((target("amx-tile,amx-int8,avx512f"))) int64_t q8_cols_amx_ch(
    const int8_t* w, const float* row_scale, const QuantizedRows& a, int64_t M, int64_t K,
    int64_t N, float* out, int64_t n0, int64_t n1) {
  const int64_t groups = K / (CH * kQ8AmxChunk), rows = 2 * M, blocks = (rows + 15) / 16;
  const int64_t tiles = (n1 - n0) / 16;
  if (tiles == 0) return n0;
  thread_local std::vector<int8_t> packed;
  thread_local std::vector<float> scales;
  const int64_t block_bytes = 16 * K, block_scales = 16 * groups;
  packed.resize(blocks * block_bytes + 64);
  scales.resize(blocks * block_scales + 16);
  int8_t* b = packed.data() + (64 - reinterpret_cast<uintptr_t>(packed.data()) % 64) % 64;
  float* xs = scales.data() + (16 - (reinterpret_cast<uintptr_t>(scales.data()) / 4) % 16) % 16;
  for (int64_t r = 0; r < blocks; ++r)
    pack_q8_b(a.q.data(), a.scale.data(), 16 * r, K, groups, b + r * block_bytes,
              xs + r * block_scales);
  configure_q8_tiles();
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n = n0 + 16 * t;
    for (int64_t r = 0; r < blocks; r += 4)  // four blocks (32 tokens) at a time
      q8_tile_amx<CH>(w + n * K, b + r * block_bytes, block_bytes, xs + r * block_scales,
                      block_scales, row_scale + n, K, groups,
                      static_cast<int>(std::min<int64_t>(4, blocks - r)), M - 8 * r, N,
                      out + (8 * r) * N + n);
  }
  return n0 + 16 * tiles;
}

int64_t q8_cols_amx(const int8_t* w, const float* row_scale, const QuantizedRows& a, int64_t M,
                    int64_t K, int64_t N, float* out, int64_t n0, int64_t n1, int64_t group) {
  if (group == 256) return q8_cols_amx_ch<4>(w, row_scale, a, M, K, N, out, n0, n1);
  if (group == 128) return q8_cols_amx_ch<2>(w, row_scale, a, M, K, N, out, n0, n1);
  return q8_cols_amx_ch<1>(w, row_scale, a, M, K, N, out, n0, n1);
}

#else
const bool kHasAmx = false;
std::atomic<bool> g_amx_on{false};
#endif

// Whether the q4 GEMM of `rows` term rows runs on AMX here (q8: from `min_rows`).
inline bool use_amx(int64_t rows, int64_t min_rows = kAmxMinRows) {
  return kHasAmx && rows >= min_rows && g_amx_on.load(std::memory_order_relaxed);
}

}  // namespace
