// Adapter `lora`: LoRA (Hu et al., 2021) as PEFT implements it. Each targeted linear layer
// y = x·Wᵀ + b gains (alpha / rank) · B·A·dropout(x), A [rank, in] and B [out, rank] registered
// on the layer as lora_A.weight and lora_B.weight (PEFT's names); W and b stay frozen. B starts
// at zero, so the adapted model starts as the base. Exports: a PEFT folder (the layers by their
// Hugging Face names), or merged into the base weights: W + (alpha / rank) · B·A.
#include <ATen/autocast_mode.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/matmul.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tessera/components/adapter.hpp"
#include "tessera/nn/deferred_init.hpp"
#include "tessera/nn/linear_layers.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/plugin.hpp"
#include "tessera/formats/safetensors.hpp"

namespace {

namespace fs = std::filesystem;

constexpr const char* kAllLinear = "all-linear";
// What PEFT prefixes the base model's module names with in adapter_model.safetensors.
constexpr const char* kPeftPrefix = "base_model.model.";

struct LoraConfig {
  std::int64_t rank = 8;
  double alpha = 16;
  double dropout = 0;
  std::vector<std::string> target_modules;
  std::string init = "default";
  std::string init_from;

  static void declare(tessera::ConfigFields<LoraConfig>& f) {
    f.field("rank", &LoraConfig::rank, "r: the inner dimension of each B·A").at_least(1);
    f.field("alpha", &LoraConfig::alpha, "the terms are scaled by alpha / rank").greater_than(0);
    f.field("dropout", &LoraConfig::dropout, "dropout of a layer's input before A (training only)").at_least(0);
    f.field("target_modules", &LoraConfig::target_modules,
            "the layers to adapt by their Hugging Face names (q_proj, v_proj, c_attn, down_proj, attn.c_proj: "
            "the last parts of a layer's name), or [all-linear]: every linear layer but the output head")
        .required();
    f.field("init", &LoraConfig::init,
            "default: A Kaiming-uniform, B zero (PEFT's); gaussian: A normal with std 1/rank, B zero")
        .one_of({"default", "gaussian"});
    f.field("init_from", &LoraConfig::init_from,
            "the adapter's weights from a PEFT folder (adapter_config.json, adapter_model.safetensors) or a "
            "Tessera export of a LoRA run (adapters.safetensors); empty: initialised as `init` says")
        .existing_path();
    f.check([](const LoraConfig& c) {
      if (c.dropout >= 1) throw tessera::ConfigError("dropout must be below 1", "dropout");
      for (std::size_t i = 0; i < c.target_modules.size(); ++i) {
        if (c.target_modules[i].empty()) {
          throw tessera::ConfigError("target_modules[" + std::to_string(i) + "] is empty", "target_modules");
        }
        if (c.target_modules[i] == kAllLinear && c.target_modules.size() > 1) {
          throw tessera::ConfigError("all-linear stands alone: it already names every linear layer", "target_modules");
        }
      }
    });
  }
};

// A or B: one matrix under PEFT's module name (lora_A, lora_B), its parameter `weight`.
class LoraMatrix : public torch::nn::Module {
 public:
  explicit LoraMatrix(at::Tensor values) { weight = register_parameter("weight", std::move(values)); }
  at::Tensor weight;
};

struct AdaptedLayer {
  std::string path;  // the layer's module path in the model
  std::shared_ptr<LoraMatrix> a, b;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw tessera::ConfigError("cannot read " + path.string(), "init_from");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class Lora final : public tessera::Adapter {
 public:
  // `whole_model`: false where the model is one pipeline stage's blocks (parallelism.pp > 1).
  Lora(LoraConfig config, bool whole_model)
      : config_(std::move(config)), whole_model_(whole_model), init_seed_(tessera::draw_init_seed()) {}

  std::vector<at::Tensor> apply(tessera::Model& model) override {
    if (!layers_.empty()) throw tessera::Error("adapter/lora: applied twice");
    const std::vector<tessera::LinearLayer> chosen = targets(model);
    std::vector<at::Tensor> trained;
    for (const tessera::LinearLayer& target : chosen) {
      tessera::Linear& layer = *target.layer;
      // Real storage even while the model defers its own (the host moves it to the device): the
      // adapter's values come from here, not from the model's initializer.
      const at::TensorOptions options =
          layer.weight.options().device(layer.weight.is_meta() ? c10::Device(c10::kCPU) : layer.weight.device());
      AdaptedLayer adapted{target.path, nullptr, nullptr};
      adapted.a = layer.register_module("lora_A", std::make_shared<LoraMatrix>(
                                                     at::empty({config_.rank, layer.in_features()}, options)));
      adapted.b = layer.register_module("lora_B", std::make_shared<LoraMatrix>(
                                                     at::empty({layer.out_features(), config_.rank}, options)));
      initialise(adapted, layer.in_features());
      const double scale = config_.alpha / static_cast<double>(config_.rank);
      const double dropout = config_.dropout;
      LoraMatrix* a = adapted.a.get();
      LoraMatrix* b = adapted.b.get();
      // PEFT's order: B(A(dropout(x))) * scale, added to the base output. Without autocast the
      // matrices may be in another dtype than x (fsdp gathers them in its param_dtype while the
      // frozen base stays in the master dtype): the term is computed in theirs.
      layer.add_term([a, b, scale, dropout](const at::Tensor& x) {
        at::Tensor input = dropout > 0 ? at::dropout(x, dropout, a->is_training()) : x;
        const bool cast = input.scalar_type() != a->weight.scalar_type() &&
                          !at::autocast::is_autocast_enabled(input.device().type());
        if (cast) input = input.to(a->weight.scalar_type());
        const at::Tensor term = at::linear(at::linear(input, a->weight), b->weight) * scale;
        return cast ? term.to(x.scalar_type()) : term;
      });
      trained.push_back(adapted.a->weight);
      trained.push_back(adapted.b->weight);
      layers_.push_back(std::move(adapted));
    }
    if (!config_.init_from.empty()) load(model);
    return trained;
  }

  bool exports_peft() const override { return true; }

  tessera::PeftExport peft_export(const tessera::Model& model, const tessera::StateDict& state,
                                  const std::string& base_model) const override {
    tessera::PeftExport out;
    bool fan_in_fan_out = false;
    std::set<std::string> targets;
    for (const std::string& path : adapted_paths(state)) {
      const tessera::HfModuleName hf = model.hugging_face_module(path);
      if (hf.name.empty()) {
        throw tessera::Error("adapter/lora: the model has no Hugging Face name for its layer " + path +
                             "; a PEFT folder cannot name it");
      }
      fan_in_fan_out = fan_in_fan_out || hf.fan_in_fan_out;
      for (const char* matrix : {"lora_A", "lora_B"}) {
        const std::string name = path + "." + matrix + ".weight";
        const auto it = state.find(name);
        if (it == state.end()) throw tessera::Error("adapter/lora: the exported state has no " + name);
        out.tensors[kPeftPrefix + hf.name + "." + matrix + ".weight"] = it->second;
      }
      targets.insert(path.substr(path.rfind('.') + 1));
    }
    // all-linear is written as the layers it chose, so that PEFT wraps exactly these.
    std::vector<std::string> names = config_.target_modules;
    if (names.size() == 1 && names.front() == kAllLinear) names.assign(targets.begin(), targets.end());
    const nlohmann::json json = {
        {"peft_type", "LORA"},
        {"task_type", "CAUSAL_LM"},
        {"base_model_name_or_path", base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model)},
        {"r", config_.rank},
        {"lora_alpha", config_.alpha},
        {"lora_dropout", config_.dropout},
        {"target_modules", names},
        {"fan_in_fan_out", fan_in_fan_out},
        {"bias", "none"},
        {"init_lora_weights", config_.init == "gaussian" ? nlohmann::json("gaussian") : nlohmann::json(true)},
        {"use_rslora", false},
        {"use_dora", false},
        {"modules_to_save", nullptr},
        {"inference_mode", true},
    };
    out.adapter_config_json = json.dump(2) + "\n";
    return out;
  }

