#include "roll/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "testing/temp_dir.h"

namespace roll {
namespace {

using TempDir = testing::ScratchDir;  // removed with the test

using ::testing::HasSubstr;
using ::testing::Not;


TEST(ParseJsonlTest, PromptRecords) {
  auto s = ParseJsonl(
      R"({"prompt": "1+1=", "ground_truth": "2", "tag": "math", "id": "q1"}
{"prompt": "What is 3*4?", "ground_truth": 12}
)",
      "train.jsonl");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].id, "q1");
  EXPECT_EQ((*s)[0].prompt, "1+1=");
  EXPECT_TRUE((*s)[0].messages.empty());
  EXPECT_EQ((*s)[0].ground_truth, "2");
  EXPECT_EQ((*s)[0].tag, "math");
  EXPECT_EQ((*s)[1].ground_truth, "12");  // a number becomes its text
  EXPECT_EQ((*s)[1].tag, "");             // the config's default_tag applies later
}

TEST(ParseJsonlTest, IdDefaultsToStemAndLine) {
  auto s = ParseJsonl(
      "{\"prompt\": \"a\", \"answer\": \"1\"}\n\n   "
      "\n{\"prompt\": \"b\", \"answer\": \"2\"}\n",
      "data/gsm8k_train.jsonl");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 2u);  // blank lines skipped
  EXPECT_EQ((*s)[0].id, "gsm8k_train-1");
  EXPECT_EQ((*s)[1].id, "gsm8k_train-4");  // the file's line number
}

TEST(ParseJsonlTest, NumericIdAndGroundTruths) {
  auto s = ParseJsonl(R"({"prompt": "p", "ground_truth": 0.5, "id": 7}
{"prompt": "p", "ground_truth": -3}
{"prompt": "p", "answer": "\\frac{1}{2}"})",
                      "x.jsonl");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)[0].id, "7");
  EXPECT_EQ((*s)[0].ground_truth, "0.5");
  EXPECT_EQ((*s)[1].ground_truth, "-3");
  EXPECT_EQ((*s)[2].ground_truth, R"(\frac{1}{2})");
}

TEST(ParseJsonlTest, AnswerIsAnAliasButGroundTruthWins) {
  auto s = ParseJsonl(R"({"prompt": "p", "answer": "1", "ground_truth": "2"})", "x.jsonl");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)[0].ground_truth, "2");
}

TEST(ParseJsonlTest, StructuredGroundTruthTravelsAsJson) {
  auto s = ParseJsonl(
      R"({"prompt": "reverse", "ground_truth": [{"input": "ab", "output": "ba"}], "tag": "code"}
{"prompt": "Use 3 7 25 to make 46.", "ground_truth": {"numbers": [3, 7, 25], "target": 46}})",
      "x.jsonl");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)[0].ground_truth, R"([{"input":"ab","output":"ba"}])");
  EXPECT_EQ((*s)[1].ground_truth, R"({"numbers":[3,7,25],"target":46})");
}

TEST(ParseJsonlTest, MessagesRecords) {
  auto s = ParseJsonl(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}], "ground_truth": "4"})",
      "chat.jsonl");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 1u);
  EXPECT_EQ((*s)[0].prompt, "");
  ASSERT_EQ((*s)[0].messages.size(), 2u);
  EXPECT_EQ((*s)[0].messages[0].role, "system");
  EXPECT_EQ((*s)[0].messages[0].content, "Be brief.");
  EXPECT_EQ((*s)[0].messages[1].role, "user");
  EXPECT_EQ((*s)[0].messages[1].content, "2+2?");
}

struct BadLine {
  const char *line;
  const char *error;
};

class ParseJsonlErrorTest : public ::testing::TestWithParam<BadLine> {};

TEST_P(ParseJsonlErrorTest, NamesFileAndLine) {
  const std::string text =
      absl::StrCat(R"({"prompt": "ok", "ground_truth": "1"})", "\n", GetParam().line, "\n");
  auto s = ParseJsonl(text, "set.jsonl");
  ASSERT_FALSE(s.ok()) << GetParam().line;
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr(absl::StrCat("set.jsonl:2: ", GetParam().error)));
}

INSTANTIATE_TEST_SUITE_P(
    Lines, ParseJsonlErrorTest,
    ::testing::Values(
        BadLine{R"({"prompt": "unterminated)", "not valid JSON"},
        BadLine{R"(["prompt", "1"])", "expected a JSON object"},
        BadLine{R"({"question": "2+2", "ground_truth": "4"})", R"(missing "prompt" (or "messages"))"},
        BadLine{R"({"prompt": 5, "ground_truth": "4"})", R"("prompt" must be a string)"},
        BadLine{R"({"messages": [], "ground_truth": "4"})", R"("messages" must be a non-empty list)"},
        BadLine{R"({"messages": [{"role": "user"}], "ground_truth": "4"})", R"("messages" must be)"},
        BadLine{R"({"messages": "hi", "ground_truth": "4"})", R"("messages" must be)"},
        BadLine{R"({"prompt": "p"})", R"(missing "ground_truth" (or "answer"))"},
        BadLine{R"({"prompt": "p", "ground_truth": "1", "tag": 3})", R"("tag" must be a string)"},
        BadLine{R"({"prompt": "p", "ground_truth": "1", "id": [1]})",
                R"("id" must be a string or a number)"}));

