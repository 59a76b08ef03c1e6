#include "roll/rewards/math_verifier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "roll/rewards/reward_function.h"

namespace roll {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

// --- extraction ---

TEST(ExtractFinalAnswerTest, BoxedWithNestedBraces) {
  EXPECT_THAT(ExtractFinalAnswer(R"(So $x = \boxed{\frac{1}{2}}$.)"),
              Optional(std::string(R"(\frac{1}{2})")));
  EXPECT_THAT(ExtractFinalAnswer(R"(\boxed{\frac{\sqrt{3}}{2}})"),
              Optional(std::string(R"(\frac{\sqrt{3}}{2})")));
}

TEST(ExtractFinalAnswerTest, LastBoxedWins) {
  EXPECT_THAT(ExtractFinalAnswer(R"(First \boxed{3}, corrected: \boxed{4})"), Optional(std::string("4")));
  EXPECT_THAT(ExtractFinalAnswer(R"(\boxed{3} then \fbox{5})"), Optional(std::string("5")));
}

TEST(ExtractFinalAnswerTest, BoxedBeatsAnswerMarker) {
  EXPECT_THAT(ExtractFinalAnswer("Answer: 7\nso \\boxed{8}"), Optional(std::string("8")));
}

TEST(ExtractFinalAnswerTest, AnswerMarkers) {
  EXPECT_THAT(ExtractFinalAnswer("Let me add.\nAnswer: 12"), Optional(std::string("12")));
  EXPECT_THAT(ExtractFinalAnswer("Thinking... the answer is 3/4."), Optional(std::string("3/4.")));
  EXPECT_THAT(ExtractFinalAnswer("Total apples\n#### 1,234"), Optional(std::string("1,234")));
  // Only the line after the marker counts.
  EXPECT_THAT(ExtractFinalAnswer("answer: 5\nI hope 6 is not it"), Optional(std::string("5")));
}

TEST(ExtractFinalAnswerTest, LastMarkerWins) {
  EXPECT_THAT(ExtractFinalAnswer("Answer: 3\nWait, the answer is 4"), Optional(std::string("4")));
}

TEST(ExtractFinalAnswerTest, OnlyTextAfterThinkCounts) {
  EXPECT_THAT(ExtractFinalAnswer("<think>maybe \\boxed{5}</think> The result is 7"),
              Optional(std::string("7")));
  EXPECT_THAT(ExtractFinalAnswer("<think>the answer is 1</think><think>no, 2</think> Answer: 3"),
              Optional(std::string("3")));
  // Nothing after </think> and no fallback: no answer, even though the
  // thinking has one.
  MathVerifyOptions no_fallback;
  no_fallback.last_number_fallback = false;
  EXPECT_EQ(ExtractFinalAnswer("<think>\\boxed{5}</think>", no_fallback), std::nullopt);
}

TEST(ExtractFinalAnswerTest, LastNumberFallback) {
  EXPECT_THAT(ExtractFinalAnswer("There are 3 cats and 4 dogs, so 7 animals"), Optional(std::string("7")));
  EXPECT_THAT(ExtractFinalAnswer("It costs -2.5 dollars"), Optional(std::string("-2.5")));
  EXPECT_THAT(ExtractFinalAnswer("we end with 1,000 sheep"), Optional(std::string("1,000")));
  // A comma that ends a clause is not part of the number.
  EXPECT_THAT(ExtractFinalAnswer("The total is 15, which is odd"), Optional(std::string("15")));
}

TEST(ExtractFinalAnswerTest, FallbackOff) {
  MathVerifyOptions o;
  o.last_number_fallback = false;
  EXPECT_EQ(ExtractFinalAnswer("so we get 42 apples", o), std::nullopt);
  EXPECT_THAT(ExtractFinalAnswer("Answer: 42", o), Optional(std::string("42")));
}

TEST(ExtractFinalAnswerTest, NothingFound) {
  EXPECT_EQ(ExtractFinalAnswer("I do not know."), std::nullopt);
  EXPECT_EQ(ExtractFinalAnswer(""), std::nullopt);
}

// --- normalization ---

TEST(NormalizeMathAnswerTest, LatexNoise) {
  EXPECT_EQ(NormalizeMathAnswer("$5$"), "5");
  EXPECT_EQ(NormalizeMathAnswer(R"(\left( 5 \right))"), "5");
  EXPECT_EQ(NormalizeMathAnswer(R"(12\text{ cm})"), "12");
  EXPECT_EQ(NormalizeMathAnswer(R"(90^\circ)"), "90");
  EXPECT_EQ(NormalizeMathAnswer(R"(90^{\circ})"), "90");
  EXPECT_EQ(NormalizeMathAnswer(R"(50\%)"), "50");
  EXPECT_EQ(NormalizeMathAnswer("1,234,567"), "1234567");
  EXPECT_EQ(NormalizeMathAnswer("7."), "7");
  EXPECT_EQ(NormalizeMathAnswer("{7}"), "7");
}

TEST(NormalizeMathAnswerTest, Fractions) {
  EXPECT_EQ(NormalizeMathAnswer(R"(\frac{1}{2})"), "1/2");
  EXPECT_EQ(NormalizeMathAnswer(R"(\dfrac{3}{4})"), "3/4");
  EXPECT_EQ(NormalizeMathAnswer(R"(\tfrac{3}{4})"), "3/4");
  EXPECT_EQ(NormalizeMathAnswer(R"(\dfrac12)"), "1/2");
  EXPECT_EQ(NormalizeMathAnswer(R"(-\frac{3}{4})"), "-3/4");
}

TEST(NormalizeMathAnswerTest, ListsKeepTheirCommas) {
  EXPECT_EQ(NormalizeMathAnswer("1,2"), "1,2");
  EXPECT_EQ(NormalizeMathAnswer("(1, 2)"), "(1,2)");
}

// --- verification ---

struct Case {
  const char *response;
  const char *truth;
};
void PrintTo(const Case &c, std::ostream *os) { *os << "'" << c.response << "' vs '" << c.truth << "'"; }

class VerifyMathCorrectTest : public ::testing::TestWithParam<Case> {};

TEST_P(VerifyMathCorrectTest, IsCorrect) {
  MathVerifyResult r = VerifyMath(GetParam().response, GetParam().truth);
  EXPECT_TRUE(r.correct) << "response: " << GetParam().response << "\ntruth: " << GetParam().truth
                         << "\nreason: " << r.reason;
  EXPECT_EQ(r.reason, "correct");
}

INSTANTIATE_TEST_SUITE_P(
    Realistic, VerifyMathCorrectTest,
    ::testing::Values(Case{R"(The sum is \boxed{42}.)", "42"}, Case{"Answer: 12", "12"},
                      Case{"answer: 12.", "12"}, Case{"So the answer is 3/4", "0.75"},
                      Case{"#### 1,234", "1234"}, Case{"#### 1234", "1,234"}, Case{R"(\boxed{0.50})", ".5"},
                      Case{R"(\boxed{.5})", "0.50"}, Case{R"(\boxed{1/2})", "0.5"},
                      Case{R"(\boxed{\frac{1}{2}})", "1/2"}, Case{R"(\boxed{\frac{2}{4}})", "0.5"},
                      Case{R"(\boxed{\dfrac12})", "0.5"}, Case{R"($\boxed{-\frac{3}{4}}$)", "-0.75"},
                      Case{R"(\boxed{-\dfrac{3}{4}})", "-3/4"}, Case{R"(\boxed{5\text{ cm}})", "5"},
                      Case{R"(The angle is \boxed{90^\circ})", "90"}, Case{R"(\boxed{25\%})", "25"},
                      Case{R"($\left(7\right)$)", "7"}, Case{R"(\boxed{007})", "7"},
                      Case{R"(\boxed{+3})", "3"}, Case{R"(\boxed{-0})", "0"},
                      Case{"<think>it is 5, no, 6</think>The answer is 6", "6"},
                      Case{"Adding them gives 19", "19"}, Case{"It is 15, an odd number", "15"},
                      Case{"The answer is: 7", "7"}, Case{R"(\boxed{x+1})", "x + 1"},
                      Case{R"(\boxed{\frac{\sqrt{3}}{2}})", R"(\frac{\sqrt{3}}{2})"},
                      Case{R"(\boxed{1,000,000})", "1000000"}));

TEST(VerifyMathTest, WrongAnswerSaysWhy) {
  MathVerifyResult r = VerifyMath(R"(\boxed{12})", "13");
  EXPECT_FALSE(r.correct);
  EXPECT_THAT(r.extracted, Optional(std::string("12")));
  EXPECT_EQ(r.normalized_answer, "12");
  EXPECT_EQ(r.normalized_truth, "13");
  EXPECT_EQ(r.reason, "answer 12 != ground truth 13");
}

TEST(VerifyMathTest, WrongAnswersByValue) {
  EXPECT_FALSE(VerifyMath(R"(\boxed{0.333})", "1/3").correct);
  EXPECT_FALSE(VerifyMath(R"(\boxed{-\frac{3}{4}})", "3/4").correct);
  EXPECT_FALSE(VerifyMath("Answer: 1,2", "12").correct);
  EXPECT_FALSE(VerifyMath(R"(\boxed{x+2})", "x+1").correct);
  MathVerifyResult r = VerifyMath(R"(\boxed{\frac{1}{3}})", "0.5");
  EXPECT_FALSE(r.correct);
  EXPECT_EQ(r.reason, "answer 1/3 != ground truth 0.5");
}

TEST(VerifyMathTest, ThinkingDoesNotCount) {
  // The right number only inside <think>, a wrong one after it.
  MathVerifyResult r = VerifyMath("<think>\\boxed{7}</think> I think it is 8", "7");
  EXPECT_FALSE(r.correct);
  EXPECT_THAT(r.extracted, Optional(std::string("8")));
}

TEST(VerifyMathTest, NoAnswerFound) {
  MathVerifyResult r = VerifyMath("I have no idea.", "5");
  EXPECT_FALSE(r.correct);
  EXPECT_EQ(r.extracted, std::nullopt);
  EXPECT_EQ(r.reason, "no final answer found");
}

TEST(VerifyMathTest, FallbackOffMeansNoAnswer) {
  MathVerifyOptions o;
  o.last_number_fallback = false;
  MathVerifyResult r = VerifyMath("the result: 5", "5", o);
  EXPECT_FALSE(r.correct);
  EXPECT_EQ(r.reason, "no final answer found");
  EXPECT_TRUE(VerifyMath("the result: 5", "5").correct);
}

TEST(VerifyMathTest, EmptyAnswerNeverMatchesEmptyTruth) {
  EXPECT_FALSE(VerifyMath(R"(\boxed{})", "").correct);
}

// --- MakeRewardFunction ---

absl::StatusOr<RewardResult> Score(const RewardFunction &f, const std::string &response,
                                   const std::string &truth) {
  return f.Score(RewardInput{response, truth, ""});
}

TEST(MakeRewardFunctionTest, MathRule) {
  auto f = MakeRewardFunction("math_rule", "");
  ASSERT_TRUE(f.ok()) << f.status();
  auto r = Score(**f, R"(so \boxed{12})", "12");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->score, 1.0);
  EXPECT_EQ(r->reason, "correct");
  EXPECT_EQ(r->extracted, "12");
  r = Score(**f, R"(so \boxed{11})", "12");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->score, 0.0);
  EXPECT_EQ(r->reason, "answer 11 != ground truth 12");
  r = Score(**f, "no digits here", "12");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->score, 0.0);
  EXPECT_EQ(r->extracted, "");
}

