// OptimizerPlacements (tessera/parallel/optimizer_placements.hpp) as an optimizer sees them inside
// its step, on real Gloo ranks under zero1, zero2, fsdp x tp (a padded vocabulary), hybrid fsdp
// and fsdp x ep (experts shared over one rank and over two): the
// trainer hands them over (Optimizer::set_placements); from this rank's share of a parameter (a
// 1-D piece of a strategy's flat unit, of a tensor-parallel part, of a rank's experts) whole()
// gives the whole matrix, equal to the one-rank model's weight bit for bit and its gradient
// within float32 rounding; share_of_whole() cuts it back to the share exactly; for every
// parameter at once, local_at_owners() gives its owner alone what local() gives and
// shares_from_owners() gives every rank its share back, the owners spread over the group.
#include <gtest/gtest.h>

#include <ATen/ops/allclose.h>
#include <ATen/ops/equal.h>

#include <map>
#include <mutex>

#include "gloo_ranks.hpp"
#include "small_trainer.hpp"
#include "tessera/parallel/device_mesh.hpp"
#include "tessera/parallel/optimizer_placements.hpp"

namespace tessera {
namespace optimizer_placements_test {

// An optimizer that, before the run's own optimizer updates, takes every parameter whole from
// its share: the weights and the gradients an optimizer of whole matrices would read.
class WholeMatrixReader : public Optimizer {
 public:
  explicit WholeMatrixReader(std::shared_ptr<Optimizer> inner) : inner_(std::move(inner)) {}

  void set_placements(std::shared_ptr<const OptimizerPlacements> placements) override {
    placements_ = std::move(placements);
  }
  void step() override {
    const std::vector<at::Tensor> params = inner_->parameters();
    // Each parameter's local tensor at its owner alone, and every rank's share back from it.
    std::vector<std::size_t> indices;
    std::vector<at::Tensor> shares;
    for (std::size_t i = params.size(); i-- > 0;) {  // in reverse: the batch keeps its own order
      indices.push_back(i);
      shares.push_back(params[i].detach());
    }
    const std::vector<at::Tensor> at_owners = placements_->local_at_owners(indices, shares);
    std::vector<at::Tensor> owned;
    for (std::size_t k = 0; k < indices.size(); ++k) owned.push_back(at_owners[k].defined() ? at_owners[k] : shares[k]);
    const std::vector<at::Tensor> back = placements_->shares_from_owners(indices, owned);
    const std::vector<std::int64_t> owners = placements_->owners(indices);
    for (std::size_t k = 0; k < indices.size(); ++k) {
      const std::string& name = (*placements_)[indices[k]].name;
      const at::Tensor local = placements_->local(indices[k], shares[k]);
      if (at_owners[k].defined() != (owners[k] < 0 || owners[k] == (*placements_)[indices[k]].share_group->rank()) ||
          (at_owners[k].defined() && !at::equal(at_owners[k], local))) {
        round_trip_failures.push_back(name + " local at its owner");
      }
      if (!at::equal(back[k].reshape({-1}), shares[k].reshape({-1}))) round_trip_failures.push_back(name + " share from its owner");
      if (owners[k] >= 0) ++owned_by[owners[k]];
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      const std::string& name = (*placements_)[i].name;
      const at::Tensor share = params[i].detach();
      const at::Tensor weight = placements_->whole(i, share);
      const at::Tensor grad = placements_->whole(i, params[i].grad());
      weights[name] = weight.clone();
      grads[name] = grad.clone();
      if (!at::equal(placements_->share_of_whole(i, weight), share) ||
          !at::equal(placements_->share_of_whole(i, grad), params[i].grad())) {
        round_trip_failures.push_back(name);
      }
      if (placements_->cut(i)) ++cut;
    }
    inner_->step();
  }
  void zero_grad() override { inner_->zero_grad(); }
  double base_lr() const override { return inner_->base_lr(); }
  void set_lr(double lr) override { inner_->set_lr(lr); }
  std::vector<at::Tensor> parameters() const override { return inner_->parameters(); }
  std::int64_t state_bytes() const override { return inner_->state_bytes(); }
  StateDict state_dict() const override { return inner_->state_dict(); }
  void load_state_dict(const StateDict& state) override { inner_->load_state_dict(state); }

  std::map<std::string, at::Tensor> weights, grads;
  std::vector<std::string> round_trip_failures;
  std::map<std::int64_t, std::int64_t> owned_by;  // parameters each rank of their share group owns
  std::int64_t cut = 0;  // parameters cut on this rank

