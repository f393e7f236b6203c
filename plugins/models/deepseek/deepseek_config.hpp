// model/deepseek_v3's config: what the family adds to the kit's decoder and routing fields
// (multi-head latent attention's ranks and head parts, dense first blocks, shared experts, grouped
// sigmoid routing with a correction bias and routed scaling, the auxiliary-loss-free balancing's
// speed), their checks and mesh rules, and config.json as one table (hf_table: import, export and
// the architecture record).
#pragma once

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tessera/config/config_fields.hpp"
#include "tessera/error.hpp"
#include "tessera/formats/hugging_face.hpp"
#include "tessera/nn/decoder_fields.hpp"
#include "tessera/nn/experts.hpp"
#include "tessera/nn/hf_fields.hpp"
#include "tessera/nn/hf_import.hpp"
#include "tessera/nn/latent_attention.hpp"
#include "tessera/nn/mesh_rules.hpp"
#include "tessera/nn/rotary.hpp"
#include "tessera/nn/weight_names.hpp"

namespace tessera::deepseek {

struct DeepseekConfig;
// The YAML's config with what init_from's config.json says settled in (by hf_table, below).
inline DeepseekConfig settled_by_init_from(const DeepseekConfig& yaml);

struct DeepseekConfig : nn::DecoderFields, nn::MoeFields {
  std::int64_t q_lora_rank = 0;  // 0: one q_proj (DeepSeek-V2-Lite's null)
  std::int64_t kv_lora_rank = 32;
  std::int64_t qk_nope_head_dim = 16;
  std::int64_t qk_rope_head_dim = 8;
  std::int64_t v_head_dim = 16;
  std::int64_t intermediate_size = 256;         // the dense blocks' SwiGLU
  std::int64_t expert_intermediate_size = 64;   // moe_intermediate_size
  std::int64_t shared_experts = 1;              // n_shared_experts, each of expert_intermediate_size
  std::int64_t first_dense_blocks = 1;          // first_k_dense_replace
  std::int64_t expert_groups = 1;               // n_group
  std::int64_t expert_groups_kept = 1;          // topk_group
  double routed_scaling = 1.0;                  // routed_scaling_factor
  double rope_theta = 10000.0;
  // YaRN [factor, original_max_seq_len, beta_fast, beta_slow, mscale, mscale_all_dim]; absent: none.
  std::optional<std::vector<double>> rope_yarn;
  bool rope_interleave = true;
  double rms_norm_eps = 1e-6;
  bool tie_embeddings = false;
  bool attention_bias = false;
  // Auxiliary-loss-free balancing: after each step every routed block's correction bias moves by
  // this much towards balance (up for experts loaded below the mean, down above); 0: frozen.
  double bias_update_speed = 0.0;
  std::string init_from;
  std::set<std::string> given;

  DeepseekConfig() {
    num_experts = 8;
    top_k = 2;
    aux_loss_coef = 0.0;  // DeepSeek-V3 balances by its correction bias
  }

  std::int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  bool routes(std::int64_t block) const { return block >= first_dense_blocks; }
  std::int64_t routed_blocks() const { return std::max<std::int64_t>(n_layer - first_dense_blocks, 0); }

  std::optional<nn::YarnScaling> yarn() const {
    if (!rope_yarn) return std::nullopt;
    const std::vector<double>& y = *rope_yarn;
    nn::YarnScaling out;
    out.factor = y[0];
    out.original_max_positions = static_cast<std::int64_t>(y[1]);
    out.beta_fast = y[2];
    out.beta_slow = y[3];
    if (y[4] != 0) out.mscale = y[4];
    if (y[5] != 0) out.mscale_all_dim = y[5];
    return out;
  }
  // qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim) squared (transformers'
  // yarn_apply_mscale).
  double softmax_scale() const {
    double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
    if (rope_yarn && (*rope_yarn)[5] != 0) {
      const double m = nn::YarnScaling::mscale_of((*rope_yarn)[0], (*rope_yarn)[5]);
      scale *= m * m;
    }
    return scale;
  }
  nn::LatentAttentionSpec attention() const {
    nn::LatentAttentionSpec s;
    s.hidden = n_embd;
    s.heads = n_head;
    s.q_lora_rank = q_lora_rank;
    s.kv_lora_rank = kv_lora_rank;
    s.qk_nope_head_dim = qk_nope_head_dim;
    s.qk_rope_head_dim = qk_rope_head_dim;
    s.v_head_dim = v_head_dim;
    s.norm_eps = rms_norm_eps;
    s.bias = attention_bias;
    s.softmax_scale = softmax_scale();
    s.interleaved_rotary = rope_interleave;
    s.dropout = dropout;
    return s;
  }
  ExpertRouting routing_options() const {
    ExpertRouting r = routing();
    r.score = RouterScore::sigmoid;
    r.groups = expert_groups;
    r.groups_kept = expert_groups_kept;
    r.routed_scaling = routed_scaling;
    r.correction_bias = true;
    return r;
  }

