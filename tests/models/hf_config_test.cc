#include "roll/models/hf_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "testing/temp_dir.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

::testing::AssertionResult HasSub(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

// Shaped like the config.json of Qwen2-0.5B.
constexpr char kQwen2Config[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Shaped like the config.json of a LLaMA-3.1-8B instruct model.
constexpr char kLlama3Config[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

// Qwen3 sets head_dim explicitly; heads * head_dim != hidden_size.
constexpr char kQwen3Config[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "use_sliding_window": false,
  "vocab_size": 151936
})";

json Minimal(const std::string& model_type) {
  return {{"model_type", model_type}, {"hidden_size", 64},      {"intermediate_size", 128},
          {"num_hidden_layers", 2},   {"num_attention_heads", 4}, {"vocab_size", 100}};
}

absl::Status ParseError(const json& j) {
  auto c = ModelConfig::FromJson(j.dump(), "/models/m/config.json");
  EXPECT_FALSE(c.ok()) << "accepted " << j.dump();
  return c.ok() ? absl::OkStatus() : c.status();
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.architectures, b.architectures);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  ASSERT_EQ(a.rope_scaling.has_value(), b.rope_scaling.has_value());
  if (a.rope_scaling) {
    EXPECT_EQ(a.rope_scaling->rope_type, b.rope_scaling->rope_type);
    EXPECT_EQ(a.rope_scaling->factor, b.rope_scaling->factor);
    EXPECT_EQ(a.rope_scaling->low_freq_factor, b.rope_scaling->low_freq_factor);
    EXPECT_EQ(a.rope_scaling->high_freq_factor, b.rope_scaling->high_freq_factor);
    EXPECT_EQ(a.rope_scaling->original_max_position_embeddings,
              b.rope_scaling->original_max_position_embeddings);
  }
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.extra, b.extra);
}

TEST(HfConfigTest, ParsesQwen2Config) {
  auto c = ModelConfig::FromJson(kQwen2Config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_EQ(c->architectures, std::vector<std::string>{"Qwen2ForCausalLM"});
  EXPECT_EQ(c->hidden_size, 896);
  EXPECT_EQ(c->intermediate_size, 4864);
  EXPECT_EQ(c->num_hidden_layers, 24);
  EXPECT_EQ(c->num_attention_heads, 14);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->NumKvGroups(), 7);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_FALSE(c->rope_scaling.has_value());
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{151643});
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  // Qwen2 has q/k/v biases although its config.json never says so.
  EXPECT_TRUE(c->attention_bias);
  EXPECT_TRUE(c->QkvBias());
  EXPECT_FALSE(c->OProjBias());
  EXPECT_FALSE(c->QkNorm());
  EXPECT_EQ(c->extra.at("sliding_window"), "32768");
  EXPECT_EQ(c->extra.at("transformers_version"), "\"4.40.1\"");
  EXPECT_EQ(c->extra.count("hidden_size"), 0u);
}

TEST(HfConfigTest, ParsesLlama3Config) {
  auto c = ModelConfig::FromJson(kLlama3Config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->NumKvGroups(), 4);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->rope_type, "llama3");
  EXPECT_DOUBLE_EQ(c->rope_scaling->factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling->low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->OProjBias());
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_EQ(c->extra.at("pretraining_tp"), "1");
}

TEST(HfConfigTest, ParsesQwen3ConfigWithExplicitHeadDim) {
  auto c = ModelConfig::FromJson(kQwen3Config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_attention_heads * c->head_dim, 2048);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);  // an integer literal is fine for a float key
  EXPECT_FALSE(c->rope_scaling.has_value());
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->QkNorm());
  EXPECT_EQ(c->extra.at("sliding_window"), "null");
}

TEST(HfConfigTest, DefaultsForLlama) {
  auto c = ModelConfig::FromJson(Minimal("llama").dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architectures, std::vector<std::string>{"LlamaForCausalLM"});
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->torch_dtype, "");
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->hidden_act, "silu");
  EXPECT_TRUE(c->extra.empty());
}

