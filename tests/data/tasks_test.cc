#include "roll/data/tasks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace roll {
namespace {

using ::testing::HasSubstr;

// --- an independent evaluator for the arithmetic prompts ---

// "12+7*3=" -> 33, with * before + and -.
int64_t EvalArithmeticPrompt(const std::string &prompt) {
  EXPECT_EQ(prompt.back(), '=') << prompt;
  std::vector<int64_t> nums;
  std::vector<char> ops;
  size_t i = 0;
  const std::string s = prompt.substr(0, prompt.size() - 1);
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    EXPECT_GT(j, i) << "no number at " << i << " in " << prompt;
    if (j == i) return 0;
    nums.push_back(std::stoll(s.substr(i, j - i)));
    if (j < s.size()) ops.push_back(s[j++]);
    i = j;
  }
  // Fold products first, then sum the signed terms.
  int64_t total = 0, term = nums[0];
  char sign = '+';
  for (size_t k = 0; k < ops.size(); ++k) {
    if (ops[k] == '*') {
      term *= nums[k + 1];
    } else {
      total += sign == '+' ? term : -term;
      sign = ops[k];
      term = nums[k + 1];
    }
  }
  return total + (sign == '+' ? term : -term);
}

std::vector<int64_t> Operands(const std::string &prompt) {
  std::vector<int64_t> out;
  static const std::regex num(R"(\d+)");
  for (auto it = std::sregex_iterator(prompt.begin(), prompt.end(), num); it != std::sregex_iterator();
       ++it) {
    out.push_back(std::stoll(it->str()));
  }
  return out;
}

TEST(GenerateTaskSplitTest, ArithmeticDefaults) {
  auto split = GenerateTaskSplit("arithmetic", 50, 10, 1, {});
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->train.size(), 50u);
  ASSERT_EQ(split->val.size(), 10u);
  EXPECT_EQ(split->train[0].id, "arithmetic-train-0");
  EXPECT_EQ(split->val[9].id, "arithmetic-val-9");
  for (const auto *part : {&split->train, &split->val}) {
    for (const Sample &s : *part) {
      EXPECT_THAT(s.prompt, ::testing::MatchesRegex(R"([0-9]+\+[0-9]+=)"));
      for (int64_t x : Operands(s.prompt)) {
        EXPECT_GE(x, 0);
        EXPECT_LE(x, 99);
      }
      EXPECT_EQ(s.ground_truth, std::to_string(EvalArithmeticPrompt(s.prompt))) << s.prompt;
    }
  }
}

TEST(GenerateTaskSplitTest, ArithmeticOptionsAndGroundTruths) {
  auto split = GenerateTaskSplit("arithmetic", 200, 50, 42,
                                 {"operators=+-*", "min_operand=5", "max_operand=30", "num_operands=4"});
  ASSERT_TRUE(split.ok()) << split.status();
  std::set<char> seen_ops;
  for (const auto *part : {&split->train, &split->val}) {
    for (const Sample &s : *part) {
      const std::vector<int64_t> xs = Operands(s.prompt);
      ASSERT_EQ(xs.size(), 4u) << s.prompt;
      for (int64_t x : xs) {
        EXPECT_GE(x, 5) << s.prompt;
        EXPECT_LE(x, 30) << s.prompt;
      }
      for (char c : s.prompt) {
        if (c == '+' || c == '-' || c == '*') seen_ops.insert(c);
      }
      EXPECT_EQ(s.ground_truth, std::to_string(EvalArithmeticPrompt(s.prompt))) << s.prompt;
    }
  }
  EXPECT_EQ(seen_ops, (std::set<char>{'+', '-', '*'}));
}

