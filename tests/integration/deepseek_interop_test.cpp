// model/deepseek_v3 against transformers itself: tiny random DeepseekV3ForCausalLM folders (latent
// attention with a query latent and YaRN, or one q_proj and plain rotary; a dense first block;
// shared and grouped routed experts; the routing correction bias, norms and biases perturbed; a
// multi-token-prediction layer stored as the Hub's files do) are imported by `init_from`:
// `tessera eval` gives transformers' loss; a short run's `hf` export loads in transformers
// strictly with the loss Tessera gives (the trained correction bias with it) and one
// expert-parallel run exports the model one rank trains.
#include <gtest/gtest.h>

#include <ATen/ops/allclose.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "cli_fixture.hpp"
#include "hf_fixture.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "test_support.hpp"

namespace tessera {
namespace deepseek_interop_test {

TEST_F(HfInterop, DeepseekV3ImportGivesTransformersLossAndExportsLoadStrictly) {
  const std::string tokens = dir_.file("tokens.bin");
  reference("tokens " + tokens + " --count 20000 --vocab 256");
  const std::string latent = dir_.file("deepseek"), plain = dir_.file("deepseek_plain");
  reference("make-deepseek-v3 " + latent + " --yarn --mtp");
  reference("make-deepseek-v3 " + plain + " --q-lora-rank 0 --groups 2 --groups-kept 1 --seed 3");
  for (const std::string& folder : {latent, plain}) {
    SCOPED_TRACE(folder);
    const double expected = reference_loss(folder, tokens);
    EXPECT_LT(relative(tessera_eval(spec("import", model_yaml("deepseek_v3", folder), tokens)), expected),
              kLossTolerance);
  }

  // bias_update_speed moves the correction bias after every step; the export carries it.
  const auto runs = one_rank_and_ep2("deepseek", model_yaml("deepseek_v3", latent, ", bias_update_speed: 0.01"), tokens);
  ASSERT_FALSE(runs[0].exported.empty());
  EXPECT_NE(runs[0].output.find("skipped"), std::string::npos) << "the MTP layer's skip is said: " << runs[0].output;
  // No MTP layer is written; the correction bias moved from the imported one.
  const HfCheckpoint out_files = read_hf_checkpoint(runs[0].exported), in_files = read_hf_checkpoint(latent);
  EXPECT_EQ(out_files.tensors.count("model.layers.3.eh_proj.weight"), 0u);
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  ASSERT_EQ(out_files.tensors.count(bias), 1u);
  EXPECT_FALSE(at::allclose(out_files.tensors.at(bias), in_files.tensors.at(bias))) << "the bias moved";
  EXPECT_GT(relative(runs[0].exported_loss, reference_loss(latent, tokens)), 1e-3) << "training changed nothing";
  EXPECT_LT(relative(runs[1].exported_loss, runs[0].exported_loss), 1e-4) << "ep 2 against one rank";
}

}  // namespace deepseek_interop_test
}  // namespace tessera
