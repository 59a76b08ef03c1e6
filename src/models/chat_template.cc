#include "roll/models/chat_template.h"

namespace roll {
namespace {

void AppendTurn(std::string_view role, std::string_view content, std::string* out) {
  out->append("<|im_start|>").append(role).append("\n").append(content).append("<|im_end|>\n");
}

}  // namespace

absl::StatusOr<std::string> ApplyChatMlTemplate(const std::vector<ChatMessage>& messages,
                                                const ChatTemplateOptions& options) {
  std::string out;
  if (options.default_system_message && (messages.empty() || messages.front().role != "system")) {
    AppendTurn("system", *options.default_system_message, &out);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role.empty() || role.find('\n') != std::string::npos || role.find("<|") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("chat template: messages[", i, "].role '", role,
                       "' must be non-empty and contain no newline or '<|'"));
    }
    AppendTurn(role, messages[i].content, &out);
  }
  if (options.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace roll
