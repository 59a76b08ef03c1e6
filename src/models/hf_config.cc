#include "roll/models/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"

namespace roll {
namespace {

using json = nlohmann::json;

struct TypeDefaults {
  const char* model_type;
  const char* architecture;
  int64_t max_position_embeddings;
  bool attention_bias;
};

constexpr TypeDefaults kTypes[] = {
    {"qwen2", "Qwen2ForCausalLM", 32768, true},
    {"llama", "LlamaForCausalLM", 2048, false},
    {"qwen3", "Qwen3ForCausalLM", 32768, false},
};

const TypeDefaults* FindType(std::string_view model_type) {
  for (const TypeDefaults& t : kTypes) {
    if (model_type == t.model_type) return &t;
  }
  return nullptr;
}

std::string SupportedTypes() { return "qwen2, llama, qwen3"; }

// Keys ModelConfig models; everything else goes to `extra`.
const std::set<std::string>& ModelledKeys() {
  static const auto* keys = new std::set<std::string>{
      "model_type",        "architectures",        "hidden_size",
      "intermediate_size", "num_hidden_layers",    "num_attention_heads",
      "num_key_value_heads", "head_dim",           "rms_norm_eps",
      "rope_theta",        "rope_scaling",         "rope_parameters",
      "max_position_embeddings",
      "vocab_size",        "tie_word_embeddings",  "bos_token_id",
      "eos_token_id",      "torch_dtype",          "dtype",
      "attention_bias",    "mlp_bias",             "hidden_act"};
  return *keys;
}

// Reads keys of one JSON object, producing errors that name the source and
// the key.
class Reader {
 public:
  Reader(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  absl::Status Error(std::string_view key, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": key '", prefix_, Sv(key), "': ", Sv(what)));
  }
  absl::Status TypeError(std::string_view key, std::string_view expected, const json& got) const {
    return Error(key, absl::StrCat("expected ", Sv(expected), ", got ", got.dump()));
  }

  // Present and not null.
  const json* Get(std::string_view key) const {
    auto it = obj_.find(std::string(key));
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<int64_t> RequiredPositiveInt(std::string_view key) const {
    const json* v = Get(key);
    if (v == nullptr) return Error(key, "required key is missing");
    return PositiveInt(key, *v);
  }
  absl::Status OptionalPositiveInt(std::string_view key, int64_t* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    ROLL_ASSIGN_OR_RETURN(*out, PositiveInt(key, *v));
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> PositiveInt(std::string_view key, const json& v) const {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX) ||
        v.get<int64_t>() <= 0) {
      return TypeError(key, "a positive integer", v);
    }
    return v.get<int64_t>();
  }
  absl::Status OptionalPositiveDouble(std::string_view key, double* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>())) {
      return TypeError(key, "a positive number", *v);
    }
    *out = v->get<double>();
    return absl::OkStatus();
  }
  absl::Status OptionalBool(std::string_view key, bool* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return TypeError(key, "true or false", *v);
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status OptionalString(std::string_view key, std::string* out) const {
    const json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return TypeError(key, "a string", *v);
    *out = v->get<std::string>();
    return absl::OkStatus();
  }
  absl::StatusOr<int64_t> TokenId(std::string_view key, const json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return TypeError(key, "a non-negative integer token id", v);
    }
    return v.get<int64_t>();
  }

 private:
  const json& obj_;
  std::string source_;
  std::string prefix_;
};