TEST(GenerateTaskSplitTest, DeterministicBySeed) {
  for (const char *task : {"arithmetic", "countdown"}) {
    auto a = GenerateTaskSplit(task, 30, 10, 7, {});
    auto b = GenerateTaskSplit(task, 30, 10, 7, {});
    auto c = GenerateTaskSplit(task, 30, 10, 8, {});
    ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << task;
    std::vector<std::string> pa, pb, pc;
    for (const Sample &s : a->train) pa.push_back(s.prompt + "|" + s.ground_truth);
    for (const Sample &s : a->val) pa.push_back(s.prompt + "|" + s.ground_truth);
    for (const Sample &s : b->train) pb.push_back(s.prompt + "|" + s.ground_truth);
    for (const Sample &s : b->val) pb.push_back(s.prompt + "|" + s.ground_truth);
    for (const Sample &s : c->train) pc.push_back(s.prompt + "|" + s.ground_truth);
    for (const Sample &s : c->val) pc.push_back(s.prompt + "|" + s.ground_truth);
    EXPECT_EQ(pa, pb) << task;
    EXPECT_NE(pa, pc) << task;
  }
}

TEST(GenerateTaskSplitTest, TrainAndValAreDisjoint) {
  for (const char *task : {"arithmetic", "countdown"}) {
    // A small question space, so collisions would happen if not excluded.
    const std::vector<std::string> options = std::string(task) == "arithmetic"
                                                 ? std::vector<std::string>{"max_operand=9"}
                                                 : std::vector<std::string>{"max_number=6", "max_target=30"};
    auto split = GenerateTaskSplit(task, 300, 20, 3, options);
    ASSERT_TRUE(split.ok()) << split.status();
    std::set<std::string> val;
    for (const Sample &s : split->val) val.insert(s.prompt);
    EXPECT_EQ(val.size(), split->val.size()) << task << ": validation questions repeat";
    for (const Sample &s : split->train) EXPECT_EQ(val.count(s.prompt), 0u) << task << ": " << s.prompt;
  }
}

TEST(GenerateTaskSplitTest, TooFewDistinctQuestions) {
  // 0..1 + 0..1: four questions.
  auto split = GenerateTaskSplit("arithmetic", 1, 5, 1, {"max_operand=1"});
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.status().message(), HasSubstr("num_val=5"));
  split = GenerateTaskSplit("arithmetic", 5, 4, 1, {"max_operand=1"});
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(split.status().message(), HasSubstr("num_train=5"));
}

TEST(GenerateTaskSplitTest, EmptySplitsAreFine) {
  auto split = GenerateTaskSplit("countdown", 0, 0, 1, {});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_TRUE(split->train.empty());
  EXPECT_TRUE(split->val.empty());
  EXPECT_FALSE(GenerateTaskSplit("arithmetic", -1, 0, 1, {}).ok());
}

struct BadOption {
  const char *task;
  const char *option;
  const char *named;  // what the error must mention
};

class BadOptionTest : public ::testing::TestWithParam<BadOption> {};

TEST_P(BadOptionTest, RejectedNamingTheKey) {
  auto split = GenerateTaskSplit(GetParam().task, 5, 5, 1, {GetParam().option});
  ASSERT_FALSE(split.ok()) << GetParam().option;
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.status().message(), HasSubstr(GetParam().named));
}

INSTANTIATE_TEST_SUITE_P(
    Options, BadOptionTest,
    ::testing::Values(
        BadOption{"arithmetic", "colour=red", "'colour'"},
        BadOption{"arithmetic", "colour=red", "operators, min_operand, max_operand, num_operands"},
        BadOption{"arithmetic", "max_operand", "'max_operand' is not of the form key=value"},
        BadOption{"arithmetic", "max_operand=lots", "max_operand=lots"},
        BadOption{"arithmetic", "num_operands=1", "num_operands=1 must be an integer in [2, 6]"},
        BadOption{"arithmetic", "num_operands=7", "num_operands"},
        BadOption{"arithmetic", "min_operand=-1", "min_operand"},
        BadOption{"arithmetic", "operators=/", "operators=/"},
        BadOption{"arithmetic", "operators=", "operators"}, BadOption{"countdown", "count=1", "count=1"},
        BadOption{"countdown", "max_number=1", "max_number"},
        BadOption{"countdown", "max_target=0", "max_target"},
        BadOption{"countdown", "operators=+", "'operators'"}));

TEST(GenerateTaskSplitTest, MaxBelowMinIsRejected) {
  auto split = GenerateTaskSplit("arithmetic", 5, 5, 1, {"min_operand=10", "max_operand=5"});
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(split.status().message(), HasSubstr("max_operand=5"));
}

