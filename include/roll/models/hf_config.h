#pragma once
// ModelConfig: the architecture hyper-parameters of a decoder-only model, read
// from and written to a Hugging Face `config.json`.
//
// Supported `model_type`s: "qwen2", "llama", "qwen3". When model_type is
// absent it is inferred from `architectures` (Qwen2ForCausalLM, ...).
// Required keys: hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, vocab_size. Every other field has the default noted
// beside it (Hugging Face's default for that model type where one exists).
// `hidden_act` must be "silu"; `rope_scaling` may be null, "default" or
// "llama3" (LLaMA-3.1 style); `use_sliding_window` must not be true.
//
// Keys this struct does not model (initializer_range, use_cache,
// transformers_version, sliding_window, ...) are kept verbatim in `extra`
// and written back by ToJson(), so a config survives a round trip and the
// checkpoints we write load in Hugging Face transformers.
//
// A plain value type; no internal synchronization.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/status.h"

namespace roll {

// LLaMA-3.1's frequency-dependent RoPE rescaling ("rope_type": "llama3").
struct RopeScaling {
  std::string rope_type = "llama3";  // the only kind supported
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;                  // "qwen2" | "llama" | "qwen3"
  std::vector<std::string> architectures;  // default: {"<Type>ForCausalLM"}
  int64_t hidden_size = 0;                 // required
  int64_t intermediate_size = 0;           // required
  int64_t num_hidden_layers = 0;           // required
  int64_t num_attention_heads = 0;         // required
  int64_t num_key_value_heads = 0;         // default: num_attention_heads
  int64_t head_dim = 0;                    // default: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;  // default: none
  int64_t max_position_embeddings = 0;      // default: 32768 (qwen2, qwen3), 2048 (llama)
  int64_t vocab_size = 0;                   // required
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;      // default: none
  std::vector<int64_t> eos_token_ids;       // "eos_token_id": an int or a list; default: none
  std::string torch_dtype;                  // "float32" | "float16" | "bfloat16" | ""; also read from "dtype"
  // qwen2: biases on q/k/v (never on o_proj), default true, and a missing
  // key means true because Hugging Face's Qwen2 always has them.
  // llama / qwen3: biases on q/k/v/o, default false.
  bool attention_bias = false;
  bool mlp_bias = false;                    // llama only; biases on gate/up/down
  std::string hidden_act = "silu";
  // Unmodelled top-level keys -> their JSON text, written back by ToJson().
  std::map<std::string, std::string> extra;

  // Parses config.json text. `source` (a path, usually) prefixes every error,
  // which also names the offending key.
  static absl::StatusOr<ModelConfig> FromJson(std::string_view json,
                                              std::string_view source = "config.json");
  static absl::StatusOr<ModelConfig> FromJsonFile(const std::string& path);

  // Checks the invariants FromJson enforces, for configs built in code.
  // Errors are prefixed with `source`.
  absl::Status Validate(std::string_view source = "ModelConfig") const;

  // An HF-compatible config.json (2-space indented, keys sorted).
  std::string ToJson() const;
  // Validates, then writes ToJson() to `path` atomically.
  absl::Status WriteJsonFile(const std::string& path) const;

  // Derived layout facts the model code needs.
  bool QkvBias() const { return attention_bias; }
  bool OProjBias() const { return attention_bias && model_type != "qwen2"; }
  bool QkNorm() const { return model_type == "qwen3"; }  // per-head RMSNorm on q and k
  int64_t NumKvGroups() const { return num_attention_heads / num_key_value_heads; }
};

// Compute accounting (compute/flops, docs/recipes.md): the weights of
// `config` that a token is multiplied by -- q, k, v and o projections, the
// MLP's gate, up and down, the LM head (tied or not) -- without embeddings
// and norms.
int64_t MatmulParams(const ModelConfig& config);
// FLOPs of one forward pass over a causal sequence of `length` tokens:
// 2 x MatmulParams per token, plus the attention scores and the weighted
// sum of values, 2 x 2 x heads x head_dim per (query, key) pair per layer
// over the length x (length + 1) / 2 causal pairs. Norms, activations and
// the softmax (O(hidden) per token) are left out. A backward pass costs
// twice its forward.
double ForwardFlops(const ModelConfig& config, int64_t length);

}  // namespace roll
