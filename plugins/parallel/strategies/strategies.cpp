// Plugin `parallel_strategies`: the data-parallel strategies ddp, zero1, zero2 and fsdp
// (data_parallel.hpp says what each does).
#include <memory>
#include <string>

#include "data_parallel.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera_plugins::DataParallel;
using tessera_plugins::DataParallelOptions;
using tessera_plugins::GradReduction;

std::int64_t bucket_bytes(const tessera::ComponentConfig& config) {
  return static_cast<std::int64_t>(config.number("bucket_mb") * 1024.0 * 1024.0);
}

tessera::Schema bucket_schema() {
  tessera::Schema schema;
  schema.number("bucket_mb", "gradient bucket size in MiB: each bucket's reduction starts as soon as backward fills it")
      .default_to(25.0)
      .greater_than(0);
  return schema;
}

// ddp, zero1 and zero2 differ only in how bucket gradients are reduced.
auto bucketed(const char* name, GradReduction reduction) {
  return [name, reduction](const tessera::ComponentConfig& c) {
    DataParallelOptions o;
    o.name = name;
    o.reduction = reduction;
    o.bucket_bytes = bucket_bytes(c);
    return std::make_shared<DataParallel>(o);
  };
}

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::ParallelStrategy>(
      "ddp", "data parallel: whole replicas; gradient buckets all-reduced during backward, on the last micro-batch only",
      bucket_schema(), bucketed("ddp", GradReduction::all_reduce));
  registrar.add<tessera::ParallelStrategy>(
      "zero1", "ZeRO stage 1: optimizer state sharded; gradients reduce-scattered, shards updated, parameters all-gathered",
      bucket_schema(), bucketed("zero1", GradReduction::reduce_scatter_final));
  registrar.add<tessera::ParallelStrategy>(
      "zero2", "ZeRO stage 2: optimizer state and gradients sharded; every backward reduce-scatters its buckets",
      bucket_schema(), bucketed("zero2", GradReduction::reduce_scatter_each));
  tessera::Schema fsdp;
  fsdp.boolean("prefetch", "gather the next unit's parameters while the current one computes").default_to(true);
  registrar.add<tessera::ParallelStrategy>(
      "fsdp",
      "fully sharded: parameters, gradients and optimizer state sharded; the model's units gathered one at a time",
      fsdp, [](const tessera::ComponentConfig& c) {
        DataParallelOptions o;
        o.name = "fsdp";
        o.reduction = GradReduction::reduce_scatter_each;
        o.shard_parameters = true;
        o.prefetch = c.boolean("prefetch");
        return std::make_shared<DataParallel>(o);
      });
}

}  // namespace

TESSERA_PLUGIN("parallel_strategies", "0.1.0", register_components)
