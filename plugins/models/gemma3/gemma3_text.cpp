// Model `gemma3_text`: Gemma 3's text decoder (Gemma3ForCausalLM, model_type gemma3_text) as a
// family spec over the SDK's kit (tessera/nn/family.hpp): sliding-window and global layers
// (layer_types, or every sliding_window_pattern-th layer global), each kind with its rotary base,
// q/k norms, four RMSNorms per block scaling by 1 + weight, the embedding scaled by
// sqrt(n_embd), query_pre_attn_scalar, GeGLU with the tanh GELU, a tied head; Gemma 2's
// attn_logit_softcapping where set. config.json is the table below, read and written by the kit.
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tessera/nn/decoder_factory.hpp"
#include "tessera/nn/family.hpp"
#include "tessera/nn/hf_fields.hpp"
#include "tessera/nn/mesh_rules.hpp"
#include "tessera/plugin.hpp"

namespace {

namespace nn = tessera::nn;
using tessera::ConfigError;

struct Gemma3Config : nn::DecoderFields {
  std::int64_t n_kv_head = 1, head_dim = 0, intermediate_size = 0;  // 0: n_embd / n_head; 4 n_embd
  double rope_theta = 1e6, rope_local_theta = 1e4, rope_scaling_factor = 1.0;
  double rms_norm_eps = 1e-6;
  std::int64_t query_pre_attn_scalar = 0;  // 0: head_dim
  bool tie_embeddings = true, attention_bias = false;
  std::int64_t sliding_window = 4096, sliding_window_pattern = 6;
  std::vector<std::string> layer_types;  // empty: from sliding_window_pattern
  double attn_logit_softcapping = 0, final_logit_softcapping = 0;  // 0: none
  std::string init_from;
  std::set<std::string> given;

  std::int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  std::int64_t mlp_size() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  std::int64_t pre_attn_scalar() const { return query_pre_attn_scalar > 0 ? query_pre_attn_scalar : head_size(); }
  std::vector<std::string> layers() const {
    if (!layer_types.empty()) return layer_types;
    std::vector<std::string> out;
    for (std::int64_t i = 0; i < n_layer; ++i) {
      out.push_back((i + 1) % sliding_window_pattern == 0 ? "full_attention" : "sliding_attention");
    }
    return out;
  }
  bool windowed() const {
    const auto kinds = layers();
    return std::count(kinds.begin(), kinds.end(), "sliding_attention") > 0;
  }

