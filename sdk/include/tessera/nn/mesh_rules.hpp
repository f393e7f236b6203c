// What a decoder's sizes must allow for each mesh axis, checked by `tessera validate` (a config's
// check_in_run, on the sizes settled from init_from's config.json as the model will be built
// with them) and by the model's factory: one ConfigError naming the field and what to do.
#pragma once

#include <cstdint>

#include "tessera/export.hpp"
#include "tessera/run/parallel_dims.hpp"

namespace tessera::nn {

// What tensor parallelism splits: query and key/value heads, the dense MLP's hidden units (0:
// none split, e.g. experts, which stay whole) and the vocabulary rows of the embedding and head
// (any vocabulary: they are padded to the same rows on every rank, TensorParallel::vocab_rows).
struct TensorSplit {
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;
  std::int64_t mlp_units = 0;
  std::int64_t vocab_size = 0;
  bool experts = false;  // the model routes tokens to experts (whole sequences, never slices)
};

TESSERA_API void check_tensor_parallel(const TensorSplit& split, const ParallelDims& dims);

// No attention dropout across context-parallel slices; with Ulysses each tensor-parallel rank's
// query heads divide over the context-parallel ranks (key/value heads that do not are replicated
// for the exchange, and the log says so). No sliding window (`sliding_window` > 0): the
// exchanges attend over the whole causal past.
TESSERA_API void check_context_parallel(std::int64_t heads, double dropout, const ParallelDims& dims,
                                        std::int64_t sliding_window = 0);

// Every pipeline stage holds a block (split points inside the model), and an interleaved
// schedule's stages share the blocks evenly.
TESSERA_API void check_pipeline_parallel(std::int64_t blocks, const ParallelDims& dims);

}  // namespace tessera::nn
