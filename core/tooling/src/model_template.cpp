// The scaffold of kind model: a small Llama-style decoder on the SDK's transformer kit, whose
// generated tests train it on one rank and on two Gloo ranks under tp, pp and fsdp and require
// the same per-step losses (docs/writing-a-model.md follows it).
#include "scaffold_template.hpp"

namespace tessera::tooling {

KindTemplate model_template() {
  KindTemplate t{
      "#include <optional>\n#include <string>\n#include <tuple>\n#include <vector>\n\n"
      "#include \"tessera/nn/attention.hpp\"\n#include \"tessera/nn/block.hpp\"\n#include \"tessera/nn/decoder.hpp\"\n#include \"tessera/nn/decoder_fields.hpp\"\n"
      "#include \"tessera/nn/embedding.hpp\"\n#include \"tessera/nn/mesh_rules.hpp\"\n#include \"tessera/nn/mlp.hpp\"\n"
      "#include \"tessera/nn/norms.hpp\"\n#include \"tessera/nn/parameters.hpp\"\n#include \"tessera/nn/rotary.hpp\"\n",
      "tessera::Model",
      R"tpl(// A Llama-style decoder on the SDK's transformer kit (tessera/nn/): pre-norm blocks of RMSNorm ->
// grouped-query attention with rotary positions -> RMSNorm -> SwiGLU, a final RMSNorm and an
// output head. The kit's DecoderModel runs it whole or as pipeline stages, split over tensor- and
// context-parallel ranks, one fsdp unit per block; this class says only what the model is.
class @CLASS@ : public tessera::nn::DecoderModel {
 public:
  @CLASS@(const @CLASS@Config& c, const tessera::RunContext& run)
      : DecoderModel(spec(c), tessera::TensorParallel::of(run), tessera::ContextParallel::of(run), {}, run),
        config_(c),
        rotary_({c.head_dim(), c.max_seq_len, c.rope_theta, std::nullopt}) {
    // Parameters in Hugging Face's Llama names; the embedding on the first pipeline stage, the
    // final norm and the head on the last, each block on the stage that holds it.
    if (pp_.holds_first_stage()) {
      embed_tokens_ = register_module("embed_tokens", std::make_shared<tessera::nn::Embedding>(tp_.vocab_rows(c.vocab_size, c.pad_vocab_to_multiple_of), c.n_embd));
    }
    tessera::nn::AttentionSpec attention;
    attention.hidden = c.n_embd;
    attention.heads = c.n_head;
    attention.kv_heads = c.n_kv_head;
    attention.head_dim = c.head_dim();
    attention.dropout = c.dropout;
    auto layers = register_module("layers", std::make_shared<torch::nn::Module>());
    for (std::int64_t i = 0; i < c.n_layer; ++i) {
      // Every block's splits (held here or not), then the block if this rank's stages hold it.
      const std::string block = "layers." + std::to_string(i) + ".";
      tessera::nn::GroupedQueryAttention::plan(plan_, block + "self_attn.", attention);
      tessera::nn::SwiGlu::plan(plan_, block + "mlp.");
      add_block(*layers, i, [&] {
        return std::make_shared<tessera::nn::TransformerBlock>(tessera::nn::BlockParts{
            {"input_layernorm", std::make_shared<tessera::nn::RmsNorm>(c.n_embd, 1e-5, tp_)},
            {"self_attn", std::make_shared<tessera::nn::GroupedQueryAttention>(attention, tp_, cp_)},
            {"post_attention_layernorm", std::make_shared<tessera::nn::RmsNorm>(c.n_embd, 1e-5, tp_)},
            {"mlp", std::make_shared<tessera::nn::SwiGlu>(c.n_embd, c.intermediate_size, false, tp_)}});
      });
    }
    plan_["embed_tokens.weight"] = tessera::TensorShard::vocabulary(c.vocab_size, c.pad_vocab_to_multiple_of);
    plan_["lm_head.weight"] = tessera::TensorShard::vocabulary(c.vocab_size, c.pad_vocab_to_multiple_of);
    if (pp_.holds_last_stage()) {
      norm_ = register_module("norm", std::make_shared<tessera::nn::RmsNorm>(c.n_embd, 1e-5, tp_));
      // Not adaptable: the loss reads the head's weight directly (Model::output_head).
      lm_head_ = register_module("lm_head",
                                 std::make_shared<tessera::Linear>(c.n_embd, tp_.vocab_rows(c.vocab_size, c.pad_vocab_to_multiple_of), false, false));
    }
    // Built for a run, the parameters are meta tensors until fsdp or the trainer asks for them.
    if (!has_deferred_parameters()) initialize_parameters(parameters());
    // N of 6N + 12·L·W·T: every weight but the input embedding (a lookup costs no FLOPs).
    const std::int64_t d = c.head_dim();
    const std::int64_t per_block = 2 * c.n_embd + c.n_embd * (2 * c.n_head + 2 * c.n_kv_head) * d + 3 * c.n_embd * c.intermediate_size;
    set_flop_parameters(static_cast<double>(c.n_layer * per_block + c.n_embd + c.vocab_size * c.n_embd));
  }

  // One rule from a parameter's name to its start: ones for the norms, normal(0, 0.02) else.
  void initialize_parameters(const std::vector<at::Tensor>& params) override {
    tessera::nn::initialize_parameters(
        *this, spec_.kind, params, init_seed_,
        [](const std::string& name) {
          return name.find("norm.") != std::string::npos ? tessera::nn::InitialValue::constant(1.0)
                                                         : tessera::nn::InitialValue::normal_with_std(0.02);
        },
        plan_, tp_, ep_);
  }

  // What `tessera plan` counts: the kit fills blocks and checkpointing, the model its widths.
  tessera::TransformerShape transformer_shape() const override {
    tessera::TransformerShape shape = decoder_shape();
    shape.hidden = config_.n_embd;
    shape.heads = config_.n_head;
    shape.kv_heads = config_.n_kv_head;
    shape.head_dim = config_.head_dim();
    shape.mlp_hidden = config_.intermediate_size;
    shape.gated_mlp = true;
    return shape;
  }

 protected:
  // The first stage: token ids to this rank's part of the residual stream.
  at::Tensor embed(const at::Tensor& input_ids, const tessera::nn::ForwardInputs&) override {
    return tp_.vocab_embedding(cp_.slice(input_ids), embed_tokens_->weight);
  }
  // Rotary tables at this pass's positions (packed documents and context-parallel slices give
  // them), in its compute dtype.
  void complete_inputs(tessera::nn::ForwardInputs& inputs, const at::Tensor& input_ids, const at::Tensor& stream) override {
    const auto [cos, sin] = rotary_.tables_for(input_ids.size(1), inputs.positions, stream);
    inputs.attention.rotary = {{cos, sin}};
  }
  at::Tensor final_norm(const at::Tensor& x) override { return norm_->forward(x); }
  at::Tensor head_weight() override { return lm_head_->weight; }

 private:
  static tessera::nn::DecoderSpec spec(const @CLASS@Config& c) {
    return tessera::nn::DecoderSpec::of("model/@NAME@", c);  // sizes and checkpointing from the fields
  }

  @CLASS@Config config_;
  tessera::nn::RotaryEmbedding rotary_;
  std::shared_ptr<tessera::nn::Embedding> embed_tokens_;
  std::shared_ptr<tessera::nn::RmsNorm> norm_;
  std::shared_ptr<tessera::Linear> lm_head_;
};
)tpl",
      R"tpl(  // The kit's decoder fields (vocab_size, n_layer, n_head, n_embd, max_seq_len, dropout,
  // init_std, activation checkpointing) come from tessera::nn::DecoderFields; these are the
  // family's own. A small model by default.
  std::int64_t n_kv_head = 2;
  std::int64_t intermediate_size = 128;
  double rope_theta = 10000.0;

  @CLASS@Config() {
    n_layer = 2;
    n_embd = 64;
    max_seq_len = 64;
  }
  std::int64_t head_dim() const { return n_embd / n_head; }
)tpl",
      R"tpl(    using C = @CLASS@Config;
    tessera::nn::declare_decoder_fields(f, {});  // and that the model splits over tp, cp and pp
    f.field("n_kv_head", &C::n_kv_head, "key/value heads (divides n_head)").at_least(1);
    f.field("intermediate_size", &C::intermediate_size, "hidden width of the SwiGLU MLP").at_least(1);
    f.field("rope_theta", &C::rope_theta, "base of the rotary frequencies").greater_than(0);
    f.check([](const C& c) {
      if (c.n_embd % c.n_head != 0 || (c.n_embd / c.n_head) % 2 != 0) {
        throw tessera::ConfigError("n_embd must be n_head times an even head size", "n_embd");
      }
      if (c.n_head % c.n_kv_head != 0) throw tessera::ConfigError("n_kv_head must divide n_head", "n_kv_head");
    });
    // What each mesh axis needs of the sizes: refused by `tessera validate` before anything is built.
    f.check_in_run([](const C& c, const tessera::RunContext& run) {
      tessera::nn::check_tensor_parallel({c.n_head, c.n_kv_head, c.intermediate_size, c.vocab_size}, run.parallel);
      tessera::nn::check_context_parallel(c.n_head, c.dropout, run.parallel);
      tessera::nn::check_pipeline_parallel(c.n_layer, run.parallel);
    });
    f.splits_sequence();
)tpl",
      "  model: {component_key: model, variant_key: @NAME@}\n"};
  t.config_bases = " : tessera::nn::DecoderFields";
  t.factory =
      "[](const @CLASS@Config& config, const tessera::RunContext& run) { return std::make_shared<@CLASS@>(config, run); }";
  // One rank against two Gloo ranks under each mesh (fsdp: two data-parallel ranks, as much as
  // one rank accumulating twice as many micro-batches).
  t.extra_tests = R"tpl(foreach(_mesh "tp2|--set parallelism.tp=2|" "pp2|--set parallelism.pp=2 --set trainer.grad_accum=2|--set trainer.grad_accum=2"
                    "fsdp2|--set parallelism.dp_shard=2 --set components.parallel.component_key=parallel --set components.parallel.variant_key=fsdp|--set trainer.grad_accum=2")
  string(REPLACE "|" ";" _mesh "${_mesh}")
  list(GET _mesh 0 _name)
  list(GET _mesh 1 _sets)
  list(GET _mesh 2 _one)
  add_test(NAME @NAME@_${_name}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/check_mesh.sh ${TESSERA_EXECUTABLE} ${TESSERA_PLUGIN_OUTPUT_DIR}
                   @NAME@_test.yaml ${CMAKE_CURRENT_BINARY_DIR}/mesh-${_name} "${_sets}" "${_one}"
           WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR})