TEST(GenerateTaskSplitTest, UnknownTaskListsKnownOnes) {
  auto split = GenerateTaskSplit("sudoku", 5, 5, 1, {});
  ASSERT_FALSE(split.ok());
  EXPECT_EQ(split.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.status().message(), HasSubstr("'sudoku'"));
  EXPECT_THAT(split.status().message(), HasSubstr("arithmetic"));
  EXPECT_THAT(split.status().message(), HasSubstr("countdown"));
}

// --- countdown ---

// Exact rationals small enough for the brute force below.
struct Frac {
  int64_t n, d;
};
Frac Reduce(int64_t n, int64_t d) {
  if (d < 0) n = -n, d = -d;
  const int64_t g = std::gcd(n < 0 ? -n : n, d);
  return g > 1 ? Frac{n / g, d / g} : Frac{n, d};
}

// An expression over a sub-multiset of `items` (each used at most once)
// equal to `target`, or nullopt.
struct Item {
  Frac v;
  std::string expr;
};
std::optional<std::string> Solve(const std::vector<Item> &items, int64_t target) {
  for (const Item &it : items) {
    if (it.v.d == 1 && it.v.n == target) return it.expr;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    for (size_t j = 0; j < items.size(); ++j) {
      if (i == j) continue;
      std::vector<Item> rest;
      for (size_t k = 0; k < items.size(); ++k) {
        if (k != i && k != j) rest.push_back(items[k]);
      }
      const Frac a = items[i].v, b = items[j].v;
      const std::string ea = "(" + items[i].expr + ")", eb = "(" + items[j].expr + ")";
      std::vector<Item> next = {{Reduce(a.n * b.d + b.n * a.d, a.d * b.d), ea + "+" + eb},
                                {Reduce(a.n * b.d - b.n * a.d, a.d * b.d), ea + "-" + eb},
                                {Reduce(a.n * b.n, a.d * b.d), ea + "*" + eb}};
      if (b.n != 0) next.push_back({Reduce(a.n * b.d, a.d * b.n), ea + "/" + eb});
      for (Item &n : next) {
        rest.push_back(n);
        if (auto e = Solve(rest, target)) return e;
        rest.pop_back();
      }
    }
  }
  return std::nullopt;
}

TEST(CountdownTest, GroundTruthShapeAndReachableTargets) {
  auto split = GenerateTaskSplit("countdown", 40, 10, 11, {});
  ASSERT_TRUE(split.ok()) << split.status();
  for (const auto *part : {&split->train, &split->val}) {
    for (const Sample &s : *part) {
      const nlohmann::json gt = nlohmann::json::parse(s.ground_truth);
      ASSERT_TRUE(gt.is_object()) << s.ground_truth;
      EXPECT_EQ(gt.size(), 2u) << s.ground_truth;
      const auto numbers = gt.at("numbers").get<std::vector<int64_t>>();
      const int64_t target = gt.at("target").get<int64_t>();
      ASSERT_EQ(numbers.size(), 3u);
      EXPECT_TRUE(std::is_sorted(numbers.begin(), numbers.end()));
      for (int64_t x : numbers) {
        EXPECT_GE(x, 1);
        EXPECT_LE(x, 25);
      }
      EXPECT_GE(target, 1);
      EXPECT_LE(target, 100);
      EXPECT_EQ(s.prompt,
                absl::StrCat("Use ", numbers[0], " ", numbers[1], " ", numbers[2], " to make ", target, "."));
      std::vector<Item> items;
      for (int64_t x : numbers) items.push_back({{x, 1}, std::to_string(x)});
      std::optional<std::string> expr = Solve(items, target);
      ASSERT_TRUE(expr.has_value()) << s.prompt << " is not reachable";
      auto score = CountdownScore("Answer: " + *expr, s.ground_truth);
      ASSERT_TRUE(score.ok()) << score.status();
      EXPECT_EQ(score->score, 1.0) << *expr << ": " << score->reason;
    }
  }
}

