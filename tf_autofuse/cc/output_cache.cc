// See output_cache.h.

#include "output_cache.h"

#include <cstdlib>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "tensorflow/core/framework/allocator.h"

namespace tf_autofuse {
namespace {

// Blocks are whole 2 MiB (huge) pages: the kernel may back them with huge pages, and outputs
// whose sizes differ by less than a page share blocks.
constexpr size_t kBlockAlign = size_t{2} << 20;

size_t RoundUp(size_t bytes) { return (bytes + kBlockAlign - 1) / kBlockAlign * kBlockAlign; }

class OutputCache : public tensorflow::Allocator {
 public:
  std::string Name() override { return "autofuse_output_cache"; }

  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    if (alignment > kBlockAlign) return nullptr;  // never asked for by TensorFlow (64 bytes)
    const size_t size = RoundUp(num_bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it) {
        if (it->first != size) continue;
        void* block = it->second;
        idle_.erase(it);
        idle_bytes_ -= size;
        ++hits_;
        return block;
      }
      ++misses_;
    }
    void* block = std::aligned_alloc(kBlockAlign, size);
    if (block == nullptr) return nullptr;  // the Tensor is then uninitialized: the caller falls back
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(block, size, MADV_HUGEPAGE);  // fewer, larger page faults for the first use
#endif
    std::lock_guard<std::mutex> lock(mu_);
    sizes_[block] = size;
    return block;
  }

  void DeallocateRaw(void* ptr) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const size_t size = sizes_.at(ptr);
      idle_.emplace_front(size, ptr);
      idle_bytes_ += size;
    }
    Trim();
  }

  bool on() {
    std::lock_guard<std::mutex> lock(mu_);
    return budget_ > 0;
  }

  void set_budget(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      budget_ = bytes;
    }
    Trim();
  }

  void Stats(int64_t* out) {
    std::lock_guard<std::mutex> lock(mu_);
    out[0] = hits_;
    out[1] = misses_;
    out[2] = static_cast<int64_t>(idle_bytes_);
    out[3] = static_cast<int64_t>(idle_.size());
  }

 private:
  // Releases the oldest idle blocks until the idle bytes fit the budget.
  void Trim() {
    std::vector<void*> released;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (idle_bytes_ > budget_ && !idle_.empty()) {
        idle_bytes_ -= idle_.back().first;
        sizes_.erase(idle_.back().second);
        released.push_back(idle_.back().second);
        idle_.pop_back();
      }
    }
    for (void* block : released) std::free(block);  // unmapping outside the lock
  }

  std::mutex mu_;
  size_t budget_ = 0;                           // most idle bytes kept; 0: the cache is off
  std::unordered_map<void*, size_t> sizes_;     // every block this cache allocated, live or idle
  std::list<std::pair<size_t, void*>> idle_;    // (size, block), most recently freed first
  size_t idle_bytes_ = 0;
  int64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: tensors holding its blocks may outlive every kernel (a variable adopts an
// output), and they free them into it until the process ends.
OutputCache* const cache = new OutputCache();

}  // namespace

tensorflow::Allocator* OutputCacheFor(int64_t bytes) {
  if (bytes < kOutputCacheMinBytes || !cache->on()) return nullptr;
  return cache;
}

}  // namespace tf_autofuse

// C entry points for tf_autofuse/_native.py (ctypes).
extern "C" __attribute__((visibility("default"))) void autofuse_set_output_cache(int64_t bytes) {
  tf_autofuse::cache->set_budget(bytes > 0 ? static_cast<size_t>(bytes) : 0);
}

// out[0..3]: hits (outputs that reused an idle block), misses (new blocks), idle bytes, idle
// blocks.
extern "C" __attribute__((visibility("default"))) void autofuse_output_cache_stats(int64_t* out) {
  tf_autofuse::cache->Stats(out);
}
