// Hugging Face folders (tessera/formats/hugging_face.hpp) on real files: config.json's typed, dotted
// access; writing one file or indexed shards as transformers lays them out; reading them back
// memory-mapped; and every inconsistency between an index and its shards named.
#include "tessera/formats/hugging_face.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "tessera/error.hpp"
#include "tessera/formats/safetensors.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;

namespace tessera {
namespace hugging_face_test {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

HfExport three_tensors() {
  HfExport out;
  out.config_json = R"({"model_type": "llama", "architectures": ["LlamaForCausalLM"]})";
  out.tensors["a.weight"] = at::arange(1000, at::kFloat).view({10, 100});  // 4000 bytes
  out.tensors["b.weight"] = at::ones({500}, at::kFloat);                    // 2000 bytes
  out.tensors["c.weight"] = at::full({3, 4}, 7, at::kBFloat16);             // 24 bytes
  return out;
}

TEST(HfConfig, ReadsTypedAndDottedKeys) {
  const HfConfig c = HfConfig::parse(
      R"({"hidden_size": 64, "rms_norm_eps": 1e-5, "model_type": "llama", "tie_word_embeddings": true,
          "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "head_dim": null})",
      "config.json");
  EXPECT_EQ(c.integer("hidden_size"), 64);
  EXPECT_EQ(c.number("hidden_size"), 64.0);  // integers read as numbers too
  EXPECT_EQ(c.number("rms_norm_eps"), 1e-5);
  EXPECT_EQ(c.string("model_type"), "llama");
  EXPECT_EQ(c.boolean("tie_word_embeddings"), true);
  EXPECT_EQ(c.number("rope_parameters.rope_theta"), 500000.0);
  EXPECT_FALSE(c.integer("head_dim").has_value()) << "null reads as absent";
  EXPECT_FALSE(c.integer("num_key_value_heads").has_value());
  EXPECT_FALSE(c.has("rope_parameters.factor"));
  EXPECT_NE(error_of([&] { c.integer("model_type"); }).find("config.json: model_type should be an integer"),
            std::string::npos);
  EXPECT_NE(error_of([] { HfConfig::parse("[1, 2]", "x/config.json"); }).find("x/config.json"), std::string::npos);
}

// Generation's stop ids: generation_config.json's eos_token_id (an id or a list) before
// config.json's; none when neither names one; another type is an error naming the file.
TEST(HfEosTokenIds, GenerationConfigFirstThenConfigAListAllowed) {
  testing::TempDir dir;
  EXPECT_TRUE(hf_eos_token_ids(dir.path().string()).empty()) << "no file";
  dir.write("config.json", R"({"model_type": "llama", "eos_token_id": 2})");
  EXPECT_EQ(hf_eos_token_ids(dir.path().string()), std::vector<std::int64_t>({2}));
  dir.write("generation_config.json", R"({"eos_token_id": [128001, 128008, 128009]})");
  EXPECT_EQ(hf_eos_token_ids(dir.path().string()), std::vector<std::int64_t>({128001, 128008, 128009}));
  dir.write("generation_config.json", R"({"eos_token_id": null, "do_sample": true})");
  EXPECT_EQ(hf_eos_token_ids(dir.path().string()), std::vector<std::int64_t>({2})) << "null: config.json's";
  dir.write("generation_config.json", R"({"eos_token_id": "</s>"})");
  try {
    hf_eos_token_ids(dir.path().string());
    FAIL() << "a string was taken for an id";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("generation_config.json: eos_token_id must be a token id"), std::string::npos)
        << e.what();
  }
}

TEST(HfCheckpoint, OneFileBelowTheShardSize) {
  testing::TempDir dir;
  write_hf_checkpoint(dir.path().string(), three_tensors(), 1'000'000);
  EXPECT_TRUE(fs::exists(dir.file("model.safetensors")));
  EXPECT_FALSE(fs::exists(dir.file("model.safetensors.index.json")));
  EXPECT_TRUE(is_hf_checkpoint(dir.path().string()));
  const HfCheckpoint ck = read_hf_checkpoint(dir.path().string());
  EXPECT_EQ(ck.config.string("model_type"), "llama");
  ASSERT_EQ(ck.tensors.size(), 3u);
  EXPECT_TRUE(ck.tensors.at("a.weight").equal(three_tensors().tensors.at("a.weight")));
  EXPECT_EQ(ck.tensors.at("c.weight").scalar_type(), at::kBFloat16);
  // transformers refuses safetensors files without format metadata.
  EXPECT_EQ(read_safetensors(dir.file("model.safetensors")).metadata.at("format"), "pt");
}

TEST(HfCheckpoint, ShardsGreedilyInNameOrderWithAnIndex) {
  testing::TempDir dir;
  HfExport model = three_tensors();
  model.files_to_copy.push_back(dir.write("tokenizer.json", R"({"version": "1.0"})"));
  const std::string out = dir.file("out");
  fs::create_directories(out);
  write_hf_checkpoint(out, model, 5000);
  // a (4000) fills shard 1; b (2000) would pass 5000: shard 2 with c.
  const auto index = nlohmann::json::parse(std::ifstream(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 6024);
  EXPECT_EQ(index["weight_map"]["a.weight"], "model-00001-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["b.weight"], "model-00002-of-00002.safetensors");
  EXPECT_EQ(index["weight_map"]["c.weight"], "model-00002-of-00002.safetensors");
  EXPECT_FALSE(fs::exists(out + "/model.safetensors"));
  const HfCheckpoint ck = read_hf_checkpoint(out);
  EXPECT_EQ(ck.tensors.size(), 3u);
  EXPECT_EQ(fs::path(ck.tensor_file.at("b.weight")).filename(), "model-00002-of-00002.safetensors");
  ASSERT_EQ(ck.tokenizer_files.size(), 1u);
  EXPECT_EQ(fs::path(ck.tokenizer_files[0]).filename(), "tokenizer.json");
}

// transformers 5 keeps a chat model's template in chat_template.jinja alone (earlier versions in
// chat_template.json): it travels with the tokenizer, or an exported Instruct model loses it.
TEST(HfCheckpoint, TheChatTemplateTravelsWithTheTokenizerFiles) {
  testing::TempDir dir;
  write_hf_checkpoint(dir.path().string(), three_tensors(), 1'000'000);
  dir.write("tokenizer.json", R"({"version": "1.0"})");
  dir.write("chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
  dir.write("chat_template.json", R"({"chat_template": "x"})");
  std::set<std::string> names;
  for (const auto& file : read_hf_checkpoint(dir.path().string()).tokenizer_files) names.insert(fs::path(file).filename());
  EXPECT_EQ(names, (std::set<std::string>{"tokenizer.json", "chat_template.jinja", "chat_template.json"}));
}

TEST(HfCheckpoint, TensorsReadBackAreWritableWithoutChangingTheFile) {
  testing::TempDir dir;
  write_hf_checkpoint(dir.path().string(), three_tensors(), 1'000'000);
  HfCheckpoint ck = read_hf_checkpoint(dir.path().string());
  ck.tensors.at("b.weight").mul_(3);  // a private mapping: copy-on-write
  EXPECT_TRUE(read_hf_checkpoint(dir.path().string()).tensors.at("b.weight").eq(1).all().item<bool>());
}

TEST(HfCheckpoint, InconsistentFoldersAreNamed) {
  testing::TempDir dir;
  const std::string folder = dir.path().string();
  write_hf_checkpoint(folder, three_tensors(), 5000);
  const std::string index_path = dir.file("model.safetensors.index.json");
  auto index = nlohmann::json::parse(std::ifstream(index_path));
  auto rewrite = [&](const nlohmann::json& j) { std::ofstream(index_path, std::ios::trunc) << j.dump(); };

  // A tensor the index puts in a shard that lacks it.
  auto moved = index;
  moved["weight_map"]["a.weight"] = "model-00002-of-00002.safetensors";
  rewrite(moved);
  EXPECT_NE(error_of([&] { read_hf_checkpoint(folder); }).find("puts tensor a.weight in"), std::string::npos);
  // A shard holding a tensor the index puts elsewhere.
  auto elsewhere = index;
  elsewhere["weight_map"]["c.weight"] = "model-00001-of-00002.safetensors";
  rewrite(elsewhere);
  EXPECT_NE(error_of([&] { read_hf_checkpoint(folder); }).find("c.weight"), std::string::npos);
  // A shard the index names that is not there.
  auto missing = index;
  missing["weight_map"]["d.weight"] = "model-00003-of-00003.safetensors";
  rewrite(missing);
  EXPECT_NE(error_of([&] { read_hf_checkpoint(folder); }).find("lists shard model-00003-of-00003.safetensors"),
            std::string::npos);
  // An index naming a path outside the folder.
  auto escaping = index;
  escaping["weight_map"]["a.weight"] = "../model-00001-of-00002.safetensors";
  rewrite(escaping);
  EXPECT_NE(error_of([&] { read_hf_checkpoint(folder); }).find("not a file in the folder"), std::string::npos);
  rewrite(index);
  EXPECT_NO_THROW(read_hf_checkpoint(folder));
  // No weights at all.
  testing::TempDir empty;
  empty.write("config.json", R"({"model_type": "gpt2"})");
  EXPECT_NE(error_of([&] { read_hf_checkpoint(empty.path().string()); }).find("the weights are missing"),
            std::string::npos);
  EXPECT_FALSE(is_hf_checkpoint(empty.file("nothing-here")));
}

TEST(ByteSize, ParsesHuggingFacesSizes) {
  EXPECT_EQ(parse_byte_size("5GB"), 5'000'000'000ULL);
  EXPECT_EQ(parse_byte_size("500MB"), 500'000'000ULL);
  EXPECT_EQ(parse_byte_size("2GiB"), 2ULL * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_byte_size("40kb"), 40'000ULL);
  EXPECT_EQ(parse_byte_size("123"), 123ULL);
  EXPECT_EQ(parse_byte_size("1.5GB"), 1'500'000'000ULL);
  for (const std::string bad : {"", "GB", "-1GB", "5 XB", "0", "1e3"}) {
    EXPECT_THROW(parse_byte_size(bad), Error) << bad;
  }
}

}  // namespace hugging_face_test
}  // namespace tessera
