// Dataset `mixture`: several token files (dataset/tokens windows with shared settings) drawn by
// weight. The member of every global sample follows a deterministic schedule that keeps each
// member's count within one sample of weight x samples at every point, so the proportions hold
// exactly at any length, on any number of ranks; each member reads its own seeded order. The
// state is the global position, how many samples each member has given and each member's
// layout (token_windows.hpp): resume is exact, and a resume with other files is refused. The
// weights may change between a save and a resume (a data schedule): the schedule goes on from
// the saved counts toward the new shares.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"
#include "tessera/components/dataset.hpp"
#include "token_windows.hpp"

namespace tessera::token_data {

struct MixtureConfig {
  std::vector<std::string> paths;
  std::vector<double> weights;
  std::string dtype = "uint16";
  std::int64_t seq_len = 1;
  std::int64_t stride = 0;
  std::int64_t ignore_token = -1;
  bool shuffle = true;
  std::int64_t seed = -1;
  std::int64_t vocab_size = 0;

  static void declare(ConfigFields<MixtureConfig>& f) {
    using C = MixtureConfig;
    f.field("paths", &C::paths, "the member token files (e.g. from tessera prepare-data)").required().existing_path();
    f.field("weights", &C::weights, "each member's share of the samples, in the order of paths (normalised)").required();
    f.field("dtype", &C::dtype, "width of one token id in every file").one_of({"uint8", "uint16", "uint32"});
    f.field("seq_len", &C::seq_len, "tokens per sample (each sample reads seq_len + 1)").required().at_least(1);
    f.field("stride", &C::stride, "tokens between window starts; 0 means seq_len (no overlap)").at_least(0);
    f.field("ignore_token", &C::ignore_token, "token id whose label position takes no loss; -1 = none").at_least(-1);
    f.field("shuffle", &C::shuffle, "each member: a new seeded order every epoch");
    f.field("seed", &C::seed, "seed of the members' orders (member i uses seed + i); -1 = the run seed").at_least(-1);
    f.field("vocab_size", &C::vocab_size,
            "the model's vocabulary: a member whose index names a larger tokenizer is refused at validation (0: no check)")
        .at_least(0);
    f.check([](const C& c) {
      if (c.paths.empty()) throw ConfigError("a mixture needs at least one path", "paths");
      if (c.weights.size() != c.paths.size()) {
        throw ConfigError("weights has " + std::to_string(c.weights.size()) + " entries for " +
                              std::to_string(c.paths.size()) + " paths",
                          "weights");
      }
      double sum = 0;
      for (double w : c.weights) {
        if (!std::isfinite(w) || w < 0) throw ConfigError("weights must be finite and not negative", "weights");
        sum += w;
      }
      if (!(sum > 0)) throw ConfigError("weights must not all be zero", "weights");
      for (const auto& path : c.paths) {
        check_index(path, c.dtype, c.vocab_size);
        check_unindexed_width(path, c.dtype, "paths");
        check_token_file_size(path, c.dtype, c.seq_len, "paths");
      }
    });
  }
};

std::shared_ptr<Dataset> make_mixture(const MixtureConfig& config, std::uint64_t run_seed);

}  // namespace tessera::token_data
