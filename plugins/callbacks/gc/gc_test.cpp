// callback/gc on the host: free pages that malloc keeps after a burst of small allocations are
// given back (malloc_trim) on gc's steps, and the released bytes are reported.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/run/memory_stats.hpp"
#include "tessera/components/model.hpp"
#include "test_support.hpp"

namespace tessera {
namespace gc_test {

#if defined(__SANITIZE_ADDRESS__)
#define TESSERA_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSERA_UNDER_ASAN 1
#endif
#endif

TEST(Gc, GivesFreedHeapPagesBackOnItsSteps) {
#ifdef TESSERA_UNDER_ASAN
  GTEST_SKIP() << "under ASan, malloc is ASan's allocator, which keeps freed memory in quarantine and has no "
                  "malloc_trim to give pages back; the release build runs this test";
#endif
  RunContext run;
  TrainProgress progress;
  TrainerControl control;
  auto components = testing::build_components(
      "model: {component_key: model, variant_key: gpt, config: {vocab_size: 16, n_layer: 1, n_head: 1, n_embd: 8, max_seq_len: 4}}\n"
      "gc: {component_key: callback, variant_key: gc, config: {every: 2}}\n",
      run);
  auto model = testing::built<Model>(components, "model");
  auto gc = testing::built<Callback>(components, "gc");
  CallbackContext ctx{run, progress, *model, control};

  // 192 MiB in 2 KiB blocks (below malloc's mmap threshold, so they live on the heap), all freed
  // but the last, which pins the heap's top: free() alone cannot shrink it.
  std::vector<std::unique_ptr<char[]>> blocks;
  for (int i = 0; i < 96 * 1024; ++i) {
    blocks.emplace_back(new char[2048]);
    for (int j = 0; j < 2048; j += 512) blocks.back()[j] = static_cast<char>(j);
  }
  auto pin = std::move(blocks.back());
  blocks.pop_back();
  blocks.clear();
  const std::int64_t held = memory_stats(c10::Device(c10::kCPU)).in_use;

  StepMetrics odd;
  odd.step = 1;
  gc->on_collect_metrics(ctx, odd);
  EXPECT_FALSE(odd.extra.count("gc/released_bytes")) << "gc runs only every 2 steps";

  StepMetrics even;
  even.step = 2;
  gc->on_collect_metrics(ctx, even);
  ASSERT_TRUE(even.extra.count("gc/released_bytes"));
  EXPECT_GT(even.extra.at("gc/released_bytes"), 100.0 * (1 << 20));
  EXPECT_LT(memory_stats(c10::Device(c10::kCPU)).in_use, held - 100 * (1 << 20));
}

}  // namespace gc_test
}  // namespace tessera
