// The ``minivllm_cpu::decode_attention`` op: a torch wrapper around
// attention_kernels.h (the kernel, its threading and code paths are described there).

#include "attention_kernels.h"

#include <ATen/ops/empty.h>
#include <torch/library.h>

namespace {

// out [B, nh * hd] = attention of `query` over each request's context, after
// writing `key` / `value` [B, nkv * hd] to `slots` of `cache` [2, blocks,
// block_size, nkv, hd].  `window` > 0 limits each query to its last `window` keys.
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& key,
                            const at::Tensor& value, at::Tensor cache, const at::Tensor& block_table,
                            const at::Tensor& seq_lens, const at::Tensor& slots, double scale,
                            int64_t window) {
  TORCH_CHECK(cache.dim() == 5 && cache.size(0) == 2 && cache.is_contiguous(),
              "decode_attention: cache must be contiguous [2, blocks, block_size, kv_heads, head_dim]");
  TORCH_CHECK(cache.scalar_type() == at::kFloat || cache.scalar_type() == at::kBFloat16,
              "decode_attention: float32 or bfloat16 cache");
  TORCH_CHECK(block_table.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt &&
                  slots.scalar_type() == at::kLong,
              "decode_attention: int32 block table and lengths, int64 slots");
  Shape s;
  s.batch = query.size(0);
  s.num_blocks = cache.size(1);
  s.block_size = cache.size(2);
  s.num_kv = cache.size(3);
  s.head_dim = cache.size(4);
  s.num_heads = query.size(1) / s.head_dim;
  s.table_width = block_table.size(1);
  s.scale = static_cast<float>(scale);
  s.window = window;
  TORCH_CHECK(s.num_heads % s.num_kv == 0 && key.size(1) == s.num_kv * s.head_dim,
              "decode_attention: head counts do not match the cache");
  const at::Tensor q = query.to(at::kFloat).contiguous();
  const at::Tensor k = key.to(at::kFloat).contiguous(), v = value.to(at::kFloat).contiguous();
  const at::Tensor table = block_table.contiguous(), lens = seq_lens.contiguous();
  const at::Tensor sl = slots.contiguous();
  TORCH_CHECK(table.size(0) >= s.batch && lens.numel() >= s.batch && sl.numel() >= s.batch,
              "decode_attention: block table, lengths and slots need a row per request");
  check_paged(s, table.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), sl.data_ptr<int64_t>(),
              "decode_attention");
  at::Tensor out = at::empty({s.batch, s.num_heads * s.head_dim}, q.options());
  if (cache.scalar_type() == at::kFloat) {
    float* c = cache.data_ptr<float>();
    write_rows(s, c, k.data_ptr<float>(), k.size(1), v.data_ptr<float>(), v.size(1), sl.data_ptr<int64_t>());
    attend(s, q.data_ptr<float>(), c, table.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), out.data_ptr<float>());
  } else {
    auto* c = cache.data_ptr<c10::BFloat16>();
    write_rows(s, c, k.data_ptr<float>(), k.size(1), v.data_ptr<float>(), v.size(1), sl.data_ptr<int64_t>());
    attend(s, q.data_ptr<float>(), c, table.data_ptr<int32_t>(), lens.data_ptr<int32_t>(), out.data_ptr<float>());
  }
  return out.to(query.scalar_type());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minivllm_cpu, m) {
  m.def(
      "decode_attention(Tensor query, Tensor key, Tensor value, Tensor(a!) cache, "
      "Tensor block_table, Tensor seq_lens, Tensor slots, float scale, int window) -> Tensor");
}

TORCH_LIBRARY_IMPL(minivllm_cpu, CPU, m) { m.impl("decode_attention", decode_attention); }