TEST(MakeRewardFunctionTest, MathRuleFallbackOption) {
  auto f = MakeRewardFunction("math_rule", R"({"last_number_fallback": false})");
  ASSERT_TRUE(f.ok()) << f.status();
  auto r = Score(**f, "it is 12", "12");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->score, 0.0);
  EXPECT_EQ(r->reason, "no final answer found");
  auto on = MakeRewardFunction("math_rule", R"({"last_number_fallback": true})");
  ASSERT_TRUE(on.ok());
  EXPECT_EQ(Score(**on, "it is 12", "12")->score, 1.0);
}

TEST(MakeRewardFunctionTest, FormatDefaultPattern) {
  auto f = MakeRewardFunction("format", "");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Score(**f, "<think>add 2 and 3</think> The answer is 5", "")->score, 1.0);
  EXPECT_EQ(Score(**f, "<think>\nmulti\nline\n</think>\n5", "")->score, 1.0);
  EXPECT_EQ(Score(**f, "The answer is 5", "")->score, 0.0);
  EXPECT_EQ(Score(**f, "<think>no answer after it</think>   ", "")->score, 0.0);
  EXPECT_EQ(Score(**f, "hi <think>x</think> 5", "")->score,
            0.0);  // must start with <think>
  auto r = Score(**f, "5", "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->score, 0.0);
  EXPECT_THAT(r->reason, HasSubstr("does not match"));
  EXPECT_EQ(Score(**f, "<think>x</think>5", "")->reason, "format ok");
}

