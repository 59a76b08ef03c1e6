#include "roll/data/tasks.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace roll {
namespace {

using Options = std::map<std::string, std::string>;

absl::StatusOr<Options> ParseOptions(const std::string& task, const std::vector<std::string>& items,
                                     const std::vector<std::string>& known) {
  Options out;
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.task_options: '", item, "' is not of the form key=value"));
    }
    std::string key = item.substr(0, eq);
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("data.task_options: task '", task,
                                                     "' has no option '", key, "' (options: ",
                                                     absl::StrJoin(known, ", "), ")"));
    }
    out[key] = item.substr(eq + 1);
  }
  return out;
}

absl::StatusOr<int64_t> IntOption(const Options& o, const std::string& key, int64_t fallback,
                                  int64_t min, int64_t max) {
  auto it = o.find(key);
  if (it == o.end()) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("data.task_options: ", key, "=", it->second,
                                                   " must be an integer in [", min, ", ", max, "]"));
  }
  return v;
}

// Draws distinct questions until both splits are full: the validation
// questions come first so no training question repeats one of them.
template <class Gen>
absl::StatusOr<TaskSplit> Split(const std::string& task, int num_train, int num_val, Gen gen) {
  TaskSplit out;
  std::set<std::string> val_questions;
  const int64_t max_tries = 50ll * (num_train + num_val) + 1000;
  int64_t tries = 0;
  while (static_cast<int>(out.val.size()) < num_val) {
    if (++tries > max_tries) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data: task '", task, "' has too few distinct questions for num_val=", num_val));
    }
    Sample s = gen();
    if (!val_questions.insert(s.prompt).second) continue;
    s.id = absl::StrCat(task, "-val-", out.val.size());
    out.val.push_back(std::move(s));
  }
  tries = 0;
  while (static_cast<int>(out.train.size()) < num_train) {
    if (++tries > max_tries) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data: task '", task, "' has too few questions outside the validation set for num_train=",
          num_train));
    }
    Sample s = gen();
    if (val_questions.count(s.prompt)) continue;
    s.id = absl::StrCat(task, "-train-", out.train.size());
    out.train.push_back(std::move(s));
  }
  return out;
}

absl::StatusOr<TaskSplit> Arithmetic(int num_train, int num_val, int64_t seed,
                                     const std::vector<std::string>& items) {
  ROLL_ASSIGN_OR_RETURN(Options o, ParseOptions("arithmetic", items,
                                                {"operators", "min_operand", "max_operand", "num_operands", "show_work"}));
  const std::string ops = o.count("operators") ? o["operators"] : "+";
  if (ops.empty() || ops.find_first_not_of("+-*") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.task_options: operators=", ops, " must use only + - *"));
  }
  ROLL_ASSIGN_OR_RETURN(int64_t lo, IntOption(o, "min_operand", 0, 0, 1000000));
  ROLL_ASSIGN_OR_RETURN(int64_t hi, IntOption(o, "max_operand", 99, lo, 1000000));
  ROLL_ASSIGN_OR_RETURN(int64_t k, IntOption(o, "num_operands", 2, 2, 6));
  ROLL_ASSIGN_OR_RETURN(int64_t show_work, IntOption(o, "show_work", 0, 0, 1));
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 7919 + 1);
  std::uniform_int_distribution<int64_t> num(lo, hi);
  std::uniform_int_distribution<size_t> op(0, ops.size() - 1);
  auto gen = [&]() {
    std::vector<int64_t> xs;
    std::string q = std::to_string(num(rng));
    xs.push_back(std::stoll(q));
    std::vector<char> os;
    for (int64_t i = 1; i < k; ++i) {
      os.push_back(ops[op(rng)]);
      xs.push_back(num(rng));
      absl::StrAppend(&q, std::string(1, os.back()), xs.back());
    }
    // Evaluate with * before + and -; the worked solution shows each
    // operation: products first, then the sums left to right.
    std::vector<std::string> work;
    std::vector<int64_t> terms{xs[0]};
    std::vector<char> signs{'+'};
    for (size_t i = 0; i < os.size(); ++i) {
      if (os[i] == '*') {
        work.push_back(absl::StrCat(terms.back(), "*", xs[i + 1], "=", terms.back() * xs[i + 1]));
        terms.back() *= xs[i + 1];
      } else {
        terms.push_back(xs[i + 1]);
        signs.push_back(os[i]);
      }
    }
    int64_t v = terms[0];
    for (size_t i = 1; i < terms.size(); ++i) {
      const int64_t next = signs[i] == '-' ? v - terms[i] : v + terms[i];
      work.push_back(absl::StrCat(v, std::string(1, signs[i]), terms[i], "=", next));
      v = next;
    }
    Sample s;
    s.prompt = q + "=";
    s.ground_truth = std::to_string(v);
    if (show_work != 0) s.solution = absl::StrJoin(work, ",");
    return s;
  };
  return Split("arithmetic", num_train, num_val, gen);
}