TEST(ParseJsonlTest, CollectsSeveralErrors) {
  auto s = ParseJsonl(R"({"prompt": "ok", "ground_truth": "1"}
{bad json
{"prompt": "p"}
{"prompt": "fine", "answer": "2"}
{"ground_truth": "3"}
)",
                      "many.jsonl");
  ASSERT_FALSE(s.ok());
  const std::string msg(s.status().message());
  EXPECT_THAT(msg, HasSubstr("many.jsonl:2: not valid JSON"));
  EXPECT_THAT(msg, HasSubstr("many.jsonl:3: missing \"ground_truth\""));
  EXPECT_THAT(msg, HasSubstr("many.jsonl:5: missing \"prompt\""));
  EXPECT_THAT(msg, Not(HasSubstr("many.jsonl:1:")));
  EXPECT_THAT(msg, Not(HasSubstr("many.jsonl:4:")));
}

TEST(ParseJsonlTest, ReportsAtMostTwentyErrors) {
  std::string text;
  for (int i = 0; i < 30; ++i) text += "nope\n";
  auto s = ParseJsonl(text, "bad.jsonl");
  ASSERT_FALSE(s.ok());
  std::vector<std::string> lines = absl::StrSplit(std::string(s.status().message()), '\n');
  EXPECT_EQ(lines.size(), 20u);
  EXPECT_THAT(lines.back(), HasSubstr("bad.jsonl:20:"));
}

TEST(ParseJsonlTest, EmptyTextIsNoSamples) {
  auto s = ParseJsonl("\n\n", "empty.jsonl");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->empty());
}

TEST(LoadJsonlTest, ReadsAFileAndNamesItInErrors) {
  TempDir dir;
  const std::string path = dir / "val.jsonl";
  {
    std::ofstream f(path);
    f << R"({"prompt": "a", "ground_truth": "1"})"
      << "\n"
      << R"({"prompt": 1, "ground_truth": "1"})"
      << "\n";
  }
  auto s = LoadJsonl(path);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr(path + ":2: "));
  {
    std::ofstream f(path);
    f << R"({"prompt": "a", "ground_truth": "1"})"
      << "\n";
  }
  s = LoadJsonl(path);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)[0].id, "val-1");
}

TEST(LoadJsonlTest, MissingFileIsNotFound) {
  TempDir dir;
  auto s = LoadJsonl(dir / "absent.jsonl");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.status().message(), HasSubstr("absent.jsonl"));
}

TEST(WriteJsonlTest, RoundTrip) {
  TempDir dir;
  std::vector<Sample> in(3);
  in[0] = {"a-1", "What is 2+2?", {}, "4", "math"};
  in[1] = {"a-2", "", {{"system", "Be brief."}, {"user", "Say \"hi\"\nplease"}}, "hi", ""};
  in[2] = {"a-3", "unicode: \xc3\xa9\xe2\x82\xac", {}, R"({"numbers":[1,2],"target":3})", "countdown"};
  const std::string path = dir / "out.jsonl";
  ASSERT_TRUE(WriteJsonl(path, in).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  auto out = LoadJsonl(path);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].id, in[i].id);
    EXPECT_EQ((*out)[i].prompt, in[i].prompt);
    EXPECT_EQ((*out)[i].ground_truth, in[i].ground_truth);
    EXPECT_EQ((*out)[i].tag, in[i].tag);
    ASSERT_EQ((*out)[i].messages.size(), in[i].messages.size());
    for (size_t k = 0; k < in[i].messages.size(); ++k) {
      EXPECT_EQ((*out)[i].messages[k].role, in[i].messages[k].role);
      EXPECT_EQ((*out)[i].messages[k].content, in[i].messages[k].content);
    }
  }
}

TEST(WriteJsonlTest, ReplacesAnExistingFile) {
  TempDir dir;
  const std::string path = dir / "out.jsonl";
  ASSERT_TRUE(WriteJsonl(path, {{"x", "p", {}, "1", ""}, {"y", "q", {}, "2", ""}}).ok());
  ASSERT_TRUE(WriteJsonl(path, {{"z", "r", {}, "3", ""}}).ok());
  auto out = LoadJsonl(path);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].id, "z");
}

TEST(WriteJsonlTest, UnwritableDirectoryIsAnError) {
  TempDir dir;
  EXPECT_FALSE(WriteJsonl(dir / "no/such/dir/out.jsonl", {}).ok());
}

}  // namespace
}  // namespace roll
