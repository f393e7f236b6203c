// Callback `sample_text`: generates text from the model with the generation engine
// (tessera/generation/generate.hpp), encoding the prompt and decoding the sample with a component
// of the plugin-defined kind `tokenizer`, logs it and appends it to RUN_DIR/samples.txt. Every
// rank generates the same tokens (under fsdp and tp a pass is a collective, so all ranks must run
// it); rank 0 alone logs and writes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tessera/components/callback.hpp"
#include "tessera/components/tokenizer.hpp"
#include "tessera/generation/generate.hpp"
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
      if (run.parallel.pp > 1 || run.parallel.cp > 1) {
        throw tessera::ConfigError("callback/sample_text generates with the whole model and whole sequences, which "
                                   "no rank holds under parallelism." + std::string(run.parallel.pp > 1 ? "pp " : "cp ") +
                                   std::to_string(run.parallel.pp > 1 ? run.parallel.pp : run.parallel.cp) +
                                   "; remove the callback", "prompt");
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
    if (!model.decodes()) {
      if (report) tessera::log::warn("sample_text: model/", model.name(), " does not decode from a KV cache; no sample");
      return;
    }
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
    generate(model, step, tokens);  // in eval mode without gradients, the mode restored after
    if (!report) return;
    const std::string text = config_.tokenizer->decode(tokens);
    tessera::log::info("sample: ", escape(text));
    append_to_file(step, text);
  }

  // The engine's KV cache while the text fits in max_seq_len; past it, one token at a time from a
  // fresh pass over the last max_seq_len - 1 tokens (a window that slides).
  void generate(tessera::Model& model, std::int64_t step, std::vector<std::int64_t>& tokens) {
    const auto params = model.parameters();
    tessera::GenerationOptions options;
    options.device = params.empty() ? at::Device(at::kCPU) : params.front().device();
    options.batch_size = 1;
    // A model's vocabulary may be padded past the tokenizer's (e.g. to a multiple of 64): ids the
    // tokenizer has no text for are never drawn.
    options.vocabulary = config_.tokenizer->vocab_size();
    const std::int64_t window = model.max_seq_len() - 1;
    const auto length = static_cast<std::int64_t>(tokens.size()) + config_.max_new_tokens;  // the sample's
    for (std::uint64_t part = 0; static_cast<std::int64_t>(tokens.size()) < length; ++part) {
      const auto context = std::min<std::int64_t>(static_cast<std::int64_t>(tokens.size()), window);
      tessera::GenerationRequest request;
      request.prompt_ids.assign(tokens.end() - context, tokens.end());
      request.max_new_tokens = std::min(length - static_cast<std::int64_t>(tokens.size()),
                                        model.max_seq_len() - context);
      request.sampling.temperature = config_.temperature;
      request.sampling.top_k = config_.top_k;
      // Seeded by seed + step (a step's sample is the same after a resume), each later window
      // by a stream of its own.
      request.sampling.seed = seed_ + static_cast<std::uint64_t>(step) + part * 0x9E3779B97F4A7C15ull;
      const auto completion = tessera::generate(model, {request}, options).front().completion_ids;
      tokens.insert(tokens.end(), completion.begin(), completion.end());
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