  static void check(const DeepseekConfig& c) {
    if (c.qk_rope_head_dim % 2 != 0) throw ConfigError("qk_rope_head_dim must be even (rotated pairs)", "qk_rope_head_dim");
    if (c.first_dense_blocks > c.n_layer) {
      throw ConfigError("first_dense_blocks (" + std::to_string(c.first_dense_blocks) + ") exceeds n_layer (" +
                            std::to_string(c.n_layer) + ")",
                        "first_dense_blocks");
    }
    if (c.num_experts % c.expert_groups != 0 || (c.expert_groups > 1 && c.num_experts / c.expert_groups < 2) ||
        c.expert_groups_kept > c.expert_groups || c.top_k > c.expert_groups_kept * (c.num_experts / c.expert_groups)) {
      throw ConfigError("num_experts (" + std::to_string(c.num_experts) + ") in expert_groups (" +
                            std::to_string(c.expert_groups) + ") of at least 2, expert_groups_kept (" +
                            std::to_string(c.expert_groups_kept) + ") of them, must hold top_k (" +
                            std::to_string(c.top_k) + ")",
                        "expert_groups");
    }
    if (c.rope_yarn) {
      const auto& y = *c.rope_yarn;
      if (y.size() != 6 || y[0] <= 0 || y[1] < 1) {
        throw ConfigError("rope_yarn is [factor > 0, original_max_seq_len >= 1, beta_fast, beta_slow, mscale, "
                          "mscale_all_dim] (0 for an mscale: none)",
                          "rope_yarn");
      }
    }
  }

  static void declare(ConfigFields<DeepseekConfig>& f) {
    using C = DeepseekConfig;
    nn::declare_decoder_fields(
        f, nn::DecoderDocs::rotary("attention heads per block", "dropout on the attention probabilities"));
    f.field("q_lora_rank", &C::q_lora_rank, "rank of the query latent (q_a_proj, q_b_proj); 0: one q_proj").at_least(0);
    f.field("kv_lora_rank", &C::kv_lora_rank, "rank of the key/value latent (kv_a_proj_with_mqa, kv_b_proj)").at_least(1);
    f.field("qk_nope_head_dim", &C::qk_nope_head_dim, "a head's query/key part without positions").at_least(0);
    f.field("qk_rope_head_dim", &C::qk_rope_head_dim, "a head's rotated query/key part (one key part for all heads)")
        .at_least(2);
    f.field("v_head_dim", &C::v_head_dim, "a head's value size").at_least(1);
    f.field("intermediate_size", &C::intermediate_size, "hidden width of the dense blocks' SwiGLU").at_least(1);
    f.field("expert_intermediate_size", &C::expert_intermediate_size,
            "hidden width of each routed and shared expert (Hugging Face's moe_intermediate_size)")
        .at_least(1);
    f.field("shared_experts", &C::shared_experts, "experts every token passes through in a routed block (n_shared_experts)")
        .at_least(0);
    f.field("first_dense_blocks", &C::first_dense_blocks,
            "the first blocks keep a dense SwiGLU (first_k_dense_replace)")
        .at_least(0);
    nn::declare_moe_fields(f, {"routed experts per routed block (n_routed_experts)", /*dense_allowed=*/false, "routed blocks"});
    f.field("expert_groups", &C::expert_groups, "routing groups of experts (n_group); a token's experts come from its "
                                                 "expert_groups_kept best groups, each rated by its two best scores")
        .at_least(1);
    f.field("expert_groups_kept", &C::expert_groups_kept, "groups a token's experts come from (topk_group)").at_least(1);
    f.field("routed_scaling", &C::routed_scaling, "the gates multiplied by this (routed_scaling_factor)").greater_than(0);
    f.field("rope_theta", &C::rope_theta, "base of the rotary frequencies").greater_than(0);
    f.field("rope_yarn", &C::rope_yarn,
            "YaRN [factor, original_max_seq_len, beta_fast, beta_slow, mscale, mscale_all_dim] (0 for an mscale: none; "
            "absent: plain rotary)");
    f.field("rope_interleave", &C::rope_interleave, "rotated pairs interleaved (x0, x1), (x2, x3), ... as DeepSeek's");
    f.field("rms_norm_eps", &C::rms_norm_eps, "epsilon of the RMS norms").greater_than(0);
    f.field("tie_embeddings", &C::tie_embeddings, "the output head reuses the token embedding (no lm_head)");
    f.field("attention_bias", &C::attention_bias, "biases on q_a_proj, kv_a_proj_with_mqa and o_proj");
    f.field("bias_update_speed", &C::bias_update_speed,
            "auxiliary-loss-free balancing: after each step every routed block's correction bias moves by this towards "
            "balance (+ for experts below the mean load, - above); 0: frozen")
        .at_least(0);
    nn::declare_init_from<C>(f,
                             "start from these weights: a Hugging Face DeepseekV3ForCausalLM folder (config.json + "
                             "safetensors; fields left out of the YAML come from config.json; multi-token-prediction "
                             "layers are skipped), a Tessera export folder or a safetensors file",
                             &DeepseekConfig::check, &settled_by_init_from, &DeepseekConfig::check_mesh);
  }

