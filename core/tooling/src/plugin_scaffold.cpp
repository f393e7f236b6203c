#include "tessera/tooling/plugin_scaffold.hpp"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>

#include "tessera/core/config/suggest.hpp"
#include "tessera/error.hpp"
#include "scaffold_template.hpp"

namespace fs = std::filesystem;

namespace tessera::tooling {
namespace {

const std::map<std::string, KindTemplate>& templates() {
  static const std::map<std::string, KindTemplate> t = {
      {"model", model_template()},
      {"dataset",
       {"#include <ATen/ops/empty.h>\n#include <ATen/ops/scalar_tensor.h>\n\n#include \"tessera/components/dataset.hpp\"\n",
        "tessera::Dataset",
        R"tpl(// Counting sequences: sample i is (7i + t) mod vocab_size for t = 0, 1, ... A model can
// learn it, which makes it a handy smoke test.
class @CLASS@ : public tessera::Dataset {
 public:
  explicit @CLASS@(const @CLASS@Config& config) : vocab_(config.vocab_size), seq_len_(config.seq_len) {}

  void set_shard(std::int64_t rank, std::int64_t world_size) override {
    rank_ = rank;
    world_size_ = world_size;
  }
  tessera::Batch next_batch(std::int64_t batch_size) override {
    at::Tensor tokens = at::empty({batch_size, seq_len_ + 1}, at::kLong);
    auto t = tokens.accessor<std::int64_t, 2>();
    for (std::int64_t b = 0; b < batch_size; ++b, ++position_) {
      const std::int64_t sample = position_ * world_size_ + rank_;  // disjoint across ranks
      for (std::int64_t i = 0; i <= seq_len_; ++i) t[b][i] = (7 * sample + i) % vocab_;
    }
    tessera::Batch batch;
    batch.input_ids = tokens.narrow(1, 0, seq_len_).contiguous();
    batch.labels = tokens.narrow(1, 1, seq_len_).contiguous();
    batch.num_target_tokens = batch_size * seq_len_;
    return batch;
  }
  std::int64_t seq_len() const override { return seq_len_; }
  std::int64_t num_samples() const override { return vocab_; }
  tessera::StateDict state_dict() const override {
    return {{"position", at::scalar_tensor(position_, at::kLong)}};
  }
  void load_state_dict(const tessera::StateDict& state) override {
    position_ = state.at("position").item<std::int64_t>();
  }

 private:
  std::int64_t vocab_, seq_len_, rank_ = 0, world_size_ = 1, position_ = 0;
};
)tpl",
        R"tpl(  std::int64_t vocab_size = 256;
  std::int64_t seq_len = 16;
)tpl",
        R"tpl(    f.field("vocab_size", &@CLASS@Config::vocab_size, "token ids are below this").at_least(2);
    f.field("seq_len", &@CLASS@Config::seq_len, "tokens per sample").at_least(1);
)tpl",
        "  train_data: {component_key: dataset, variant_key: @NAME@, config: {seq_len: 16}}\n"}},
      {"loss",
       {"#include <ATen/ops/log_softmax.h>\n\n#include \"tessera/run/batch.hpp\"\n#include \"tessera/components/loss.hpp\"\n",
        "tessera::Loss",
        R"tpl(// Token cross-entropy, returned as a sum and a count (the trainer divides by the global count).
class @CLASS@ : public tessera::Loss {
 public:
  explicit @CLASS@(const @CLASS@Config& config) : scale_(config.scale) {}

  tessera::LossSum compute(const at::Tensor& logits, const at::Tensor& labels) override {
    at::Tensor flat = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
    at::Tensor target = labels.reshape({-1});
    at::Tensor keep = target.ne(tessera::kIgnoreIndex);
    at::Tensor log_p = at::log_softmax(flat, -1).gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1);
    return {log_p.mul(keep).sum().mul(-scale_), keep.sum()};
  }

 private:
  double scale_;
};
)tpl",
        R"tpl(  double scale = 1.0;
)tpl",
        R"tpl(    f.field("scale", &@CLASS@Config::scale, "multiplies the loss").greater_than(0);
)tpl",
        "  loss: {component_key: loss, variant_key: @NAME@}\n"}},
      {"optimizer",
       {"#include <c10/core/GradMode.h>\n\n#include \"tessera/components/model.hpp\"\n#include \"tessera/components/optimizer.hpp\"\n",
        "tessera::Optimizer",
        R"tpl(// Plain stochastic gradient descent: p -= lr * grad.
class @CLASS@ : public tessera::Optimizer {
 public:
  explicit @CLASS@(const @CLASS@Config& config)
      : base_lr_(config.lr), lr_(base_lr_), parameters_(config.model->parameters()) {}

  void step() override {
    c10::NoGradGuard no_grad;
    for (auto& p : parameters_) {
      if (p.grad().defined()) p.add_(p.grad(), -lr_);
    }
  }
  void zero_grad() override {
    for (auto& p : parameters_) p.mutable_grad() = at::Tensor();
  }
  double base_lr() const override { return base_lr_; }
  void set_lr(double lr) override { lr_ = lr; }
  std::vector<at::Tensor> parameters() const override { return parameters_; }
  std::int64_t state_bytes() const override { return 0; }
  tessera::StateDict state_dict() const override { return {}; }  // plain SGD keeps no state
  void load_state_dict(const tessera::StateDict&) override {}

 private:
  double base_lr_, lr_;
  std::vector<at::Tensor> parameters_;
};
)tpl",
        R"tpl(  std::shared_ptr<tessera::Model> model;
  double lr = 0.1;
)tpl",
        R"tpl(    f.field("model", &@CLASS@Config::model, "the model whose parameters are optimised");
    f.field("lr", &@CLASS@Config::lr, "learning rate").greater_than(0);
)tpl",
        "  optimizer: {component_key: optimizer, variant_key: @NAME@, config: {model: {instance_key: model}}}\n"}},
      {"adapter",
       {"#include <vector>\n\n#include \"tessera/components/adapter.hpp\"\n",
        "tessera::Adapter",
        R"tpl(// Norm tuning: the base frozen but for its one-dimensional parameters (norm weights, biases),
// which go on training. A working start; see adapter/lora for layers wrapped with new terms.
class @CLASS@ : public tessera::Adapter {
 public:
  explicit @CLASS@(const @CLASS@Config& config) : biases_(config.biases) {}

  // The host freezes every parameter this does not return, before the optimizer sees the model.
  std::vector<at::Tensor> apply(tessera::Model& model) override {
    std::vector<at::Tensor> trained;
    for (const auto& item : model.named_parameters()) {
      const bool bias = item.key().size() >= 4 && item.key().compare(item.key().size() - 4, 4, "bias") == 0;
      if (item.value().dim() == 1 && (biases_ || !bias)) trained.push_back(item.value());
    }
    return trained;
  }

 private:
  bool biases_;
};
)tpl",
        R"tpl(  bool biases = true;
)tpl",
        R"tpl(    f.field("biases", &@CLASS@Config::biases, "train the biases too, not only the norms' weights");
)tpl",
        "  adapters: [{component_key: adapter, variant_key: @NAME@}]\n"}},
      {"scheduler",
       {"#include <cmath>\n\n#include \"tessera/components/scheduler.hpp\"\n",
        "tessera::Scheduler",
        R"tpl(// Exponential decay: the learning rate is multiplied by gamma every step.
class @CLASS@ : public tessera::Scheduler {
 public:
  explicit @CLASS@(const @CLASS@Config& config) : gamma_(config.gamma) {}
  double lr_factor(std::int64_t step) const override { return std::pow(gamma_, double(step)); }

 private:
  double gamma_;
};
)tpl",
        R"tpl(  double gamma = 0.99;
)tpl",
        R"tpl(    f.field("gamma", &@CLASS@Config::gamma, "multiplier per step").greater_than(0).at_most(1);
)tpl",
        "  scheduler: {component_key: scheduler, variant_key: @NAME@, config: {gamma: 0.9}}\n"}},
      {"callback",
       {"#include \"tessera/components/callback.hpp\"\n#include \"tessera/log.hpp\"\n",
        "tessera::Callback",
        R"tpl(// Logs the loss every N steps on rank 0.
class @CLASS@ : public tessera::Callback {
 public:
  explicit @CLASS@(const @CLASS@Config& config) : every_(config.every) {}

  void on_step_end(tessera::CallbackContext& context, const tessera::StepMetrics& m) override {
    if (context.run.rank == 0 && m.step % every_ == 0) tessera::log::info("@NAME@: step ", m.step, " loss ", m.loss);
  }

 private:
  std::int64_t every_;
};
)tpl",
        R"tpl(  std::int64_t every = 1;
)tpl",
        R"tpl(    f.field("every", &@CLASS@Config::every, "log every N steps").at_least(1);
)tpl",
        "  callbacks: [{component_key: callback, variant_key: @NAME@, config: {every: 1}}]\n"}},
  };
  return t;
}

