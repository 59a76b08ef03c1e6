#pragma once
// The small decoder the model-update tests move between ranks: 2 layers,
// hidden 32, 4 heads (`kv_heads` key-value heads, so 4 allows a split in 4).

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "roll/models/hf_config.h"
#include "roll/models/transformer.h"

namespace roll::testing {

inline std::unique_ptr<CausalLM> SyncTestModel(uint64_t seed, c10::ScalarType dtype, int kv_heads, int vocab) {
  auto c = ModelConfig::FromJson(absl::StrFormat(
      R"({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": %d, "vocab_size": %d, "max_position_embeddings": 64})",
      kv_heads, vocab));
  EXPECT_TRUE(c.ok()) << c.status();
  ModelOptions mo;
  mo.dtype = dtype;
  auto m = CausalLM::Random(*c, seed, mo);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

}  // namespace roll::testing
