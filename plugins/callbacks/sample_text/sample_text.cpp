// Callback `sample_text`: generates text from the model, encoding the prompt and decoding the
// sample with a component of the plugin-defined kind `tokenizer`, logs it and appends it to
// RUN_DIR/samples.txt. Every rank generates (under fsdp a forward pass is a collective, so all
// ranks must run it); rank 0 alone logs and writes.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/log.hpp"
#include "tessera/components/model.hpp"
#include "tessera/plugin.hpp"

namespace {

// One log line per sample: newlines and other non-printable bytes become escapes.
std::string escape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '\\') {
      out += "\\\\";
    } else if (byte >= 0x20 && byte < 0x7f) {
      out += ch;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", byte);
      out += hex;
    }
  }
  return out;
}

// Puts the model in eval mode for its lifetime and restores the previous mode, even on error.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(tessera::Model& model)
      : model_(model), was_training_(model.is_training()) {
    model_.eval();
  }
  ~EvalModeGuard() { model_.train(was_training_); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  tessera::Model& model_;
  bool was_training_;
};

struct SampleTextConfig {
  std::shared_ptr<tessera::Tokenizer> tokenizer;
  std::string prompt = "The ";
  std::int64_t max_new_tokens = 200;
  double temperature = 0.8;
  std::int64_t top_k = 0;
  std::int64_t every = 0;
  std::int64_t seed = -1;

  static void declare(tessera::ConfigFields<SampleTextConfig>& f) {
    using C = SampleTextConfig;
    f.field("tokenizer", &C::tokenizer, "turns the prompt into token ids and the sample back into text");
    f.field("prompt", &C::prompt, "text the sample starts from");
    f.field("max_new_tokens", &C::max_new_tokens, "tokens to generate").at_least(1);
    f.field("temperature", &C::temperature, "divides the logits; lower is more conservative").greater_than(0);
    f.field("top_k", &C::top_k, "sample only from the k most likely tokens; 0 = all").at_least(0);
    f.field("every", &C::every, "also sample every N steps; 0 = only at train end").at_least(0);
    f.field("seed", &C::seed, "seed of the sampling generator; -1 = the run seed").at_least(-1);
    f.check([](const C& c) {
      if (c.prompt.empty()) throw tessera::ConfigError("prompt must not be empty", "prompt");
    });
    f.check_in_run([](const C&, const tessera::RunContext& run) {
      if (run.parallel.pp > 1) {
        throw tessera::ConfigError("callback/sample_text generates with the whole model, which no rank holds under "
                                   "parallelism.pp " + std::to_string(run.parallel.pp) + "; remove the callback",
                                   "prompt");
      }
    });
  }
};

class SampleText final : public tessera::Callback {
 public:
  SampleText(const SampleTextConfig& config, const tessera::RunContext& run)
      : config_(config),
        seed_(config.seed < 0 ? run.seed : static_cast<std::uint64_t>(config.seed)),
        samples_path_(std::filesystem::path(run.run_dir) / "samples.txt") {}

  void on_step_end(tessera::CallbackContext& ctx, const tessera::StepMetrics& m) override {
    if (config_.every == 0 || m.step % config_.every != 0) return;
    sample(ctx.model, m.step, ctx.run.rank == 0);
  }

  void on_train_end(tessera::CallbackContext& ctx) override {
    if (last_sampled_step_ == ctx.progress.step) return;
    sample(ctx.model, ctx.progress.step, ctx.run.rank == 0);
  }

 private:
  // Same generator seed and weights on every rank: every rank draws the same tokens.
  void sample(tessera::Model& model, std::int64_t step, bool report) {
    last_sampled_step_ = step;
    std::vector<std::int64_t> tokens = config_.tokenizer->encode(config_.prompt);
    for (std::int64_t t : tokens) {
      if (t < 0 || t >= model.vocab_size()) {
        if (report) {
          tessera::log::warn("sample_text: prompt token ", t, " is outside the model's vocabulary (",
                             model.vocab_size(), "); no sample");
        }
        return;
      }
    }
    {
      EvalModeGuard eval_mode(model);
      c10::NoGradGuard no_grad;
      generate(model, step, tokens);
    }
    if (!report) return;
    const std::string text = config_.tokenizer->decode(tokens);
    tessera::log::info("sample: ", escape(text));
    append_to_file(step, text);
  }

  void generate(tessera::Model& model, std::int64_t step, std::vector<std::int64_t>& tokens) {
    const auto params = model.parameters();
    const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().device();
    // A private CPU generator leaves the training RNG untouched; seeding with seed + step makes a
    // step's sample the same whether or not the run was resumed.
    at::Generator generator =
        at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<std::uint64_t>(step));
    const auto window = static_cast<std::size_t>(model.max_seq_len());
    for (std::int64_t i = 0; i < config_.max_new_tokens; ++i) {
      const std::size_t start = tokens.size() > window ? tokens.size() - window : 0;
      const auto length = static_cast<std::int64_t>(tokens.size() - start);
      at::Tensor context = at::empty({1, length}, at::kLong);
      std::memcpy(context.mutable_data_ptr<std::int64_t>(), tokens.data() + start,
                  static_cast<std::size_t>(length) * sizeof(std::int64_t));
      at::Tensor logits = model.forward(context.to(device)).select(0, 0).select(0, -1);
      logits = logits.to(at::kCPU, at::kFloat) / config_.temperature;
      // A model's vocabulary may be padded past the tokenizer's (e.g. to a multiple of 64): ids
      // the tokenizer has no text for are never drawn.
      logits = logits.narrow(0, 0, std::min(logits.size(0), config_.tokenizer->vocab_size()));
      if (config_.top_k > 0 && config_.top_k < logits.size(0)) {
        const at::Tensor kth_largest = std::get<0>(logits.topk(config_.top_k)).select(0, -1);
        logits =
            logits.masked_fill(logits.lt(kth_largest), -std::numeric_limits<float>::infinity());
      }
      const at::Tensor next = logits.softmax(-1).multinomial(1, /*replacement=*/false, generator);
      tokens.push_back(next.item<std::int64_t>());
    }
  }

  void append_to_file(std::int64_t step, const std::string& text) {
    if (samples_path_.has_parent_path()) {
      std::filesystem::create_directories(samples_path_.parent_path());
    }
    std::ofstream out(samples_path_, std::ios::app | std::ios::binary);
    out << "--- step " << step << " ---\n" << text << "\n";
    if (!out) tessera::log::warn("sample_text: cannot write ", samples_path_.string());
  }

  const SampleTextConfig config_;
  std::uint64_t seed_;  // config_.seed, or the run seed
  std::filesystem::path samples_path_;
  std::int64_t last_sampled_step_ = -1;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Callback, SampleTextConfig>(
      "sample_text", "generates text from the model (on every rank) and logs it (rank 0)",
      [](const SampleTextConfig& c, const tessera::RunContext& run) { return std::make_shared<SampleText>(c, run); });
}

}  // namespace

TESSERA_PLUGIN("callback_sample_text", "0.1.0", register_components)
