// Plugin `parallel_strategies`: the data-parallel strategies ddp, zero1, zero2 and fsdp
// (data_parallel.hpp says what each does).
#include <memory>
#include <optional>
#include <string>

#include "data_parallel.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/plugin.hpp"

namespace {

using tessera_plugins::DataParallel;
using tessera_plugins::DataParallelOptions;
using tessera_plugins::GradReduction;

// fp32 | bf16 -> the dtype; fp32 means the parameters' own (no cast).
std::optional<at::ScalarType> dtype_of(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  return std::nullopt;
}

struct BucketedConfig {
  double bucket_mb = 25.0;
  std::string reduce_dtype = "fp32";
  bool find_unused_parameters = false;

  static void declare(tessera::ConfigFields<BucketedConfig>& f) {
    f.field("bucket_mb", &BucketedConfig::bucket_mb,
            "gradient bucket size in MiB: each bucket's reduction starts as soon as backward fills it")
        .greater_than(0);
    f.field("reduce_dtype", &BucketedConfig::reduce_dtype,
            "dtype gradients are reduced in: fp32, or bf16 (half the traffic; summed in bf16, kept in fp32)")
        .one_of({"fp32", "bf16"});
    f.field("find_unused_parameters", &BucketedConfig::find_unused_parameters,
            "for models that leave parameters unused in a step: those no rank used are not updated, as with "
            "one process; off, such a parameter is an error (the ranks agree on which parameters they used "
            "with one small host all-reduce per step either way)");
  }
};

struct FsdpConfig {
  bool prefetch = true;
  std::string param_dtype = "fp32";
  std::string reduce_dtype = "fp32";

  static void declare(tessera::ConfigFields<FsdpConfig>& f) {
    f.field("prefetch", &FsdpConfig::prefetch, "gather the next unit's parameters while the current one computes");
    f.field("param_dtype", &FsdpConfig::param_dtype,
            "dtype parameters are all-gathered and computed in: fp32, or bf16 (the fp32 shard stays the master)")
        .one_of({"fp32", "bf16"});
    f.field("reduce_dtype", &FsdpConfig::reduce_dtype,
            "dtype gradients are reduce-scattered in: fp32, or bf16 (the fp32 gradient shard accumulates them)")
        .one_of({"fp32", "bf16"});
  }
};

// Under expert parallelism, the ranks holding the same stacked experts.
std::shared_ptr<tessera::Communicator> expert_group(const tessera::RunContext& run) {
  if (!run.mesh || run.mesh->dims().ep == 1) return nullptr;
  return run.mesh->expert_data_parallel_ptr();
}

// ddp, zero1 and zero2 differ only in how bucket gradients are reduced.
auto bucketed(const char* name, GradReduction reduction) {
  return [name, reduction](const BucketedConfig& c, const tessera::RunContext& run) {
    DataParallelOptions o;
    o.expert_group = expert_group(run);
    o.pipeline = run.mesh && run.mesh->dims().pp > 1;
    o.name = name;
    o.reduction = reduction;
    o.bucket_bytes = static_cast<std::int64_t>(c.bucket_mb * 1024.0 * 1024.0);
    o.precision.reduce = dtype_of(c.reduce_dtype);
    o.find_unused_parameters = c.find_unused_parameters;
    if (o.pipeline && o.find_unused_parameters) {
      // Which buckets reduce would then depend on what each rank's stage used, and could differ
      // between the ranks of a stage.
      throw tessera::ConfigError("find_unused_parameters is not available under pipeline parallelism "
                                 "(parallelism.pp > 1); set it to false",
                                 "find_unused_parameters");
    }
    return std::make_shared<DataParallel>(o);
  };
}

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::ParallelStrategy, BucketedConfig>(
      "ddp", "data parallel: whole replicas; gradient buckets all-reduced during backward, on the last micro-batch only",
      bucketed("ddp", GradReduction::all_reduce));
  registrar.add<tessera::ParallelStrategy, BucketedConfig>(
      "zero1", "ZeRO stage 1: optimizer state sharded; gradients reduce-scattered, shards updated, parameters all-gathered",
      bucketed("zero1", GradReduction::reduce_scatter_final));
  registrar.add<tessera::ParallelStrategy, BucketedConfig>(
      "zero2", "ZeRO stage 2: optimizer state and gradients sharded; every backward reduce-scatters its buckets",
      bucketed("zero2", GradReduction::reduce_scatter_each));
  registrar.add<tessera::ParallelStrategy, FsdpConfig>(
      "fsdp",
      "fully sharded: parameters, gradients and optimizer state sharded; the model's units gathered one at a time",
      [](const FsdpConfig& c, const tessera::RunContext& run) {
        DataParallelOptions o;
        o.device = c10::Device(run.device);
        o.name = "fsdp";
        o.reduction = GradReduction::reduce_scatter_each;
        o.shard_parameters = true;
        o.prefetch = c.prefetch;
        o.precision.param = dtype_of(c.param_dtype);
        o.precision.reduce = dtype_of(c.reduce_dtype);
        o.expert_group = expert_group(run);
        o.pipeline = run.mesh && run.mesh->dims().pp > 1;
        if (run.mesh && run.mesh->dims().dp_replicate > 1) {
          // Hybrid sharding: shard within dp_shard (and its context-parallel peers), replicate
          // across dp_replicate.
          o.shard_group = run.mesh->group_ptr({tessera::MeshAxis::dp_shard, tessera::MeshAxis::cp});
          o.replicate_group = run.mesh->group_ptr({tessera::MeshAxis::dp_replicate});
        }
        return std::make_shared<DataParallel>(o);
      });
}

}  // namespace

TESSERA_PLUGIN("parallel_strategies", "0.1.0", register_components)
