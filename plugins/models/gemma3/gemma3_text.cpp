// Model `gemma3_text`: Gemma 3's text decoder (Gemma3ForCausalLM) as a family spec over the kit: sliding
// and global layers with their rotary bases, q/k norms, four (1 + weight) RMSNorms a block, the embedding
// scaled by sqrt(n_embd), query_pre_attn_scalar, GeGLU, a tied head; Gemma 2's two softcaps where set.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "tessera/nn/decoder_factory.hpp"
#include "tessera/nn/layer_kinds.hpp"
#include "tessera/nn/mesh_rules.hpp"
#include "tessera/plugin.hpp"

namespace {

namespace nn = tessera::nn;
constexpr const char* kSliding = "sliding_attention";

struct Gemma3Config : nn::DecoderFields {
  std::int64_t n_kv_head = 1, head_dim = 0, intermediate_size = 0;  // 0: n_embd / n_head; 4 n_embd
  double rope_theta = 1e6, rope_local_theta = 1e4, rope_scaling_factor = 1.0, rms_norm_eps = 1e-6;
  bool tie_embeddings = true, attention_bias = false;
  std::int64_t query_pre_attn_scalar = 0, sliding_window = 4096, sliding_window_pattern = 6;  // 0: head_dim
  std::vector<std::string> layer_types;  // empty: from sliding_window_pattern
  double attn_logit_softcapping = 0, final_logit_softcapping = 0;  // Gemma 2's caps; 0: none
  std::string init_from;
  std::set<std::string> given;

  std::int64_t head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  std::int64_t mlp_size() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  std::int64_t pre_attn_scalar() const { return query_pre_attn_scalar > 0 ? query_pre_attn_scalar : head_size(); }
  std::vector<std::string> layers() const {
    return nn::layer_kinds(layer_types, n_layer, sliding_window_pattern, kSliding, "full_attention");
  }