  static void check_mesh(const DeepseekConfig& c, const RunContext& run, const DeepseekConfig& /*yaml*/) {
    const ParallelDims& dims = run.parallel;
    // The dense blocks' and the shared experts' units divide over tp; the routed experts stay whole.
    nn::check_tensor_parallel({c.n_head, c.n_head, c.first_dense_blocks > 0 ? c.intermediate_size : 0, c.vocab_size, true},
                              dims);
    if (c.shared_experts > 0 && dims.tp > 1 && (c.shared_experts * c.expert_intermediate_size) % dims.tp != 0) {
      throw ConfigError("the shared experts' units (" + std::to_string(c.shared_experts * c.expert_intermediate_size) +
                            ") must be divisible by parallelism.tp (" + std::to_string(dims.tp) + ")",
                        "expert_intermediate_size");
    }
    nn::check_context_parallel(c.n_head, c.dropout, dims);
    nn::check_expert_parallel(c, dims);
    nn::check_pipeline_parallel(c.n_layer, dims);
  }
};

inline const nn::HfFieldTable<DeepseekConfig>& hf_table();
inline DeepseekConfig settled_by_init_from(const DeepseekConfig& yaml) {
  return nn::settled_by_table(yaml, "deepseek_v3", hf_table(), &DeepseekConfig::check);
}

// DeepseekV3ForCausalLM's config.json, both ways (no multi-token-prediction layers).
inline const nn::HfFieldTable<DeepseekConfig>& hf_table() {
  using C = DeepseekConfig;
  using nlohmann::json;
  namespace t = nn::hf_transforms;
  static const auto table = [] {
    nn::HfFieldTable<C> f("model/deepseek_v3");
    f.architecture("DeepseekV3ForCausalLM", "deepseek_v3");
    nn::causal_lm_rows(f);
    f.written("num_key_value_heads", [](const C& c) { return c.n_head; });
    f.field("q_lora_rank", &C::q_lora_rank, "q_lora_rank", nullptr)
        .transform(t::null_as_zero(), t::zero_as_null())
        .at_least(0);
    f.field("kv_lora_rank", &C::kv_lora_rank, "kv_lora_rank");
    f.field("qk_nope_head_dim", &C::qk_nope_head_dim, "qk_nope_head_dim").at_least(0);
    f.field("qk_rope_head_dim", &C::qk_rope_head_dim, "qk_rope_head_dim");
    f.field("v_head_dim", &C::v_head_dim, "v_head_dim");
    f.field("intermediate_size", &C::intermediate_size, "intermediate_size");
    f.field("expert_intermediate_size", &C::expert_intermediate_size, "moe_intermediate_size");
    f.field("num_experts", &C::num_experts, "n_routed_experts").field("top_k", &C::top_k, "num_experts_per_tok");
    f.field("shared_experts", &C::shared_experts, "n_shared_experts", 0).at_least(0);
    f.field("first_dense_blocks", &C::first_dense_blocks, "first_k_dense_replace", 0).at_least(0);
    f.field("expert_groups", &C::expert_groups, "n_group").field("expert_groups_kept", &C::expert_groups_kept, "topk_group");
    f.field("routed_scaling", &C::routed_scaling, "routed_scaling_factor");
    f.field("renormalize_topk", &C::renormalize_topk, "norm_topk_prob", true);
    f.field("rms_norm_eps", &C::rms_norm_eps, "rms_norm_eps");
    f.field("tie_embeddings", &C::tie_embeddings, "tie_word_embeddings", false);
    f.field("attention_bias", &C::attention_bias, "attention_bias", false);
    f.field("rope_interleave", &C::rope_interleave, "rope_interleave", true);
    f.field("rope_theta", &C::rope_theta, "rope_parameters.rope_theta|rope_theta", 10000.0);
    f.field("rope_yarn", &C::rope_yarn, "rope_parameters", nullptr)
        .transform(t::yarn_rope("model/deepseek_v3"), t::yarn_rope_out());
    f.expect("hidden_act", {"silu"}, "silu").expect("scoring_func", {"sigmoid"}, "sigmoid");
    // Latent attention has one key/value head per query head.
    f.rule([](const C& c, const json& whole) -> std::string {
      const json kv = whole.value("num_key_value_heads", json(c.n_head));
      return kv == json(c.n_head) ? "" : "num_key_value_heads " + kv.dump() + " apart from num_attention_heads";
    });
    return f;
  }();
  return table;
}

}  // namespace tessera::deepseek