TEST(HfConfigTest, DefaultsForQwen2) {
  auto c = ModelConfig::FromJson(Minimal("qwen2").dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_EQ(c->architectures, std::vector<std::string>{"Qwen2ForCausalLM"});
}

TEST(HfConfigTest, NullMeansDefault) {
  json j = Minimal("llama");
  j["num_key_value_heads"] = nullptr;
  j["bos_token_id"] = nullptr;
  j["eos_token_id"] = nullptr;
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_FALSE(c->bos_token_id.has_value());
}

TEST(HfConfigTest, InfersModelTypeFromArchitectures) {
  json j = Minimal("qwen2");
  j.erase("model_type");
  j["architectures"] = {"Qwen2ForCausalLM"};
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen2");

  j["architectures"] = {"MistralForCausalLM"};
  absl::Status s = ParseError(j);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'model_type'"));
}

TEST(HfConfigTest, ReadsNewStyleDtypeKey) {
  json j = Minimal("qwen3");
  j["dtype"] = "float16";
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->torch_dtype, "float16");
}

TEST(HfConfigTest, MissingRequiredKeysAreNamed) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size"}) {
    json j = Minimal("llama");
    j.erase(key);
    absl::Status s = ParseError(j);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(HasSub(std::string(s.message()), "/models/m/config.json"));
    EXPECT_TRUE(HasSub(std::string(s.message()), std::string("'") + key + "'"));
    EXPECT_TRUE(HasSub(std::string(s.message()), "missing"));
  }
}

TEST(HfConfigTest, WrongTypesAreNamed) {
  const std::vector<std::pair<std::string, json>> cases = {
      {"hidden_size", "896"},       {"hidden_size", 896.5},       {"num_hidden_layers", -2},
      {"num_attention_heads", 0},   {"rms_norm_eps", "1e-6"},     {"rope_theta", -1.0},
      {"tie_word_embeddings", 1},   {"eos_token_id", "</s>"},     {"eos_token_id", {1, "x"}},
      {"bos_token_id", -1},         {"architectures", "Llama"},   {"torch_dtype", 16},
      {"attention_bias", "false"},  {"rope_scaling", "llama3"},   {"max_position_embeddings", 1.0}};
  for (const auto& [key, value] : cases) {
    json j = Minimal("llama");
    j[key] = value;
    absl::Status s = ParseError(j);
    EXPECT_TRUE(HasSub(std::string(s.message()), "/models/m/config.json"));
    EXPECT_TRUE(HasSub(std::string(s.message()), "'" + key + "'")) << value.dump();
  }
}

TEST(HfConfigTest, HeadsMustDivideHiddenSizeWithoutHeadDim) {
  json j = Minimal("llama");
  j["num_attention_heads"] = 5;
  j["num_key_value_heads"] = 5;
  absl::Status s = ParseError(j);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'num_attention_heads'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "do not divide hidden_size 64"));
  j["head_dim"] = 16;  // explicit head_dim lifts the constraint
  EXPECT_TRUE(ModelConfig::FromJson(j.dump()).ok());
}

TEST(HfConfigTest, KvHeadsMustDivideHeads) {
  json j = Minimal("qwen2");
  j["num_key_value_heads"] = 3;
  absl::Status s = ParseError(j);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'num_key_value_heads'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "do not divide 4 attention heads"));
}

TEST(HfConfigTest, RejectsUnsupportedModelTypeActivationAndFeatures) {
  json j = Minimal("mistral");
  absl::Status s = ParseError(j);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'model_type'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "mistral"));

  j = Minimal("llama");
  j["hidden_act"] = "gelu";
  s = ParseError(j);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'hidden_act'"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "gelu"));

  j = Minimal("llama");
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  s = ParseError(j);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'rope_scaling.rope_type'"));

  j = Minimal("qwen2");
  j["use_sliding_window"] = true;
  s = ParseError(j);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'use_sliding_window'"));

  j = Minimal("llama");
  j["torch_dtype"] = "int4";
  s = ParseError(j);
  EXPECT_TRUE(HasSub(std::string(s.message()), "'torch_dtype'"));
}

TEST(HfConfigTest, AcceptsDefaultRopeScalingAsNone) {
  json j = Minimal("llama");
  j["rope_scaling"] = {{"type", "default"}};
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->rope_scaling.has_value());
}