// Exact rational for countdown expressions.
struct Q {
  int64_t n = 0, d = 1;
};
std::optional<Q> Norm(__int128 n, __int128 d) {
  if (d == 0) return std::nullopt;
  if (d < 0) {
    n = -n;
    d = -d;
  }
  __int128 a = n < 0 ? -n : n, b = d;
  while (b != 0) {
    __int128 t = a % b;
    a = b;
    b = t;
  }
  if (a > 1) {
    n /= a;
    d /= a;
  }
  const __int128 lim = static_cast<__int128>(1) << 62;
  if (n > lim || n < -lim || d > lim) return std::nullopt;
  return Q{static_cast<int64_t>(n), static_cast<int64_t>(d)};
}

// Recursive descent over + - * / and parentheses; records the literals.
class ExprParser {
 public:
  explicit ExprParser(const std::string& s) : s_(s) {}
  std::optional<Q> Parse(std::string* why) {
    auto v = Sum();
    Skip();
    if (v && pos_ != s_.size()) {
      *why = absl::StrCat("unexpected '", s_.substr(pos_, 1), "' in the expression");
      return std::nullopt;
    }
    if (!v) *why = why_.empty() ? "not an arithmetic expression" : why_;
    return v;
  }
  const std::vector<int64_t>& literals() const { return literals_; }

 private:
  void Skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  std::optional<Q> Sum() {
    auto a = Product();
    while (a) {
      Skip();
      if (pos_ >= s_.size() || (s_[pos_] != '+' && s_[pos_] != '-')) break;
      const char op = s_[pos_++];
      auto b = Product();
      if (!b) return std::nullopt;
      a = Norm(static_cast<__int128>(a->n) * b->d + (op == '+' ? 1 : -1) * static_cast<__int128>(b->n) * a->d,
               static_cast<__int128>(a->d) * b->d);
    }
    return a;
  }
  std::optional<Q> Product() {
    auto a = Atom();
    while (a) {
      Skip();
      if (pos_ >= s_.size() || (s_[pos_] != '*' && s_[pos_] != '/')) break;
      const char op = s_[pos_++];
      auto b = Atom();
      if (!b) return std::nullopt;
      if (op == '*') {
        a = Norm(static_cast<__int128>(a->n) * b->n, static_cast<__int128>(a->d) * b->d);
      } else {
        if (b->n == 0) {
          why_ = "division by zero";
          return std::nullopt;
        }
        a = Norm(static_cast<__int128>(a->n) * b->d, static_cast<__int128>(a->d) * b->n);
      }
    }
    return a;
  }
  std::optional<Q> Atom() {
    Skip();
    if (pos_ >= s_.size()) return std::nullopt;
    if (s_[pos_] == '(') {
      ++pos_;
      if (++depth_ > 64) return std::nullopt;
      auto v = Sum();
      --depth_;
      Skip();
      if (!v || pos_ >= s_.size() || s_[pos_] != ')') return std::nullopt;
      ++pos_;
      return v;
    }
    size_t start = pos_;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    if (start == pos_ || pos_ - start > 12) return std::nullopt;
    const int64_t v = std::stoll(s_.substr(start, pos_ - start));
    literals_.push_back(v);
    return Q{v, 1};
  }

  const std::string& s_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string why_;
  std::vector<int64_t> literals_;
};

