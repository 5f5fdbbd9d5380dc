// A CPU allocator that keeps large freed blocks for reuse (`install_block_cache`).
//
// glibc serves any block above 32 MiB (its largest mmap threshold) with a fresh mmap
// and unmaps it on free, so a tensor of that size costs a page fault per 4 KiB every
// time it is made: ~11 ms for the 32 MiB float32 logits of 32 rows of a 262k-token
// vocabulary, several times a decode step (the int32 LM-head product, the logits, the
// sampler's copy, its softmax).  This allocator hands blocks from 16 MiB up out of a
// list of freed blocks of the same size (rounded to 2 MiB), asks the kernel for
// transparent huge pages on new ones, and keeps at most `limit` bytes cached: a freed
// block that does not fit pushes out the blocks freed longest ago, whatever their
// size, so a change of shapes (a new batch size) replaces what the old ones left.
// Smaller blocks go to torch's default CPU allocator as before.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <sys/mman.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <list>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

constexpr size_t kLargeBytes = size_t{16} << 20;
constexpr size_t kGranule = size_t{2} << 20;

struct BlockCache {
  std::mutex mutex;
  std::unordered_map<void*, size_t> live;               // large blocks in use -> size
  std::list<std::pair<size_t, void*>> free;             // cached blocks, oldest first
  size_t cached = 0, limit = 0;
  int64_t hits = 0, misses = 0;
};

BlockCache& cache() {
  static BlockCache* instance = new BlockCache();  // never destroyed: frees run at exit
  return *instance;
}

// Takes the blocks freed longest ago off the list until the cache is within its limit;
// the caller frees them once the lock is released.  Called with the lock held.
std::vector<void*> trim(BlockCache& c) {
  std::vector<void*> evicted;
  while (c.cached > c.limit && !c.free.empty()) {
    evicted.push_back(c.free.front().second);
    c.cached -= c.free.front().first;
    c.free.pop_front();
  }
  return evicted;
}

// The deleter of the large blocks (and the raw deleter of all): a large one goes back
// to the free list (or to the system past the limit), a small one to c10's free.
void release(void* data) {
  bool large = false;
  std::vector<void*> evicted;
  {
    BlockCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.live.find(data);
    if (it != c.live.end()) {
      large = true;
      const size_t size = it->second;
      c.live.erase(it);
      c.free.emplace_back(size, data);
      c.cached += size;
      evicted = trim(c);  // may include this block, when it alone is over the limit
    }
  }
  if (!large) c10::free_cpu(data);
  for (void* block : evicted) std::free(block);
}

class CachingCpuAllocator final : public c10::Allocator {
 public:
  explicit CachingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) override {
    const c10::Device device(c10::DeviceType::CPU);
    // Small blocks keep torch's own allocation and deleter: no lock on their frees
    // (a decode step frees thousands; taking the lock for each cost ~5% at batch 1).
    if (n < kLargeBytes) return base_->allocate(n);
    const size_t size = (n + kGranule - 1) / kGranule * kGranule;
    BlockCache& c = cache();
    void* data = nullptr;
    {
      std::lock_guard<std::mutex> lock(c.mutex);
      // The most recently freed block of this size: its pages are the likeliest to be
      // in cache.  The list holds at most limit / 16 MiB entries.
      auto it = std::find_if(c.free.rbegin(), c.free.rend(),
                             [size](const auto& block) { return block.first == size; });
      if (it != c.free.rend()) {
        data = it->second;
        c.free.erase(std::next(it).base());
        c.cached -= size;
        ++c.hits;
      } else {
        ++c.misses;
      }
    }
    if (data == nullptr) {
      data = std::aligned_alloc(kGranule, size);
      TORCH_CHECK(data != nullptr, "minivllm's CPU block cache: out of memory allocating ",
                  size, " bytes");
      madvise(data, size, MADV_HUGEPAGE);  // a hint: fewer, larger faults where allowed
    }
    {
      std::lock_guard<std::mutex> lock(c.mutex);
      c.live.emplace(data, size);
    }
    return {data, data, &release, device};
  }

  // `release` frees a small block with c10's free too (the default CPU allocator's
  // blocks come from c10's alloc_cpu), so raw allocation works for both sizes.
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

// Makes the cache the process's CPU allocator (once; a later call only sets the limit,
// handing cached blocks past a lower one back to the system).  Blocks made before keep
// their own deleters.  Returns 1.
int64_t install_block_cache(int64_t limit_bytes) {
  static std::once_flag installed;
  std::vector<void*> evicted;
  {
    BlockCache& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    c.limit = static_cast<size_t>(std::max<int64_t>(limit_bytes, 0));
    evicted = trim(c);
  }
  for (void* block : evicted) std::free(block);
  std::call_once(installed, [] {
    c10::SetCPUAllocator(new CachingCpuAllocator(c10::GetDefaultCPUAllocator()), 255);
  });
  return 1;
}

// [cached bytes, blocks reused, blocks newly made, large blocks in use, limit]
std::vector<int64_t> block_cache_stats() {
  BlockCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return {static_cast<int64_t>(c.cached), c.hits, c.misses, static_cast<int64_t>(c.live.size()),
          static_cast<int64_t>(c.limit)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(minivllm_cpu, m) {
  m.def("install_block_cache(int limit_bytes) -> int", install_block_cache);
  m.def("block_cache_stats() -> int[]", block_cache_stats);
}