// `key` is "rope_scaling", or "rope_parameters" (Transformers 5's one
// object for the rotary settings: rope_theta beside the scaling's keys).
absl::StatusOr<std::optional<RopeScaling>> ParseRopeScaling(const Reader& top, const json& v,
                                                            const std::string& source,
                                                            const std::string& key) {
  if (!v.is_object()) return top.TypeError(key, "an object or null", v);
  Reader r(v, source, key + ".");
  std::string type;
  ROLL_RETURN_IF_ERROR(r.OptionalString("rope_type", &type));
  // Older configs spell the key "type".
  if (type.empty()) ROLL_RETURN_IF_ERROR(r.OptionalString("type", &type));
  if (type.empty() || type == "default") return std::optional<RopeScaling>();
  if (type != "llama3") {
    return r.Error("rope_type",
                   absl::StrCat("unsupported rope scaling '", type, "' (supported: llama3)"));
  }
  RopeScaling s;
  if (r.Get("factor") == nullptr) return r.Error("factor", "required key is missing");
  ROLL_RETURN_IF_ERROR(r.OptionalPositiveDouble("factor", &s.factor));
  ROLL_RETURN_IF_ERROR(r.OptionalPositiveDouble("low_freq_factor", &s.low_freq_factor));
  ROLL_RETURN_IF_ERROR(r.OptionalPositiveDouble("high_freq_factor", &s.high_freq_factor));
  ROLL_RETURN_IF_ERROR(
      r.OptionalPositiveInt("original_max_position_embeddings", &s.original_max_position_embeddings));
  return std::optional<RopeScaling>(s);
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view text, std::string_view source_sv) {
  const std::string source(source_sv);
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid JSON: ", e.what()));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": config is not a JSON object"));
  }
  Reader r(j, source);
  ModelConfig c;

  if (const json* a = r.Get("architectures")) {
    if (!a->is_array()) return r.TypeError("architectures", "a list of strings", *a);
    for (const json& s : *a) {
      if (!s.is_string()) return r.TypeError("architectures", "a list of strings", *a);
      c.architectures.push_back(s.get<std::string>());
    }
  }
  ROLL_RETURN_IF_ERROR(r.OptionalString("model_type", &c.model_type));
  if (c.model_type.empty()) {
    for (const std::string& arch : c.architectures) {
      for (const TypeDefaults& t : kTypes) {
        if (arch == t.architecture) c.model_type = t.model_type;
      }
      if (!c.model_type.empty()) break;
    }
    if (c.model_type.empty()) {
      return r.Error("model_type", absl::StrCat("missing, and architectures name no supported "
                                                "model (supported model types: ",
                                                SupportedTypes(), ")"));
    }
  }
  const TypeDefaults* type = FindType(c.model_type);
  if (type == nullptr) {
    return r.Error("model_type", absl::StrCat("unsupported model type '", c.model_type,
                                              "' (supported: ", SupportedTypes(), ")"));
  }
  if (c.architectures.empty()) c.architectures.push_back(type->architecture);

  ROLL_ASSIGN_OR_RETURN(c.hidden_size, r.RequiredPositiveInt("hidden_size"));
  ROLL_ASSIGN_OR_RETURN(c.intermediate_size, r.RequiredPositiveInt("intermediate_size"));
  ROLL_ASSIGN_OR_RETURN(c.num_hidden_layers, r.RequiredPositiveInt("num_hidden_layers"));
  ROLL_ASSIGN_OR_RETURN(c.num_attention_heads, r.RequiredPositiveInt("num_attention_heads"));
  ROLL_ASSIGN_OR_RETURN(c.vocab_size, r.RequiredPositiveInt("vocab_size"));

  c.num_key_value_heads = c.num_attention_heads;
  ROLL_RETURN_IF_ERROR(r.OptionalPositiveInt("num_key_value_heads", &c.num_key_value_heads));
  if (r.Get("head_dim") != nullptr) {
    ROLL_RETURN_IF_ERROR(r.OptionalPositiveInt("head_dim", &c.head_dim));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return r.Error("num_attention_heads",
                     absl::StrCat(c.num_attention_heads, " heads do not divide hidden_size ",
                                  c.hidden_size, " (and no head_dim is given)"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  ROLL_RETURN_IF_ERROR(r.OptionalPositiveDouble("rms_norm_eps", &c.rms_norm_eps));
  ROLL_RETURN_IF_ERROR(r.OptionalPositiveDouble("rope_theta", &c.rope_theta));
  if (const json* rs = r.Get("rope_scaling")) {
    ROLL_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(r, *rs, source, "rope_scaling"));
  }
  // Transformers 5 writes rope_parameters instead of the two keys above; when
  // both are there, it reads rope_parameters, and so does this.
  if (const json* rp = r.Get("rope_parameters")) {
    ROLL_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(r, *rp, source, "rope_parameters"));
    Reader p(*rp, source, "rope_parameters.");
    ROLL_RETURN_IF_ERROR(p.OptionalPositiveDouble("rope_theta", &c.rope_theta));
  }
  c.max_position_embeddings = type->max_position_embeddings;
  ROLL_RETURN_IF_ERROR(r.OptionalPositiveInt("max_position_embeddings", &c.max_position_embeddings));
  ROLL_RETURN_IF_ERROR(r.OptionalBool("tie_word_embeddings", &c.tie_word_embeddings));

  if (const json* b = r.Get("bos_token_id")) {
    ROLL_ASSIGN_OR_RETURN(c.bos_token_id, r.TokenId("bos_token_id", *b));
  }
  if (const json* e = r.Get("eos_token_id")) {
    if (e->is_array()) {
      for (const json& id : *e) {
        ROLL_ASSIGN_OR_RETURN(int64_t v, r.TokenId("eos_token_id", id));
        c.eos_token_ids.push_back(v);
      }
    } else {
      ROLL_ASSIGN_OR_RETURN(int64_t v, r.TokenId("eos_token_id", *e));
      c.eos_token_ids.push_back(v);
    }
  }

  ROLL_RETURN_IF_ERROR(r.OptionalString("torch_dtype", &c.torch_dtype));
  // Recent transformers write "dtype" instead.
  if (c.torch_dtype.empty()) ROLL_RETURN_IF_ERROR(r.OptionalString("dtype", &c.torch_dtype));

  c.attention_bias = type->attention_bias;
  ROLL_RETURN_IF_ERROR(r.OptionalBool("attention_bias", &c.attention_bias));
  ROLL_RETURN_IF_ERROR(r.OptionalBool("mlp_bias", &c.mlp_bias));
  ROLL_RETURN_IF_ERROR(r.OptionalString("hidden_act", &c.hidden_act));

  bool sliding = false;
  ROLL_RETURN_IF_ERROR(r.OptionalBool("use_sliding_window", &sliding));
  if (sliding) {
    return r.Error("use_sliding_window", "sliding-window attention is not supported");
  }

  for (const auto& [key, value] : j.items()) {
    if (ModelledKeys().count(key) == 0) c.extra[key] = value.dump();
  }
  ROLL_RETURN_IF_ERROR(c.Validate(source));
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open model config"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat(path, ": read failed"));
  return FromJson(ss.str(), path);
}