  static void check(const Gemma3Config& c) {
    nn::check_layer_kinds(c.layers(), c.n_layer, {kSliding, "full_attention"}, "layer_types");
    nn::check_grouped_heads(c.n_embd, c.n_head, c.n_kv_head, c.head_dim, c.head_size());
  }
  static void check_mesh(const Gemma3Config& c, const tessera::RunContext& run, const Gemma3Config&) {
    const auto kinds = c.layers();
    nn::check_tensor_parallel({c.n_head, c.n_kv_head, c.mlp_size(), c.vocab_size}, run.parallel);
    const bool windowed = std::count(kinds.begin(), kinds.end(), kSliding) > 0;
    nn::check_context_parallel(c.n_head, c.dropout, run.parallel, windowed ? c.sliding_window : 0);
    nn::check_pipeline_parallel(c.n_layer, run.parallel);
  }
  static void declare(tessera::ConfigFields<Gemma3Config>& f);
};

// config.json, both ways: the YAML field, Hugging Face's key, transformers' value when it is absent.
const nn::HfFieldTable<Gemma3Config>& table() {
  using C = Gemma3Config;
  using I = std::int64_t;
  namespace t = nn::hf_transforms;
  static const auto rows = [] {
    nn::HfFieldTable<C> f("model/gemma3_text");
    f.architecture("Gemma3ForCausalLM", "gemma3_text");
    nn::causal_lm_rows(f);
    f.field("n_kv_head", &C::n_kv_head, "num_key_value_heads", 4);
    f.field<I>("head_dim", &C::head_dim, "head_dim", 256, &C::head_size);
    f.field<I>("intermediate_size", &C::intermediate_size, "intermediate_size", 9216, &C::mlp_size);
    f.field("rms_norm_eps", &C::rms_norm_eps, "rms_norm_eps", 1e-6);
    f.field("sliding_window", &C::sliding_window, "sliding_window", 4096);
    f.field("tie_embeddings", &C::tie_embeddings, "tie_word_embeddings", true);
    const std::string global = "rope_parameters.full_attention.", local = "rope_parameters.sliding_attention.";
    f.field("rope_theta", &C::rope_theta, global + "rope_theta|rope_theta", 1e6);
    f.written(global + "rope_type", [](const C& c) { return c.rope_scaling_factor != 1.0 ? "linear" : "default"; });
    f.field("rope_scaling_factor", &C::rope_scaling_factor, global + "factor|rope_scaling.factor", 1.0)
        .transform({}, t::omitted_when(1.0));
    f.field("rope_local_theta", &C::rope_local_theta, local + "rope_theta|rope_local_base_freq", 1e4);
    f.field<std::vector<std::string>>("layer_types", &C::layer_types, "layer_types", {}, &C::layers)
        .transform(t::layers_from_pattern("sliding_window_pattern", 6, kSliding, "full_attention"));
    f.field<I>("query_pre_attn_scalar", &C::query_pre_attn_scalar, "query_pre_attn_scalar", 256, &C::pre_attn_scalar);
    f.field("attention_bias", &C::attention_bias, "attention_bias", false);
    f.field("attn_logit_softcapping", &C::attn_logit_softcapping, "attn_logit_softcapping", nullptr).zero_is_null();
    f.field("final_logit_softcapping", &C::final_logit_softcapping, "final_logit_softcapping", nullptr).zero_is_null();
    f.expect("hidden_activation", {"gelu_pytorch_tanh", "gelu_tanh"}, "gelu_pytorch_tanh")
        .expect("use_bidirectional_attention", {false, nullptr}, false)
        .expect(global + "rope_type|rope_scaling.rope_type", {"default", "linear"}, "default")
        .expect(local + "rope_type", {"default"}, "default");
    return f;
  }();
  return rows;
}

Gemma3Config settled(Gemma3Config yaml) {
  if (yaml.given.count("sliding_window_pattern")) yaml.given.insert("layer_types");  // compared as what it means
  return nn::settled_by_table(yaml, "gemma3_text", table(), &Gemma3Config::check);
}

void Gemma3Config::declare(tessera::ConfigFields<Gemma3Config>& f) {
  using C = Gemma3Config;
  nn::declare_decoder_fields(f, nn::DecoderDocs::rotary("query heads per block", "dropout on attention probabilities"));
  f.field("n_kv_head", &C::n_kv_head, "key/value heads (grouped-query attention)").at_least(1);
  f.field("head_dim", &C::head_dim, "size of one attention head (0: n_embd / n_head)").at_least(0);
  f.field("intermediate_size", &C::intermediate_size, "hidden width of the GeGLU MLP (0: 4 n_embd)").at_least(0);
  f.field("rope_theta", &C::rope_theta, "rotary base of the global (full_attention) layers").greater_than(0);
  f.field("rope_local_theta", &C::rope_local_theta, "rotary base of the sliding layers").greater_than(0);
  f.field("rope_scaling_factor", &C::rope_scaling_factor, "linear RoPE scaling of the global layers").at_least(1);
  f.field("rms_norm_eps", &C::rms_norm_eps, "epsilon of the RMS norms").greater_than(0);
  f.field("query_pre_attn_scalar", &C::query_pre_attn_scalar, "scores scaled by its -1/2 power (0: head_dim)")
      .at_least(0);
  f.field("tie_embeddings", &C::tie_embeddings, "the output head reuses the token embedding (no lm_head)");
  f.field("attention_bias", &C::attention_bias, "biases on q_proj, k_proj, v_proj and o_proj");
  f.field("sliding_window", &C::sliding_window, "the sliding layers attend within this many positions").at_least(1);
  f.field("sliding_window_pattern", &C::sliding_window_pattern, "every k-th layer is global").at_least(1);
  f.field("layer_types", &C::layer_types, "each block's sliding_attention or full_attention (empty: the pattern)");
  f.field("attn_logit_softcapping", &C::attn_logit_softcapping, "cap of the attention scores (0: none)").at_least(0);
  f.field("final_logit_softcapping", &C::final_logit_softcapping, "cap of the logits (0: none)").at_least(0);
  nn::declare_init_from<C>(f, "start from these weights: a Hugging Face Gemma3ForCausalLM folder, a Tessera export "
                           "folder or a safetensors file", &C::check, &settled, &C::check_mesh);
}

// The model as the kit's family spec: a sandwich of (1 + weight) RMSNorms around every branch.
nn::FamilySpec family(const Gemma3Config& c) {
  nn::FamilySpec f = nn::FamilySpec::of("model/gemma3_text", c);
  f.decoder.logit_softcap = c.final_logit_softcapping;
  f.tied = c.tie_embeddings;
  f.embedding_scale = std::sqrt(static_cast<double>(c.n_embd));
  f.rotaries = {{c.head_size(), c.max_seq_len, c.rope_local_theta}, {c.head_size(), c.max_seq_len, c.rope_theta}};
  f.rotaries[1].linear_factor = c.rope_scaling_factor;
  f.final_norm = {c.rms_norm_eps, nn::RmsWeight::one_plus};
  for (const std::string& kind : c.layers()) {
    nn::BlockSpec block{f.final_norm, /*sandwich=*/true};
    nn::AttentionSpec& a = block.attention;
    a = {c.n_embd, c.n_head, c.n_kv_head, c.head_size(), c.attention_bias, c.attention_bias, c.dropout, c.rms_norm_eps};
    a.qk_norm_weight = nn::RmsWeight::one_plus;
    if (c.pre_attn_scalar() != c.head_size()) a.scale = 1.0 / std::sqrt(static_cast<double>(c.pre_attn_scalar()));
    if (c.attn_logit_softcapping > 0) a.logit_softcap = c.attn_logit_softcapping;
    a.sliding_window = kind == kSliding ? c.sliding_window : 0;
    a.rotary = kind == kSliding ? 0 : 1;
    block.feed_forward = {"mlp", c.mlp_size(), /*gated=*/true, "gelu_tanh"};
    f.blocks.push_back(block);
  }
  f.init.scaled_residual = false;
  nn::describe_by_table(f, table(), c);
  return f;
}

void register_components(tessera::Registrar& registrar) {
  registrar.add<tessera::Model, Gemma3Config>(
      "gemma3_text",
      "Gemma 3 text decoder (Gemma3ForCausalLM): sliding and global layers, sandwich norms; Hugging Face import/export",
      nn::family_factory<Gemma3Config>(&settled, &Gemma3Config::check_mesh, &family));
}

}  // namespace

TESSERA_PLUGIN("model_gemma3_text", "0.1.0", register_components)
