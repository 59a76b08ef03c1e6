#pragma once
// ChatML prompt formatting as the Qwen2/Qwen2.5/Qwen3 chat templates render
// plain conversations (no tools, no images):
//
//   <|im_start|>system\n{content}<|im_end|>\n
//   <|im_start|>user\n{content}<|im_end|>\n
//   <|im_start|>assistant\n            (only with add_generation_prompt)
//
// The result is text; Tokenizer::Encode turns the markers into their special
// token ids because they are added tokens of the Qwen tokenizer.json.
// Pure functions; thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool", ...
  std::string content;  // copied verbatim; not escaped
};

struct ChatTemplateOptions {
  // Inserted as a system turn when the first message is not a system message.
  // Default: none. Qwen2.5 uses kQwenDefaultSystemMessage.
  std::optional<std::string> default_system_message;
  // Append the opening of an assistant turn for generation. Default: false.
  bool add_generation_prompt = false;
};

inline constexpr const char* kQwenDefaultSystemMessage =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// Renders `messages` as ChatML. A role that is empty or contains a newline or
// "<|" is an error naming the message index, since it would break the format.
absl::StatusOr<std::string> ApplyChatMlTemplate(const std::vector<ChatMessage>& messages,
                                                const ChatTemplateOptions& options = {});

}  // namespace roll