absl::Status ModelConfig::Validate(std::string_view source_sv) const {
  const std::string source(source_sv);
  auto err = [&](std::string_view key, std::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key '", Sv(key), "': ", Sv(what)));
  };
  if (FindType(model_type) == nullptr) {
    return err("model_type", absl::StrCat("unsupported model type '", model_type,
                                          "' (supported: ", SupportedTypes(), ")"));
  }
  const std::pair<const char*, int64_t> positive[] = {
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
      {"vocab_size", vocab_size},
  };
  for (const auto& [key, value] : positive) {
    if (value <= 0) return err(key, absl::StrCat("must be a positive integer, got ", value));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return err("num_key_value_heads",
               absl::StrCat(num_key_value_heads, " key/value heads do not divide ",
                            num_attention_heads, " attention heads"));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return err("rms_norm_eps", "must be a positive number");
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return err("rope_theta", "must be a positive number");
  }
  if (rope_scaling.has_value()) {
    const RopeScaling& s = *rope_scaling;
    if (s.rope_type != "llama3") {
      return err("rope_scaling.rope_type",
                 absl::StrCat("unsupported rope scaling '", s.rope_type, "' (supported: llama3)"));
    }
    if (!(s.factor > 0) || !(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor) ||
        s.original_max_position_embeddings <= 0) {
      return err("rope_scaling",
                 "llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                 "original_max_position_embeddings > 0");
    }
  }
  if (hidden_act != "silu") {
    return err("hidden_act",
               absl::StrCat("unsupported activation '", hidden_act, "' (only silu is supported)"));
  }
  static const std::set<std::string> kDtypes = {"", "float32", "float16", "bfloat16", "float64"};
  if (kDtypes.count(torch_dtype) == 0) {
    return err("torch_dtype", absl::StrCat("unsupported dtype '", torch_dtype,
                                           "' (float32, float16, bfloat16 or float64)"));
  }
  if (bos_token_id.has_value() && *bos_token_id < 0) {
    return err("bos_token_id", "must be non-negative");
  }
  for (int64_t id : eos_token_ids) {
    if (id < 0) return err("eos_token_id", "must be non-negative");
  }
  if (mlp_bias && model_type != "llama") {
    return err("mlp_bias", absl::StrCat("is only supported for llama, not ", model_type));
  }
  for (const auto& [key, text] : extra) {
    if (ModelledKeys().count(key) != 0) {
      return err(key, "is a modelled key and must not appear in `extra`");
    }
    if (!json::accept(text)) return err(key, "extra value is not valid JSON text");
  }
  return absl::OkStatus();
}

std::string ModelConfig::ToJson() const {
  json j = json::object();
  for (const auto& [key, text] : extra) {
    j[key] = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j[key].is_discarded()) j[key] = text;
  }
  j["model_type"] = model_type;
  j["architectures"] = architectures;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (rope_scaling.has_value()) {
    j["rope_scaling"] = {
        {"rope_type", rope_scaling->rope_type},
        {"factor", rope_scaling->factor},
        {"low_freq_factor", rope_scaling->low_freq_factor},
        {"high_freq_factor", rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", rope_scaling->original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["max_position_embeddings"] = max_position_embeddings;
  j["vocab_size"] = vocab_size;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (bos_token_id.has_value()) j["bos_token_id"] = *bos_token_id;
  if (eos_token_ids.size() == 1) {
    j["eos_token_id"] = eos_token_ids[0];
  } else if (!eos_token_ids.empty()) {
    j["eos_token_id"] = eos_token_ids;
  }
  if (!torch_dtype.empty()) j["torch_dtype"] = torch_dtype;
  j["attention_bias"] = attention_bias;
  if (model_type == "llama") j["mlp_bias"] = mlp_bias;
  j["hidden_act"] = hidden_act;
  return j.dump(2) + "\n";
}

absl::Status ModelConfig::WriteJsonFile(const std::string& path) const {
  ROLL_RETURN_IF_ERROR(Validate(path));
  return common_internal::WriteFileAtomically(path, ToJson());
}

int64_t MatmulParams(const ModelConfig& c) {
  const int64_t hd = c.head_dim > 0 ? c.head_dim : c.hidden_size / std::max<int64_t>(c.num_attention_heads, 1);
  const int64_t kv = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  const int64_t h = c.hidden_size;
  const int64_t attention = h * c.num_attention_heads * hd + 2 * h * kv * hd + c.num_attention_heads * hd * h;
  const int64_t mlp = 3 * h * c.intermediate_size;
  return c.num_hidden_layers * (attention + mlp) + h * c.vocab_size;
}

double ForwardFlops(const ModelConfig& c, int64_t length) {
  const int64_t hd = c.head_dim > 0 ? c.head_dim : c.hidden_size / std::max<int64_t>(c.num_attention_heads, 1);
  const double L = static_cast<double>(length);
  const double pairs = L * (L + 1) / 2;
  return 2.0 * static_cast<double>(MatmulParams(c)) * L +
         4.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads * hd) * pairs;
}

}  // namespace roll
