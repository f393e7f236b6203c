// Forward and backward of causal self-attention as the model plugins call it, timed for
// tessera::causal_attention (q, k, v views into one projection's output, as llama),
// tessera::causal_self_attention (the projection's output itself, as gpt; without grouped queries)
// and LibTorch's at::scaled_dot_product_attention on the views, interleaved. Run by
// tools/bench/attention.
//   tessera_bench_attention BATCH HEADS KV_HEADS SEQ HEAD_DIM REPEATS
// Prints one JSON line: the median milliseconds of each (packed_ms 0 with grouped queries) and
// whether the CPU kernel ran.
#include <ATen/Parallel.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "tessera/kernels/attention.hpp"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double milliseconds(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s BATCH HEADS KV_HEADS SEQ HEAD_DIM REPEATS\n", argv[0]);
    return 2;
  }
  const std::int64_t batch = std::atoll(argv[1]), heads = std::atoll(argv[2]), kv_heads = std::atoll(argv[3]),
                     seq = std::atoll(argv[4]), dim = std::atoll(argv[5]);
  const int repeats = std::atoi(argv[6]);
  const at::Tensor qkv = at::randn({batch, seq, (heads + 2 * kv_heads) * dim}).requires_grad_();
  const at::Tensor upstream = at::randn({batch, heads, seq, dim});
  const auto split = [&] {
    const auto part = [&](std::int64_t first, std::int64_t count) {
      return qkv.narrow(2, first * dim, count * dim).view({batch, seq, count, dim}).transpose(1, 2);
    };
    return std::vector<at::Tensor>{part(0, heads), part(heads, kv_heads), part(heads + kv_heads, kv_heads)};
  };
  const auto tessera_step = [&] {
    const auto h = split();
    torch::autograd::grad({tessera::causal_attention(h[0], h[1], h[2])}, {qkv}, {upstream});
  };
  // GPT-2's call: the heads read in place from the projection's output.
  const auto packed_step = [&] {
    const at::Tensor merged_upstream = upstream.transpose(1, 2).reshape({batch, seq, heads * dim});
    torch::autograd::grad({tessera::causal_self_attention(qkv, heads)}, {qkv}, {merged_upstream});
  };
  const auto libtorch_step = [&] {
    const auto h = split();
    const at::Tensor out = at::scaled_dot_product_attention(h[0], h[1], h[2], {}, 0.0, /*is_causal=*/true,
                                                            std::nullopt, heads != kv_heads);
    torch::autograd::grad({out}, {qkv}, {upstream});
  };
  const bool packed = heads == kv_heads;  // causal_self_attention has no grouped queries
  for (int i = 0; i < 3; ++i) {
    tessera_step();
    if (packed) packed_step();
    libtorch_step();
  }
  std::vector<double> tessera_ms, packed_ms, libtorch_ms;
  for (int i = 0; i < repeats; ++i) {
    tessera_ms.push_back(milliseconds(tessera_step));
    if (packed) packed_ms.push_back(milliseconds(packed_step));
    libtorch_ms.push_back(milliseconds(libtorch_step));
  }
  const auto h = split();
  std::printf("{\"tessera_ms\": %.4f, \"packed_ms\": %.4f, \"libtorch_ms\": %.4f, \"cpu_kernel\": %s, "
              "\"threads\": %d}\n",
              median(tessera_ms), packed ? median(packed_ms) : 0.0, median(libtorch_ms),
              tessera::causal_attention_uses_cpu_kernel(h[0], h[1], h[2]) ? "true" : "false", at::get_num_threads());
  return 0;
}