// A random expression over the numbers gives a reachable target.
absl::StatusOr<TaskSplit> Countdown(int num_train, int num_val, int64_t seed,
                                    const std::vector<std::string>& items) {
  ROLL_ASSIGN_OR_RETURN(Options o, ParseOptions("countdown", items, {"count", "max_number", "max_target"}));
  ROLL_ASSIGN_OR_RETURN(int64_t count, IntOption(o, "count", 3, 2, 6));
  ROLL_ASSIGN_OR_RETURN(int64_t max_number, IntOption(o, "max_number", 25, 2, 1000));
  ROLL_ASSIGN_OR_RETURN(int64_t max_target, IntOption(o, "max_target", 100, 1, 100000));
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 104729 + 3);
  std::uniform_int_distribution<int64_t> num(1, max_number);
  auto gen = [&]() {
    while (true) {
      std::vector<int64_t> xs(count);
      for (auto& x : xs) x = num(rng);
      int64_t v = xs[0];
      for (int64_t i = 1; i < count; ++i) {
        switch (rng() % 3) {
          case 0: v += xs[i]; break;
          case 1: v -= xs[i]; break;
          default: v *= xs[i]; break;
        }
      }
      if (v < 1 || v > max_target) continue;
      std::vector<int64_t> shown = xs;
      std::sort(shown.begin(), shown.end());
      Sample s;
      s.prompt = absl::StrCat("Use ", absl::StrJoin(shown, " "), " to make ", v, ".");
      nlohmann::json gt;
      gt["numbers"] = shown;
      gt["target"] = v;
      s.ground_truth = gt.dump();
      return s;
    }
  };
  return Split("countdown", num_train, num_val, gen);
}

}  // namespace

absl::StatusOr<TaskSplit> GenerateTaskSplit(const std::string& task, int num_train, int num_val,
                                            int64_t seed, const std::vector<std::string>& options) {
  if (num_train < 0 || num_val < 0) return absl::InvalidArgumentError("data: sizes must be >= 0");
  if (task == "arithmetic") return Arithmetic(num_train, num_val, seed, options);
  if (task == "countdown") return Countdown(num_train, num_val, seed, options);
  return absl::InvalidArgumentError(
      absl::StrCat("data.task: unknown task '", task, "' (known: arithmetic, countdown)"));
}

absl::StatusOr<CountdownResult> CountdownScore(const std::string& response,
                                               const std::string& ground_truth) {
  std::vector<int64_t> numbers;
  int64_t target = 0;
  try {
    nlohmann::json gt = nlohmann::json::parse(ground_truth);
    numbers = gt.at("numbers").get<std::vector<int64_t>>();
    target = gt.at("target").get<int64_t>();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("countdown ground truth '", ground_truth,
                                                   "' is not {\"numbers\": [...], \"target\": n}: ",
                                                   e.what()));
  }
  std::string expr = response;
  std::string lower = response;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (size_t p = lower.rfind("answer:"); p != std::string::npos) {
    expr = response.substr(p + 7);
  } else {
    std::vector<std::string> lines = absl::StrSplit(response, '\n', absl::SkipWhitespace());
    expr = lines.empty() ? "" : lines.back();
  }
  // "expr = 46" is fine: score the left side.
  if (size_t eq = expr.find('='); eq != std::string::npos) expr = expr.substr(0, eq);
  CountdownResult r;
  std::string why;
  ExprParser p(expr);
  std::optional<Q> v = p.Parse(&why);
  if (!v) {
    r.reason = absl::StrCat("no valid expression: ", why);
    return r;
  }
  std::multiset<int64_t> avail(numbers.begin(), numbers.end());
  for (int64_t lit : p.literals()) {
    auto it = avail.find(lit);
    if (it == avail.end()) {
      r.reason = absl::StrCat("uses ", lit, ", which is not available (or used twice)");
      return r;
    }
    avail.erase(it);
  }
  if (v->d != 1 || v->n != target) {
    r.reason = absl::StrCat("expression equals ", v->n, v->d == 1 ? "" : absl::StrCat("/", v->d),
                            ", not ", target);
    return r;
  }
  r.score = 1.0;
  r.reason = "correct";
  return r;
}

}  // namespace roll