endforeach()
)tpl";
  t.extra_file_name = "check_mesh.sh";
  t.extra_file = R"tpl(#!/bin/sh
# check_mesh.sh TESSERA PLUGINS SPEC OUT "MESH SETS" "ONE-RANK SETS": trains SPEC on one rank and
# on two Gloo ranks with MESH SETS, and fails unless every step's loss agrees within 1e-4.
set -e
tessera=$1 plugins=$2 spec=$3 out=$4 mesh=$5 one=$6
rm -rf "$out"
"$tessera" train "$spec" --plugin-path "$plugins" --run-dir "$out/one" $one
"$tessera" launch --nproc-per-node 2 -- train "$spec" --plugin-path "$plugins" --run-dir "$out/mesh" $mesh
losses() { sed -n 's/.*"loss":\([-0-9.eE+]*\).*/\1/p' "$1/metrics.jsonl"; }
losses "$out/one" >"$out/one.txt"
losses "$out/mesh" >"$out/mesh.txt"
paste "$out/one.txt" "$out/mesh.txt" | awk '
  { n++; d = $1 - $2; if (d < 0) d = -d; if (NF != 2 || d > 1e-4) { print "step " n ": one rank " $1 ", two ranks " $2; bad = 1 } }
  END { if (n == 0) { print "no steps"; exit 1 } if (bad) exit 1; print n " steps agree within 1e-4" }'
)tpl";
  return t;
}

}  // namespace tessera::tooling