TEST(CountdownTest, Options) {
  auto split = GenerateTaskSplit("countdown", 20, 5, 2, {"count=4", "max_number=9", "max_target=50"});
  ASSERT_TRUE(split.ok()) << split.status();
  for (const Sample &s : split->train) {
    const nlohmann::json gt = nlohmann::json::parse(s.ground_truth);
    const auto numbers = gt.at("numbers").get<std::vector<int64_t>>();
    ASSERT_EQ(numbers.size(), 4u);
    for (int64_t x : numbers) EXPECT_LE(x, 9);
    EXPECT_LE(gt.at("target").get<int64_t>(), 50);
  }
}

const char kTruth[] = R"({"numbers":[3,7,25],"target":46})";

CountdownResult Score(const std::string &response, const std::string &truth = kTruth) {
  auto r = CountdownScore(response, truth);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : CountdownResult{};
}

TEST(CountdownScoreTest, Correct) {
  EXPECT_EQ(Score("25 + 3 * 7").score, 1.0);
  EXPECT_EQ(Score("25 + 3 * 7").reason, "correct");
  EXPECT_EQ(Score("(7 * 3) + 25 = 46").score, 1.0);  // "= target" is allowed
  EXPECT_EQ(Score("I try several things.\n25+20 no\n3*7+25\n").score,
            1.0);  // the last line
}

TEST(CountdownScoreTest, AnswerForm) {
  EXPECT_EQ(Score("Let me think: 25 + 21 = 46 and 21 = 3*7.\nAnswer: 25 + 3*7").score, 1.0);
  EXPECT_EQ(Score("ANSWER: (25 + 3*7)").score, 1.0);
  // Not every number has to be used.
  EXPECT_EQ(Score("answer: 25 + 7", R"({"numbers":[3,7,25],"target":32})").score, 1.0);
}

TEST(CountdownScoreTest, NumberReused) {
  CountdownResult r = Score("Answer: 25 + 7 + 7 + 7");
  EXPECT_EQ(r.score, 0.0);
  EXPECT_EQ(r.reason, "uses 7, which is not available (or used twice)");
}

TEST(CountdownScoreTest, NumberNotAvailable) {
  CountdownResult r = Score("Answer: 50 - 4");
  EXPECT_EQ(r.score, 0.0);
  EXPECT_EQ(r.reason, "uses 50, which is not available (or used twice)");
}

TEST(CountdownScoreTest, WrongValue) {
  CountdownResult r = Score("Answer: 25 + 7 + 3");
  EXPECT_EQ(r.score, 0.0);
  EXPECT_EQ(r.reason, "expression equals 35, not 46");
}

TEST(CountdownScoreTest, DivisionMustBeExactOverall) {
  const std::string truth = R"({"numbers":[4,6,8],"target":12})";
  EXPECT_EQ(Score("Answer: 8 / 4 * 6", truth).score, 1.0);
  EXPECT_EQ(Score("Answer: 6 / 4 * 8", truth).score,
            1.0);  // 3/2 on the way is fine
  CountdownResult r = Score("Answer: (8 + 6) / 4", truth);
  EXPECT_EQ(r.score, 0.0);
  EXPECT_EQ(r.reason, "expression equals 7/2, not 12");
}

TEST(CountdownScoreTest, DivisionByZero) {
  CountdownResult r = Score("Answer: 5 / (3 - 3)", R"({"numbers":[3,3,5],"target":1})");
  EXPECT_EQ(r.score, 0.0);
  EXPECT_EQ(r.reason, "no valid expression: division by zero");
}

TEST(CountdownScoreTest, NotAnExpression) {
  EXPECT_EQ(Score("I give up").score, 0.0);
  EXPECT_THAT(Score("I give up").reason, HasSubstr("no valid expression"));
  EXPECT_THAT(Score("Answer: 25 + ").reason, HasSubstr("no valid expression"));
  EXPECT_THAT(Score("Answer: 25 ^ 2").reason, HasSubstr("unexpected '^'"));
  EXPECT_EQ(Score("").score, 0.0);
}

TEST(CountdownScoreTest, BadGroundTruthIsAnError) {
  for (const char *bad : {"46", R"({"numbers":[1,2]})", R"({"numbers":"1 2","target":3})", "not json"}) {
    auto r = CountdownScore("1+2", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace roll