// Transformers 5 writes the rotary settings as one object; before this was
// read, such a Llama-3 config silently got rope_theta 10000 and no scaling.
TEST(HfConfigTest, ReadsTransformers5RopeParameters) {
  json j = Minimal("llama");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64},
                          {"rope_theta", 500000.0}};
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->rope_type, "llama3");
  EXPECT_DOUBLE_EQ(c->rope_scaling->factor, 8.0);
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 64);
  EXPECT_EQ(c->extra.count("rope_parameters"), 0u);

  json q = Minimal("qwen2");
  q["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  auto d = ModelConfig::FromJson(q.dump());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_DOUBLE_EQ(d->rope_theta, 1000000.0);
  EXPECT_FALSE(d->rope_scaling.has_value());

  q["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  auto e = ModelConfig::FromJson(q.dump(), "cfg.json");
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(HasSub(std::string(e.status().message()), "rope_parameters.rope_type"));
}

TEST(HfConfigTest, RejectsInvalidJsonAndNonObjects) {
  auto c = ModelConfig::FromJson("{\"hidden_size\": ", "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(HasSub(std::string(c.status().message()), "cfg.json"));
  EXPECT_TRUE(HasSub(std::string(c.status().message()), "invalid JSON"));
  c = ModelConfig::FromJson("[1]", "cfg.json");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(HasSub(std::string(c.status().message()), "not a JSON object"));
}

TEST(HfConfigTest, ToJsonRoundTrips) {
  for (const char* text : {kQwen2Config, kLlama3Config, kQwen3Config}) {
    auto a = ModelConfig::FromJson(text);
    ASSERT_TRUE(a.ok()) << a.status();
    auto b = ModelConfig::FromJson(a->ToJson());
    ASSERT_TRUE(b.ok()) << b.status() << "\n" << a->ToJson();
    ExpectSameConfig(*a, *b);
  }
}

TEST(HfConfigTest, ToJsonWritesWhatHuggingFaceReads) {
  json original = json::parse(kLlama3Config);
  json out = json::parse(ModelConfig::FromJson(kLlama3Config).value().ToJson());
  // Every key of the original survives with its value (HF spelling and form).
  for (const auto& [key, value] : original.items()) {
    ASSERT_TRUE(out.contains(key)) << key;
    EXPECT_EQ(out[key], value) << key;
  }
  EXPECT_EQ(out["head_dim"], 128);

  json qwen = json::parse(ModelConfig::FromJson(kQwen2Config).value().ToJson());
  EXPECT_EQ(qwen["eos_token_id"], 151643);  // a single id stays an int
  EXPECT_EQ(qwen["rope_scaling"], nullptr);
  EXPECT_EQ(qwen["use_sliding_window"], false);
  EXPECT_EQ(qwen["rms_norm_eps"].get<double>(), 1e-6);
}

TEST(HfConfigTest, ValidateCatchesProgrammaticMistakes) {
  ModelConfig c = ModelConfig::FromJson(Minimal("llama").dump()).value();
  EXPECT_TRUE(c.Validate().ok());
  c.num_key_value_heads = 3;
  absl::Status s = c.Validate("my_config");
  EXPECT_TRUE(HasSub(std::string(s.message()), "my_config"));
  EXPECT_TRUE(HasSub(std::string(s.message()), "'num_key_value_heads'"));
  c.num_key_value_heads = 4;
  c.extra["hidden_size"] = "12";
  EXPECT_TRUE(HasSub(std::string(c.Validate().message()), "'hidden_size'"));
  c.extra.clear();
  c.extra["note"] = "not json";
  EXPECT_TRUE(HasSub(std::string(c.Validate().message()), "'note'"));
}

class HfConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("hf-config");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(HfConfigFileTest, WriteThenReadFile) {
  ModelConfig c = ModelConfig::FromJson(kQwen2Config).value();
  const std::string path = dir_ + "/config.json";
  ASSERT_TRUE(c.WriteJsonFile(path).ok());
  auto back = ModelConfig::FromJsonFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameConfig(c, *back);
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename(), "config.json");  // no temporary left
  }
}

TEST_F(HfConfigFileTest, InvalidConfigIsNotWritten) {
  ModelConfig c = ModelConfig::FromJson(kQwen2Config).value();
  c.hidden_act = "relu";
  const std::string path = dir_ + "/config.json";
  absl::Status s = c.WriteJsonFile(path);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(HasSub(std::string(s.message()), "'hidden_act'"));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(HfConfigFileTest, FileErrorsNameThePath) {
  auto missing = ModelConfig::FromJsonFile(dir_ + "/absent.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(HasSub(std::string(missing.status().message()), "absent.json"));

  json j = Minimal("llama");
  j["vocab_size"] = "many";
  const std::string path = dir_ + "/config.json";
  std::ofstream(path) << j.dump();
  auto bad = ModelConfig::FromJsonFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(HasSub(std::string(bad.status().message()), path));
  EXPECT_TRUE(HasSub(std::string(bad.status().message()), "'vocab_size'"));
}

}  // namespace
}  // namespace roll