  bool merges() const override { return true; }

  void merge(tessera::StateDict& state) const override {
    c10::NoGradGuard no_grad;
    const double scale = config_.alpha / static_cast<double>(config_.rank);
    for (const std::string& path : adapted_paths(state)) {
      const std::string weight = path + ".weight", a = path + ".lora_A.weight", b = path + ".lora_B.weight";
      for (const std::string& name : {weight, a, b}) {
        if (!state.count(name)) throw tessera::Error("adapter/lora: merging needs " + name + ", which the state lacks");
      }
      const at::Tensor& base = state[weight];
      const at::Tensor delta = at::matmul(state[b].to(at::kFloat), state[a].to(at::kFloat)) * scale;
      state[weight] = (base.to(at::kFloat) + delta.to(base.device())).to(base.scalar_type());
      state.erase(a);
      state.erase(b);
    }
  }

 private:
  // The paths of the layers this adapter wraps in the whole model whose `state` an export writes:
  // those whose A the state holds and target_modules names. Read from the state, not layers_: a
  // pipeline stage adapted only its own blocks' layers, and an export's state is every stage's.
  std::vector<std::string> adapted_paths(const tessera::StateDict& state) const {
    std::vector<std::string> paths;
    const std::string suffix = ".lora_A.weight";
    const bool all_linear = config_.target_modules.size() == 1 && config_.target_modules.front() == kAllLinear;
    for (const auto& item : state) {
      const std::string& name = item.first;
      if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
      const std::string path = name.substr(0, name.size() - suffix.size());
      bool named = all_linear;
      for (const std::string& target : config_.target_modules) named = named || tessera::matches_target(path, target);
      if (named) paths.push_back(path);
    }
    return paths;
  }