TEST(MakeRewardFunctionTest, FormatCustomPattern) {
  auto f = MakeRewardFunction("format", R"({"pattern": "^Answer: \\d+$"})");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Score(**f, "Answer: 42", "")->score, 1.0);
  EXPECT_EQ(Score(**f, "Answer: forty-two", "")->score, 0.0);
  EXPECT_THAT(Score(**f, "x", "")->reason, HasSubstr(R"(^Answer: \d+$)"));
}

TEST(MakeRewardFunctionTest, FormatInvalidRegexNamesPattern) {
  auto f = MakeRewardFunction("format", R"({"pattern": "(unclosed"})");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr("(unclosed"));
}

TEST(MakeRewardFunctionTest, Countdown) {
  auto f = MakeRewardFunction("countdown", "");
  ASSERT_TRUE(f.ok()) << f.status();
  const std::string truth = R"({"numbers":[3,7,25],"target":46})";
  EXPECT_EQ(Score(**f, "25 + 3 * 7", truth)->score, 1.0);
  auto r = Score(**f, "25 + 3 + 7", truth);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->score, 0.0);
  EXPECT_THAT(r->reason, HasSubstr("not 46"));
  // A ground truth it cannot read is an error, not a score.
  EXPECT_FALSE(Score(**f, "1+2", "46").ok());
}