 private:
  std::shared_ptr<Optimizer> inner_;
  std::shared_ptr<const OptimizerPlacements> placements_;
};

// `pad`: the vocabulary's rows padded to a multiple of 3 per tensor-parallel rank (32 -> 33 on
// one rank, 2 x 18 on two), the padding dropped from the whole.
std::string dense_model(bool pad) {
  return "model: {component_key: model, variant_key: gpt,\n"
         "        config: {vocab_size: 32, n_layer: 2, n_head: 2, n_embd: 16, max_seq_len: 16" +
         std::string(pad ? ", pad_vocab_to_multiple_of: 3" : "") + "}}\n";
}

// Four experts of top-2, no capacity limit or auxiliary losses: a token's loss does not depend on
// the micro-batch it shares, so the ranks' gradients sum to the one rank's.
std::string moe_model() {
  return "model: {component_key: model, variant_key: gpt_moe,\n"
         "        config: {vocab_size: 32, n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 16, num_experts: 4,\n"
         "                 top_k: 2, expert_hidden: 16, capacity_factor: 0, aux_loss_coef: 0, z_loss_coef: 0}}\n";
}

std::string spec(const std::string& model, const std::string& data, const std::string& strategy) {
  return model +
         "train_data: {component_key: dataset, variant_key: tokens,\n"
         "             config: {path: " + data + ", seq_len: 16, ignore_token: 0}}\n"
         "loss: {component_key: loss, variant_key: cross_entropy}\n"
         "optimizer: {component_key: optimizer, variant_key: sgd,\n"
         "            config: {lr: 0.5, model: {instance_key: model}}}\n" +
         (strategy.empty() ? std::string()
                           : "parallel: {component_key: parallel, variant_key: " + strategy + ", config: {}}\n");
}

std::mutex build_mutex;  // the ranks build in turn, from the same global seed

// One step of the run `yaml` on this rank, its optimizer wrapped by the reader.
std::shared_ptr<WholeMatrixReader> read_one_step(const std::string& yaml, RunContext context, std::int64_t accum) {
  core::BuiltComponents built;
  {
    std::lock_guard<std::mutex> lock(build_mutex);
    core::seed_everything(context.seed, "cpu");
    built = testing::build_components(yaml, context);
  }
  core::TrainerParts parts = testing::trainer_parts(built);
  auto reader = std::make_shared<WholeMatrixReader>(parts.optimizer);
  parts.optimizer = reader;
  core::Trainer trainer(std::move(parts), testing::settings(accum, 2), context);
  trainer.step();
  return reader;
}

struct MeshCase {
  const char* name;
  bool moe;
  bool pad;  // a padded vocabulary (dense models)
  const char* strategy;
  std::int64_t dp_replicate, dp_shard, tp, ep;
};

class OptimizerPlacementsOnMeshes : public ::testing::TestWithParam<MeshCase> {};

TEST_P(OptimizerPlacementsOnMeshes, GiveTheOptimizerWholeMatricesFromItsShares) {
  const MeshCase c = GetParam();
  testing::TempDir dir;
  const std::string data = testing::uneven_token_file(dir);
  const std::string model = c.moe ? moe_model() : dense_model(c.pad);
  const std::int64_t ranks = c.dp_replicate * c.dp_shard * c.tp;
  const std::int64_t data_ranks = c.dp_replicate * c.dp_shard;
  // One rank accumulates as many micro-batches as the mesh has data-parallel ranks.
  const auto one = read_one_step(spec(model, data, ""), testing::rank_context(core::make_local_communicator(), 42),
                                 data_ranks);
  EXPECT_EQ(one->cut, c.pad ? 1 : 0) << "nothing is cut on one rank but a padded vocabulary";
  EXPECT_TRUE(one->round_trip_failures.empty());

  std::mutex mutex;
  std::vector<std::string> mismatches;
  std::vector<std::int64_t> cut(static_cast<std::size_t>(ranks));
  const auto errors = testing::run_on_gloo_ranks(ranks, [&](std::int64_t rank, std::shared_ptr<Communicator> world) {
    RunContext context = testing::rank_context(world, 42);
    ParallelDims dims;
    dims.dp_replicate = c.dp_replicate;
    dims.dp_shard = c.dp_shard;
    dims.tp = c.tp;
    dims.ep = c.ep;
    context.mesh = core::make_device_mesh(world, dims);
    context.parallel = dims;
    const auto reader = read_one_step(spec(model, data, c.strategy), context, 1);
    std::lock_guard<std::mutex> lock(mutex);
    const std::string who = "rank " + std::to_string(rank) + ": ";
    cut[static_cast<std::size_t>(rank)] = reader->cut;
    // Every rank of a shared parameter's group owns some of them: the work is split.
    if (c.dp_shard * c.dp_replicate > 1 && reader->owned_by.size() < 2) mismatches.push_back(who + "owners not spread");
    for (const std::string& name : reader->round_trip_failures) mismatches.push_back(who + name + " round trip");
    if (reader->weights.size() != one->weights.size()) mismatches.push_back(who + "parameter count");
    for (const auto& [name, w] : one->weights) {
      const auto weight = reader->weights.find(name);
      if (weight == reader->weights.end() || weight->second.sizes() != w.sizes() || !at::equal(weight->second, w)) {
        mismatches.push_back(who + name + " weight");
        continue;
      }
      if (!at::allclose(reader->grads.at(name), one->grads.at(name), 1e-4, 1e-6)) {
        mismatches.push_back(who + name + " gradient");
      }
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_TRUE(mismatches.empty()) << mismatches.size() << " mismatches, first: " << mismatches.front();
  EXPECT_GT(one->weights.size(), 5u);
  // The mesh cut every parameter (fsdp and zero shard them all): the gathers were exercised.
  for (const std::int64_t n : cut) EXPECT_EQ(n, static_cast<std::int64_t>(one->weights.size()));
}

INSTANTIATE_TEST_SUITE_P(OptimizerPlacements, OptimizerPlacementsOnMeshes,
                         ::testing::Values(MeshCase{"zero1_dp2", false, false, "zero1", 1, 2, 1, 1},
                                           MeshCase{"zero2_dp2_padded_vocab", false, true, "zero2", 1, 2, 1, 1},
                                           MeshCase{"fsdp_dp2_tp2_padded_vocab", false, true, "fsdp", 1, 2, 2, 1},
                                           MeshCase{"hybrid_fsdp_2x2", false, false, "fsdp", 2, 2, 1, 1},
                                           MeshCase{"moe_fsdp_dp2_ep2", true, false, "fsdp", 1, 2, 1, 2},
                                           // experts shared over their expert data-parallel pair too
                                           MeshCase{"moe_fsdp_dp4_ep2", true, false, "fsdp", 1, 4, 1, 2}),
                         [](const ::testing::TestParamInfo<MeshCase>& info) { return std::string(info.param.name); });

}  // namespace optimizer_placements_test
}  // namespace tessera