  // The layers target_modules names, each checked: every entry names some layer, and only
  // layers the model lets adapters wrap.
  std::vector<tessera::LinearLayer> targets(tessera::Model& model) const {
    const std::vector<tessera::LinearLayer> layers = tessera::linear_layers(model);
    std::vector<tessera::LinearLayer> chosen;
    if (config_.target_modules.size() == 1 && config_.target_modules.front() == kAllLinear) {
      // As PEFT's all-linear: every linear layer but the output head.
      const at::Tensor head = model.output_head().weight;
      for (const auto& layer : layers) {
        if (layer.layer->adaptable() && !(head.defined() && head.is_same(layer.layer->weight))) chosen.push_back(layer);
      }
      if (chosen.empty()) throw tessera::ConfigError("all-linear: the model has no linear layer to adapt", "target_modules");
      return chosen;
    }
    std::set<std::string> names;
    for (const auto& layer : layers) names.insert(layer.path.substr(layer.path.rfind('.') + 1));
    std::set<std::string> taken;
    for (std::size_t i = 0; i < config_.target_modules.size(); ++i) {
      const std::string& target = config_.target_modules[i];
      bool matched = false;
      for (const auto& layer : layers) {
        if (!tessera::matches_target(layer.path, target)) continue;
        matched = true;
        if (!layer.layer->adaptable()) {
          throw tessera::ConfigError("target_modules[" + std::to_string(i) + "] '" + target + "' names " + layer.path +
                                         ", whose weight the model reads directly (an output head, an MoE router): LoRA cannot wrap it",
                                     "target_modules");
        }
        if (taken.insert(layer.path).second) chosen.push_back(layer);
      }
      if (!matched) {
        std::string known;
        for (const auto& name : names) known += (known.empty() ? "" : ", ") + name;
        throw tessera::ConfigError("target_modules[" + std::to_string(i) + "] '" + target +
                                       "' matches no linear layer of the model; its linear layers are " + known +
                                       " (or all-linear)",
                                   "target_modules");
      }
    }
    // The model's order, whatever the order of the names.
    std::vector<tessera::LinearLayer> ordered;
    for (const auto& layer : layers) {
      if (taken.count(layer.path)) ordered.push_back(layer);
    }
    return ordered;
  }

  void initialise(const AdaptedLayer& layer, std::int64_t in_features) const {
    c10::NoGradGuard no_grad;
    // Independent of the order layers are adapted in: each matrix's own stream, by its name.
    at::Generator gen = tessera::init_generator(init_seed_, layer.path + ".lora_A.weight");
    at::Tensor a = at::empty(layer.a->weight.sizes(), layer.a->weight.options().device(c10::kCPU));
    if (config_.init == "gaussian") {
      a.normal_(0.0, 1.0 / static_cast<double>(config_.rank), gen);
    } else {
      // kaiming_uniform_(a = sqrt(5)) over fan_in = in_features: bound 1 / sqrt(in_features).
      const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
      a.uniform_(-bound, bound, gen);
    }
    layer.a->weight.copy_(a);
    layer.b->weight.zero_();
  }