  static void check(const Gemma3Config& c);
  static void check_mesh(const Gemma3Config& c, const tessera::RunContext& run, const Gemma3Config&) {
    nn::check_tensor_parallel({c.n_head, c.n_kv_head, c.mlp_size(), c.vocab_size}, run.parallel);
    nn::check_context_parallel(c.n_head, c.dropout, run.parallel, c.windowed() ? c.sliding_window : 0);
    nn::check_pipeline_parallel(c.n_layer, run.parallel);
  }
  static Gemma3Config settled(const Gemma3Config& yaml);
  static void declare(tessera::ConfigFields<Gemma3Config>& f);
};

// config.json, both ways: the YAML field, Hugging Face's key, transformers' value when it is absent.
const nn::HfFieldTable<Gemma3Config>& table() {
  using C = Gemma3Config;
  namespace t = nn::hf_transforms;
  static const auto rows = [] {
    nn::HfFieldTable<C> f("model/gemma3_text");
    f.written("architectures", [](const C&) { return nlohmann::json::array({"Gemma3ForCausalLM"}); })
        .written("model_type", [](const C&) { return "gemma3_text"; });
    f.field("vocab_size", &C::vocab_size, "vocab_size", 262208).field("n_layer", &C::n_layer, "num_hidden_layers", 26);
    f.field("n_head", &C::n_head, "num_attention_heads", 8).field("n_kv_head", &C::n_kv_head, "num_key_value_heads", 4);
    f.field("n_embd", &C::n_embd, "hidden_size", 2304);
    f.field<std::int64_t>("head_dim", &C::head_dim, "head_dim", 256, &C::head_size);
    f.field<std::int64_t>("intermediate_size", &C::intermediate_size, "intermediate_size", 9216, &C::mlp_size);
    f.field("max_seq_len", &C::max_seq_len, "max_position_embeddings", 131072).fill_only();
    f.field("rms_norm_eps", &C::rms_norm_eps, "rms_norm_eps", 1e-6);
    f.field("tie_embeddings", &C::tie_embeddings, "tie_word_embeddings", true);
    f.field("rope_theta", &C::rope_theta, "rope_parameters.full_attention.rope_theta|rope_theta", 1e6);
    f.written("rope_parameters.full_attention.rope_type",
              [](const C& c) { return c.rope_scaling_factor != 1.0 ? "linear" : "default"; });
    f.field("rope_scaling_factor", &C::rope_scaling_factor, "rope_parameters.full_attention.factor|rope_scaling.factor",
            1.0).transform({}, t::omitted_when(1.0));
    f.written("rope_parameters.sliding_attention.rope_type", [](const C&) { return "default"; });
    f.field("rope_local_theta", &C::rope_local_theta,
            "rope_parameters.sliding_attention.rope_theta|rope_local_base_freq", 1e4);
    f.field("sliding_window", &C::sliding_window, "sliding_window", 4096);
    f.field<std::vector<std::string>>("layer_types", &C::layer_types, "layer_types", {}, &C::layers)
        .transform(t::layers_from_pattern("sliding_window_pattern", 6, "sliding_attention", "full_attention"));
    f.field<std::int64_t>("query_pre_attn_scalar", &C::query_pre_attn_scalar, "query_pre_attn_scalar", 256,
                    &C::pre_attn_scalar);
    f.field("attention_bias", &C::attention_bias, "attention_bias", false);
    f.field("dropout", &C::dropout, "attention_dropout", 0.0);
    for (auto cap : {&C::attn_logit_softcapping, &C::final_logit_softcapping}) {
      const std::string key = cap == &C::attn_logit_softcapping ? "attn_logit_softcapping" : "final_logit_softcapping";
      f.field(key, cap, key, nullptr).transform(t::null_as_zero(), t::zero_as_null());
    }
    f.written("initializer_range", [](const C& c) { return c.init_std; });
    f.expect("hidden_activation", {"gelu_pytorch_tanh", "gelu_tanh"}, "gelu_pytorch_tanh")
        .expect("use_bidirectional_attention", {false, nullptr}, false)
        .expect("rope_parameters.full_attention.rope_type|rope_scaling.rope_type", {"default", "linear"}, "default")
        .expect("rope_parameters.sliding_attention.rope_type", {"default"}, "default");
    return f;
  }();
  return rows;
}

void Gemma3Config::check(const Gemma3Config& c) {
  if (c.n_head % c.n_kv_head != 0) throw ConfigError("n_head must be a multiple of n_kv_head", "n_kv_head");
  if (c.head_size() % 2 != 0) throw ConfigError("the head size must be even for rotary embeddings", "head_dim");
  if (static_cast<std::int64_t>(c.layers().size()) != c.n_layer) throw ConfigError("layer_types needs n_layer kinds", "layer_types");
  for (const std::string& kind : c.layers()) {
    if (kind != "sliding_attention" && kind != "full_attention") {
      throw ConfigError("layer_types lists '" + kind + "' (sliding_attention or full_attention)", "layer_types");
    }
  }
  if (c.final_logit_softcapping > 0) {
    throw ConfigError("final_logit_softcapping (Gemma 2's) is not computed by model/gemma3_text yet", "final_logit_softcapping");
  }
}

Gemma3Config Gemma3Config::settled(const Gemma3Config& yaml) {
  const auto checked = [](Gemma3Config c) { return check(c), c; };
  return tessera::hf_import::settled_by_init_from(
      yaml, "gemma3_text", [&](const Gemma3Config& c, const tessera::HfConfig& e) { return checked(table().settle_export(c, e)); },
      [&](const Gemma3Config& c, const tessera::HfConfig& j) { return checked(table().settle_hf(c, j)); });
}

void Gemma3Config::declare(tessera::ConfigFields<Gemma3Config>& f) {
  using C = Gemma3Config;
  nn::declare_decoder_fields(f, nn::DecoderDocs::rotary("query heads per block", "dropout on the attention probabilities"));
  f.field("n_kv_head", &C::n_kv_head, "key/value heads (grouped-query attention)").at_least(1);
  f.field("head_dim", &C::head_dim, "size of one attention head (0: n_embd / n_head)").at_least(0);
  f.field("intermediate_size", &C::intermediate_size, "hidden width of the GeGLU MLP (0: 4 n_embd)").at_least(0);
  f.field("rope_theta", &C::rope_theta, "rotary base of the global (full_attention) layers").greater_than(0);
  f.field("rope_local_theta", &C::rope_local_theta, "rotary base of the sliding layers (rope_local_base_freq)").greater_than(0);
  f.field("rope_scaling_factor", &C::rope_scaling_factor, "linear RoPE scaling of the global layers (1: none)").at_least(1);
  f.field("rms_norm_eps", &C::rms_norm_eps, "epsilon of the RMS norms").greater_than(0);
  f.field("query_pre_attn_scalar", &C::query_pre_attn_scalar, "scores scaled by its -1/2 power (0: head_dim)").at_least(0);
  f.field("tie_embeddings", &C::tie_embeddings, "the output head reuses the token embedding (no lm_head)");
  f.field("attention_bias", &C::attention_bias, "biases on q_proj, k_proj, v_proj and o_proj");
  f.field("sliding_window", &C::sliding_window, "the sliding layers attend within this many positions").at_least(1);
  f.field("sliding_window_pattern", &C::sliding_window_pattern, "without layer_types: every k-th layer is global").at_least(1);
  f.field("layer_types", &C::layer_types, "each block's sliding_attention or full_attention (empty: the pattern)");
  f.field("attn_logit_softcapping", &C::attn_logit_softcapping, "Gemma 2's cap of the attention scores (0: none)").at_least(0);
  f.field("final_logit_softcapping", &C::final_logit_softcapping, "Gemma 2's cap of the logits (0: none)").at_least(0);
  nn::declare_init_from<C>(f, "start from these weights: a Hugging Face Gemma3ForCausalLM folder, a Tessera export folder or a "
                           "safetensors file", &C::check, &C::settled, &C::check_mesh);
}

// The model as the kit's family spec: a sandwich of (1 + weight) RMSNorms around every branch.
nn::FamilySpec family(const Gemma3Config& c) {
  nn::FamilySpec f;
  f.decoder = nn::DecoderSpec::of("model/gemma3_text", c);
  f.parts = {c.vocab_size, c.n_embd, c.rms_norm_eps, c.tie_embeddings,
             {{c.head_size(), c.max_seq_len, c.rope_local_theta}, {c.head_size(), c.max_seq_len, c.rope_theta}},
             std::sqrt(static_cast<double>(c.n_embd)), nn::RmsWeight::one_plus};
  f.parts.rotaries[1].linear_factor = c.rope_scaling_factor;
  const std::vector<std::string> kinds = c.layers();
  for (const std::string& kind : kinds) {
    nn::BlockSpec block;
    block.norm = {c.rms_norm_eps, nn::RmsWeight::one_plus};
    block.sandwich = true;
    nn::AttentionSpec& a = block.attention;
    a = {c.n_embd, c.n_head, c.n_kv_head, c.head_size(), c.attention_bias, c.attention_bias, c.dropout, c.rms_norm_eps};
    a.qk_norm_weight = nn::RmsWeight::one_plus;
    a.scale = 1.0 / std::sqrt(static_cast<double>(c.pre_attn_scalar()));
    if (c.attn_logit_softcapping > 0) a.logit_softcap = c.attn_logit_softcapping;
    const bool sliding = kind == "sliding_attention";
    a.sliding_window = sliding ? c.sliding_window : 0;
    a.rotary = sliding ? 0 : 1;
    block.feed_forward.width = c.mlp_size();
    block.feed_forward.activation = "gelu_tanh";
    f.blocks.push_back(block);
  }
  f.init = {c.init_std, /*scaled_residual=*/false};
  f.names = nn::HfWeightNames::causal_lm();
  nn::describe_by_table(f, table(), c);
  return f;
}

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, Gemma3Config>(
      "gemma3_text",
      "Gemma 3 text decoder (Gemma3ForCausalLM): sliding and global layers, q/k norms, sandwich (1 + weight) RMSNorms, "
      "GeGLU, a scaled embedding tied to the head; Hugging Face import/export",
      [](const Gemma3Config& yaml, const tessera::RunContext& run) {
        return nn::build_family(yaml, run, &Gemma3Config::settled, &Gemma3Config::check_mesh, &family);
      });
}

}  // namespace

TESSERA_PLUGIN("model_gemma3_text", "0.1.0", register_components)
