#include "roll/models/chat_template.h"

#include <gtest/gtest.h>

namespace roll {
namespace {

TEST(ChatTemplateTest, RendersChatMlWithDefaultSystemAndGenerationPrompt) {
  ChatTemplateOptions options;
  options.default_system_message = kQwenDefaultSystemMessage;
  options.add_generation_prompt = true;
  auto text = ApplyChatMlTemplate({{"user", "What is 2+2?"}}, options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, GivenSystemMessageReplacesTheDefault) {
  ChatTemplateOptions options;
  options.default_system_message = "unused";
  auto text = ApplyChatMlTemplate(
      {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye\nnow"}}, options);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nBye\nnow<|im_end|>\n");
}

TEST(ChatTemplateTest, NoDefaultSystemMessageAndNoPrompt) {
  auto text = ApplyChatMlTemplate({{"user", ""}});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "<|im_start|>user\n<|im_end|>\n");
  auto empty = ApplyChatMlTemplate({}, {std::nullopt, true});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, RejectsRolesThatBreakTheFormat) {
  for (const char* role : {"", "us\ner", "<|im_start|>"}) {
    auto text = ApplyChatMlTemplate({{"user", "ok"}, {role, "x"}});
    ASSERT_FALSE(text.ok()) << role;
    EXPECT_NE(text.status().message().find("messages[1]"), std::string::npos) << text.status();
  }
}

}  // namespace
}  // namespace roll