const char* kTestSpecRoles[][2] = {
    {"model", "  model: {component_key: model, variant_key: gpt,\n"
              "          config: {vocab_size: 256, n_layer: 1, n_head: 2, n_embd: 16, max_seq_len: 16}}\n"},
    {"adapter", ""},
    {"dataset", "  train_data: {component_key: dataset, variant_key: tokens,\n"
                "               config: {path: README.md, dtype: uint8, seq_len: 16}}\n"},
    {"loss", "  loss: {component_key: loss, variant_key: cross_entropy}\n"},
    {"optimizer", "  optimizer: {component_key: optimizer, variant_key: adamw, config: {model: {instance_key: model}}}\n"},
    {"scheduler", ""},
    {"callback", ""},
};

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

std::string class_name(const std::string& name) {
  std::string out;
  bool upper = true;
  for (char c : name) {
    if (c == '_') {
      upper = true;
    } else {
      out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
      upper = false;
    }
  }
  return out;
}

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  if (!out) throw Error("cannot write " + path.string());
}

}  // namespace

std::vector<std::string> scaffold_kinds() {
  std::vector<std::string> kinds;
  for (const auto& [kind, t] : templates()) kinds.push_back(kind);
  return kinds;
}

std::string scaffold_plugin(const std::string& kind, const std::string& name, const std::string& dir) {
  auto it = templates().find(kind);
  if (it == templates().end()) {
    throw ConfigError("no plugin template for kind '" + kind + "'" + core::did_you_mean(kind, scaffold_kinds()) +
                      "; templates exist for: " + core::join(scaffold_kinds()));
  }
  bool identifier = !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_');
  for (char c : name) identifier = identifier && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!identifier || name != replace_all(name, "__", "_")) {
    throw ConfigError("plugin name '" + name + "' must be a lower-case C identifier such as my_scheduler");
  }
  const fs::path folder = fs::path(dir) / name;
  if (fs::exists(folder)) throw ConfigError(folder.string() + " already exists; choose another name or --dir");
  fs::create_directories(folder);
  const KindTemplate& t = it->second;
  auto fill = [&](std::string text) {
    text = replace_all(text, "@CLASS@", class_name(name));
    text = replace_all(text, "@NAME@", name);
    return replace_all(text, "@KIND@", kind);
  };

  write_file(folder / (name + ".cpp"),
             fill("// @KIND@/@NAME@: TODO say in two lines what this component is for.\n#include <cstdint>\n#include <memory>\n\n" +
                  std::string(t.includes) + "#include \"tessera/plugin.hpp\"\n\nnamespace {\n\n"
                  "// The config, declared once: the members' initialisers are the defaults, declare() gives each\n"
                  "// its YAML key, doc and constraints; the host validates a run against it before building.\n"
                  "struct @CLASS@Config" + t.config_bases + " {\n" + t.members +
                  "\n  static void declare(tessera::ConfigFields<@CLASS@Config>& f) {\n" + t.fields + "  }\n};\n\n" +
                  t.body +
                  "\nvoid register_components(tessera::Registrar& registrar) {\n"
                  "  registrar.add<" + t.interface + ", @CLASS@Config>(\n"
                  "      \"@NAME@\", \"TODO: one line for tessera components\",\n"
                  "      " + t.factory + ");\n}\n\n"
                  "}  // namespace\n\nTESSERA_PLUGIN(\"@NAME@\", \"0.1.0\", register_components)\n"));

  write_file(folder / "CMakeLists.txt", fill(R"tpl(# Plugin @KIND@/@NAME@, built against an installed Tessera:
#   cmake -S . -B build -DCMAKE_PREFIX_PATH=<tessera prefix> && cmake --build build && ctest --test-dir build
cmake_minimum_required(VERSION 3.25)
project(@NAME@ LANGUAGES C CXX)
find_package(Tessera REQUIRED)
tessera_add_plugin(@NAME@ SOURCES @NAME@.cpp)

# The installed host loads the plugin, shows its schema, and trains two steps with it.
enable_testing()
add_test(NAME @NAME@_describe
         COMMAND ${TESSERA_EXECUTABLE} describe @KIND@/@NAME@ --plugin-path ${TESSERA_PLUGIN_OUTPUT_DIR})
set_tests_properties(@NAME@_describe PROPERTIES PASS_REGULAR_EXPRESSION "@KIND@/@NAME@")
add_test(NAME @NAME@_train
         COMMAND ${TESSERA_EXECUTABLE} train @NAME@_test.yaml --plugin-path ${TESSERA_PLUGIN_OUTPUT_DIR}
                 --run-dir ${CMAKE_CURRENT_BINARY_DIR}/test-run
         WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
)tpl") + fill(t.extra_tests));
  if (t.extra_file_name) write_file(folder / t.extra_file_name, fill(t.extra_file));

  std::string components;
  for (const auto& [role_kind, node] : kTestSpecRoles) {
    components += role_kind == kind ? t.test_node : node;
  }
  write_file(folder / (name + "_test.yaml"),
             fill("# Two training steps with @KIND@/@NAME@ on this folder's README as bytes (the generated test).\n"
                  "name: @NAME@_test\ncomponents:\n" + components +
                  "trainer: {max_steps: 2, micro_batch_size: 2}\n"));

  write_file(folder / "README.md", fill(R"tpl(# @KIND@/@NAME@

TODO: what this component does and when to use it.

## Build and test

```sh
cmake -S . -B build -DCMAKE_PREFIX_PATH=<where Tessera is installed>
cmake --build build
ctest --test-dir build        # the installed tessera loads the plugin and trains two steps
```

## Use

```sh
tessera describe @KIND@/@NAME@ --plugin-path build/plugins
tessera train my_run.yaml --plugin-path build/plugins
```

See `@NAME@_test.yaml` for a run spec that uses it.
)tpl"));
  return folder.string();
}

}  // namespace tessera::tooling