  // init_from: a PEFT folder (the layers by their Hugging Face names) or a Tessera export
  // (adapters.safetensors, by the model's names). Every adapted layer's A and B must be there,
  // shaped as this config makes them, and nothing else.
  void load(const tessera::Model& model) {
    const fs::path from(config_.init_from);
    const bool peft = fs::exists(from / "adapter_config.json");
    const fs::path file = peft ? from / "adapter_model.safetensors" : from / "adapters.safetensors";
    if (!fs::exists(file)) {
      throw tessera::ConfigError(config_.init_from + " is neither a PEFT folder (adapter_config.json) nor a Tessera "
                                 "export of a run with adapters (adapters.safetensors)",
                                 "init_from");
    }
    if (peft) check_peft_config(from / "adapter_config.json");
    tessera::StateDict tensors;
    try {
      tensors = tessera::read_safetensors(file.string()).tensors;
    } catch (const tessera::Error& e) {
      throw tessera::ConfigError(e.what(), "init_from");
    }
    std::set<std::string> used;
    c10::NoGradGuard no_grad;
    for (const AdaptedLayer& layer : layers_) {
      for (const auto& [matrix, target] : {std::pair<const char*, LoraMatrix*>{"lora_A", layer.a.get()},
                                           {"lora_B", layer.b.get()}}) {
        std::string name = layer.path + "." + matrix + ".weight";
        if (peft) {
          const tessera::HfModuleName hf = model.hugging_face_module(layer.path);
          if (hf.name.empty()) {
            throw tessera::ConfigError("the model has no Hugging Face names to find its layers in a PEFT folder by",
                                       "init_from");
          }
          name = kPeftPrefix + hf.name + "." + matrix + ".weight";
        }
        const auto it = tensors.find(name);
        if (it == tensors.end()) {
          throw tessera::ConfigError(file.string() + " has no " + name + " (does target_modules name the layers it " +
                                         "was trained with?)",
                                     "init_from");
        }
        if (it->second.sizes() != target->weight.sizes()) {
          std::ostringstream shapes;
          shapes << it->second.sizes() << " in the file, " << target->weight.sizes() << " here";
          throw tessera::ConfigError(file.string() + ": " + name + " is " + shapes.str() + " (rank differs?)",
                                     "init_from");
        }
        target->weight.copy_(it->second);
        used.insert(name);
      }
    }
    // A pipeline stage takes its own layers' tensors; the rest are the other stages' (`tessera
    // validate` checks the folder against the whole model).
    for (const auto& [name, tensor] : tensors) {
      if (!used.count(name) && whole_model_) {
        throw tessera::ConfigError(file.string() + " holds " + name + ", which no layer this config adapts takes " +
                                       "(target_modules names fewer layers than it was trained with?)",
                                   "init_from");
      }
    }
  }

  // A PEFT folder's own settings must be this config's: the same terms, scaled the same.
  void check_peft_config(const fs::path& path) const {
    const nlohmann::json peft = nlohmann::json::parse(read_text(path), nullptr, false);
    if (!peft.is_object()) throw tessera::ConfigError(path.string() + " is not a JSON object", "init_from");
    auto value = [&](const char* key) { return peft.contains(key) ? peft[key] : nlohmann::json(nullptr); };
    if (const auto type = value("peft_type"); type.is_string() && type != "LORA") {
      throw tessera::ConfigError(path.string() + " is a " + type.get<std::string>() + " adapter, not LoRA", "init_from");
    }
    if (const auto r = value("r"); r.is_number_integer() && r.get<std::int64_t>() != config_.rank) {
      throw tessera::ConfigError(path.string() + " has r " + r.dump() + "; set rank: " + r.dump(), "rank");
    }
    if (const auto alpha = value("lora_alpha"); alpha.is_number() && alpha.get<double>() != config_.alpha) {
      throw tessera::ConfigError(path.string() + " has lora_alpha " + alpha.dump() + "; set alpha: " + alpha.dump(),
                                 "alpha");
    }
    if (value("use_dora") == true || value("use_rslora") == true) {
      throw tessera::ConfigError(path.string() + " uses DoRA or rsLoRA, which adapter/lora does not", "init_from");
    }
    // Per-layer ranks or scales: adapter/lora has one rank and one alpha for every layer.
    for (const char* pattern : {"rank_pattern", "alpha_pattern"}) {
      if (!value(pattern).is_null() && !value(pattern).empty()) {
        throw tessera::ConfigError(path.string() + " gives some layers their own rank or alpha (" + pattern +
                                       "); adapter/lora has one rank and one alpha for every layer",
                                   "init_from");
      }
    }
  }

  LoraConfig config_;
  bool whole_model_;
  std::uint64_t init_seed_;
  std::vector<AdaptedLayer> layers_;
};

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Adapter, LoraConfig>(
      "lora", "LoRA: low-rank terms on the named linear layers, the base frozen (PEFT's names and exports)",
      [](const LoraConfig& c, const tessera::RunContext& context) {
        return std::make_shared<Lora>(c, context.parallel.pp == 1);
      });
}

}  // namespace

TESSERA_PLUGIN("adapter_lora", "0.1.0", register_components)