TEST(MakeRewardFunctionTest, UnknownTypeListsKnownOnes) {
  auto f = MakeRewardFunction("math_rules", "");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr("'math_rules'"));
  for (const char *known : {"math_rule", "format", "code_sandbox", "countdown"}) {
    EXPECT_THAT(f.status().message(), HasSubstr(known));
  }
}

TEST(MakeRewardFunctionTest, UnknownOptionIsAnError) {
  for (const char *type : {"math_rule", "format", "countdown", "code_sandbox"}) {
    auto f = MakeRewardFunction(type, R"({"bogus_option": 1})");
    ASSERT_FALSE(f.ok()) << type;
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << type;
    EXPECT_THAT(f.status().message(), HasSubstr("bogus_option")) << type;
  }
}

TEST(MakeRewardFunctionTest, BadOptionsJsonIsAnError) {
  for (const char *type : {"math_rule", "format", "countdown", "code_sandbox"}) {
    for (const char *options : {"{not json", "[1, 2]"}) {
      auto f = MakeRewardFunction(type, options);
      ASSERT_FALSE(f.ok()) << type << " " << options;
      EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << type << " " << options;
    }
  }
}

TEST(MakeRewardFunctionTest, WrongOptionTypeIsAnErrorNotAThrow) {
  auto a = MakeRewardFunction("math_rule", R"({"last_number_fallback": "yes"})");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("last_number_fallback"));
  auto b = MakeRewardFunction("format", R"({"pattern": 5})");
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("pattern"));
  auto c = MakeRewardFunction("code_sandbox", R"({"timeout_s": "fast"})");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MakeRewardFunctionTest, CodeSandboxOptionsAccepted) {
  auto f = MakeRewardFunction("code_sandbox",
                              R"({"timeout_s": 2.5, "cpu_s": 2, "memory_mb": 256, "file_mb": 2,
                                  "processes": 16, "all_or_nothing": true,
                                  "allow_network_fallback": false})");
  EXPECT_TRUE(f.ok()) << f.status();
}

TEST(RewardOptionsJsonTest, KeyValuesBecomeTypedJson) {
  auto j = RewardOptionsJson({"timeout_s=2.5", "cpu_s=1", "last_number_fallback=false", "pattern=^<a>"});
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(*j, R"({"cpu_s":1,"last_number_fallback":false,"pattern":"^<a>","timeout_s":2.5})");
  EXPECT_EQ(*RewardOptionsJson({}), "");
  // The options reach the reward: the fallback off means no last number.
  auto f = MakeRewardFunction("math_rule", *RewardOptionsJson({"last_number_fallback=false"}));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(Score(**f, "so 12", "12")->score, 0.0);
  EXPECT_THAT(RewardOptionsJson({"timeout_s"}).status().message(), ::testing::HasSubstr("'timeout_s' is not key=value"));
  EXPECT_THAT(RewardOptionsJson({"a=1", "a=2"}).status().message(), ::testing::HasSubstr("'a' is given twice"));
  // A wrongly typed option is refused by the reward, naming it.
  auto bad = MakeRewardFunction("code_sandbox", *RewardOptionsJson({"timeout_s=soon"}));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("timeout_s"));
}

}  // namespace
}  // namespace roll
